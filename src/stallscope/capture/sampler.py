"""Where a DataLoader's fetch time goes: a light stack sampler in the process that fetches.

The anatomy (capture/anatomy.py) says whether a loader waits or computes; the fix depends on
*what* it computes or waits on (a PIL decode wants `Image.draft()`, a network read wants a cache)
and on which of the user's lines does it. A daemon thread in the fetching process (each worker,
or the training process for a num_workers=0 loader) reads the fetching thread's Python stack
(`sys._current_frames()`) every ~SAMPLE_S while a fetch is active (`begin` .. `end`), and counts
samples by (category, the user's innermost frame, the innermost library function). C calls
are invisible to frame walking, so the source line of the innermost Python frame decides those
(`time.sleep(...)`, `f.read()`, `cv2.imdecode(...)`).

The thread holds the GIL only while it samples, and only every SAMPLE_S; a walk is cached per
code object and per (code object, line), so a sample costs one dict of the threads' frames, a
walk of ~20 frames with dict lookups, one key tuple and one dict increment. Every failure here
stops the sampler and loses only the stack figures: nothing raises into the user's code.
"""

from __future__ import annotations

import linecache
import os
import random
import re
import sys
import sysconfig
import threading
import time
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

# Mean seconds between samples (each interval drawn uniformly in [0.5, 1.5] x the mean, so
# that samples do not lock onto a periodic loop). Taking a sample is cheap, but waking the
# thread and taking the GIL from a busy thread costs an order of magnitude more, and in the
# training process that lands on the step (benchmarks/bench_anatomy.py; the figures in
# docs/performance.md, "Figures behind the code"). So workers, where it lands on the loading
# beside the step, sample more often than the training process (num_workers=0).
SAMPLE_S = 0.03
SAMPLE_S_MAIN = 0.05
MAX_KEYS = 200  # distinct (category, frame) keys per process; the rest count under "other"
MAX_DEPTH = 200  # frames walked before a sample is given up (no boundary found: dropped)
IDLE_WAKES = 50  # wake-ups without an active fetch (1.5-2.5 s) before sleeping until the next one
MIN_SAMPLES = 10  # fewer samples than this say too little: no stack figures
TOP = 8
OTHER = "other"

PIL, CV2, FILES, WAIT = "image decode (PIL)", "image decode (cv2)", "file reads", "sleep/wait"
TRANSFORMS, NUMPY, TORCH, COLLATE, YOURS = (
    "transforms", "numpy", "torch ops", "collate", "your code")
CATEGORIES = (PIL, CV2, FILES, WAIT, TRANSFORMS, NUMPY, TORCH, COLLATE, YOURS)

# A frame's category by its module's top-level package (f_globals["__name__"]).
_SPECIFIC_MODULES = {
    "PIL": PIL, "cv2": CV2, "albumentations": TRANSFORMS,
    **dict.fromkeys(("io", "_pyio", "pathlib", "os", "posixpath", "ntpath", "genericpath",
                     "shutil", "gzip", "zipfile", "tarfile", "bz2", "lzma", "glob", "tempfile",
                     "h5py", "lmdb", "fsspec", "pyarrow", "zarr", "tifffile"), FILES),
    **dict.fromkeys(("socket", "ssl", "selectors", "http", "urllib", "urllib3", "requests",
                     "threading", "queue", "asyncio", "botocore", "boto3", "aiohttp", "grpc"),
                    WAIT),
}
_GENERIC_MODULES = {"numpy": NUMPY, "torch": TORCH, "torchvision": TORCH}
# C calls, from the source line of the innermost Python frame, most specific first.
_SPECIFIC_LINES = (
    (PIL, re.compile(r"Image\.open\(|\.convert\(|\.resize\(|\.draft\(|\.thumbnail\(|"
                     r"\.load\(\)")),
    (CV2, re.compile(r"\bcv2\.")),
    (WAIT, re.compile(r"\bsleep\(|\.wait\(|\burlopen\(|\.recv\w*\(")),
    (FILES, re.compile(r"\b(?:open|read\w*|load|fromfile|memmap)\(")),
)
_GENERIC_LINES = ((NUMPY, re.compile(r"\b(?:np|numpy)\.")),
                  (TORCH, re.compile(r"\b(?:torch|F|nn)\.")))  # F: torch.nn.functional

_OURS = str(Path(__file__).resolve().parent.parent) + os.sep
_LIBRARY = tuple(sorted({q for k in ("stdlib", "platstdlib", "purelib", "platlib")
                         if (p := sysconfig.get_paths().get(k))
                         for q in (p + os.sep, str(Path(p).resolve()) + os.sep)}))


class _Code:
    """What a code object says about a sample, whatever line it is on (cached per code)."""

    __slots__ = ("user", "ours", "specific", "generic", "collate", "name", "filename")

    def __init__(self, code: CodeType, module: str) -> None:
        filename = code.co_filename
        qualname = getattr(code, "co_qualname", code.co_name)
        root = module.partition(".")[0]
        self.user = not (filename.startswith(_LIBRARY) or filename.startswith(_OURS)
                         or filename.startswith("<frozen") or "-packages" + os.sep in filename
                         or root in ("torch", "stallscope"))
        self.filename = filename
        self.ours = filename.startswith(_OURS) or root == "stallscope"
        self.name = qualname if self.user else f"{module}.{qualname}" if module else qualname
        self.collate = module.startswith("torch.utils.data._utils.collate") or (
            module.startswith("stallscope") and qualname.startswith("TimedCollate"))
        loading = module.startswith(("torch.utils.data", "stallscope"))  # the loader's own
        self.specific = None if self.user else (
            TRANSFORMS if module.startswith("torchvision.transforms")
            else _SPECIFIC_MODULES.get(root))
        self.generic = None if self.user or loading else _GENERIC_MODULES.get(root)


class _Line:
    """One line of code as reported: function, file:line, source text, and the category of a
    C call made on it. Compared by identity: one object per (code object, line)."""

    __slots__ = ("function", "site", "text", "specific", "generic")

    def __init__(self, code: _Code, lineno: int, base: str) -> None:
        self.function = plain(code.name)
        self.site = plain(f"{display_path(code.filename, base)}:{lineno}")
        text = linecache.getline(code.filename, lineno).strip()
        self.specific, self.generic = line_category(text)
        self.text = plain(text[:160])


_OTHER_LINE = _Line.__new__(_Line)
_OTHER_LINE.function, _OTHER_LINE.site, _OTHER_LINE.text = OTHER, "", ""


def line_category(text: str) -> tuple[str | None, str | None]:
    """(specific, generic) category of the C call a source line makes; None where it names
    none. The comment is left out: `time.sleep(x)  # the read` is a sleep."""
    code = text.split("#", 1)[0]
    specific = next((c for c, rx in _SPECIFIC_LINES if rx.search(code)), None)
    generic = next((c for c, rx in _GENERIC_LINES if rx.search(code)), None)
    return specific, generic


def plain(text: str) -> str:
    """`text` with nothing JSON must escape: the figures travel in the trace's metadata, and
    Kineto turns every backslash there into a slash (`\\"` would end the string). Double
    quotes become single ones, backslashes slashes (as Kineto would), the rest of non-ASCII
    and control characters "?"."""
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return text
    text = text.replace('"', "'").replace("\\", "/")
    return "".join(c if " " <= c <= "~" else "?" for c in text)


def display_path(filename: str, base: str) -> str:
    """Relative to the script's folder when under it, else the file's parent folder and name
    (`PIL/ImageFile.py`): short, and still says which package."""
    if base and filename.startswith(base):
        return filename[len(base):]
    path = Path(filename)
    return f"{path.parent.name}/{path.name}" if path.parent.name else path.name


def _script_folder() -> str:
    """The script's folder: `sys.path[0]` (set to it by `stallscope run`, inherited by fork
    workers and restored in spawn workers); the working folder for `-m`."""
    first = sys.path[0] if sys.path and sys.path[0] else os.getcwd()
    return os.path.abspath(first) + os.sep


class StackSampler:
    """Samples one thread at a time, while it is marked active by `begin` and until `end`.

    `counts` maps (category, user line or None, innermost library line or None) to a number of
    samples; `begin` may name another dict (one per loader in the training process)."""

    def __init__(self, interval: float = SAMPLE_S) -> None:
        self.interval = interval
        self.pid = os.getpid()
        self.counts: dict[tuple[Any, ...], int] = {}
        self.broken = False
        self._target: tuple[int, FrameType, dict[tuple[Any, ...], int]] | None = None
        self._codes: dict[CodeType, _Code] = {}
        self._lines: dict[CodeType, dict[int, _Line]] = {}
        self._base = _script_folder()
        self._stop = False
        self._idle = False
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stallscope-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop = True
        self._target = None
        self._wake.set()

    @property
    def alive(self) -> bool:
        return not self.broken and not self._stop and self._thread.is_alive()

    def begin(self, counts: dict[tuple[Any, ...], int] | None = None, depth: int = 1) -> None:
        """Sample the calling thread until `end`; the caller's frame (`depth` up) bounds the
        walk: frames outside it are not the fetch (a fork worker's stack still holds the
        parent's training loop)."""
        self._target = (threading.get_ident(), sys._getframe(depth),
                        self.counts if counts is None else counts)
        if self._idle:
            self._idle = False
            self._wake.set()

    def end(self) -> None:
        self._target = None

    def _run(self) -> None:
        uniform = random.Random().random
        idle = 0
        try:
            while not self._stop:
                time.sleep(self.interval * (0.5 + uniform()))
                target = self._target
                if target is None:
                    idle += 1
                    if idle >= IDLE_WAKES:  # no fetch for a while: sleep until the next one
                        idle = 0
                        self._idle = True
                        self._wake.clear()
                        if self._target is None and not self._stop:
                            self._wake.wait()
                    continue
                idle = 0
                frame = sys._current_frames().get(target[0])
                if frame is not None:
                    self.sample(frame, target[1], target[2])
                del frame, target
        except Exception:  # the stack figures are lost, nothing else
            self.broken = True

    def sample(self, frame: FrameType, boundary: FrameType | None,
               counts: dict[tuple[Any, ...], int]) -> tuple[Any, ...] | None:
        """Count one sample of the stack from `frame` out to `boundary` (excluded); None (and
        nothing counted) when the boundary is not on the stack: the fetch has just ended."""
        codes = self._codes
        if frame is boundary or (codes.get(frame.f_code) or self._code(frame)).ours:
            # The fetch has not begun or has just returned, or the thread is in stallscope's
            # own timing (TimedCollate): not the user's loading.
            return None
        inner = self._line(frame, None)
        category, generic = inner.specific, inner.generic
        user: _Line | None = None
        innermost_user: bool | None = None
        f: FrameType | None = frame
        depth = 0
        while f is not boundary:
            if f is None or depth >= MAX_DEPTH:
                return None
            code = codes.get(f.f_code) or self._code(f)
            if innermost_user is None:
                innermost_user = code.user
            if category is None:
                if code.specific is not None:
                    category = code.specific
                elif code.collate:
                    category = COLLATE
                elif generic is None:
                    generic = code.generic
            if user is None and code.user:
                user = inner if f is frame else self._line(f, code)
            f = f.f_back
            depth += 1
        category = category or generic or YOURS
        lib = None if innermost_user else inner
        key = (category, user, lib) if user is not None else (category, lib, None)
        if key not in counts and len(counts) >= MAX_KEYS:
            key = (category, _OTHER_LINE, None)
        counts[key] = counts.get(key, 0) + 1
        return key

    def _code(self, frame: FrameType) -> _Code:
        if len(self._codes) > 20_000:  # code made at run time without end: start over
            self._codes.clear()
            self._lines.clear()
        code = _Code(frame.f_code, str(frame.f_globals.get("__name__") or ""))
        self._codes[frame.f_code] = code
        return code

    def _line(self, frame: FrameType, code: _Code | None) -> _Line:
        by_line = self._lines.get(frame.f_code)
        if by_line is None:
            by_line = self._lines[frame.f_code] = {}
        lineno = frame.f_lineno or 0
        line = by_line.get(lineno)
        if line is None:
            code = code or self._codes.get(frame.f_code) or self._code(frame)
            line = by_line[lineno] = _Line(code, lineno, self._base)
        return line


# ------------------------------------------------------------------ one sampler per process

_sampler: StackSampler | None = None


def start(interval: float = SAMPLE_S) -> StackSampler | None:
    """This process's sampler, started on first use (a fork child starts its own: the
    parent's thread is not in it). None when no thread can be started."""
    global _sampler
    s = _sampler
    if s is not None and s.pid == os.getpid():
        return s if s.alive else None  # broken: no figures rather than a thread per call
    try:
        s = StackSampler(interval)
        s.start()
    except Exception:
        return None
    _sampler = s
    return s


def begin(counts: dict[tuple[Any, ...], int] | None = None) -> StackSampler | None:
    """Mark the calling thread's fetch active (its caller's frame bounds the walk); returns the
    sampler to `end` it, or None when this process samples nothing."""
    s = _sampler
    if s is None or s.pid != os.getpid():
        return None
    try:
        s.begin(counts, depth=2)
    except Exception:  # never into the user's fetch
        return None
    return s


def stop() -> None:
    """Stop this process's sampler (the end of `stallscope run`)."""
    global _sampler
    s = _sampler
    if s is not None and s.pid == os.getpid():
        s.stop()
        _sampler = None


def export(counts: dict[tuple[Any, ...], int] | None = None) -> dict[str, Any] | None:
    """The counts (this process's sampler's own when None) as JSON: rows of
    [category, function, site, source line, library function called, samples] (a sampler
    that broke keeps what it counted before). None when this process has no sampler."""
    try:
        s = _sampler
        if counts is None:
            if s is None or s.pid != os.getpid():
                return None
            counts = s.counts
        rows = []
        for (category, line, lib), n in list(counts.items()):
            calls = lib.function if lib is not None else ""
            rows.append([category, line.function, line.site, line.text, calls, n])
        return {"interval_ms": round((s.interval if s else SAMPLE_S) * 1000, 3), "rows": rows}
    except Exception:
        return None


def subtract(now: Any, base: Any) -> Any:
    """`now`'s rows less `base`'s, per key (a worker's samples since the recording began)."""
    try:
        before = {tuple(r[:5]): r[5] for r in base["rows"]}
        rows = [[*r[:5], r[5] - before.get(tuple(r[:5]), 0)] for r in now["rows"]]
        return {**now, "rows": [r for r in rows if r[5] > 0]}
    except Exception:  # no base (the worker started within the recording): all of `now`
        return now


def summary(sources: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Shares of the samples by category and by line, over the processes that made batches;
    None with fewer than MIN_SAMPLES samples (too few to say), or rows it cannot read."""
    try:
        return _summary(sources)
    except Exception:  # the stack figures are lost, not the anatomy
        return None


def _summary(sources: list[dict[str, Any]]) -> dict[str, Any] | None:
    cats: dict[str, int] = {}
    lines: dict[tuple[str, str, str, str], dict[str, int]] = {}
    interval = None
    for src in sources:
        stack = src.get("stack")
        if not (src.get("batches") or 0) > 0 or not isinstance(stack, dict):
            continue
        interval = stack.get("interval_ms", interval)
        for category, function, site, text, calls, n in stack.get("rows") or []:
            cats[category] = cats.get(category, 0) + n
            by_call = lines.setdefault((category, function, site, text), {})
            by_call[calls] = by_call.get(calls, 0) + n
    total = sum(cats.values())
    if total < MIN_SAMPLES:
        return None
    ranked = sorted(((k, v) for k, v in lines.items() if k[1] != OTHER),
                    key=lambda kv: -sum(kv[1].values()))
    top = []
    for (category, function, site, text), by_call in ranked[:TOP]:
        row = {"function": function, "site": site, "category": category,
               "share": round(sum(by_call.values()) / total, 3), "line": text}
        calls = max(by_call, key=lambda c: by_call[c])
        if calls:
            row["calls"] = calls
        top.append(row)
    return {
        "samples": total, "interval_ms": interval,
        "categories": [{"category": c, "share": round(n / total, 3)}
                       for c, n in sorted(cats.items(), key=lambda kv: -kv[1])],
        "top": top,
    }

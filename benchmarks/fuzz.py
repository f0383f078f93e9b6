"""Mutation fuzzer for `stallscope analyze`: damaged copies of real traces, in-process.

    python benchmarks/fuzz.py --cases 10000 --seed 1 --out /tmp/fuzz [--jobs 2] [--damage-64]

Each case takes a seed trace (the public real traces under sample_traces/public, read-only,
and sample_traces/*.gz), applies one to three mutations, writes the result to a scratch file
and runs what `stallscope analyze` runs on it: the loader, the step model, the rules, the fix
plan and every writer (JSON, HTML, Markdown, terminal). A case ends in one of:

- `ok`: a report;
- `refused`: a StallscopeError, i.e. the one `stallscope:` line and a documented exit code;
- `internal`: any other exception, a stallscope bug (its input is saved under OUT/failures);
- `hang`: over --timeout seconds of wall time (default 60; the input is saved too).

A seeded mutation loop rather than hypothesis or atheris: the inputs are multi-megabyte
documents whose interesting damage is structural (a key deleted, a type changed, an event cut),
which a generic byte-level engine reaches rarely, and atheris has no wheel for this Python.
Most mutations work on the decoded document (fast, and every field the analysis reads gets
wrong values); some work on the bytes and on the gzip stream.

One case in `JOB_SHARE` is a job instead: a folder of two or three copies of the mutated trace
as ranks, beside one or two ranks that died (a 0-byte file, one cut before its first event,
garbage bytes, a link to a file that is gone). Such a case is `ok` only when the report lists
every dead file in `source.left_out`; a report that does not is counted `internal`.

After the cases (`main`), dense damage at growing sizes: a real trace tiled to 1 and 8 MB (64 MB
with --damage-64) with one event in 20 damaged plus one lone surrogate escape, and one in 2 plus
100 escapes (benchmarks/damaged.py), each loaded once; the time per MB is printed and kept in
the summary. Linear reading keeps it flat as the size grows (issue 36).

Every `--progress` cases (default 250) one line says how far the run is: cases done, internal
errors, hangs, cases over the time limit (LIMIT_S) and over the memory limit (LIMIT_MB), the
slowest case and the largest peak so far. The time limit is checked on the CPU seconds a case
took (the process's and its children's), which the machine's other work does not inflate; the
wall seconds are kept and reported beside them. A case's memory is the process's peak resident size
while that case was analysed (VmHWM, reset before each case through /proc/self/clear_refs), so
it also counts what the process held before the case (imports, the seeds' text): an upper
bound on the case's own; a case over the limit that way is analysed again alone, in a fresh
`stallscope analyze` process, whose own peak counts (VmHWM again; not a child's `ru_maxrss`,
which Linux carries over from the parent across fork and exec). The summary (counts, the
slowest case, peak RSS) is printed, ending with one line (cases, seed, internal errors, hangs,
over 10 s of CPU and of wall time, over 1 GB, max seconds, max RSS), and written to
OUT/summary.json.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import ctypes
import gc
import gzip
import json
import math
import multiprocessing
import random
import resource
import shutil
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

ROOT = Path(__file__).resolve().parent.parent
REAL = ROOT / "sample_traces" / "public"

# The acceptance limits: no case over LIMIT_S CPU seconds or LIMIT_MB of peak resident memory.
LIMIT_S = 10.0
LIMIT_MB = 1024.0


# Values a field may be given instead of its own: wrong types, out-of-range numbers, odd text.
ODD_VALUES: list[Any] = [
    None, "", "x", "0x7", "12", [], {}, [1, 2], {"a": 1}, True, False, -1, 0, 0.5, 1.5, -0.0,
    1e308, -1e308, 2**64, -(2**63), 2**53 + 1, 1e-320, "\u202eevil", "\x00", "\ud800",
    "ProfilerStep#99999999999999999999999", "a" * 5000,
]
FIELDS = ["ph", "cat", "name", "pid", "tid", "ts", "dur"]
ARG_FIELDS = ["correlation", "device", "stream", "bytes", "External id"]
META_KEYS = ["schemaVersion", "deviceProperties", "distributedInfo", "traceName", "stallscope",
             "baseTimeNanoseconds"]


def seeds(small_only: bool = False) -> list[Path]:
    """The traces to mutate: the sample traces and, when present, the shared real traces."""
    found = sorted((ROOT / "sample_traces").glob("*.pt.trace.json.gz"))
    if REAL.is_dir():
        found += sorted(REAL.rglob("*.json.gz"))
    if small_only:
        found = [p for p in found if p.stat().st_size < 200_000]
    return found


class Doc:
    """A seed's text, read once; decoded afresh for each case that mutates it (a decoded copy
    kept per seed would hold tens of bytes of objects per byte of text in the fuzzing process,
    and count in every case's memory)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with gzip.open(path) as fh:
            self.text = fh.read()

    def fresh(self) -> dict:
        """The decoded document, a copy of its own to mutate (as a deep copy would be)."""
        data = msgspec.json.decode(self.text)
        return data if isinstance(data, dict) else {"traceEvents": data}


# ------------------------------------------------------------------ document mutations


def _events(doc: dict) -> list:
    events = doc.get("traceEvents")
    return events if isinstance(events, list) else []


def _some_event(rng: random.Random, doc: dict, complete: bool = True) -> dict | None:
    events = [e for e in _events(doc) if isinstance(e, dict)
              and (not complete or e.get("ph") == "X")]
    return rng.choice(events) if events else None


def wrong_field(rng: random.Random, doc: dict) -> str:
    for _ in range(rng.randint(1, 20)):
        event = _some_event(rng, doc)
        if event is None:
            break
        key = rng.choice(FIELDS)
        event[key] = rng.choice(ODD_VALUES)
    return "wrong-field"


def wrong_arg(rng: random.Random, doc: dict) -> str:
    for _ in range(rng.randint(1, 20)):
        event = _some_event(rng, doc)
        if event is None:
            break
        args = event.setdefault("args", {})
        if isinstance(args, dict):
            args[rng.choice(ARG_FIELDS)] = rng.choice(ODD_VALUES)
        else:
            event["args"] = rng.choice(ODD_VALUES)
    return "wrong-arg"


def wrong_meta(rng: random.Random, doc: dict) -> str:
    key = rng.choice(META_KEYS)
    if key == "deviceProperties" and rng.random() < 0.5:
        doc[key] = [{"id": rng.choice(ODD_VALUES), "name": rng.choice(ODD_VALUES),
                     "totalGlobalMem": rng.choice(ODD_VALUES),
                     "computeMajor": rng.choice(ODD_VALUES)}]
    elif key == "distributedInfo" and rng.random() < 0.5:
        doc[key] = {"rank": rng.choice(ODD_VALUES), "world_size": rng.choice(ODD_VALUES),
                    "backend": rng.choice(ODD_VALUES)}
    elif key == "stallscope" and rng.random() < 0.5:
        base = doc.get(key) if isinstance(doc.get(key), dict) else {}
        base = dict(base)
        target = rng.choice(list(base) or ["tool", "steps", "loaders"])
        base[target] = rng.choice(ODD_VALUES)
        doc[key] = base
    else:
        doc[key] = rng.choice(ODD_VALUES)
    return "wrong-meta"


def delete_keys(rng: random.Random, doc: dict) -> str:
    for _ in range(rng.randint(1, 30)):
        event = _some_event(rng, doc, complete=rng.random() < 0.7)
        if event is None or not event:
            break
        event.pop(rng.choice(list(event)), None)
    if rng.random() < 0.2 and doc:
        doc.pop(rng.choice(list(doc)), None)
    return "delete-keys"


def duplicate_events(rng: random.Random, doc: dict) -> str:
    events = _events(doc)
    if events:
        for _ in range(rng.randint(1, 50)):
            events.insert(rng.randrange(len(events) + 1), copy.deepcopy(rng.choice(events)))
    return "duplicate-events"


def drop_events(rng: random.Random, doc: dict) -> str:
    events = _events(doc)
    if events:
        kind = rng.random()
        if kind < 0.3:  # the tail, as a run stopped early
            del events[rng.randrange(len(events)):]
        elif kind < 0.5:  # a category
            cat = rng.choice(["kernel", "cuda_runtime", "gpu_memcpy", "user_annotation",
                              "cpu_op", "ac2g", "python_function"])
            events[:] = [e for e in events if not (isinstance(e, dict) and e.get("cat") == cat)]
        else:
            for _ in range(rng.randint(1, 200)):
                if events:
                    events.pop(rng.randrange(len(events)))
    return "drop-events"


def steps(rng: random.Random, doc: dict) -> str:
    marks = [e for e in _events(doc) if isinstance(e, dict)
             and str(e.get("name", "")).startswith("ProfilerStep#")]
    for e in rng.sample(marks, min(len(marks), rng.randint(1, 3))):
        choice = rng.random()
        if choice < 0.25:
            e["dur"] = 0
        elif choice < 0.4:
            e["dur"] = -e.get("dur", 1) if isinstance(e.get("dur"), int | float) else -1
        elif choice < 0.6:
            e["name"] = f"ProfilerStep#{rng.choice([10**30, 2**64, -5, 0, 2**63 - 1])}"
        elif choice < 0.8:
            e["ts"] = rng.choice([1e308, 2**64, -1e15, 0, 1e18])
        else:
            e["name"] = f"ProfilerStep#{rng.randint(0, 3)}"  # repeated numbers
    return "steps"


def numbers(rng: random.Random, doc: dict) -> str:
    for _ in range(rng.randint(1, 30)):
        event = _some_event(rng, doc)
        if event is None:
            break
        event[rng.choice(["ts", "dur"])] = rng.choice([1e308, -1e308, 2**64, 1e18, -1, 0,
                                                       1e-300, 4.9e-324, 1e15])
    return "numbers"


def unicode(rng: random.Random, doc: dict) -> str:
    texts = ["\u202e\u2066x", "\x00\x07\x1b[31m", "</script><script>alert(1)</script>",
             "😀" * 100, "\ufffd", "名前", "a\nb\rc", "{{ x }}"]
    for _ in range(rng.randint(1, 20)):
        event = _some_event(rng, doc, complete=False)
        if event is None:
            break
        event[rng.choice(["name", "cat", "pid", "tid"])] = rng.choice(texts)
    return "unicode"


def deep(rng: random.Random, doc: dict) -> str:
    event = _some_event(rng, doc)
    depth = rng.choice([50, 900, 3000])
    nested: Any = 1
    for _ in range(depth):
        nested = [nested] if rng.random() < 0.5 else {"a": nested}
    if event is not None and rng.random() < 0.7:
        event.setdefault("args", {})
        if isinstance(event["args"], dict):
            event["args"]["deep"] = nested
    else:
        doc[rng.choice(META_KEYS)] = nested
    return f"deep-{depth}"


def last_runtime_htod(rng: random.Random, doc: dict) -> str:
    """End the trace on a runtime call that copies host to device (the issue's crash)."""
    events = _events(doc)
    calls = [e for e in events if isinstance(e, dict) and e.get("cat") == "cuda_runtime"
             and "Memcpy" in str(e.get("name", ""))]
    if calls:
        last = max(float(e.get("ts", 0)) if isinstance(e.get("ts"), int | float) else 0
                   for e in events if isinstance(e, dict))
        call = copy.deepcopy(rng.choice(calls))
        call["ts"] = last + 1
        events.append(call)
    return "last-runtime-htod"


DOC_MUTATIONS: list[Callable[[random.Random, dict], str]] = [
    wrong_field, wrong_arg, wrong_meta, delete_keys, duplicate_events, drop_events, steps,
    numbers, unicode, deep, last_runtime_htod,
]


# ------------------------------------------------------------------ byte mutations


def flip(rng: random.Random, text: bytes) -> tuple[bytes, str]:
    b = bytearray(text)
    for _ in range(rng.choice([1, 1, 2, 5, 50])):
        i = rng.randrange(len(b))
        b[i] = rng.choice(b'{}[],:"\\x0 \x00\xff') if rng.random() < 0.7 else rng.randrange(256)
    return bytes(b), "byte-flip"


def cut(rng: random.Random, text: bytes) -> tuple[bytes, str]:
    return text[: rng.randrange(len(text))], "cut"


def duplicate_key(rng: random.Random, text: bytes) -> tuple[bytes, str]:
    key = rng.choice([b'"ts": ', b'"dur": ', b'"name": ', b'"ph": ', b'"args": '])
    i = text.find(key, rng.randrange(len(text)))
    if i < 0:
        return text, "duplicate-key (none)"
    value = rng.choice([b'"x", ', b"1e999, ", b"NaN, ", b"Infinity, ", b"-1, ", b"null, "])
    return text[:i] + key + value + text[i:], "duplicate-key"


def special_numbers(rng: random.Random, text: bytes) -> tuple[bytes, str]:
    word = rng.choice([b"NaN", b"Infinity", b"-Infinity", b"1e999", b"123456789012345678901234"])
    key = rng.choice([b'"ts": ', b'"dur": ', b'"correlation": '])
    out, pos = bytearray(), 0
    for _ in range(rng.randint(1, 10)):
        i = text.find(key, pos + rng.randrange(1, max(2, len(text) // 10)))
        if i < 0:
            break
        j = i + len(key)
        k = j
        while k < len(text) and text[k:k + 1] not in b",}":
            k += 1
        out += text[pos:j] + word
        pos = k
    out += text[pos:]
    return bytes(out), "special-numbers"


def whitespace(rng: random.Random, text: bytes) -> tuple[bytes, str]:
    i = text.find(b"}, {", rng.randrange(len(text)))
    if i < 0:
        return text, "whitespace (none)"
    return text[: i + 2] + b" " * rng.choice([1, 10_000, 3_000_000]) + text[i + 2:], "whitespace"


def header(rng: random.Random, text: bytes) -> tuple[bytes, str]:
    """The keys before the event list in the shapes the reader once choked on: the
    `traceEvents` key nested thousands of times, megabytes of tiny objects, a stray byte or a
    lone surrogate escape in a name, a byte-order mark, runs of whitespace."""
    start = text.find(b"{")
    if start < 0 or text.lstrip()[:1] != b"{":
        return text, "header (array form)"
    shape = rng.choice(["nested-key", "tiny-objects", "stray-byte", "lone-surrogate", "bom",
                        "whitespace-run"])
    n = rng.choice([10, 1_000, 100_000])
    keys = {
        "nested-key": b'"k":[' + b",".join([b'{"traceEvents":[]}'] * n) + b"],",
        "tiny-objects": b'"tiny":[' + b",".join([b"{}"] * (n * 10)) + b"],",
        "stray-byte": b'"deviceName":"GPU \xff\xc3(",',
        "lone-surrogate": b'"deviceName":"GPU \\ud83d x",',
        "bom": b"",
        "whitespace-run": bytes(rng.choice(b" \t\n\r") for _ in range(n * 10)),
    }[shape]
    out = text[: start + 1] + keys + text[start + 1:]
    if shape == "bom" or rng.random() < 0.2:
        out = b"\xef\xbb\xbf" + out
    return out, f"header-{shape}"


BYTE_MUTATIONS = [flip, cut, duplicate_key, special_numbers, whitespace, header, header]


def gzip_variant(rng: random.Random, raw: bytes) -> tuple[bytes, str]:
    """The file as written: plain, gzip, two gzip members, gzip with trailing garbage, cut."""
    choice = rng.random()
    if choice < 0.35:
        return raw, "plain"
    packed = gzip.compress(raw, compresslevel=1)
    if choice < 0.75:
        return packed, "gzip"
    if choice < 0.85:
        half = len(raw) // 2
        return (gzip.compress(raw[:half], compresslevel=1)
                + gzip.compress(raw[half:], compresslevel=1)), "gzip-two-members"
    if choice < 0.93:
        return packed + b"garbage\x00\x01", "gzip-trailing-garbage"
    return packed[: rng.randrange(10, len(packed))], "gzip-cut"


# ------------------------------------------------------------------ one case


def encode(data: Any) -> bytes:
    """JSON text of a mutated document (lone surrogates as escapes; deep nesting allowed)."""
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)
    try:
        try:
            return msgspec.json.encode(data)
        except UnicodeEncodeError:
            return json.dumps(data).encode()
    finally:
        sys.setrecursionlimit(old)


def make_case(rng: random.Random, doc: Doc) -> tuple[bytes, list[str]]:
    what: list[str] = [doc.path.name]
    if rng.random() < 0.7:
        data = doc.fresh()
        # A mutation after `deep` may copy an event holding 3,000 levels of nesting: the
        # fuzzer's own copy needs the deeper stack (stallscope runs with the default limit).
        old = sys.getrecursionlimit()
        sys.setrecursionlimit(max(old, 20_000))
        try:
            for _ in range(rng.randint(1, 3)):
                what.append(rng.choice(DOC_MUTATIONS)(rng, data))
        finally:
            sys.setrecursionlimit(old)
        raw = encode(data)
    else:
        raw = doc.text
    if rng.random() < 0.4 or raw is doc.text:
        raw, how = rng.choice(BYTE_MUTATIONS)(rng, raw)
        what.append(how)
    out, how = gzip_variant(rng, raw)
    what.append(how)
    return out, what


# ------------------------------------------------------------------ a job with dead ranks

JOB_SHARE = 0.05  # of the cases: a job folder with ranks that died beside the case's trace
DEAD_RANKS = ["empty", "cut-before-events", "garbage", "dangling-link"]


def dead_rank(kind: str, text: bytes) -> bytes | None:
    """What a rank that died leaves, from a trace's text; None for a link to a missing file."""
    if kind == "empty":
        return b""
    if kind == "cut-before-events":
        key = text.find(b'"traceEvents"')
        return text[: key + 20] if key >= 0 else text[:20]
    if kind == "garbage":
        return bytes(range(256)) * 8
    return None


def write_job(folder: Path, key: str, data: bytes, seed_text: bytes) -> tuple[list[str], str]:
    """A job folder: 2-3 copies of the case's file as ranks, plus 1-2 dead ranks made from the
    seed's text. (the dead files' names, what was made), drawn from their own generator so the
    other cases stay the same."""
    rng = random.Random(f"{key}-job")
    folder.mkdir(parents=True)
    suffix = ".pt.trace.json" + (".gz" if data[:2] == b"\x1f\x8b" else "")
    for r in range(rng.randint(2, 3)):
        (folder / f"rank{r}{suffix}").write_bytes(data)
    dead, kinds = [], []
    for r in range(10, 10 + rng.randint(1, 2)):
        kind = rng.choice(DEAD_RANKS)
        path = folder / f"rank{r}.pt.trace.json"
        content = dead_rank(kind, seed_text)
        if content is None:
            path.symlink_to(folder / "gone" / path.name)
        else:
            path.write_bytes(content)
        dead.append(path.name)
        kinds.append(kind)
    return dead, f"job-dead-ranks ({'+'.join(kinds)})"


def dead_listed(report: Any, dead: list[str]) -> str:
    """'' when the report lists every dead rank file as left out, else what it missed."""
    listed = {Path(row["path"]).name for row in report.source.get("left_out", [])}
    missed = [name for name in dead if name not in listed]
    return f"dead rank files not listed as left out: {missed}" if missed else ""


# ------------------------------------------------------------------ dense damage, time per MB


def dense_damage(sizes_mb: list[float], out: Path) -> list[dict[str, Any]]:
    """Time `load_trace` on damaged traces of each size (benchmarks/damaged.py) at two
    densities; one row per (size, density), with seconds per MB."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from damaged import damaged_text, hostile_header, time_load, with_header

    rows = []
    folder = out / "dense"
    folder.mkdir(parents=True, exist_ok=True)
    for every, escapes, in_header in ((20, 1, False), (2, 100, False), (20, 1, True)):
        for mb in sizes_mb:
            size_bytes = int(mb * (1 << 20))
            # in_header: half the file is a hostile header (damaged.hostile_header), half
            # damaged events
            case = damaged_text(size_bytes // 2 if in_header else size_bytes, every, escapes,
                                seed=1)
            text = (with_header(case.text, hostile_header(size_bytes // 2, seed=1))
                    if in_header else case.text)
            size = len(text) / (1 << 20)
            try:
                wall, kept, skipped = time_load(text, folder)
                outcome = "ok" if skipped == len(case.damaged) else "internal"
            except Exception:  # noqa: BLE001 (counted, like any case's)
                wall, kept, skipped, outcome = 0.0, 0, 0, "internal"
            rows.append({"mb": round(size, 2), "every": every, "escapes": escapes,
                         "header": in_header,
                         "damaged": len(case.damaged), "kept": kept, "skipped": skipped,
                         "wall_s": round(wall, 3), "s_per_mb": round(wall / size, 4),
                         "outcome": outcome})
            del case, text
    return rows


class Hang(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise Hang


def analyze_in_process(path: Path) -> Any:
    """What `stallscope analyze PATH` does, minus writing files: load, model, diagnose, plan,
    render every view. The report."""
    from stallscope.commands.pipeline import analyze_paths
    from stallscope.report.html import render_html
    from stallscope.report.json_writer import render_json
    from stallscope.report.markdown import render_markdown
    from stallscope.report.terminal import render_terminal

    report = analyze_paths([path])
    render_json(report)
    render_html(report)
    render_markdown(report)
    render_terminal(report, {"report.json": "report.json"})
    return report


def run_case(path: Path, timeout: float, dead: list[str] | None = None) -> tuple[str, str]:
    """(outcome, detail) of analysing `path`; `dead`: rank files of a job folder that must be
    listed as left out."""
    from stallscope.errors import StallscopeError

    signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        report = analyze_in_process(path)
        missed = dead_listed(report, dead) if dead else ""
        return ("internal", missed) if missed else ("ok", "")
    except Hang:
        return "hang", f"over {timeout:g} s"
    except StallscopeError as exc:
        return "refused", str(exc)[:200]
    except Exception:  # noqa: BLE001 (the point: anything else is a bug)
        return "internal", traceback.format_exc(limit=-14)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


# Seeds larger than this (gzip bytes) are read for each case that uses them and dropped
# before the analysis runs, so the fuzzer's own copy of a 54 MB trace (over 1 GB of Python
# objects with its mutated copy) is not counted as the analysis' memory; the smaller ones keep
# their text (not their objects) between cases.
KEEP_DECODED_BYTES = 2_000_000


def _give_back_memory() -> None:
    """Collect and hand freed heap back to the system (glibc's malloc_trim), so that what the
    fuzzer held for one case's input does not stay resident in the next case's peak."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _reset_peak() -> None:
    """Reset this process's peak resident size to its current one (Linux: clear_refs 5), so
    the peak read after a case is that case's."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def _cpu_s() -> float:
    """CPU seconds used so far by this process and the children it has waited for."""
    own, kids = (resource.getrusage(who) for who in (resource.RUSAGE_SELF,
                                                        resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _resident_mb() -> float:
    """This process's resident size now (VmRSS), in MB; 0 where /proc cannot say."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        line = next(x for x in Path("/proc/self/status").read_text().splitlines()
                    if x.startswith("VmRSS:"))
        return int(line.split()[1]) / 1024
    return 0.0


def _peak_mb() -> float:
    """Peak resident size since the last reset (VmHWM), in MB; else the process's maximum."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        line = next(x for x in Path("/proc/self/status").read_text().splitlines()
                    if x.startswith("VmHWM:"))
        return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# `stallscope ARGS` in this interpreter, then its own VmHWM (kB) written to argv[1]. Not the
# rusage of wait4: Linux carries a process's peak RSS across fork and exec, so a child's
# ru_maxrss is at least what this (large) fuzzing process held when it forked.
_PEAK_OF_CLI = """
import sys, runpy
out = sys.argv[1]
sys.argv = ["stallscope", *sys.argv[2:]]
try:
    runpy.run_module("stallscope", run_name="__main__", alter_sys=True)
finally:
    kb = [line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:")]
    open(out, "w").write(kb[0])
"""


def fresh_peak_mb(target: Path, scratch: Path) -> float | None:
    """Peak resident size (MB) of `stallscope analyze TARGET` in a fresh process; None when
    it wrote none (killed)."""
    import subprocess

    hwm = scratch / "vmhwm"
    hwm.unlink(missing_ok=True)
    with contextlib.suppress(subprocess.TimeoutExpired):
        subprocess.run([sys.executable, "-c", _PEAK_OF_CLI, str(hwm), "analyze", str(target),
                        "-q", "--force", "-o", str(scratch / "fresh-report")],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False,
                       timeout=300)
    return int(hwm.read_text()) / 1024 if hwm.exists() else None


# Small seeds' text, read once per process (one process runs many batches with --jobs 1).
_DOCS: dict[Path, Doc] = {}


def worker(args: tuple[int, int, int, str, float, bool]) -> list[dict[str, Any]]:
    """Cases `first`..`first + count - 1` of the run seeded `seed` (each case its own rng)."""
    import warnings

    warnings.simplefilter("ignore")
    first, count, seed, out, timeout, small = args
    out_dir = Path(out)
    scratch = out_dir / "scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    paths = seeds(small)
    docs = _DOCS
    results = []
    for case in range(first, first + count):
        # The seed trace and the mutations draw from separate generators, so a case can be
        # made again from its key and seed trace alone (tests/test_fuzz_found.py does).
        pick = random.Random(f"{seed}-{case}-seed-trace")
        rng = random.Random(f"{seed}-{case}")
        # Small traces most of the time: the big ones cost seconds a case.
        pool = [p for p in paths if p.stat().st_size < 400_000]
        path = pick.choice(paths if pick.random() < 0.1 or not pool else pool)
        doc = docs.get(path) or Doc(path)
        large = path.stat().st_size >= KEEP_DECODED_BYTES
        if not large:
            docs[path] = doc  # small seeds stay decoded; a large one is decoded per case
        try:
            data, what = make_case(rng, doc)
        except Exception:  # noqa: BLE001 (a fuzzer bug must not end the run: counted apart)
            results.append({"case": case, "key": f"{seed}-{case}", "what": [path.name],
                            "outcome": "fuzzer-error", "wall_s": 0.0,
                            "detail": traceback.format_exc(limit=-3), "rss_mb": 0.0})
            continue
        name = f"case{case}.pt.trace.json" + (".gz" if data[:2] == b"\x1f\x8b" else "")
        target = scratch / name
        dead: list[str] = []
        if random.Random(f"{seed}-{case}-job").random() < JOB_SHARE:
            target = scratch / f"case{case}-job"
            dead, how = write_job(target, f"{seed}-{case}", data, doc.text)
            what.append(how)
        else:
            target.write_bytes(data)
        del doc, data  # the analysis' memory is measured without the fuzzer's copies
        _give_back_memory()
        _reset_peak()
        before = _resident_mb()
        cpu0 = _cpu_s()
        t0 = time.perf_counter()
        outcome, detail = run_case(target, timeout, dead)
        wall = time.perf_counter() - t0
        cpu = _cpu_s() - cpu0
        peak = _peak_mb()
        # Over the limit in this process, whose peak counts what it held before the case:
        # measured again alone, in a fresh `stallscope analyze` process; that figure counts.
        fresh = fresh_peak_mb(target, scratch) if peak > LIMIT_MB else None
        if outcome in ("internal", "hang"):
            keep = out_dir / "failures"
            keep.mkdir(exist_ok=True)
            if target.is_dir():
                shutil.copytree(target, keep / target.name, symlinks=True, dirs_exist_ok=True)
            else:
                (keep / name).write_bytes(target.read_bytes())
            (keep / f"{name}.txt").write_text(f"{what}\n{detail}")
        if target.is_dir():
            shutil.rmtree(target)
        else:
            target.unlink()
        results.append({"case": case, "key": f"{seed}-{case}", "what": what,
                        "outcome": outcome, "wall_s": wall, "cpu_s": cpu,
                        "detail": detail if outcome != "ok" else "",
                        "rss_mb": peak if fresh is None else fresh, "rss_before_mb": before,
                        "in_process_rss_mb": peak,
                        "process_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                        / 1024})
    return results


def tally(results: list[dict[str, Any]]) -> dict[str, Any]:
    """What the progress and summary lines say of `results`: internal errors, hangs, cases
    over LIMIT_S (CPU; and wall) and over LIMIT_MB, the slowest case and the largest peak."""
    slowest = max(results, key=lambda r: r.get("cpu_s", 0.0), default=None)
    heaviest = max(results, key=lambda r: r["rss_mb"], default=None)
    return {
        "cases": len(results),
        "internal": sum(r["outcome"] == "internal" for r in results),
        "hangs": sum(r["outcome"] == "hang" for r in results),
        "fuzzer_errors": sum(r["outcome"] == "fuzzer-error" for r in results),
        # A hang was stopped at --timeout: over the limit whatever it had used.
        "over_time": sum(r.get("cpu_s", 0.0) > LIMIT_S or r["outcome"] == "hang"
                         for r in results),
        "over_wall": sum(r["wall_s"] > LIMIT_S for r in results),
        "over_memory": sum(r["rss_mb"] > LIMIT_MB for r in results),
        "max_cpu_s": slowest.get("cpu_s", 0.0) if slowest else 0.0,
        "slowest_wall_s": slowest["wall_s"] if slowest else 0.0,
        "slowest": slowest["what"] if slowest else None,
        "max_wall_s": max((r["wall_s"] for r in results), default=0.0),
        "max_rss_mb": heaviest["rss_mb"] if heaviest else 0.0,
        "heaviest": heaviest["what"] if heaviest else None,
    }


def progress_line(done: dict[str, Any], total: int, elapsed: float) -> str:
    """One line on the run so far (from `tally`)."""
    return (f"progress: {done['cases']:,}/{total:,} cases, {done['internal']} internal errors, "
            f"{done['hangs']} hangs, {done['over_time']} over {LIMIT_S:g} s CPU "
            f"({done['over_wall']} over {LIMIT_S:g} s wall), {done['over_memory']} over "
            f"{LIMIT_MB / 1024:g} GB, slowest {done['max_cpu_s']:.2f} s CPU "
            f"({done['slowest_wall_s']:.2f} s wall: {' '.join(done['slowest'] or [])}), "
            f"max wall {done['max_wall_s']:.2f} s, max RSS {done['max_rss_mb']:.0f} MB, "
            f"{elapsed:.0f} s")


def summary_line(summary: dict[str, Any]) -> str:
    """The run's one-line result, as docs/robustness.md quotes it."""
    return (f"summary: {summary['cases']:,} cases, seed {summary['seed']}, "
            f"{len(summary['internal_errors'])} internal errors, {len(summary['hangs'])} hangs, "
            f"{summary['over_time']} over {LIMIT_S:g} s CPU ({summary['over_wall']} over "
            f"{LIMIT_S:g} s wall), {summary['over_memory']} over {LIMIT_MB / 1024:g} GB, "
            f"max {summary['max_cpu_s']:.2f} s CPU, max {summary['max_wall_s']:.2f} s wall, "
            f"max RSS {summary['peak_rss_mb']:.0f} MB")


def _runs(todo: list[int], size: int) -> list[tuple[int, int]]:
    """The case numbers in `todo` as (first, count) runs of consecutive cases, none over
    `size`."""
    out: list[tuple[int, int]] = []
    for case in todo:
        if out and out[-1][0] + out[-1][1] == case and out[-1][1] < size:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((case, 1))
    return out


def fuzz(cases: int, seed: int, out: Path, timeout: float = 60.0, jobs: int = 1,
         small: bool = False, progress: int = 250, resume: bool = False) -> dict[str, Any]:
    """Run `cases` cases in `jobs` processes, saying how far every `progress` cases; the
    summary (also in OUT/summary.json). `resume`: the cases OUT/partial.json already holds
    (a stopped run of the same seed) are kept, not run again: each case is made from the seed
    and its number alone."""
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    results: list[dict[str, Any]] = []
    if resume and (out / "partial.json").is_file():
        results = [r for r in json.loads((out / "partial.json").read_text()) if r["case"] < cases]
        print(f"resumed: {len(results):,} cases from {out / 'partial.json'}", flush=True)
    done_cases = {r["case"] for r in results}
    # Batches no larger than `progress`, so that a line comes at least that often.
    size = max(1, min(math.ceil(cases / (jobs * 8)), progress))
    batches = [(i, n, seed, str(out), timeout, small)
               for i, n in _runs([c for c in range(cases) if c not in done_cases], size)]
    said = len(results)

    def done(part: list[dict[str, Any]]) -> None:
        nonlocal said
        results.extend(part)
        # What is done so far, in case the run is stopped (--remeasure reads it).
        (out / "partial.json").write_text(json.dumps(results))
        if len(results) - said >= progress or len(results) == cases:
            said = len(results)
            print(progress_line(tally(results), cases, time.perf_counter() - t0), flush=True)

    if jobs == 1:
        for batch in batches:
            done(worker(batch))
    else:
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(jobs, maxtasksperchild=1) as pool:
            for part in pool.imap_unordered(worker, batches):
                done(part)
    results.sort(key=lambda r: r["case"])
    counts: dict[str, int] = {}
    for r in results:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    totals = tally(results)
    summary = {
        "command": " ".join(sys.argv),
        "cases": len(results),
        "seed": seed,
        "outcomes": counts,
        "internal_errors": [r for r in results if r["outcome"] == "internal"],
        "hangs": [r for r in results if r["outcome"] == "hang"],
        "over_time": totals["over_time"],
        "over_wall": totals["over_wall"],
        "over_memory": totals["over_memory"],
        "limits": {"cpu_seconds": LIMIT_S, "rss_mb": LIMIT_MB},
        "max_cpu_s": totals["max_cpu_s"],
        "max_wall_s": totals["max_wall_s"],
        "slowest": totals["slowest"],
        "over_time_cases": [r for r in results
                            if r.get("cpu_s", 0.0) > LIMIT_S or r["outcome"] == "hang"],
        "over_wall_cases": [{k: r[k] for k in ("case", "what", "wall_s", "cpu_s")}
                            for r in results if r["wall_s"] > LIMIT_S],
        # The process's peak while a case was analysed (its resident imports, the small seeds
        # kept decoded, and the analysis); process_peak_rss_mb adds the fuzzer's own copies.
        "peak_rss_mb": totals["max_rss_mb"],
        "peak_rss_case": totals["heaviest"],
        # What the process held as that case began: the part of its peak that is not its own.
        "peak_rss_before_mb": max(results, key=lambda r: r["rss_mb"]).get("rss_before_mb", 0)
        if results else 0,
        "over_memory_cases": [r for r in results if r["rss_mb"] > LIMIT_MB],
        "process_peak_rss_mb": max((r.get("process_rss_mb", 0) for r in results), default=0),
        "total_s": time.perf_counter() - t0,
        "by_mutation": _by_mutation(results),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def _by_mutation(results: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    table: dict[str, dict[str, int]] = {}
    for r in results:
        for what in r["what"][1:]:
            row = table.setdefault(what.split(" ")[0], {})
            row[r["outcome"]] = row.get(r["outcome"], 0) + 1
    return table


def remeasure(out: Path, largest: int, seed: int) -> dict[str, Any]:
    """Peak memory of the heaviest cases of a finished run, each analysed by `stallscope
    analyze` in a fresh process (the in-process figure carries what the fuzzing process kept
    from earlier cases): every case on the `largest` largest seed traces, whose memory bounds
    the rest (docs/robustness.md has the whitespace and decompression bombs measured apart)."""
    import subprocess

    results = json.loads((out / "partial.json").read_text())
    by_name = {p.name: p for p in seeds()}
    biggest = sorted(by_name.values(), key=lambda p: p.stat().st_size)[-largest:]
    chosen = [r for r in results if r["outcome"] in ("ok", "refused")
              and by_name.get(r["what"][0]) in biggest]
    scratch = out / "remeasure"
    scratch.mkdir(exist_ok=True)
    rows = []
    for r in chosen:
        doc = Doc(by_name[r["what"][0]])
        data, what = make_case(random.Random(f"{seed}-{r['case']}"), doc)
        del doc
        target = scratch / (f"case{r['case']}.pt.trace.json"
                            + (".gz" if data[:2] == b"\x1f\x8b" else ""))
        target.write_bytes(data)
        del data
        hwm = scratch / "vmhwm"
        hwm.unlink(missing_ok=True)
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", _PEAK_OF_CLI, str(hwm), "analyze",
                               str(target), "-q", "--force", "-o", str(scratch / "report")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        rows.append({"case": r["case"], "what": what, "exit": proc.returncode,
                     "wall_s": time.perf_counter() - t0,
                     "peak_rss_mb": int(hwm.read_text()) / 1024 if hwm.exists() else None})
        target.unlink()
    top = max(rows, key=lambda x: x["peak_rss_mb"] or 0) if rows else None
    summary = {"command": " ".join(sys.argv), "cases": len(rows),
               "peak_rss_mb": top["peak_rss_mb"] if top else 0, "peak_case": top,
               "exits": {str(k): sum(1 for x in rows if x["exit"] == k)
                         for k in sorted({x["exit"] for x in rows})},
               "max_wall_s": max((x["wall_s"] for x in rows), default=0)}
    (out / "remeasure.json").write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("/tmp/stallscope-fuzz"))
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="wall seconds before a case is stopped as a hang")
    parser.add_argument("--jobs", type=int, default=1, help="processes")
    parser.add_argument("--resume", action="store_true",
                        help="keep the cases a stopped run of the same seed left in "
                             "OUT/partial.json and run the rest")
    parser.add_argument("--small", action="store_true", help="only seeds under 200 kB")
    parser.add_argument("--progress", type=int, default=250, metavar="N",
                        help="a progress line every N cases")
    parser.add_argument("--damage-sizes", default="1,8", metavar="MB,MB",
                        help="sizes of the dense-damage timing after the cases ('' for none)")
    parser.add_argument("--damage-64", action="store_true",
                        help="add a 64 MB dense-damage case (about 6 s and 1 GB)")
    parser.add_argument("--remeasure", type=int, metavar="N",
                        help="after a run in --out: measure the cases on the N largest seeds "
                             "each in a fresh process")
    args = parser.parse_args()
    if args.remeasure:
        print(json.dumps(remeasure(args.out, args.remeasure, args.seed), indent=1))
        return 0
    summary = fuzz(args.cases, args.seed, args.out, args.timeout, args.jobs, args.small,
                   args.progress, args.resume)
    sizes = [float(x) for x in args.damage_sizes.split(",") if x] + ([64.0] if args.damage_64
                                                                      else [])
    if sizes:
        summary["dense_damage"] = dense_damage(sizes, args.out)
        (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
        for row in summary["dense_damage"]:
            print(f"dense damage{' + hostile header' if row['header'] else ''}: "
                  f"{row['mb']:6.2f} MB, one event in {row['every']} damaged, "
                  f"{row['escapes']} escapes: {row['wall_s']:.2f} s, {row['s_per_mb']:.3f} s/MB, "
                  f"{row['skipped']:,} skipped, {row['kept']:,} kept ({row['outcome']})")
    with contextlib.suppress(Exception):
        for r in summary["internal_errors"][:20] + summary["hangs"][:20]:
            print(r["case"], r["what"], r["detail"].strip().splitlines()[-1:], sep="  ")
    shown = {k: summary[k] for k in ("cases", "outcomes", "max_cpu_s", "max_wall_s", "slowest",
                                      "peak_rss_mb", "peak_rss_case", "peak_rss_before_mb",
                                      "total_s")}
    print(json.dumps(shown, indent=1))
    print(summary_line(summary), flush=True)
    bad_damage = any(r["outcome"] != "ok" for r in summary.get("dense_damage", []))
    over = summary["over_time"] or summary["over_memory"]
    return 1 if summary["internal_errors"] or summary["hangs"] or over or bad_damage else 0


if __name__ == "__main__":
    sys.exit(main())

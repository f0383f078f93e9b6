"""Where a DataLoader's fetch time goes (issue 16): under `stallscope run` a stack sampler in each
worker (fork and spawn) or in the training process (num_workers=0) says which of the user's lines
the fetches spend their time on and doing what, and the dataloader-bound advice names them with
the fix for that kind of work. The categoriser is checked on synthetic frames too."""

from __future__ import annotations

import json
import linecache
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from stallscope.capture import anatomy, sampler
from stallscope.capture.sampler import (
    COLLATE,
    FILES,
    NUMPY,
    PIL,
    TORCH,
    WAIT,
    YOURS,
    StackSampler,
    line_category,
)

SCRIPT = textwrap.dedent(
    """
    import glob
    import os
    import sys
    import time

    import torch
    from PIL import Image
    from torch.utils.data import DataLoader, Dataset
    import io


    class Jpegs(Dataset):
        def __init__(self, folder):
            self.blobs = [open(p, "rb").read() for p in sorted(glob.glob(folder + "/*.jpg"))]

        def __len__(self):
            return 100000

        def __getitem__(self, i):
            img = Image.open(io.BytesIO(self.blobs[i % len(self.blobs)])).convert("RGB")
            return torch.tensor(img.getpixel((0, 0)), dtype=torch.float32)


    class Waits(Dataset):
        def __len__(self):
            return 100000

        def __getitem__(self, i):
            time.sleep(0.005)  # a remote read
            return torch.ones(3)


    class Rows(Dataset):
        def __len__(self):
            return 100000

        def __getitem__(self, i):
            return torch.ones(3)


    def slow_collate(items):
        out = []
        for x in items:
            acc = 0.0
            for _ in range(300000):
                acc += 1.0
            out.append(x * acc)
        return torch.stack(out)


    if __name__ == "__main__":
        kind, workers, ctx, batch = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
        dataset = {"pil": lambda: Jpegs(os.environ["IMAGES"]), "sleep": Waits,
                   "collate": Rows}[kind]()
        loader = DataLoader(dataset, batch_size=batch, num_workers=workers,
                            multiprocessing_context=ctx if workers else None,
                            collate_fn=slow_collate if kind == "collate" else None)
        model = torch.nn.Linear(3, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for x in loader:  # the training loop
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
    """
)


def _line_of(text: str) -> int:
    return next(i for i, line in enumerate(SCRIPT.splitlines(), 1) if text in line)


def _images(folder: Path) -> Path:
    """Eight 512x512 JPEGs of noise (slow to decode: nothing compresses away; ~4 ms each, so
    that a quiet machine's short recording still holds enough samples)."""
    image_mod = pytest.importorskip("PIL.Image")
    import random

    folder.mkdir()
    rnd = random.Random(0)
    for i in range(8):
        img = image_mod.frombytes("RGB", (512, 512), rnd.randbytes(512 * 512 * 3))
        img.save(folder / f"{i}.jpg", quality=90)
    return folder


def _run(tmp_path: Path, *args: str, steps: int) -> dict:
    script = tmp_path / "loaders.py"
    script.write_text(SCRIPT)
    out = tmp_path / "out"
    env = {**os.environ, "IMAGES": str(tmp_path / "images")}
    proc = subprocess.run(
        [sys.executable, "-m", "stallscope", "run", "-q", "-o", str(out), "--steps", str(steps),
         str(script), *args],
        capture_output=True, text=True, timeout=180, cwd=tmp_path, env=env,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads((out / "report.json").read_text())


def _loader(report: dict) -> dict:
    return max(report["dataloaders"], key=lambda d: d["batches_recorded"])


def _finding(report: dict) -> dict:
    return next(f for f in report["findings"] if f["id"] == "dataloader-bound")


def _top(stack: dict, function: str) -> dict:
    return next(t for t in stack["top"] if t["function"] == function)


def _assert_pil_decode(report: dict) -> dict:
    """The decode is named: its category first, the dataset's Image.open line in `top`, and
    the advice to decode at the target size; nothing from the training loop around the fetch."""
    loader = _loader(report)
    assert "stack" in loader["anatomy"], loader["anatomy"]
    stack = loader["anatomy"]["stack"]
    assert stack["samples"] >= sampler.MIN_SAMPLES and stack["interval_ms"] > 0
    assert stack["categories"][0]["category"] == PIL, stack
    assert sum(c["share"] for c in stack["categories"]) == pytest.approx(1.0, abs=0.01)
    decode = _top(stack, "Jpegs.__getitem__")
    assert decode["site"] == f"loaders.py:{_line_of('Image.open')}"
    assert decode["category"] == PIL and decode["share"] >= 0.4
    # The line's double quotes are shown as single ones: the figures travel in the trace's
    # metadata too, where Kineto would turn an escaped quote into a broken file.
    assert decode["line"].startswith("img = Image.open(") and '"' not in decode["line"]
    loop = f"loaders.py:{_line_of('the training loop')}"
    assert all(t["site"] != loop for t in stack["top"])
    f = _finding(report)
    assert f["evidence"]["loader_top_category"] == PIL
    assert f["evidence"]["loader_top_function"] == f"Jpegs.__getitem__ ({decode['site']})"
    assert f"in Jpegs.__getitem__ ({decode['site']}, {PIL})" in f["recommendation"]
    assert "img.draft(" in f["recommendation"]
    return loader


# ----------------------------------------------------------------------- under stallscope run


@pytest.mark.slow
@pytest.mark.parametrize("ctx", ["fork", "spawn"])
def test_pil_decode_in_workers_is_named_with_its_fix(tmp_path: Path, ctx: str) -> None:
    _images(tmp_path / "images")
    report = _run(tmp_path, "pil", "2", ctx, "24", steps=12)
    loader = _assert_pil_decode(report)
    assert loader["bound"] == "cpu-bound", loader["anatomy"]
    assert loader["anatomy"]["where"] == "workers"


@pytest.mark.slow
def test_num_workers_0_samples_the_training_process(tmp_path: Path) -> None:
    _images(tmp_path / "images")
    # The training process samples every SAMPLE_S_MAIN (50 ms): 32 batches of 16 decodes are
    # ~1.2 s of fetching here, ~24 samples, and still MIN_SAMPLES on a machine twice as fast.
    report = _run(tmp_path, "pil", "0", "fork", "16", steps=32)
    loader = _assert_pil_decode(report)
    assert loader["anatomy"]["where"] == "main process"


@pytest.mark.slow
def test_expensive_collate_is_sampled_as_collate(tmp_path: Path) -> None:
    report = _run(tmp_path, "collate", "2", "fork", "8", steps=16)
    loader = _loader(report)
    assert loader["bound"] == "collate/transfer-bound", loader["anatomy"]
    assert "stack" in loader["anatomy"], loader["anatomy"]
    stack = loader["anatomy"]["stack"]
    assert stack["categories"][0]["category"] == COLLATE, stack
    assert stack["top"][0]["function"] == "slow_collate"
    assert _finding(report)["evidence"]["loader_top_category"] == COLLATE


@pytest.mark.slow
def test_sleeping_loader_waits_in_its_sleep(tmp_path: Path) -> None:
    report = _run(tmp_path, "sleep", "2", "fork", "16", steps=20)
    loader = _loader(report)
    assert loader["bound"] == "waiting", loader["anatomy"]
    assert "stack" in loader["anatomy"], loader["anatomy"]
    stack = loader["anatomy"]["stack"]
    assert stack["categories"][0]["category"] == WAIT and stack["categories"][0]["share"] >= 0.75
    sleep = _top(stack, "Waits.__getitem__")
    assert sleep["site"] == f"loaders.py:{_line_of('time.sleep(0.005)')}"
    f = _finding(report)
    assert f"in Waits.__getitem__ ({sleep['site']}, {WAIT})" in f["recommendation"]
    assert "more of them than cores" in f["recommendation"]


# ----------------------------------------------------------------------- the categoriser


def _module(path: Path, name: str, source: str) -> dict:
    """Define `source` as if it were the file `path` of module `name`, its lines readable."""
    source = textwrap.dedent(source)
    linecache.cache[str(path)] = (len(source), None, source.splitlines(True), str(path))
    namespace: dict = {"__name__": name, "sys": sys}
    exec(compile(source, str(path), "exec"), namespace)
    return namespace


@pytest.fixture
def fake(tmp_path: Path) -> dict:
    """A user's script calling into a fake PIL (under a site-packages folder) and into numpy-
    like code; each innermost function hands its own frame to `probe`."""
    lib = tmp_path / "site-packages"
    pil = _module(lib / "PIL" / "ImageFile.py", "PIL.ImageFile", """
        def load(probe):
            return probe(sys._getframe())
        """)
    user = _module(tmp_path / "train.py", "__main__", """
        def bounded(fn, probe):
            return fn(probe)

        def getitem(probe):
            img = load(probe)  # Image.open(...).load()
            return img

        def waits(probe):
            return probe(sys._getframe())  # time.sleep(0.1)

        def collate(probe):
            return probe(sys._getframe())  # pure Python work

        def stacked(probe):
            return probe(sys._getframe()) and np.stack([])
        """)
    user["load"] = pil["load"]
    return user


def _sample(fake: dict, fn: str, wrap=None) -> tuple:
    s = StackSampler()
    s._base = str(Path(fake["bounded"].__code__.co_filename).parent) + os.sep
    counts: dict = {}
    seen = []

    def probe(frame):
        boundary = frame
        while boundary.f_code.co_name != "bounded":
            boundary = boundary.f_back
        seen.append(s.sample(frame, boundary, counts))

    target = fake[fn] if wrap is None else wrap(fake[fn])
    fake["bounded"](target, probe)
    return seen[0], counts


def test_categoriser_on_synthetic_frames(fake: dict) -> None:
    # Inside PIL's Python code: the decode, on the user's line that called it.
    (category, user, lib), counts = _sample(fake, "getitem")
    assert category == PIL and counts == {(category, user, lib): 1}
    assert (user.function, user.site) == ("getitem", "train.py:6")
    assert user.text == "img = load(probe)  # Image.open(...).load()"
    assert lib.function == "PIL.ImageFile.load"
    # A C call is invisible to the walk: the innermost line says what it is, comments aside.
    (category, user, lib), _ = _sample(fake, "waits")
    assert category == YOURS and lib is None  # "# time.sleep(0.1)" is a comment
    assert line_category("time.sleep(0.1)  # the read") == (WAIT, None)
    assert line_category("img = Image.open(path).convert('RGB')")[0] == PIL
    assert line_category("x = cv2.imdecode(buf, cv2.IMREAD_COLOR)")[0] == "image decode (cv2)"
    assert line_category("data = f.read()")[0] == FILES
    assert line_category("x = np.load(path)") == (FILES, NUMPY)
    assert line_category("y = np.fft.fft(x)") == (None, NUMPY)
    assert line_category("y = F.conv2d(x, w)") == (None, TORCH)
    # Inside the loader's collate_fn (reached through stallscope's wrapper): collate, even on
    # a numpy line; the wrapper's own frames are never what is named.
    (category, user, _), _ = _sample(fake, "collate", wrap=anatomy.TimedCollate)
    assert category == COLLATE and user.function == "collate"
    (category, user, _), _ = _sample(fake, "stacked", wrap=anatomy.TimedCollate)
    assert category == COLLATE
    (category, _, _), _ = _sample(fake, "stacked")
    assert category == NUMPY


def test_a_sample_outside_the_fetch_counts_nothing(fake: dict) -> None:
    s = StackSampler()
    counts: dict = {}
    ended = (lambda: sys._getframe())()  # a fetch that has returned: never on the stack
    fake["bounded"](fake["collate"], lambda f: s.sample(f, ended, counts))
    assert counts == {}
    here = sys._getframe()  # the fetch not begun yet: the thread is at the boundary itself
    assert s.sample(here, here, counts) is None and counts == {}


def test_distinct_keys_are_capped_without_losing_categories(fake: dict) -> None:
    s = StackSampler()
    counts: dict = {(YOURS, object(), None): 1 for _ in range(sampler.MAX_KEYS)}

    def probe(frame):
        s.sample(frame, frame.f_back.f_back, counts)  # PIL, getitem, then bounded

    fake["bounded"](fake["getitem"], probe)
    assert len(counts) == sampler.MAX_KEYS + 1
    assert counts[(PIL, sampler._OTHER_LINE, None)] == 1


def test_summary_shares_and_the_recording_window() -> None:
    rows = [[PIL, "Jpegs.__getitem__", "ds.py:20", "img = Image.open(p)", "PIL.load", 30],
            [PIL, "Jpegs.__getitem__", "ds.py:20", "img = Image.open(p)", "PIL.open", 15],
            [TORCH, "Jpegs.__getitem__", "ds.py:21", "return torch.tensor(x)", "", 10]]
    before = {"pid": 7, "batches": 5, "stack": {"interval_ms": 20.0, "rows": [
        [*rows[0][:5], 20], [*rows[2][:5], 10]]}}
    now = {"pid": 7, "batches": 9, "stack": {"interval_ms": 20.0, "rows": rows}}
    # Over the recording only: the 20 decode and 10 torch samples before it are not counted.
    (worker,) = anatomy.window({7: now}, {7: before})
    stack = sampler.summary([worker])
    assert stack["samples"] == 25 and stack["interval_ms"] == 20.0
    assert stack["categories"] == [{"category": PIL, "share": 1.0}]
    assert stack["top"] == [{"function": "Jpegs.__getitem__", "site": "ds.py:20",
                             "category": PIL, "share": 1.0, "line": "img = Image.open(p)",
                             "calls": "PIL.open"}]
    # Too few samples to say: no stack figures rather than shares of a handful.
    few = {"batches": 1, "stack": {"interval_ms": 20.0, "rows": [[*rows[0][:5], 9]]}}
    assert sampler.summary([few]) is None
    assert "stack" not in anatomy.summarise(
        0, [], {"batches": 2, "wall_us": 2e4, "cpu_us": 2e4, **few})


def test_a_broken_sampler_loses_only_its_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*args: object) -> None:
        raise RuntimeError("walk failed")

    monkeypatch.setattr(StackSampler, "sample", boom)
    monkeypatch.setattr(sampler, "_sampler", None)
    s = sampler.start()
    assert s is not None
    s.interval = 0.001
    try:
        smp = sampler.begin()
        deadline = time.monotonic() + 5
        while not s.broken and time.monotonic() < deadline:
            sum(range(1000))  # the user's code runs on
        smp.end()
        assert s.broken
        assert sampler.start() is None  # no new thread per fetch once broken
        assert sampler.begin() is s  # marking a fetch still costs nothing and raises nothing
    finally:
        sampler.stop()

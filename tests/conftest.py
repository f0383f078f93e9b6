"""Shared helpers: where the real traces live, and running the CLI as a user would."""

from __future__ import annotations

import contextlib
import functools
import gzip
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import settings

from stallscope.commands.pipeline import analyze_paths
from stallscope.report.build import Report
from stallscope.trace.load import load_trace
from stallscope.trace.model import TraceModel, build_model

# Property tests draw the same examples on every run (hypothesis' derandomize): a new random
# draw must never fail CI by chance. One did on a fresh clone (a cudaFree whose own kernel ends
# inside its return window makes the replay graph a cycle): such a find is recorded as an
# issue to fix, not left to a later run's luck.
settings.register_profile("stallscope", derandomize=True)
settings.load_profile("stallscope")

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_traces"
# The public real GPU traces (HTA, kineto), committed with their licences: a clone tests itself.
REAL = SAMPLES / "public"


def real_trace(relative: str) -> Path:
    """A committed public trace (`hta/...`, `kineto/...`); a missing one fails the test."""
    path = REAL / relative
    assert path.is_file(), f"public trace missing from the checkout: {path}"
    return path


def all_real_traces() -> list[Path]:
    return sorted(p for p in REAL.rglob("*") if p.is_file() and ".json" in p.name)


@functools.cache
def report_of(*paths: Path) -> Report:
    """`analyze_paths(paths)` once per test process: the committed traces are analysed by many
    tests (verdicts, schema, replay invariants, views); each reads the same Report and must not
    change it."""
    return analyze_paths(list(paths))


def committed_traces() -> list[Path]:
    """Every trace file committed in sample_traces/ (its own recordings, the synthetic ones and
    the public real traces): what the snapshot and end-to-end tests walk through."""
    return sorted(p for p in SAMPLES.rglob("*") if p.is_file() and ".json" in p.name
                  and not p.name.endswith(("-measured.json", ".jsonl")))


@pytest.fixture(scope="session")
def analysed(tmp_path_factory: pytest.TempPathFactory
             ) -> Callable[[Path], tuple[subprocess.CompletedProcess[str], Path]]:
    """`stallscope analyze TRACE -q` run once per committed trace and test process, from the
    project root with the path relative to it (so the reports do not name this checkout's
    place): the CLI's result and the folder its report files are in."""
    root = tmp_path_factory.mktemp("analysed")
    done: dict[Path, tuple[subprocess.CompletedProcess[str], Path]] = {}

    def analyse(path: Path) -> tuple[subprocess.CompletedProcess[str], Path]:
        relative = path.resolve().relative_to(ROOT)
        if relative not in done:
            out = root / f"{len(done)}"
            done[relative] = (cli_in_process("analyze", relative.as_posix(), "-o", str(out),
                                             "-q", cwd=ROOT), out)
        return done[relative]

    return analyse


def make_synthetic() -> ModuleType:
    """sample_traces/make_synthetic.py, the generator of the synthetic traces."""
    spec = importlib.util.spec_from_file_location("make_synthetic", SAMPLES / "make_synthetic.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TraceModel]:
    """The synthetic traces generated afresh (the committed `synthetic-*` files' bytes, which
    tests/test_synthetic_traces.py checks), modelled, by name without the `synthetic-`."""
    out = tmp_path_factory.mktemp("synthetic")
    paths = make_synthetic().main(out)
    return {p.name.split(".")[0].removeprefix("synthetic-"): build_model(load_trace(p))
            for p in paths}


def recorded_gpu_samples() -> list[Path]:
    """The real GPU traces this project recorded itself (sample_traces/real-*: committed, so
    never skipped), for the tests every real trace goes through."""
    return sorted(SAMPLES.glob("real-*.pt.trace.json.gz"))


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`stallscope ARGS` as a user types it, with its exit status, stdout and stderr.

    `analyze` and `compare` run in this process (`stallscope.cli.main`, output captured): they
    are pure functions of their files, and a fresh interpreter per call cost about a second of
    imports. `run` and `tune` execute the user's script (which may exit, fork, or take signals)
    and so get a process of their own, as `run_process` does."""
    if args and args[0] in ("run", "tune"):
        return run_process(*args, cwd=cwd)
    return cli_in_process(*args, cwd=cwd)


def run_process(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m stallscope ARGS` in a process of its own: where the process boundary (exit
    status of a real process, signals, a user script) is what the test is about."""
    return subprocess.run(
        [sys.executable, "-m", "stallscope", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
    )


def cli_in_process(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`stallscope.cli.main(args)` with stdout and stderr captured and `cwd` as the working
    folder; argparse's own exits become the status, as in a process."""
    from stallscope.cli import main

    out, err = io.StringIO(), io.StringIO()
    before = os.getcwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = main(list(args))
            except SystemExit as stop:
                status = stop.code if isinstance(stop.code, int) else (0 if stop.code is None
                                                                       else 1)
    finally:
        os.chdir(before)
    return subprocess.CompletedProcess(["stallscope", *args], status, out.getvalue(),
                                       err.getvalue())


def storage_script(items: int, sleep_s: float, batch: int, loader_args: str = "",
                   before_loop: str = "") -> str:
    """A training script whose loader waits on storage: each sample sleeps `sleep_s` (no CPU)
    and the step's own work is well under a millisecond, so loading sets the pace and machine
    load cannot make a step shorter than its sleeps. `loader_args` go to the DataLoader;
    `before_loop` runs between building the loader and the loop (model building)."""
    return textwrap.dedent(f"""\
        import time
        import torch
        from torch.utils.data import DataLoader, Dataset


        class Storage(Dataset):
            def __len__(self):
                return {items}

            def __getitem__(self, i):
                time.sleep({sleep_s})
                return torch.full((8,), float(i % 5)), i % 2


        if __name__ == "__main__":
            model = torch.nn.Linear(8, 2)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            loader = DataLoader(Storage(), batch_size={batch}{loader_args})
            {before_loop}
            for x, y in loader:
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
        """)


def line_of(script: str, start: str) -> int:
    """The 1-based line of `script` whose text (indent stripped) starts with `start`."""
    return next(i for i, line in enumerate(script.splitlines(), 1)
                if line.strip().startswith(start))


def write_trace(path: Path, events: list[dict], **meta: object) -> Path:
    """Write a small Kineto-shaped trace (gzip when the name ends in .gz)."""
    doc = {"schemaVersion": 1, "deviceProperties": [], **meta, "traceEvents": events}
    data = json.dumps(doc).encode()
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


@pytest.fixture(scope="session")
def chromium(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One headless Chromium, driven through chromedriver, for every browser test of the
    session (a fresh profile, no network); skips, naming what to install, where either is
    missing (`.ci/run` installs both)."""
    from selenium import webdriver

    binary = next((p for p in map(shutil.which, ("chromium", "chromium-browser",
                                                 "google-chrome")) if p), None)
    driver_path = shutil.which("chromedriver")
    if binary is None or driver_path is None:
        pytest.skip("needs Chromium and chromedriver (Debian: apt-get install chromium "
                    "chromium-driver; .ci/run installs them)")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--no-first-run",
                f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(options=options,
                              service=webdriver.ChromeService(executable_path=driver_path))
    driver.set_page_load_timeout(20)
    try:
        yield driver
    finally:
        driver.quit()

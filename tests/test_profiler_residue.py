"""A finished profiler session leaves the process slower (on a GPU host, CUPTI stays attached),
so `run` opens none before it has timed the script's unprofiled steps: the profiler's per-op
cost is measured once the recording has stopped and written into the trace it belongs to.
`run` and `watch` end promptly while the script's DataLoader workers are still alive."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from stallscope.capture.metadata import metadata_text, patch_head

# Loaded at interpreter start (before stallscope imports anything): every profiler session
# started in the process, stallscope's own included, leaves a line in $LOG.
SITECUSTOMIZE = textwrap.dedent(
    """
    import os

    if os.environ.get("LOG"):
        import torch.profiler as tp

        _start = tp.profile.start

        def start(self):
            with open(os.environ["LOG"], "a") as f:
                f.write("profiler\\n")
            return _start(self)

        tp.profile.start = start
    """
)

# Persistent workers, and the loader still referenced when the script ends: its workers are
# alive at every teardown.
SCRIPT = textwrap.dedent(
    """
    import os
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    ds = TensorDataset(torch.randn(2048, 16), torch.randn(2048, 1))
    loader = DataLoader(ds, batch_size=16, num_workers=2, persistent_workers=True)
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(int(os.environ.get("EPOCHS", "1"))):
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            with open(os.environ["LOG"], "a") as f:
                f.write("step\\n")
    print("trained")
    """
)


def _stallscope(tmp_path: Path, command: str, epochs: int = 1) -> tuple[Path, list[str]]:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    (tmp_path / "train.py").write_text(SCRIPT)
    log, out = tmp_path / "log", tmp_path / "out"
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "LOG": str(log), "EPOCHS": str(epochs)}
    done = subprocess.run(
        [sys.executable, "-m", "stallscope", command, "-q", "-o", str(out), "train.py"],
        capture_output=True, text=True, timeout=240, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return out, log.read_text().split()


def _metadata(out: Path) -> dict:
    [trace] = sorted(out.glob("tensorboard/*/*.pt.trace.json.gz"))
    with gzip.open(trace, "rt") as fh:
        return json.load(fh)["stallscope"]


@pytest.mark.slow
def test_run_opens_no_profiler_session_before_the_unprofiled_steps(tmp_path: Path) -> None:
    out, log = _stallscope(tmp_path, "run")
    meta = _metadata(out)
    first = log.index("profiler")  # the session's own recording
    assert first >= len(meta["unprofiled_steps_us"]) >= 3, log
    # The cost was measured after the recording, in sessions of its own, and reached the trace.
    assert log.count("profiler") > 1, log
    cost = meta["profiler_cost"]["cpu_op"]
    assert cost["profiled_us"] > 0 and cost["events_per_op"], cost
    report = json.loads((out / "report.json").read_text())
    assert report["traces"][0]["recording"]["op_us"] == pytest.approx(
        cost["added_us"], abs=0.01)


@pytest.mark.slow
def test_watch_ends_with_the_scripts_workers_alive_and_its_trace_holds_the_cost(
        tmp_path: Path) -> None:
    out, log = _stallscope(tmp_path, "watch", epochs=2)
    assert log.count("step") == 256, log  # the whole run, both epochs
    assert "added_us" in _metadata(out)["profiler_cost"]["cpu_op"]


# ------------------------------------------------------------------ the metadata line's patch


def _head(meta: dict, comma: bool = True) -> bytes:
    line = f'      "stallscope": {metadata_text(meta)}' + ("," if comma else "")
    return ('{\n  "schemaVersion": 1,\n      "trace_id": "7E79",\n' + line
            + '\n      "host_name": "vm",\n  "traceEvents": [\n  {"ph": "X"}').encode()


def test_a_figure_measured_after_recording_is_set_in_the_metadata_line() -> None:
    head = _head({"tool": "stallscope", "profiler_cost": {}})
    patched = patch_head(head, {"profiler_cost": {"cpu_op": {"added_us": 1.1}}})
    assert patched is not None
    text = patched.decode()
    assert text.startswith('{\n  "schemaVersion": 1,') and text.endswith('[\n  {"ph": "X"}')
    line = next(ln for ln in text.splitlines() if '"stallscope"' in ln)
    body = line.split(": ", 1)[1]
    assert body.endswith(",")
    assert json.loads(body[:-1]) == {"tool": "stallscope",
                                     "profiler_cost": {"cpu_op": {"added_us": 1.1}}}
    last = patch_head(_head({"a": 1}, comma=False), {"b": 2})
    assert last is not None and b'"stallscope": {"a": 1, "b": 2}\n' in last


def test_a_head_without_a_readable_metadata_line_is_left_as_kineto_wrote_it() -> None:
    assert patch_head(b'{\n  "traceEvents": [\n  {"ph": "X", "name": "stallscope"}', {}) is None
    # Our key only inside the events does not count.
    events = b'{\n  "traceEvents": [\n  {"args": {"stallscope": {"a": 1}}}\n'
    assert patch_head(events, {"b": 2}) is None
    assert patch_head(b'{\n      "stallscope": {"a": 1,\n', {"b": 2}) is None  # cut short
    assert patch_head(b'{\n      "stallscope": [1, 2],\n  "traceEvents": []', {"b": 2}) is None

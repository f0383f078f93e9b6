"""Label the traces of record_h100.py sessions for the corpus (sample_traces/README.md).

Each session folder (record_h100.py's OUT) becomes `real-<gpu>-<session>-<name>.pt.trace.json.gz`
here, with a top-level `stallscope_recording` object in the trace saying it is a real recording,
on which GPU, with which torch and how (the workload's arguments and the `stallscope run`
options); the sessions' plain timings go to `real-<gpu>-measured.json`, keyed by session. The
trace events are kept as recorded.

    python sample_traces/publish_gpu_recordings.py r1=h100/rec1 r2=h100/rec2
    python sample_traces/publish_gpu_recordings.py --watch h100/watch   # record_watch_gpu.py's

A `--watch` folder (record_watch_gpu.py's OUT) becomes `real-<gpu>-watch-<case>.pt.trace.json.gz`
(the capture `watch` recorded), `real-<gpu>-watch-<case>.steps.jsonl` (its step log) and
`real-<gpu>-watch-measured.json` (each case's arguments and its plain run's step times).
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent


def gpu_label(name: str) -> str:
    """'NVIDIA H200' -> 'h200', 'NVIDIA H100 80GB HBM3' -> 'h100'."""
    found = re.search(r"\b([A-Z]+\d+)\b", name)
    return (found.group(1) if found else name.split()[-1]).lower()


def publish(session: str, folder: Path, out: Path, measured: dict) -> str:
    facts = json.loads((folder / "measured.json").read_text())
    env = facts.pop("_env")
    label = gpu_label(env["gpu"])
    # A session may come from several folders (one per set of `run` options): each
    # configuration keeps the options it was recorded with.
    entry = measured.setdefault(label, {}).setdefault(session, {"_env": env})
    entry.update({name: {**run, "run": env["run"]} for name, run in facts.items()})
    for name, run in facts.items():
        src = next(folder.glob(f"real-*-{name}.pt.trace.json.gz"), None)
        if src is None:
            continue
        with gzip.open(src, "rt") as f:
            trace = json.load(f)
        trace["stallscope_recording"] = {
            "kind": f"real-{label}", "gpu": env["gpu"], "torch": env["torch"],
            "cuda": env["cuda"], "python": env["python"], "cpus": env["cpus"],
            "session": session,
            "script": "sample_traces/gpu_workload.py " + " ".join(run["args"]),
            "recorded_with": "stallscope run " + " ".join(env["run"]) +
                             " (sample_traces/record_h100.py)",
            "plain_mean_step_ms": run["plain_mean_step_ms"],
        }
        write(trace, out / f"real-{label}-{session}-{name}.pt.trace.json.gz")
    return label


def write(trace: dict, dest: Path) -> None:
    with gzip.GzipFile(dest, "wb", mtime=0) as f:
        f.write(json.dumps(trace, separators=(",", ":")).encode())
    print(f"{dest.name}: {dest.stat().st_size / 1e6:.2f} MB")


def publish_watch(folder: Path, out: Path) -> None:
    env = json.loads((folder / "env.json").read_text())
    label = gpu_label(env["gpu"])
    measured: dict = {"_env": {k: env[k] for k in ("gpu", "torch", "cuda")}}
    for case, args in env["cases"].items():
        src = folder / f"real-{label}-watch-{case}.pt.trace.json.gz"
        plain = folder / f"plain-{case}.json"
        if not src.exists() or not plain.exists():
            continue
        script = "sample_traces/gpu_workload.py " + " ".join(args)
        with gzip.open(src, "rt") as f:
            trace = json.load(f)
        trace["stallscope_recording"] = {
            "kind": f"real-{label}", "gpu": env["gpu"], "torch": env["torch"],
            "cuda": env["cuda"], "session": "watch", "script": script,
            "recorded_with": "stallscope watch -q (sample_traces/record_watch_gpu.py)"}
        write(trace, out / src.name)
        steps = folder / f"steps-{case}.jsonl"
        if steps.exists():
            (out / f"real-{label}-watch-{case}.steps.jsonl").write_bytes(steps.read_bytes())
        measured[case] = {"args": args, "plain_step_ms": json.loads(plain.read_text())}
    (out / f"real-{label}-watch-measured.json").write_text(json.dumps(measured) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("sessions", nargs="*", help="SESSION=FOLDER")
    p.add_argument("--watch", type=Path, help="a record_watch_gpu.py folder")
    p.add_argument("--out", type=Path, default=HERE)
    a = p.parse_args()
    if a.watch:
        publish_watch(a.watch, a.out)
    measured: dict = {}
    for item in a.sessions:
        session, folder = item.split("=", 1)
        publish(session, Path(folder), a.out, measured)
    for label, sessions in measured.items():
        path = a.out / f"real-{label}-measured.json"
        old = json.loads(path.read_text()) if path.exists() else {}
        path.write_text(json.dumps({**old, **sessions}, indent=1) + "\n")


if __name__ == "__main__":
    main()

"""Fault fuzzer for `stallscope run`: a training script that forks, a disk that fills (issue 36).

    python benchmarks/fuzz_run.py --cases 20 --seed 1 --out /tmp/fuzz-run

Each case runs `stallscope run` on a small CPU training loop, as a user would, with a seeded
draw of: how the script starts children at batch AT (none; os.fork() whose child returns,
calls sys.exit(0), raises, or runs the loop on; multiprocessing with fork, spawn or
forkserver), --skip, --run-to-end, the script's own exit status (0 or 3), and the disk (-o on
a folder with room, on a full 1 MiB tmpfs, or on one the script fills after its loop: a
checkpoint). A case is `ok` when every invariant holds, else `bad` with the broken ones:

- the exit status is the one documented (docs/usage.md, "Exit codes"): the script's own when it ran
  to its end (--run-to-end) with a non-zero status, also when stallscope could not write;
  2 when stallscope could not write for a script that ended well; else 0;
- at most one `stallscope:` line, naming ENOSPC when the disk was full; no Kineto
  "Failed to write to log file!" line; no traceback but the child's own when it raised;
- with room on the disk, the report holds the parent's 5 recorded steps, in one trace;
- no child still running 2 s after stallscope exited; no case over --timeout (`hang`).

The full-disk cases need a tmpfs (root, or CAP_SYS_ADMIN); where it cannot be mounted they are
drawn as `none` and the summary says why. About 20 s a case on a busy 2-core VM.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

HOWS = ["none", "fork-return", "fork-exit", "fork-raise", "fork-loop", "mp-fork", "mp-spawn",
        "mp-forkserver"]
DISKS = ["room", "full", "fills"]

# argv: HOW AT STATUS [FILL]. Every child leaves its pid in children/.
SCRIPT = textwrap.dedent(
    """
    import multiprocessing, os, sys
    import torch
    from torch.utils.data import DataLoader, TensorDataset


    def little_work():
        os.makedirs("children", exist_ok=True)
        open(os.path.join("children", str(os.getpid())), "w").close()
        return sum(range(10000))


    def fill(folder):
        with open(os.path.join(folder, "checkpoint"), "wb", buffering=0) as fh:
            try:
                while True:
                    fh.write(b"x" * 4096)
            except OSError:
                pass


    def main():
        how, at, status = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        data = TensorDataset(torch.randn(512, 8), torch.randn(512, 1))
        child = False
        for i, (x, y) in enumerate(DataLoader(data, batch_size=8)):
            if i == at and how.startswith("fork") and not child:
                if os.fork() == 0:
                    child = True
                    little_work()
                    if how == "fork-exit":
                        sys.exit(0)
                    if how == "fork-raise":
                        raise ValueError("the child's own error")
                    if how == "fork-return":
                        return
            if i == at and how.startswith("mp-"):
                p = multiprocessing.get_context(how[3:]).Process(target=little_work)
                p.start()
                p.join(60)
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        if child:
            return
        if len(sys.argv) > 4:
            fill(sys.argv[4])
        sys.exit(status)


    if __name__ == "__main__":
        main()
    """
)


def draw(rng: random.Random, can_mount: bool) -> dict[str, Any]:
    return {"how": rng.choice(HOWS), "at": rng.randrange(0, 12), "skip": rng.randrange(0, 4),
            "run_to_end": rng.random() < 0.5, "status": rng.choice([0, 3]),
            "disk": rng.choice(DISKS) if can_mount else "room"}


def expected_status(case: dict[str, Any]) -> int:
    ran_to_end = case["run_to_end"]
    wrote_nothing = case["disk"] == "full" or (case["disk"] == "fills" and ran_to_end)
    if ran_to_end and case["status"]:
        return case["status"]
    return 2 if wrote_nothing else 0


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _mount(disk: Path) -> str | None:
    """Mount a 1 MiB tmpfs at `disk`; None, or why it cannot be."""
    disk.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)],
                          capture_output=True, text=True, check=False)
    return None if proc.returncode == 0 else (proc.stderr.strip() or f"exit {proc.returncode}")


def run_case(case: dict[str, Any], folder: Path, timeout: float) -> list[str]:
    """Run one case in `folder`; the invariants it broke (empty: ok)."""
    (folder / "train.py").write_text(SCRIPT)
    disk = folder / "disk"
    if case["disk"] != "room":
        assert _mount(disk) is None
        if case["disk"] == "full":
            with (disk / "filler").open("wb", buffering=0) as fh:
                try:
                    while True:
                        fh.write(b"x" * 4096)
                except OSError:
                    pass
    out = disk / "out" if case["disk"] != "room" else folder / "out"
    args = [sys.executable, "-m", "stallscope", "run", "-o", str(out), "--no-steady-wait",
            "--skip", str(case["skip"]), *(["--run-to-end"] if case["run_to_end"] else []),
            "train.py", case["how"], str(case["at"]), str(case["status"]),
            *([str(disk)] if case["disk"] == "fills" else [])]
    try:
        proc = subprocess.run(args, cwd=folder, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return ["hang"]
    finally:
        if case["disk"] != "room":
            subprocess.run(["umount", "-l", str(disk)], check=False)
    broken = []
    want = expected_status(case)
    if proc.returncode != want:
        broken.append(f"exit {proc.returncode}, documented {want}")
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("stallscope:")]
    if len(lines) > 1:
        broken.append(f"{len(lines)} stallscope: lines")
    if case["disk"] == "full" and not any("ENOSPC" in ln for ln in lines):
        broken.append("a full disk not named ENOSPC")
    if "Failed to write to log file" in proc.stderr:
        broken.append("Kineto's raw line")
    tracebacks = proc.stderr.count("Traceback (most recent call last)")
    if tracebacks > (case["how"] == "fork-raise"):
        broken.append(f"{tracebacks} traceback(s)")
    if case["disk"] == "room":
        try:
            report = json.loads((out / "report.json").read_text())
            if report["run"]["steps_recorded"] != 5:
                broken.append(f"report of {report['run']['steps_recorded']} step(s), not 5")
        except (OSError, ValueError, KeyError) as exc:
            broken.append(f"no report ({exc})")
        if len(list(out.rglob("*.pt.trace.json.gz"))) != 1:
            broken.append("not one trace")
    pids = [int(p.name) for p in (folder / "children").glob("*")]
    deadline = time.monotonic() + 2
    while any(_running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = [p for p in pids if _running(p)]
    if alive:
        broken.append(f"child(ren) {alive} alive 2 s after")
    return broken


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "fuzz-run")
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    why_not = _mount(args.out / "probe-mount")
    if why_not is None:
        subprocess.run(["umount", "-l", str(args.out / "probe-mount")], check=False)
    rng = random.Random(args.seed)
    results = []
    for i in range(args.cases):
        case = draw(rng, why_not is None)
        folder = args.out / f"case-{i}"
        folder.mkdir(exist_ok=True)
        t0 = time.monotonic()
        broken = run_case(case, folder, args.timeout)
        results.append({**case, "broken": broken, "seconds": round(time.monotonic() - t0, 1)})
        print(f"case {i}: {case} -> {'ok' if not broken else 'BAD: ' + '; '.join(broken)} "
              f"({results[-1]['seconds']} s)", flush=True)
    summary = {"cases": len(results), "ok": sum(not r["broken"] for r in results),
               "bad": [r for r in results if r["broken"]],
               "full_disk_cases": why_not is None and sum(r["disk"] != "room" for r in results),
               "tmpfs": "mounted" if why_not is None else f"not available: {why_not}"}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: v for k, v in summary.items() if k != "bad"}))
    return 1 if summary["bad"] else 0


if __name__ == "__main__":
    sys.exit(main())

"""Snapshot report.json for every shared real trace, and check a later snapshot is identical.

Run by hand around a change that must not alter what users read (a refactor, a faster loader):

    python benchmarks/snapshot_reports.py save /tmp/before
    ... change the code ...
    python benchmarks/snapshot_reports.py check /tmp/before

Each trace file is analysed on its own (the project's own sample_traces/ too), each folder of
traces as one job, and the two sampled ranks of the 128-rank job together, through the CLI
(`python -m stallscope analyze`), so the script needs nothing from stallscope's internals and
works across a reshuffle of its modules.
`check` prints one line per input and exits 1 when any report.json differs by a byte.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REAL = ROOT / "sample_traces" / "public"


def inputs(real: Path) -> dict[str, list[Path]]:
    """Name -> the paths one `analyze` call gets: every file, every folder, the rank pair."""
    out: dict[str, list[Path]] = {}
    for folder in sorted(p for p in real.iterdir() if p.is_dir()):
        files = sorted(folder.glob("*.json*"))
        for f in files:
            out[f"{folder.name}/{f.name}"] = [f]
        out[f"{folder.name}/ (folder)"] = [folder]
    for f in sorted((ROOT / "sample_traces").glob("*.pt.trace.json*")):
        out[f"sample_traces/{f.name}"] = [f]
    pair = [real / "hta" / f"rank{r}of128_sampled.pt.trace.json.gz" for r in (0, 1)]
    if all(p.is_file() for p in pair):
        out["hta/rank{0,1}of128 (pair)"] = pair
    return out


def report_json(paths: list[Path], work: Path) -> bytes | str:
    """The report.json bytes `analyze` writes for `paths`, or its error line."""
    out = work / "out"
    shutil.rmtree(out, ignore_errors=True)
    proc = subprocess.run(
        [sys.executable, "-m", "stallscope", "analyze", *map(str, paths), "-o", str(out), "-q",
         "--force"],
        capture_output=True, text=True, check=False,
    )
    if not (out / "report.json").is_file():
        return f"exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}"
    return (out / "report.json").read_bytes()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("save", "check"))
    parser.add_argument("folder", type=Path, help="where the snapshot is kept")
    parser.add_argument("--real", type=Path, default=REAL, help="the shared real traces")
    args = parser.parse_args()
    if not args.real.is_dir():
        print(f"no real traces at {args.real}", file=sys.stderr)
        return 2
    args.folder.mkdir(parents=True, exist_ok=True)
    differ = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, paths) in enumerate(inputs(args.real).items()):
            got = report_json(paths, Path(tmp))
            data = got if isinstance(got, bytes) else got.encode()
            kept = args.folder / f"{i:02d}.report.json"
            if args.action == "save":
                kept.write_bytes(data)
                print(f"saved    {name}: {hashlib.sha256(data).hexdigest()[:12]}")
                continue
            same = kept.is_file() and kept.read_bytes() == data
            differ += not same
            print(f"{'same' if same else 'DIFFERS':8} {name}: "
                  f"{hashlib.sha256(data).hexdigest()[:12]}")
    if args.action == "check":
        print(f"{differ} of {i + 1} report.json differ")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())

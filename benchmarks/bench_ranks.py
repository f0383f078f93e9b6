"""Many-rank benchmark (issue 20): `stallscope analyze` on N rank files of one job, run by hand.

    python benchmarks/bench_ranks.py [--source TRACE] [--ranks 128 1024 10000]
                                     [--stragglers 3] [--scheduler local:2] [--work DIR]
                                     [--large 64 [--tiles 10]]

Generates, from a real trace (default: hta/rank0of128_sampled, 1.8 MB of JSON, 2 steps), N rank
files of one job: each rank's timestamps shifted by 1 ms per rank and its distributedInfo set to
rank r of N; `--stragglers` ranks (spread over the job) get every GPU kernel 40% longer, so the
job-level rule must name them. Then times `stallscope analyze FOLDER` end to end in a fresh
process (the local pool; with `--scheduler`, also through Dask) and prints wall time, peak
resident memory of the whole process tree (workers included, sampled every 20 ms), the report's
sizes and which ranks the verdict and the rank-imbalance finding name.

`--large N`: N files of about 300 MB instead (bench_scale's tiled resnet50 trace, `--tiles`
copies of kineto/resnet50_num_workers_0 end to end, 30 MB each): tiled once, then written N
times with only `distributedInfo.rank` changed (no stragglers planted: every rank is the same).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import tempfile
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_scale import DEFAULT_SOURCE as LARGE_SOURCE  # noqa: E402
from bench_scale import GB, REAL, measure  # noqa: E402
from tiling import tile_trace  # noqa: E402

DEFAULT_SOURCE = REAL / "hta" / "rank0of128_sampled.pt.trace.json.gz"
SHIFT_US = 1000  # per rank: ranks do not start their steps at the same instant
STRAGGLE = 1.4  # a straggler's kernels take this much longer


def straggler_ranks(n: int, count: int) -> list[int]:
    """`count` ranks spread over 0..n-1, never rank 0 (the reference most users look at)."""
    if n < 2 or count <= 0:
        return []
    return sorted({max(1, (i + 1) * n // (count + 1)) for i in range(count)})


def generate(source: Path, folder: Path, n: int, stragglers: list[int]) -> list[Path]:
    """Write N rank files into `folder` (kept when already there with N files)."""
    files = [folder / f"rank{r}.pt.trace.json" for r in range(n)]
    if folder.is_dir() and all(f.exists() for f in files):
        return files
    folder.mkdir(parents=True, exist_ok=True)
    raw = source.read_bytes()
    doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    events = doc["traceEvents"]
    timed = [e for e in events if "ts" in e]
    base = [e["ts"] for e in timed]
    kernels = [e for e in events if e.get("cat") == "kernel" and "dur" in e]
    durs = [e["dur"] for e in kernels]
    slow = set(stragglers)
    encoder = msgspec.json.Encoder()
    for r, path in enumerate(files):
        for e, ts in zip(timed, base, strict=True):
            e["ts"] = ts + r * SHIFT_US
        factor = STRAGGLE if r in slow else 1.0
        for e, d in zip(kernels, durs, strict=True):
            e["dur"] = d * factor
        doc["distributedInfo"] = {**doc.get("distributedInfo", {}), "rank": r, "world_size": n}
        path.write_bytes(encoder.encode(doc))
    return files


def generate_large(folder: Path, n: int, tiles: int) -> list[Path]:
    """N rank files of `tiles` tiled copies of the resnet50 trace (kept when already there):
    one tiling, then its bytes with each rank's number in the header (written first)."""
    files = [folder / f"rank{r}.pt.trace.json" for r in range(n)]
    if folder.is_dir() and all(f.exists() for f in files):
        return files
    folder.mkdir(parents=True, exist_ok=True)
    tile_trace(LARGE_SOURCE, files[0], tiles, rank=0, world_size=n)
    raw = files[0].read_bytes()
    info = b'"distributedInfo":{"backend":"nccl","rank":0,"world_size":%d}' % n
    at = raw.find(info, 0, 1 << 16)
    if at < 0:
        raise SystemExit("tiling wrote no distributedInfo in the file's header")
    for r, path in enumerate(files[1:], 1):
        with path.open("wb") as fh:
            fh.write(raw[:at])
            fh.write(info.replace(b'"rank":0', b'"rank":%d' % r))
            fh.write(memoryview(raw)[at + len(info):])
    return files


def report_facts(out: Path) -> str:
    rep = json.loads((out / "report.json").read_text())
    sizes = ", ".join(f"{p.name} {p.stat().st_size / 1e6:.2f} MB"
                      for p in sorted(out.glob("report.*")))
    imb = next((f for f in rep["findings"] if f["id"] == "rank-imbalance"), None)
    named = imb["evidence"].get("stragglers") if imb else None
    verdict = (out / "report.md").read_text().split("**Verdict:**", 1)[-1].splitlines()[0]
    return f"    {sizes}\n    verdict:{verdict[:200]}\n    stragglers named: {named}"


def per_file_cost(path: Path, repeats: int = 20) -> None:
    """What one rank file costs in a warm worker (imports paid, name caches filled by the
    previous files, as in a job), phase by phase, and the size of what the worker sends back."""
    import pickle
    import time

    from stallscope.commands.pipeline import _analyze_file
    from stallscope.diagnose import diagnose
    from stallscope.diagnose.plan import make_plan
    from stallscope.report.digest import digest
    from stallscope.trace.load import infer_rank, load_trace
    from stallscope.trace.model import build_model

    for _ in range(3):  # warm: the first file pays imports' lazy parts and the name caches
        _analyze_file(path, True, None, None)
    phases = {"load": [], "model": [], "rules": [], "plan": [], "digest": []}
    for _ in range(repeats):
        t0 = time.perf_counter()
        trace = load_trace(path)
        infer_rank(trace)
        t1 = time.perf_counter()
        model = build_model(trace)
        t2 = time.perf_counter()
        verdict = diagnose(model)
        t3 = time.perf_counter()
        plan = make_plan(model, verdict)
        t4 = time.perf_counter()
        result = (digest(model, plan, draw=False), verdict)
        t5 = time.perf_counter()
        for key, dt in zip(phases, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4), strict=True):
            phases[key].append(dt * 1000)
    med = {k: sorted(v)[len(v) // 2] for k, v in phases.items()}
    sent = len(pickle.dumps(result))
    hot = len(pickle.dumps((result[0].host_ops, result[0].gpu_kernels)))
    print(f"per file, warm worker, median of {repeats} ({path.name}, "
          f"{path.stat().st_size / 1e6:.2f} MB): "
          + ", ".join(f"{k} {v:.1f} ms" for k, v in med.items())
          + f"; total {sum(med.values()):.1f} ms; sent back {sent / 1000:.1f} kB "
          f"({hot / 1000:.1f} kB of it hotspot totals, summed and dropped on arrival)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    ap.add_argument("--ranks", type=int, nargs="*", default=[128, 1024, 10000])
    ap.add_argument("--stragglers", type=int, default=3)
    ap.add_argument("--scheduler", help="also run through Dask: an address or local:N")
    ap.add_argument("--work", type=Path, help="folder for the generated traces (kept)")
    ap.add_argument("--jobs", type=int, help="--jobs for the local pool (default: its own)")
    ap.add_argument("--no-local", action="store_true",
                    help="skip the local pool's run (with --scheduler: only Dask)")
    ap.add_argument("--large", type=int, metavar="N",
                    help="instead: N files of about 300 MB (see --tiles)")
    ap.add_argument("--tiles", type=int, default=10,
                    help="--large: copies of the 30 MB resnet50 trace per file (10: 302 MB)")
    ap.add_argument("--per-file", action="store_true",
                    help="first measure one rank file's cost in a warm process, phase by phase")
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="stallscope-ranks-"))
    if args.per_file:
        files = generate(args.source, work / "job2", 2, [])
        per_file_cost(files[1])
    jobs = [(n, f"job{n}") for n in args.ranks]
    if args.large:
        jobs = [(args.large, f"large{args.large}x{args.tiles}")]
    for n, name in jobs:
        folder = work / name
        if args.large:
            slow: list[int] = []
            files = generate_large(folder, n, args.tiles)
        else:
            slow = straggler_ranks(n, args.stragglers)
            files = generate(args.source, folder, n, slow)
        mb = sum(f.stat().st_size for f in files) / 1e6
        print(f"\n{n} rank files, {mb:,.0f} MB of JSON; planted stragglers {slow}")
        runs = [] if args.no_local else [
            ("local pool", [] if args.jobs is None else ["--jobs", str(args.jobs)])]
        if args.scheduler:
            runs.append((f"dask {args.scheduler}", ["--scheduler", args.scheduler]))
        for label, extra in runs:
            out = work / f"out-{name}-{label.split()[0]}"
            cmd = [sys.executable, "-m", "stallscope", "analyze", str(folder), "-q", "--force",
                   "-o", str(out), *extra]
            m = measure(cmd)
            print(f"  {label:<20} {m.wall_s:8.1f} s   peak {m.peak_bytes / GB:5.2f} GB "
                  f"({m.wall_s / n * 1000:.1f} ms per file)")
            print(report_facts(out))


if __name__ == "__main__":
    main()

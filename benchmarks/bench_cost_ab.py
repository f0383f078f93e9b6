"""Two checkouts' cost, interleaved round by round, by hand (not in CI).

    python benchmarks/bench_cost_ab.py OLD_SRC NEW_SRC [--rounds 7] [--big TRACE] [--work DIR]

OLD_SRC and NEW_SRC are the `src` folders of two checkouts (`git worktree add /tmp/old <commit>`
gives one). On a VM whose speed drifts 10-30% within a minute, one checkout's bench_cost.py run
against another's an hour later compares the drift as much as the code: here each round runs,
in fresh processes one after another, the typed msgspec decode of the big trace, old and new
`analyze` of it on every core and with `--jobs 1`, old and new `analyze` of the small trace, and
`python -c "import pandas"`; the ratios are taken within each round. Memory is the process
tree's summed resident peak, sampled every 20 ms as bench_cost.py samples it.
"""

from __future__ import annotations

import argparse
import compileall
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_cost as cost  # noqa: E402
from tiling import tile_trace  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old", type=Path, help="the old checkout's src folder")
    ap.add_argument("new", type=Path, help="the new checkout's src folder")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--big", type=Path, help="the big trace (default: tiled as bench_cost.py)")
    ap.add_argument("--work", type=Path, help="where the tiled trace and the reports go")
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="stallscope-ab-"))
    work.mkdir(parents=True, exist_ok=True)
    big = args.big or work / "tiled10.pt.trace.json"
    if not big.exists():
        tile_trace(cost.SOURCE, big, 10)
    trees = {"old": args.old.resolve(), "new": args.new.resolve()}
    for src in trees.values():  # both from compiled bytecode, as an installed package runs
        compileall.compile_dir(str(src), quiet=1)
    py = sys.executable

    def analyze(tree: str, trace: Path, *extra: str) -> list[str]:
        out = work / f"out-{tree}-{trace.name}-{'-'.join(extra) or 'all'}"
        return ["env", f"PYTHONPATH={trees[tree]}", py, "-m", "stallscope", "analyze",
                str(trace), *extra, "-q", "--force", "-o", str(out)]

    cost.ENV["PYTHONPATH"] = str(trees["new"])  # the typed decode imports the new Event
    runs: dict[str, list[cost.Run]] = {k: [] for k in (
        "typed", "old", "new", "old --jobs 1", "new --jobs 1", "old small", "new small",
        "import pandas")}
    for r in range(args.rounds):
        runs["typed"].append(cost.run([py, "-c", cost.TYPED_DECODE, str(big)]))
        for tree in ("old", "new"):
            runs[tree].append(cost.run(analyze(tree, big)))
        for tree in ("old", "new"):
            runs[f"{tree} --jobs 1"].append(cost.run(analyze(tree, big, "--jobs", "1")))
        for tree in ("old", "new"):
            runs[f"{tree} small"].append(cost.run(analyze(tree, cost.SMALL)))
        runs["import pandas"].append(cost.run([py, "-c", "import pandas"]))
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1].wall_s:.2f} s" for k, v in runs.items())
              + f" (load average {os.getloadavg()[0]:.1f})", flush=True)

    size = big.stat().st_size
    print(f"\nmedians of {args.rounds} rounds; {big.name}: {size / cost.MB:,.0f} MB")
    for k, v in runs.items():
        print(f"  {k:<14} {statistics.median(x.wall_s for x in v):.3f} s   "
              f"peak RSS {max(x.rss for x in v) / cost.MB:,.0f} MB")

    def per_round(a: str, b: str) -> float:
        return statistics.median(x.wall_s / y.wall_s for x, y in zip(runs[a], runs[b],
                                                                      strict=True))

    for tree in ("old", "new"):
        for k in (tree, f"{tree} --jobs 1"):
            print(f"  {k:<14} / typed decode {per_round(k, 'typed'):.2f}x, peak RSS / file "
                  f"{max(x.rss for x in runs[k]) / size:.2f}x")
    print(f"  new / old per round: {per_round('new', 'old'):.3f} "
          f"({per_round('new --jobs 1', 'old --jobs 1'):.3f} with --jobs 1)")
    for tree in ("old", "new"):
        over = statistics.median(x.wall_s - p.wall_s for x, p in
                                 zip(runs[f"{tree} small"], runs["import pandas"], strict=True))
        print(f"  {tree} small trace less import pandas, per round: {over:.3f} s")


if __name__ == "__main__":
    main()

"""`stallscope compare A B`: did a change help? Step time, breakdown and findings, before/after.

Each side is a stallscope output folder (its report.json) or traces, analysed on the spot into
the same report data, so both kinds compare the same way. The comparison itself is plain data
(no torch): the writers in `report/compare_writers.py` render it.

Step time: each side's per-step samples give a seeded bootstrap interval for the speedup of the
mean step (throughput; steps resampled in whole rounds of the training loader's workers:
`commands/stats.py`). There is one recording per side, so the A/A noise a change must exceed is
each side against itself (the mean of its first half of steps against its second half, the
larger of the two); the speedup itself must also clear a run-to-run floor (`--noise-floor`),
since two recordings of one unchanged script differ by more than either shows inside itself.
A change that does not clear both is "no measurable difference"; so is any change when either
side was recorded on a busy machine (`_step_time` says why).

Findings on both sides are worse, better or unchanged by what each measures (its time per step:
`commands/compare_metrics.py`), never by severity or saving, which are shares of the step and
grow when the step shrinks.

`--fail-on slower|new|worse` turns the comparison into a CI gate: exit EXIT_SLOWER (6),
EXIT_NEW (7) or EXIT_WORSE (8), the first that applies in that order, after writing the files.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stallscope import __version__
from stallscope.commands import COMMANDS, stats
from stallscope.commands.compare_metrics import (
    BETTER,
    WORSE,
    change_text,
    judge,
    measure,
)
from stallscope.errors import (
    EXIT_NEW,
    EXIT_OK,
    EXIT_SLOWER,
    EXIT_WORSE,
    InputError,
    OutputError,
)
from stallscope.text import speedup_range_text, speedup_text
from stallscope.trace.otherload import OTHER_LOAD_PCT
from stallscope.units import percent

NAME = "compare"
TAKES_SCRIPT = False
# 3: findings judged by their measured quantity (`metric`, `judged`, the `better` group),
# rows in AFTER's words, `speedup` of the mean step (the verdict's) with `speedup_text`.
SCHEMA_VERSION = 3
COMPARE_FILES = ("compare.json", "compare.html", "compare.md")
# The groups of compare.json's `findings`, in the order every view lists them.
GROUPS = ("resolved", "new", "worse", "better", "unchanged", "not_assessed")
FAIL_ON = {"slower": EXIT_SLOWER, "new": EXIT_NEW, "worse": EXIT_WORSE}
# The least speedup (or slowdown) claimed between two recordings, in percent. One recording's
# halves see the drift of a second or so, not the machine's between two runs: nine pairs of
# `run`s of one unchanged script (examples/loader_bound.py, the acceptance test's) on this
# project's 2-core VM gave mean-step ratios 0.80-1.17, while a run's two halves differed by
# 0.2-6% in 10 of the 12 runs measured (28% in two); `--fail-on slower` fired on two such
# pairs in CI (at no floor, then at 10%). On a lent H200 one configuration's recorded median
# moved 3-41% between two sessions (sample_traces/README.md). 20% keeps those from being called
# a change; `--noise-floor` sets it for a quieter machine. The interval must still clear the
# sides' own noise.
NOISE_FLOOR_PCT = 20.0


@dataclass
class Side:
    """One input of the comparison: where it came from and its report data."""

    path: str
    kind: str  # "report" (an output folder's report.json) or "traces" (analysed now)
    data: dict[str, Any]


def load_side(path: Path) -> Side:
    """A report folder (or its report.json) is read; anything else is analysed as traces."""
    if not path.exists():
        raise InputError(f"no such file or folder: {path}")
    report_json = path / "report.json" if path.is_dir() else path
    if report_json.name == "report.json" and report_json.is_file():
        return Side(str(path), "report", _read_report(report_json))
    from stallscope.commands.pipeline import analyze_paths
    from stallscope.report.json_writer import report_data

    return Side(str(path), "traces", report_data(analyze_paths([path])))


def _read_report(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"cannot read {path}: {exc}") from None
    from stallscope.commands.compare_input import validate_report

    return validate_report(data, path)


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks, as numpy's default (and report.json's p90)."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def step_stats(durations: list[float]) -> dict[str, float]:
    """Centre and spread of one side's step times; p10-p90 ignores one odd step in ten."""
    return {
        "median": percentile(durations, 50),
        "mean": sum(durations) / len(durations),
        "p10": percentile(durations, 10),
        "p90": percentile(durations, 90),
        "min": min(durations),
        "max": max(durations),
    }


def _durations(side: Side) -> list[float]:
    durations = [float(s["duration_us"]) for s in side.data.get("steps", [])]
    if not durations:
        raise InputError(f"{side.path} has no recorded training step: nothing to compare")
    return durations


def _workers(data: dict[str, Any]) -> int:
    """Steps per round of the training loader's workers (1 without workers or without a
    recorded DataLoader): the block the bootstrap keeps whole."""
    loaders = [d for d in data.get("dataloaders") or [] if isinstance(d, dict)]
    if not loaders:
        return 1
    loader = max(loaders, key=lambda d: (d.get("batches_recorded") or 0, d.get("batches") or 0))
    n = loader.get("num_workers")
    return n if isinstance(n, int) and n > 0 else 1


def _other_cpu_pct(data: dict[str, Any]) -> list[float]:
    """Other processes' share of the cores while `run` recorded (capture/hostload.py)."""
    host = ((data.get("environment") or {}).get("captured") or {}).get("host") or {}
    share = host.get("other_cpu_share_pct")
    return [float(share)] if isinstance(share, int | float) else []


def _side_info(side: Side, durations: list[float]) -> dict[str, Any]:
    data = side.data
    return {
        "path": side.path,
        "kind": side.kind,
        "traces": [t.get("label") for t in data.get("traces", [])],
        "steps": len(durations),
        "step_time_us": step_stats(durations),
        "partial": bool((data.get("run") or {}).get("partial")),
        "busy": stats.busy_reasons([durations], _workers(data), _other_cpu_pct(data),
                                   OTHER_LOAD_PCT),
    }


def _noise(db: list[float], da: list[float],
           blocks: tuple[int, int]) -> tuple[float, str, list[float | None]]:
    """The A/A noise the interval must clear: the larger of each side's halves against each
    other; infinite (nothing claimed) when a side is too short to split. Also how it was
    found, and each side's own figure."""
    (nb, _), (na, _) = stats.aa_noise([db], blocks[0]), stats.aa_noise([da], blocks[1])
    sides = [stats.noise_json(nb), stats.noise_json(na)]
    if math.isinf(nb) or math.isinf(na):
        return math.inf, "a side too short to split in two: not measured", sides
    which = "BEFORE" if nb >= na else "AFTER"
    return max(nb, na), f"{which}: the first half of its steps against its second half", sides


def _step_time(before: dict[str, float], after: dict[str, float], db: list[float],
               da: list[float], blocks: tuple[int, int], busy: bool,
               floor: float = NOISE_FLOOR_PCT / 100) -> dict[str, Any]:
    """Ratio after/before of the medians (and means), the ratio's range when the two p10-p90
    spreads are set against each other, and the verdict: the bootstrap interval of the mean
    step's speedup against the A/A noise (`_noise`), and the speedup itself against the
    run-to-run floor. Ratios to stats.RATIO_DIGITS.

    With one recording per side, the interval and the noise see only step-to-step variation,
    not what changes between two runs; on a busy machine that is the larger part (measured:
    two runs of one unchanged script, 37 ms and 650 ms mean steps, under other helpers'
    load), so there a difference is not claimed: `interval_verdict` keeps what the interval
    alone said."""
    interval = stats.speedup_interval([db], [da], *blocks)
    noise, how, sides = _noise(db, da, blocks)
    said = stats.classify(interval, noise, floor)
    r = stats.rnd
    return {
        "ratio": r(after["median"] / before["median"]),
        # The one speedup every view states: the mean step's (throughput), the verdict's.
        "speedup": interval.as_json()["speedup"],
        "speedup_text": speedup_text(interval.point),
        "ratio_mean": r(after["mean"] / before["mean"]),
        "ratio_range": [r(after["p10"] / before["p90"]), r(after["p90"] / before["p10"])],
        "delta_us": round(after["median"] - before["median"], 1),
        "interval": interval.as_json(),  # of the mean step's speedup (throughput)
        "aa_noise": stats.noise_json(noise),
        "aa_noise_from": how,
        "aa_noise_sides": sides,  # BEFORE's and AFTER's halves, as fractions
        "noise_floor": r(floor),
        "verdict": stats.SAME if busy else said,
        "interval_verdict": said,
        "ratio_digits": stats.RATIO_DIGITS,
    }


def _per_step_us(steps: list[dict[str, Any]], category: str) -> float:
    return sum(float(s["breakdown_us"].get(category, 0.0)) for s in steps) / len(steps)


def _breakdown(before: dict[str, Any], after: dict[str, Any]) -> list[dict[str, Any]]:
    """Each host category's share of the step and its time per step, before and after."""
    pct_b = before["summary"].get("breakdown_pct") or {}
    pct_a = after["summary"].get("breakdown_pct") or {}
    rows = []
    for cat in dict.fromkeys([*pct_b, *pct_a]):
        b_us = _per_step_us(before["steps"], cat)
        a_us = _per_step_us(after["steps"], cat)
        b_pct, a_pct = float(pct_b.get(cat, 0.0)), float(pct_a.get(cat, 0.0))
        rows.append({
            "category": cat,
            "before_pct": b_pct, "after_pct": a_pct, "delta_pct": a_pct - b_pct,
            "before_us": b_us, "after_us": a_us, "delta_us": a_us - b_us,
        })
    return rows


def _gpu(before: dict[str, Any], after: dict[str, Any]) -> list[dict[str, Any]]:
    """Busy/idle share per GPU; a device seen on one side only has None on the other."""
    gpu_b = before["summary"].get("gpu_pct") or {}
    gpu_a = after["summary"].get("gpu_pct") or {}
    rows = []
    for dev in sorted(dict.fromkeys([*gpu_b, *gpu_a])):
        b_idle = gpu_b.get(dev, {}).get("idle")
        a_idle = gpu_a.get(dev, {}).get("idle")
        b_busy = None if b_idle is None else 100.0 - b_idle
        a_busy = None if a_idle is None else 100.0 - a_idle
        rows.append({
            "device": dev,
            "before_busy_pct": b_busy, "after_busy_pct": a_busy,
            "before_idle_pct": b_idle, "after_idle_pct": a_idle,
            "delta_busy_pct": None if b_busy is None or a_busy is None else a_busy - b_busy,
        })
    return rows


def _trace_keys(data: dict[str, Any]) -> dict[str, str]:
    """Trace label -> the key findings are matched on. One trace per side: the labels are file
    names that differ between runs, so the single trace matches the other side's single trace.
    Several: by rank when known, else by label. Job-level findings keep `job`."""
    traces = data.get("traces", [])
    keys = {"job": "job"}
    for t in traces:
        label = str(t.get("label"))
        if len(traces) == 1:
            keys[label] = "trace"
        elif t.get("rank") is not None:
            keys[label] = f"rank {t['rank']}"
        else:
            keys[label] = label
    return keys


def _indexed_findings(data: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    keys = _trace_keys(data)
    return {
        (f["id"], keys.get(str(f.get("trace")), str(f.get("trace")))): f
        for f in data.get("findings", [])
    }


def _assessment_status(data: dict[str, Any], rule: str, key: str) -> str | None:
    keys = _trace_keys(data)
    for a in data.get("assessments", []):
        if a.get("rule") == rule and keys.get(str(a.get("trace")), str(a.get("trace"))) == key:
            return str(a.get("status"))
    return None


def _row(key: tuple[str, str], b: dict[str, Any] | None,
         a: dict[str, Any] | None) -> dict[str, Any]:
    """One finding's row: AFTER's words and figures where AFTER has the finding (a resolved
    one has only BEFORE's), each side's severity and saving beside them."""
    ref = a or b
    assert ref is not None
    return {
        "id": key[0],
        "trace": key[1],
        "trace_before": b.get("trace") if b else None,
        "trace_after": a.get("trace") if a else None,
        "title": ref.get("title"),
        "title_before": b.get("title") if b else None,
        "severity_before": b.get("severity") if b else None,
        "severity_after": a.get("severity") if a else None,
        "saving_before_pct": b.get("estimated_saving_pct") if b else None,
        "saving_after_pct": a.get("estimated_saving_pct") if a else None,
        # replayed / counted / upper_bound (reports before schema 2: upper bounds)
        "saving_before_kind": (b.get("saving_kind") or "upper_bound") if b else None,
        "saving_after_kind": (a.get("saving_kind") or "upper_bound") if a else None,
        "caused_by_before": (b.get("caused_by") or None) if b else None,
        "caused_by_after": (a.get("caused_by") or None) if a else None,
        "metric": measure(key[0], b, a),
        "judged": None,  # worse / better / same / not measured, on both sides only
        "change": "",
        "worse_because": [],
    }


def _judged(row: dict[str, Any], floor: float, step_ms: float) -> str:
    """The group of a finding found on both sides, by its measured quantity
    (commands/compare_metrics.py); its severity, saving and cause are said, not judged."""
    judged = judge(row["metric"], floor, step_ms)
    row["judged"] = judged
    row["change"] = change_text(row["metric"])
    if judged == WORSE:
        m = row["metric"]
        grew = f"+{percent(100 * (m['after'] / m['before'] - 1), 0)}" if m["before"] else "from 0"
        row["worse_because"] = [f"{row['change']}: {grew}, past the {percent(100 * floor, None)} "
                                "run-to-run floor"]
    return {WORSE: "worse", BETTER: "better"}.get(judged, "unchanged")


def _findings(before: dict[str, Any], after: dict[str, Any], floor: float = 0.0,
              step_ms: float = 0.0) -> dict[str, list[dict[str, Any]]]:
    """Resolved: found before, assessed clear after. New: found after only. On both sides:
    worse, better or unchanged by the finding's measured quantity (`_judged`). A finding gone
    because the rule could not be assessed on the other side is `not_assessed`, not resolved."""
    fb, fa = _indexed_findings(before), _indexed_findings(after)
    out: dict[str, list[dict[str, Any]]] = {k: [] for k in GROUPS}
    for key in dict.fromkeys([*fb, *fa]):
        b, a = fb.get(key), fa.get(key)
        row = _row(key, b, a)
        if b and a:
            out[_judged(row, floor, step_ms)].append(row)
            continue
        row["change"] = change_text(row["metric"])
        other, rule = (after, key[0]) if b else (before, key[0])
        status = _assessment_status(other, rule, key[1])
        out["not_assessed" if status == "not_assessed" else
            ("resolved" if b else "new")].append(row)
    return out


def verdict(step: dict[str, Any], findings: dict[str, list[dict[str, Any]]],
            busy: bool = False) -> str:
    """One sentence: faster, slower or no measurable difference (the mean step's speedup and
    its interval against the A/A noise), and what the findings did."""
    iv = step["interval"]
    figures = (f"mean step {speedup_text(iv['speedup'])}, 95% interval "
               f"{speedup_range_text(iv['low'], iv['high'])}, A/A noise "
               f"{stats.noise_text(step['aa_noise'])}, run-to-run floor "
               f"{percent(100 * step['noise_floor'], None)}")
    if step["verdict"] == stats.FASTER:
        head = f"Faster: {figures}"
    elif step["verdict"] == stats.SLOWER:
        head = f"Slower: {figures}"
    elif busy and step["interval_verdict"] != stats.SAME:
        head = (f"No measurable difference in step time: the machine was busy, so the "
                f"{step['interval_verdict']} interval is not claimed ({figures})")
    else:
        head = f"No measurable difference in step time ({figures})"
    if busy:
        head += "; busy machine, see the inputs"
    kinds = ("resolved", "new", "worse", "better", "unchanged")
    parts = [f"{len(findings[k])} {k}" for k in kinds if findings[k]]
    tail = "; findings: " + ", ".join(parts) if parts else "; no findings on either side"
    return head + tail + "."


def compare_data(before: Side, after: Side,
                 noise_floor_pct: float = NOISE_FLOOR_PCT) -> dict[str, Any]:
    """The whole comparison as JSON-ready data: what compare.json holds."""
    db, da = _durations(before), _durations(after)
    info_b, info_a = _side_info(before, db), _side_info(after, da)
    busy = bool(info_b["busy"] or info_a["busy"])
    step = _step_time(info_b["step_time_us"], info_a["step_time_us"], db, da,
                      (_workers(before.data), _workers(after.data)), busy,
                      noise_floor_pct / 100)
    longest_ms = max(info_b["step_time_us"]["median"], info_a["step_time_us"]["median"]) / 1e3
    findings = _findings(before.data, after.data, noise_floor_pct / 100, longest_ms)
    return {
        "schema_version": SCHEMA_VERSION,
        "stallscope_version": __version__,
        "before": info_b,
        "after": info_a,
        "step_time": step,
        "breakdown": _breakdown(before.data, after.data),
        "gpu": _gpu(before.data, after.data),
        "findings": findings,
        "verdict": verdict(step, findings, busy),
    }


def gate(data: dict[str, Any], fail_on: list[str]) -> tuple[int, str | None]:
    """The exit status `--fail-on` asks for, and why; (EXIT_OK, None) when none applies."""
    hits = {
        "slower": data["step_time"]["verdict"] == stats.SLOWER,
        "new": bool(data["findings"]["new"]),
        "worse": bool(data["findings"]["worse"]),
    }
    for cond in FAIL_ON:  # fixed order: the status does not depend on the flags' order
        if cond in fail_on and hits[cond]:
            return FAIL_ON[cond], cond
    return EXIT_OK, None


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """The `compare` subcommand, added to the CLI's subparsers."""
    cmp = sub.add_parser(
        NAME,
        help=COMMANDS[NAME],
        description="Compare BEFORE and AFTER, each a stallscope output folder (holding "
        "report.json) or traces (a trace file or a folder of traces, analysed now): step-time "
        "ratio with its spread and a bootstrap interval (no measurable difference unless it "
        "clears both sides' own noise and the run-to-run floor), where the step's time went, "
        "and which findings were resolved, are new, got worse or better (by what each "
        "measures) or remain. Writes compare.json, "
        "compare.html and compare.md.",
    )
    cmp.add_argument("before", type=Path, metavar="BEFORE", help="report folder or traces")
    cmp.add_argument("after", type=Path, metavar="AFTER", help="report folder or traces")
    cmp.add_argument("-o", "--out", type=Path, default=Path("stallscope-compare"),
                     help="output folder (default: ./stallscope-compare)")
    cmp.add_argument("--force", action="store_true", help="overwrite an existing comparison")
    cmp.add_argument("-q", "--quiet", action="store_true", help="print nothing on success")
    cmp.add_argument("--noise-floor", type=_pct, default=NOISE_FLOOR_PCT, metavar="PCT",
                     help="the least step-time difference, in percent, that two recordings "
                     "must show to be called faster or slower (default "
                     f"{NOISE_FLOOR_PCT:g}: what two runs of one unchanged script differed "
                     "by on shared machines; lower it on a quiet, dedicated one)")
    cmp.add_argument("--fail-on", action="append", choices=list(FAIL_ON), default=[],
                     metavar="{slower,new,worse}",
                     help="CI gate, may be repeated: after writing the files, exit "
                     f"{EXIT_SLOWER} when AFTER is measurably slower (its interval below the "
                     f"A/A noise), {EXIT_NEW} when a finding is new, {EXIT_WORSE} when one got "
                     "worse by what it measures, its time per step, not its severity (the "
                     "first that applies, in that order)")
    return cmp


def _pct(text: str) -> float:
    """A percentage from 0 to 100, for argparse."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.0 <= value <= 100.0:
        raise argparse.ArgumentTypeError(f"must be 0-100, not {text}")
    return value


def _prepare(out: Path, force: bool) -> None:
    """Refuse to overwrite an earlier comparison; a report in the same folder is fine (the
    comparison does not touch report.*), so prepare_out_dir only creates and checks the folder."""
    from stallscope.outputs import prepare_out_dir

    existing = [f for f in COMPARE_FILES if (out / f).exists()]
    if existing and not force:
        raise OutputError(
            f"{out} already holds {', '.join(existing)}; use --force to overwrite or -o for "
            "another folder"
        )
    prepare_out_dir(out, force=True)


def main(args: argparse.Namespace, script_args: list[str], command: list[str]) -> int:
    """Load both sides, compare, write compare.json/html/md atomically, print a summary."""
    from stallscope import progress
    from stallscope.outputs import write_files
    from stallscope.report.compare_writers import (
        render_compare_html,
        render_compare_markdown,
        render_compare_terminal,
    )

    progress.configure(args.quiet, None)
    for p in (args.before, args.after):  # both checked before any slow analysis
        if not p.exists():
            raise InputError(f"no such file or folder: {p}")
    out: Path = args.out
    _prepare(out, args.force)
    data = compare_data(load_side(args.before), load_side(args.after), args.noise_floor)
    rendered = {
        "compare.json": json.dumps(data, indent=2, sort_keys=True, allow_nan=False) + "\n",
        "compare.html": render_compare_html(data),
        "compare.md": render_compare_markdown(data),
    }
    write_files(out, rendered)  # all three or none: a full disk never mixes old and new
    if not args.quiet:
        sys.stdout.write(render_compare_terminal(data, {k: str(out / k) for k in rendered}))
    status, why = gate(data, args.fail_on)
    if why is not None:
        sys.stderr.write(f"stallscope: --fail-on {why}: exit {status}\n")
    return status

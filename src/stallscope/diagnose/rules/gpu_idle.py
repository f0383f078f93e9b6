"""`gpu-idle`: the GPU sits idle inside the training step, and whose fault that is.

Per device, the time inside step windows when no kernel, memcpy or memset runs, with every idle
gap split the way HolisticTraceAnalysis's idle-time breakdown does (diagnose/idlegaps.py): a
*host-wait* gap is one the host caused (the runtime call that launched the next GPU work
started only after the GPU had gone idle); any other gap had its next work already queued (it
waited on a stream/event dependency or another device) or is the tail of the step. The part of
the idle time during which the host was waiting on the DataLoader is reported separately,
because that cause and its fix belong to `dataloader-bound`.

What the host did during the host-wait gaps is read over every thread of the process
(diagnose/idlethreads.py): the autograd engine's launches are launch work, a pin-memory
thread's hold is named as such, and "not launch overhead" is said only of the time no thread
was launching. Three steps: `measure` (the trace -> IdleEvidence), `judge` (pure: is it found,
its cause, whether CUDA graphs fit), `advise` (the finding's words).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from stallscope.diagnose.advice import for_torch, has
from stallscope.diagnose.common import IDLE_THRESHOLD_PCT, idle_windows, judged_steps, ms, pct
from stallscope.diagnose.finding import Assessment, Finding
from stallscope.diagnose.idlegaps import (
    GAP_KINDS,
    KIND_SORT_LABEL,
    REGION_MIN_PCT,
    GapPieces,
    gap_pieces,
    host_layers,
    host_regions,
    idle_gaps,
    largest,
    median,
)
from stallscope.diagnose.idlethreads import (
    CPU_WORK_MIN_GAP_US,
    KINDS,
    NOT_LAUNCH,
    ThreadShare,
    attribute,
    graph_launches,
)
from stallscope.diagnose.spec import MS, Cause, Change, Metric, RuleSpec, evidence_key
from stallscope.runfacts import RunContext
from stallscope.trace.grouped import group_sums
from stallscope.trace.model import TraceModel
from stallscope.trace.names import OPTIMIZER_STEP
from stallscope.trace.workload import step_word
from stallscope.units import millis, percent

__all__ = ["SPEC", "IdleEvidence", "IdleJudgement", "advise", "gpu_idle", "idle_gaps", "judge",
           "measure"]

RULE_ID = "gpu-idle"

# Among the idle time not explained by the DataLoader, the share one cause needs to be named
# as the dominant one; below this the advice covers both.
DOMINANT_SHARE = 0.6
# How many of the largest idle gaps, and of the (thread, op) rows, to list as evidence.
TOP_GAPS = 5
TOP_ROWS = 6
# A host region (the optimizer step, allocator calls) holding this share of the host-wait idle
# is named as the idle's cause: the largest part, and a change to it (an allocator left
# steady, a cheaper optimizer step) comes before launch-overhead fixes, which leave it.
REGION_CAUSE_PCT = 40.0
# A part of the host time is named beside the largest when it is at least this share of it.
NAMED_SHARE = 0.25
IDLE_DOCS = "https://hta.readthedocs.io/en/latest/source/features/idle_time_breakdown.html"


@dataclass(frozen=True)
class IdleEvidence:
    """What `measure` read from one trace: the busiest GPU's idle time (us, summed over the
    steps), split by gap kind, by the host's waits, and by what every thread did."""

    device: str
    steps: int
    step_us: float  # the steps' (idle windows') summed length
    idle_us: float
    by_gap_kind: tuple[float, float, float]  # host-wait, other, launch-unknown
    loader_us: float  # idle while the stepping thread waited in DataLoader.__next__
    sync_us: float  # ... while it waited on the GPU
    rest: tuple[float, float, float]  # by gap kind, less the DataLoader wait
    host_kinds: Mapping[str, float]  # host-wait idle by what the process did (idlethreads)
    rows: tuple[ThreadShare, ...]  # ... by (thread, op), largest first
    regions: tuple[Mapping[str, Any], ...]  # host regions under the host-wait idle
    graph_launches: int  # CUDA graph launches in the steps
    has_host_ops: bool  # the trace records host ops (a legacy GPU-only export does not)
    bound_pct: float  # the saving bound over the judged steps
    detail: Mapping[str, Any]  # evidence shown as it is: gap and kernel counts, largest gaps

    @property
    def idle_pct(self) -> float:
        return pct(self.idle_us, self.step_us)


@dataclass(frozen=True)
class IdleJudgement:
    """`judge`'s reading: found or clear, the cause, and the host-wait idle split into launch
    work and host time no launch-overhead fix removes (us, summed over the steps)."""

    found: bool
    cause: str
    launch_us: float
    not_launch_us: float
    graphs: bool  # CUDA graphs fit: launch work is the larger part, and no graphs yet


def gpu_idle(model: TraceModel, context: RunContext | None = None) -> Assessment:
    evidence = measure(model, context)
    if isinstance(evidence, Assessment):
        return evidence
    verdict = judge(evidence)
    if not verdict.found:
        return Assessment(
            RULE_ID,
            "clear",
            f"The busiest GPU (device {evidence.device}) is idle {percent(evidence.idle_pct)} "
            f"of step time (threshold {percent(IDLE_THRESHOLD_PCT, 0)}).",
        )
    return Assessment.found(advise(model, evidence, verdict))


def measure(model: TraceModel, context: RunContext | None = None) -> IdleEvidence | Assessment:
    """The busiest GPU's idle time and what the host's threads did meanwhile."""
    if not model.has_gpu:
        return Assessment(RULE_ID, "not_assessed", "No GPU activity in the trace.")
    if not model.steps or model.total_step_us <= 0:
        return Assessment(RULE_ID, "not_assessed", "No step windows to measure idle time in.")
    windows = idle_windows(model)
    total = float((windows[:, 1] - windows[:, 0]).sum())
    if total <= 0:
        return Assessment(RULE_ID, "not_assessed", "No GPU work inside the analysed window.")
    n = len(model.steps)
    host = host_layers(model)
    by_device = {dev: gap_pieces(model, dev, windows, host) for dev in model.gpu_devices}
    idle_by_device = {dev: float(p.us.sum()) for dev, p in by_device.items()}
    # The busiest device bounds the step: idle there is what the step could actually lose.
    dev = min(idle_by_device, key=lambda d: idle_by_device[d])
    p = by_device[dev]
    # Sums by kind as pandas' groupby gave them (trace/grouped.py), kinds labelled in their
    # sorted order as groupby("kind") did.
    kind_label = KIND_SORT_LABEL[p.kind_code]
    by_kind = group_sums(p.us, kind_label, len(GAP_KINDS))
    not_loader = group_sums(p.us - p.loader_us, kind_label, len(GAP_KINDS))
    host_us = float(by_kind[KIND_SORT_LABEL[0]])
    threads = attribute(model, p.host_wait, windows, host)
    return IdleEvidence(
        device=dev, steps=n, step_us=total, idle_us=idle_by_device[dev],
        by_gap_kind=(host_us, float(by_kind[KIND_SORT_LABEL[1]]),
                     float(by_kind[KIND_SORT_LABEL[2]])),
        loader_us=float(p.loader_us.sum()), sync_us=float(p.sync_us.sum()),
        rest=(float(not_loader[KIND_SORT_LABEL[0]]), float(not_loader[KIND_SORT_LABEL[1]]),
              float(not_loader[KIND_SORT_LABEL[2]])),
        host_kinds=threads.us_by_kind, rows=threads.rows,
        regions=tuple(host_regions(model, p.host_wait, windows, n, host_us)),
        graph_launches=graph_launches(model), has_host_ops=bool(len(model.ops)),
        bound_pct=_bound_pct(p, windows, judged_steps(n),
                             threads.by_step[:, KINDS.index("graphed")]),
        detail=_detail(model, p, dev, idle_by_device, total),
    )


def _detail(model: TraceModel, p: GapPieces, dev: str, idle_by_device: dict[str, float],
            total: float) -> dict[str, Any]:
    """The evidence shown as measured: gap and kernel counts, the largest gaps."""
    n = len(model.steps)
    # One row per gap: its pieces (one per step it spans) are consecutive.
    new = np.r_[True, p.gap[1:] != p.gap[:-1]] if len(p.gap) else np.zeros(0, dtype=bool)
    gap_first, gap_label = np.flatnonzero(new), np.cumsum(new) - 1
    gap_us = group_sums(p.us, gap_label, len(gap_first))
    gap_loader = group_sums(p.loader_us, gap_label, len(gap_first))
    gap_kind = p.kind_code[gap_first]
    g = model.gpu
    kernels = ((g["device"].to_numpy() == dev) & (g["kind"].to_numpy() == "kernel")
               & (g["step"].to_numpy() >= 0))
    kernel_dur = g["dur"].to_numpy()[kernels]
    host_gaps = gap_us[gap_kind == 0]
    out: dict[str, Any] = {
        "gaps_per_step": round(len(gap_first) / n, 1),
        "median_host_wait_gap_us": round(median(host_gaps), 1) if len(host_gaps) else 0.0,
        "kernels_per_step": round(len(kernel_dur) / n, 1),
        "median_kernel_us": round(median(kernel_dur), 1) if len(kernel_dur) else 0.0,
        "largest_gaps": [
            {"step": model.steps[int(p.step[f])].name,
             "at_ms_into_step": ms(float(p.offset_us[f])), "ms": ms(float(gap_us[i])),
             "kind": GAP_KINDS[gap_kind[i]],
             "during_dataloader_ms": ms(float(gap_loader[i])),
             "next_gpu_work": str(p.next_name[f])[:80]}
            for i, f in ((int(i), int(gap_first[i])) for i in largest(gap_us, TOP_GAPS))
        ],
    }
    if len(idle_by_device) > 1:
        out["idle_share_pct_by_device"] = {d: pct(u, total) for d, u in idle_by_device.items()}
    if model.steps_source == "whole-trace":
        out["window"] = "no ProfilerStep markers: the span from the first to the last GPU activity"
    return out


def _bound_pct(p: GapPieces, windows: np.ndarray, judged: slice, graphed: np.ndarray) -> float:
    """The idle time not spent waiting on the DataLoader, nor under the host ops that launch
    CUDA graphs (their own host work, which no advice here removes), as a share of the steps
    the plan's median and floor are over (not the first step, which carries work queued
    before the recording): a bound over all steps, set against the median of the others,
    would claim more than the step less its floor allows."""
    first, stop = judged.start, judged.stop
    mine = (p.step >= first) & (p.step < stop)
    total = float((windows[first:stop, 1] - windows[first:stop, 0]).sum())
    kept = float((p.us[mine] - p.loader_us[mine]).sum()) - float(graphed[first:stop].sum())
    return pct(max(kept, 0.0), total) if total > 0 else 0.0


# ---------------------------------------------------------------------------------- judge


def judge(ev: IdleEvidence) -> IdleJudgement:
    """Found when the busiest GPU idles IDLE_THRESHOLD_PCT of the steps or more. The cause:
    the DataLoader wait when it covers half the idle; else host-wait or other by which gaps
    dominate (`mixed` when neither does); host-wait whose host time is more not launching
    (no thread was) than launching is `host-cpu-work`; a host region (optimizer, allocator)
    holding REGION_CAUSE_PCT of the host-wait idle is the cause itself. CUDA graphs fit
    launch work the step does not yet replay as graphs."""
    launch = ev.host_kinds.get("launch", 0.0)
    graphed = ev.host_kinds.get("graphed", 0.0)
    # Without recorded host ops nothing says what the host did (legacy GPU-only exports).
    not_launch = sum(ev.host_kinds.get(k, 0.0) for k in NOT_LAUNCH) if ev.has_host_ops else 0.0
    if ev.idle_pct < IDLE_THRESHOLD_PCT:
        return IdleJudgement(False, "clear", launch, not_launch, False)
    host, other, unknown = ev.rest
    cause = _idle_cause(ev.loader_us, ev.idle_us, host, other, unknown)
    if cause == "host-wait" and not_launch > launch + graphed:
        cause = "host-cpu-work"
    if ev.regions and cause in ("host-wait", "mixed", "host-cpu-work") and host >= other \
            and ev.regions[0]["pct_of_host_wait"] >= REGION_CAUSE_PCT:
        cause = str(ev.regions[0]["kind"])
    return IdleJudgement(True, cause, launch, not_launch, graphs_fit(cause, ev.graph_launches))


def graphs_fit(cause: str, graph_launches: int) -> bool:
    """CUDA graphs are the change when launch work is the larger part of the host-wait idle
    (`host-wait`), and never for a step that already launches graphs: what is outside them is
    not launch work the change removes. Launch work beside a larger part that is not (a
    `host-cpu-work` idle) is named, not replayed: the change would leave the larger part."""
    return cause == "host-wait" and not graph_launches


def _idle_cause(
    loader_us: float, idle: float, rest_host: float, rest_other: float, rest_unknown: float
) -> str:
    """The cause that explains most of the idle time: the DataLoader wait when it covers half
    of it, else host-wait or other when one dominates the gaps whose launch is known."""
    if idle > 0 and loader_us >= 0.5 * idle:
        return "dataloader"
    known = rest_host + rest_other
    if rest_unknown > known:
        return "launch-unknown"
    if known <= 0:
        return "mixed"
    if rest_host >= DOMINANT_SHARE * known:
        return "host-wait"
    if rest_other >= DOMINANT_SHARE * known:
        return "other"
    return "mixed"


# --------------------------------------------------------------------------------- advise


def advise(model: TraceModel, ev: IdleEvidence, verdict: IdleJudgement) -> Finding:
    """The finding: its evidence, title, recommendation, snippet and bound."""
    evidence = _evidence(ev, verdict)
    rec, snippet = _recommendation(model, ev, verdict, evidence)
    return Finding(
        id=RULE_ID,
        title=_title(model, ev, verdict),
        evidence=evidence,
        recommendation=rec,
        snippet=snippet,
        precondition=(
            "Launch-overhead fixes help when the host cannot issue work as fast as the GPU "
            "runs it (many short kernels, host-wait gaps); CUDA graphs need static shapes and "
            "no host synchronisation inside the captured region. Host time no thread spends "
            "launching is removed only by moving or cutting that work. Dependency gaps are "
            "fixed by reordering or removing the waits, not by faster launching."),
        estimated_saving_pct=ev.bound_pct,
        saving_basis=(
            f"upper bound: the idle time of the busiest GPU (device {ev.device}) inside the "
            "steps, less the part during which the host waited on the DataLoader (that is "
            "dataloader-bound's saving, not counted twice), if the GPU were kept busy through "
            "every remaining gap; the step can never get shorter than that GPU's busy time"
        ),
        docs=IDLE_DOCS,
    )


def _evidence(ev: IdleEvidence, verdict: IdleJudgement) -> dict[str, Any]:
    n, total, idle = ev.steps, ev.step_us, ev.idle_us
    host_us, other_us, unknown_us = ev.by_gap_kind
    detail = dict(ev.detail)
    out: dict[str, Any] = {
        "device": ev.device,
        "idle_share_pct": ev.idle_pct,
        "idle_ms_per_step": ms(idle / n),
        "host_wait_share_pct": pct(host_us, total),
        "other_share_pct": pct(other_us, total),
        "launch_unknown_share_pct": pct(unknown_us, total),
        "host_wait_pct_of_idle": pct(host_us, idle),
        "idle_during_dataloader_pct": pct(ev.loader_us, idle),
        "idle_during_sync_pct": pct(ev.sync_us, idle),
        "unexplained_idle_share_pct": pct(sum(ev.rest), total),
        **{k: detail.pop(k) for k in ("gaps_per_step", "median_host_wait_gap_us",
                                      "kernels_per_step", "median_kernel_us", "largest_gaps")},
        "steps": n,
        **detail,
    }
    if ev.rows:
        out.update(_thread_evidence(ev, verdict))
    if ev.regions:
        out["host_wait_under"] = [dict(r) for r in ev.regions]
    out["dominant_cause"] = verdict.cause
    return out


def _thread_evidence(ev: IdleEvidence, verdict: IdleJudgement) -> dict[str, Any]:
    """The host-wait idle by what every thread did: per kind, per thread, per (thread, op)."""
    n = ev.steps
    names = _thread_names(ev.rows)
    by_thread: dict[str, float] = {}
    for r in ev.rows:
        by_thread[names[r.tid]] = by_thread.get(names[r.tid], 0.0) + r.us
    out: dict[str, Any] = {
        "launch_work_ms_per_step": ms(verdict.launch_us / n),
        "launch_work_share_pct": pct(verdict.launch_us, ev.step_us),
        "host_wait_ms_per_step_by_kind": {k: ms(v / n) for k, v in ev.host_kinds.items()
                                          if ms(v / n) > 0},
        "idle_ms_per_step_by_thread": {t: ms(us / n) for t, us in sorted(
            by_thread.items(), key=lambda kv: -kv[1]) if ms(us / n) > 0},
        "idle_by_thread_op": [{"thread": names[r.tid], "op": r.op[:100], "kind": r.kind,
                               "ms_per_step": ms(r.us / n)} for r in ev.rows[:TOP_ROWS]],
    }
    if ev.graph_launches:
        out["cuda_graph_launches_per_step"] = round(ev.graph_launches / n, 1)
    if verdict.not_launch_us > 0:
        out["cpu_work_share_pct"] = pct(verdict.not_launch_us, ev.step_us)
        out["cpu_work_ms_per_step"] = ms(verdict.not_launch_us / n)
        out["cpu_work_ops"] = [{"op": r.op[:100], "thread": names[r.tid],
                                "ms_per_step": ms(r.us / n)}
                               for r in _not_launch_rows(ev)[:5]]
    return out


def _thread_names(rows: tuple[ThreadShare, ...]) -> dict[str, str]:
    """tid -> the thread in words: its role, with its id when two threads share one."""
    roles: dict[str, set[str]] = {}
    for r in rows:
        roles.setdefault(r.thread, set()).add(r.tid)
    return {r.tid: r.thread if len(roles[r.thread]) == 1 else f"{r.thread} {r.tid}"
            for r in rows}


def _not_launch_rows(ev: IdleEvidence) -> list[ThreadShare]:
    return [r for r in ev.rows if r.kind in NOT_LAUNCH and ev.has_host_ops and r.us > 0]


def _describe(r: ThreadShare, names: dict[str, str]) -> str:
    """One (thread, op) row in words, for a title or a recommendation."""
    if r.kind == "pin-memory":
        return f"held by the pin-memory thread after its {r.op}"
    if r.op.startswith("(no recorded op, after "):
        return f"the {names[r.tid]} recording nothing after {r.op[23:-1]}"
    if r.op.startswith("("):
        return "Python code or untraced work"
    return r.op if r.kind != "python" else f"Python {r.op}"


def _named(ev: IdleEvidence, most: int = 2) -> list[str]:
    """The largest parts of the host time no thread spent launching, in words: those at least
    NAMED_SHARE of the largest."""
    rows = _not_launch_rows(ev)
    names = _thread_names(ev.rows)
    kept = [r for r in rows[:most] if rows and r.us >= NAMED_SHARE * rows[0].us]
    return list(dict.fromkeys(_describe(r, names) for r in kept))


def _by_thread_words(ev: IdleEvidence, kind: str, most: int = 2) -> str:
    """`autograd engine 3.6 ms, stepping thread 1.4 ms`: a kind's time per thread, largest
    first."""
    names = _thread_names(ev.rows)
    per: dict[str, float] = {}
    for r in ev.rows:
        if r.kind == kind:
            per[names[r.tid]] = per.get(names[r.tid], 0.0) + r.us
    top = sorted(per.items(), key=lambda kv: -kv[1])[:most]
    return ", ".join(f"{t} {millis(ms(us / ev.steps))} ms" for t, us in top
                     if ms(us / ev.steps) > 0)


def _title(model: TraceModel, ev: IdleEvidence, verdict: IdleJudgement) -> str:
    word = step_word(model.workload)
    host, other, _ = ev.rest
    cause = verdict.cause
    outside = " outside the CUDA graphs it launches" if ev.graph_launches else ""
    if cause == "host-wait":
        threads = _by_thread_words(ev, "launch") if ev.has_host_ops else ""
        suffix = (f", waiting for the host to launch work{outside}"
                  + (f" ({threads} per {word}" if threads else ""))
        if threads and verdict.not_launch_us >= NAMED_SHARE * (
                verdict.launch_us + verdict.not_launch_us):
            top = _not_launch_rows(ev)[0]
            suffix += (f"; {millis(ms(verdict.not_launch_us / ev.steps))} ms with no thread "
                       f"launching, the most {_named(ev, 1)[0]} "
                       f"{millis(ms(top.us / ev.steps))} ms")
        suffix += ")" if threads else ""
    elif cause == "host-cpu-work":
        named = _named(ev)
        suffix = (f", while the host does work that launches nothing{outside}"
                  + (f" ({', '.join(named)})" if named else ""))
    else:
        suffix = {
            "dataloader": ", mostly while the host waits for the DataLoader",
            "other": ", with work queued behind dependencies or after the step's last kernel",
            "launch-unknown": "",
            "mixed": (f": {percent(pct(host, ev.step_us))} waiting for the host's launches"
                      f"{_region_words(ev, word, ' (the host in ')}, "
                      f"{percent(pct(other, ev.step_us))} with work queued behind dependencies"),
            "host-optimizer": _region_words(ev, word),
            "allocator": _region_words(ev, word),
        }[cause]
    return f"The GPU is idle {percent(ev.idle_pct)} of each {word}{suffix}"


def _region_words(ev: IdleEvidence, word: str, lead: str = ", while the host is busy in ") -> str:
    if not ev.regions:
        return ""
    named = ", ".join(f"{r['region']} {millis(r['ms_per_step'])} ms per {word}"
                      for r in ev.regions[:2])
    return f"{lead}{named}" + (")" if lead.endswith("(the host in ") else "")


def _recommendation(model: TraceModel, ev: IdleEvidence, verdict: IdleJudgement,
                    evidence: dict[str, Any]) -> tuple[str, str]:
    """The recommendation and its snippet, by cause, then what else the evidence says."""
    host, other, _ = ev.rest
    host_part, other_part = _parts(ev, evidence)
    launch, dependency = _launch_words(model), _DEPENDENCY_WORDS
    fits_launch = host >= other
    cause = verdict.cause
    if cause == "host-cpu-work":
        rec, snippet = _cpu_work_advice(model, ev, verdict)
    elif cause in ("host-optimizer", "allocator"):
        rec, snippet = _region_advice(cause, evidence)
    elif cause == "host-wait":
        rec = f"The idle time is mostly {host_part}.{_launch_threads(ev, verdict)} " + (
            _outside_graphs(ev) if ev.graph_launches else launch)
        snippet = (_outside_graphs_snippet(ev) if ev.graph_launches
                   else _launch_snippet(model))
    elif cause == "other":
        rec, snippet = f"The idle time is mostly {other_part}. {dependency}", _DEPENDENCY_SNIPPET
    elif cause in ("dataloader", "launch-unknown"):
        lead = (f"{percent(evidence['idle_during_dataloader_pct'], 0)} of the GPU's idle time "
                "is the host waiting for the next batch: that cause and its fix are reported "
                "by `dataloader-bound`. The rest "
                f"({percent(evidence['unexplained_idle_share_pct'])} of step time) is mostly "
                if cause == "dataloader" else
                f"{percent(evidence['launch_unknown_share_pct'])} of step time is idle before "
                "GPU work whose launching runtime call is not in the trace, so host-wait "
                "cannot be told from a dependency wait; of the gaps whose launch is known, "
                "most are ")
        rec = lead + (f"{host_part}. {launch}" if fits_launch else f"{other_part}. {dependency}")
        snippet = _launch_snippet(model) if fits_launch else _DEPENDENCY_SNIPPET
    else:
        rec = f"The idle time splits between {host_part} and {other_part}. {launch} {dependency}"
        snippet = _launch_snippet(model)
    return rec + _also(ev, cause, evidence), snippet


def _parts(ev: IdleEvidence, evidence: dict[str, Any]) -> tuple[str, str]:
    host, other, _ = ev.rest
    n = ev.steps
    return (
        f"host-wait gaps ({millis(ms(host / n))} ms per step: the next kernel was launched "
        f"only after the GPU ran dry; {evidence['kernels_per_step']:.0f} kernels per step, "
        f"median {evidence['median_kernel_us']} us)",
        f"gaps with work already queued ({millis(ms(other / n))} ms per step: it waited on a "
        "stream/event dependency or another device, or the step ended before the next "
        "launch)",
    )


def _launch_words(model: TraceModel) -> str:
    if has(model, (2, 0)):
        fewer = ("launch fewer, larger kernels (torch.compile fuses elementwise ops; "
                 "mode=\"reduce-overhead\" also replays the step as a CUDA graph, removing "
                 "per-kernel launch cost)")
    elif has(model, (1, 10)):
        fewer = ("launch fewer, larger kernels (this torch has CUDA graphs, "
                 "torch.cuda.make_graphed_callables, which remove per-kernel launch cost; "
                 "torch.compile needs torch 2.0)")
    else:
        fewer = ("launch fewer, larger kernels (torch.compile and CUDA graphs need a newer "
                 "torch than the one that recorded this trace: 2.0 and 1.10)")
    return (f"Keep the GPU fed: {fewer}, raise the batch size so each kernel does more work, "
            "and remove host work between launches (Python-side bookkeeping, .item()/.cpu() "
            "calls).")


_DEPENDENCY_WORDS = (
    "Look for what the queued work waited on: cudaStreamWaitEvent/wait_stream between "
    "streams, a synchronising call before the next launch, or a peer device; move waits as "
    "late as possible and keep independent work launched ahead of them.")


def _launch_threads(ev: IdleEvidence, verdict: IdleJudgement) -> str:
    """Which threads launched, and the host-wait time no thread spent launching."""
    if not ev.has_host_ops or verdict.launch_us <= 0:
        return ""
    out = (f" Counted over every thread of the process, {millis(ms(verdict.launch_us / ev.steps))}"
           f" ms per step of it is launch work ({_by_thread_words(ev, 'launch', 3)})")
    if verdict.not_launch_us > 0:
        names = _thread_names(ev.rows)
        top = _not_launch_rows(ev)[0]
        out += (f"; {millis(ms(verdict.not_launch_us / ev.steps))} ms is host time no thread "
                f"spent launching (the most: {_describe(top, names)}, "
                f"{millis(ms(top.us / ev.steps))} ms)")
        if verdict.not_launch_us >= NAMED_SHARE * (verdict.launch_us + verdict.not_launch_us):
            return out + ". " + _hint(top)[0]
    return out + "."


def _outside_graphs(ev: IdleEvidence) -> str:
    """A step that already replays CUDA graphs: what is left outside them."""
    n = ev.steps
    graphed = ev.host_kinds.get("graphed", 0.0)
    outside = [r for r in ev.rows if r.kind == "launch"][:3]
    return (
        f"The step already launches {ev.graph_launches / n:.1f} CUDA graphs per step: "
        f"{millis(ms(graphed / n))} ms per step of the idle falls under the host ops that "
        "launch them (their own host work, not launch overhead the graphs could remove), and "
        "the launch work left is outside them ("
        + ", ".join(f"{r.op} {millis(ms(r.us / n))} ms" for r in outside)
        + "). Capture more of the step (the loss, the optimizer step) or launch fewer kernels "
        "outside the graphs.")


def _outside_graphs_snippet(ev: IdleEvidence) -> str:
    opt = next((m.group(1) for r in ev.rows if (m := OPTIMIZER_STEP.match(r.op))), None)
    return (
        "# the step already replays CUDA graphs: bring what stays outside into the compiled\n"
        "# region, the loss with the model:\n"
        "@torch.compile(mode=\"reduce-overhead\")\n"
        "def forward_loss(x, y):\n"
        "    return torch.nn.functional.cross_entropy(model(x), y)\n"
        + (f"# and the optimizer's step as one kernel:\noptimizer = torch.optim.{opt}("
           "model.parameters(), lr=lr, fused=True)" if opt else ""))


def _cpu_work_advice(model: TraceModel, ev: IdleEvidence,
                     verdict: IdleJudgement) -> tuple[str, str]:
    """Host time during which no thread launched: what it was, and what names or moves it."""
    n = ev.steps
    names = _thread_names(ev.rows)
    rows = _not_launch_rows(ev)
    listed = "; ".join(f"{_describe(r, names)} {millis(ms(r.us / n))} ms" for r in rows[:4])
    rec = (
        f"For {millis(ms(verdict.not_launch_us / n))} ms per step "
        f"({percent(pct(verdict.not_launch_us, ev.step_us))} of step time) the GPU had nothing "
        f"to run while no thread of the process was launching work (per step: {listed}). That "
        "time is not launch overhead: CUDA graphs, torch.compile or fewer kernels would not "
        "remove it. ")
    words, snippet = _hint(rows[0] if rows else None)
    rec += words
    if ev.has_host_ops and verdict.launch_us >= NAMED_SHARE * verdict.not_launch_us > 0:
        rec += (f" The other {millis(ms(verdict.launch_us / n))} ms per step of host-wait idle is "
                f"launch work ({_by_thread_words(ev, 'launch', 3)}), which fewer, larger "
                "launches (CUDA graphs, torch.compile) remove; they leave the larger part above.")
    return rec, snippet


def _hint(top: ThreadShare | None) -> tuple[str, str]:
    """What names or removes the largest part of the host time no thread spent launching."""
    opt = OPTIMIZER_STEP.match(top.op) if top is not None else None
    if top is not None and top.kind == "pin-memory":
        return _PIN_WORDS, _PIN_SNIPPET
    if opt is not None:
        return (f"The largest part is {opt.group(1)}.step()'s own host time between its "
                "kernels: a torch optimizer takes fused=True (one kernel per parameter group) "
                "or foreach=True; time the step alone to confirm.",
                f"optimizer = torch.optim.{opt.group(1)}(model.parameters(), lr=lr, "
                "fused=True)  # or foreach=True")
    if top is None or top.kind == "untraced":
        after = (top.op[23:-1] if top is not None
                 and top.op.startswith("(no recorded op, after ") else None)
        return ("Nothing in the trace names it" + (
            f": the thread records nothing after {after} until its next op" if after else "")
            + ". Record a few steps with Python stacks (with_stack=True) to see which code "
            "runs there, then move it off the step's critical path.", _STACK_SNIPPET)
    return ("Take that work off the critical path: do preprocessing, tokenisation and image "
            "processing in the Dataset or collate_fn so DataLoader workers (num_workers > 0) "
            "prepare the next batch while the GPU runs this one, precompute it once, or move it "
            "onto the GPU.", _CPU_WORK_SNIPPET)


_PIN_WORDS = (
    "The DataLoader's pin-memory thread (pin_memory=True) is a Python thread: while it holds "
    "the interpreter, the stepping thread's Python cannot run, and the process records "
    "nothing until it lets go, right after the pin-memory thread's runtime calls. Pinned "
    "copies can still win overall: time the loop plainly with pin_memory=True and False "
    "before choosing.")
_PIN_SNIPPET = (
    "# time both plainly; the pin-memory thread shares the interpreter with the step\n"
    "loader = torch.utils.data.DataLoader(dataset, batch_size=bs, num_workers=workers,\n"
    "                                     pin_memory=False)  # against pin_memory=True\n"
    "for x, y in loader:\n"
    "    x = x.to(device, non_blocking=True)"
)
_STACK_SNIPPET = (
    "# name the host time the trace leaves untraced: a few steps with Python stacks\n"
    "from torch.profiler import ProfilerActivity, profile, schedule\n"
    "with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True,\n"
    "             schedule=schedule(wait=5, warmup=2, active=3)) as prof:\n"
    "    for step, batch in zip(range(10), loader):\n"
    "        train_step(batch)\n"
    "        prof.step()\n"
    "prof.export_chrome_trace(\"stacks.pt.trace.json\")  # its python_function events name it"
)
_CPU_WORK_SNIPPET = (
    "# Do per-sample CPU work in the Dataset, where DataLoader workers run it in parallel\n"
    "class Prepared(torch.utils.data.Dataset):\n"
    "    def __getitem__(self, i):\n"
    "        return preprocess(self.raw[i])  # tokenise / decode / resize here\n"
    "loader = torch.utils.data.DataLoader(Prepared(raw), batch_size=bs, num_workers=4,\n"
    "                                     pin_memory=True, persistent_workers=True)\n"
    "for batch in loader:  # no preprocessing between here and the model call\n"
    "    out = model(batch.to(device, non_blocking=True))"
)
_DEPENDENCY_SNIPPET = (
    "# Find what the queued work waits on: cross-stream waits, events, other devices\n"
    "# e.g. do not make the compute stream wait on a side stream before it must:\n"
    "with torch.cuda.stream(side):\n"
    "    batch = batch.to(device, non_blocking=True)\n"
    "...  # independent compute here\n"
    "torch.cuda.current_stream().wait_stream(side)  # wait as late as possible\n"
    "batch.record_stream(torch.cuda.current_stream())"
)


def _also(ev: IdleEvidence, cause: str, evidence: dict[str, Any]) -> str:
    """What else the evidence says: host regions under the idle, waits on the GPU."""
    out = ""
    if ev.graph_launches and cause != "host-wait":
        out += " " + _outside_graphs(ev)
    if ev.regions and cause not in ("host-optimizer", "allocator"):
        out += " Of the host-wait idle, " + "; ".join(
            f"{percent(r['pct_of_host_wait'], 0)} ({millis(r['ms_per_step'])} ms per step) falls "
            f"inside {r['region']}" for r in ev.regions) + (
            ": host work that CUDA graphs and torch.compile do not remove (an optimizer's own "
            "host computation, device allocations).")
    if evidence["idle_during_sync_pct"] >= 25.0:
        out += (
            f" During {percent(evidence['idle_during_sync_pct'], 0)} of the idle time the host "
            "was blocked waiting on the GPU while the GPU had nothing running: the queued work "
            "waited on something outside this process's GPU timeline (another rank, another "
            "stream's event): see host-device-sync and rank-imbalance.")
    return out


def _region_advice(cause: str, ev: dict[str, Any]) -> tuple[str, str]:
    """What helps when the host-wait idle sits under the optimizer step or allocator calls."""
    top = ev["host_wait_under"][0]
    share = (f"{percent(top['pct_of_host_wait'], 0)} of the GPU's host-wait idle "
             f"({millis(top['ms_per_step'])} ms per step) falls inside {top['region']}")
    if cause == "allocator":
        rec = (f"{share}: the host is in device allocator calls while the GPU has nothing to "
               "run. Each cudaMalloc/cudaFree synchronises or stalls the host; the caching "
               "allocator makes them only when its cache misses or is emptied. Remove "
               "torch.cuda.empty_cache() (and memory-stat resets) from the loop, keep tensor "
               "shapes steady between steps, and let segments grow instead of being re-made.")
        snippet = (
            "# no torch.cuda.empty_cache() inside the training loop; let the allocator grow\n"
            "# segments instead of freeing and re-allocating them (before the first CUDA call):\n"
            "import os\n"
            "os.environ.setdefault(\"PYTORCH_CUDA_ALLOC_CONF\", \"expandable_segments:True\")")
        return rec, snippet
    name = OPTIMIZER_STEP.match(top["region"])
    opt = name.group(1) if name else top["region"]
    rec = (f"{share}: the optimizer's own host work, which CUDA graphs or torch.compile of the "
           f"model do not remove. Time {opt}.step() alone to confirm. A torch optimizer with a "
           "per-parameter loop takes foreach=True or fused=True; an optimizer whose host "
           "computation is long (Shampoo's preconditioner roots, second-order statistics) "
           "should update that state less often, compute it on the GPU, or overlap it with "
           "the next step.")
    if "shampoo" in opt.lower():
        snippet = ("# Distributed Shampoo: compute the preconditioners every N steps\n"
                   f"optimizer = {opt}(model.parameters(), lr=lr, precondition_frequency=100, "
                   "...)")
    else:
        snippet = ("# a built-in optimizer: one multi-tensor or fused kernel per step\n"
                   f"optimizer = torch.optim.{opt}(model.parameters(), lr=lr, fused=True)  "
                   "# or foreach=True")
    return rec, snippet


def _launch_snippet(model: TraceModel) -> str:
    """Fewer launches, spelled for the trace's torch: torch.compile from 2.0, CUDA graphs
    (make_graphed_callables) from 1.10, only a larger batch before that."""
    bigger = (
        "# and/or a larger batch per step, so each kernel does more work per launch:\n"
        "loader = torch.utils.data.DataLoader(dataset, batch_size=2 * batch_size, ...)"
    )
    if has(model, (2, 0)):
        return (
            f"{for_torch(model)}\n"
            "# Fewer, larger launches: fuse small ops and replay the step as a CUDA graph\n"
            "model = torch.compile(model, mode=\"reduce-overhead\")  # CUDA graphs + fusion\n"
            + bigger
        )
    if has(model, (1, 10)):
        return (
            f"{for_torch(model)} (torch.compile needs 2.0)\n"
            "# Replay the forward and backward as CUDA graphs (static shapes, no host sync):\n"
            "model = torch.cuda.make_graphed_callables(model, (sample_inputs,))\n" + bigger
        )
    return (
        f"{for_torch(model)}\n"
        "# torch.compile (2.0) and CUDA graphs (1.10) are not in this torch: upgrading gives\n"
        "# both. In this version, a larger batch per step makes each launch do more work:\n"
        "loader = torch.utils.data.DataLoader(dataset, batch_size=2 * batch_size, ...)"
    )



# ------------------------------------------------------------------------------- changes


def changes(finding: Finding, model: TraceModel) -> list[Change]:
    """The change by the idle's cause: launch overhead is what CUDA graphs remove, from torch
    1.10 (make_graphed_callables; torch.compile's reduce-overhead from 2.0), when the step
    does not launch graphs already (graphs_fit); allocator calls are what a steady caching
    allocator removes. Host work no thread spends launching, the optimizer's own host time,
    dependency gaps: none of these."""
    ev = finding.evidence or {}
    cause = ev.get("dominant_cause")
    if cause == "allocator":
        return [Change("allocator", "steady")]
    if graphs_fit(str(cause), int(ev.get("cuda_graph_launches_per_step", 0) > 0)) \
            and has(model, (1, 10)):
        return [Change("cuda_graphs", "true")]
    return []


def no_change(finding: Finding) -> str:
    ev = finding.evidence or {}
    cause = ev.get("dominant_cause")
    under = (ev.get("host_wait_under") or [{}])[0]
    if ev.get("cuda_graph_launches_per_step"):
        return (f"the step already launches {ev['cuda_graph_launches_per_step']} CUDA graphs "
                "per step: what is left outside them (the loss, the optimizer step, the "
                "fetch, the host ops that launch the graphs) is not one change the replay "
                "models")
    if cause == "host-optimizer":
        return (f"its host-wait idle sits under {under.get('region')} "
                f"({under.get('ms_per_step')} ms per step): the optimizer's own host work, "
                "whose change (fewer preconditioner updates, a fused or foreach "
                "implementation) the replay models only for torch's built-in for-loop "
                "optimizers (single-tensor-optimizer)")
    if cause == "host-wait":
        return "CUDA graphs need torch 1.10 or later; this trace's torch is older"
    if cause == "host-cpu-work":
        return ("the host time no thread spent launching (untraced Python, a pin-memory "
                "thread's hold, CPU ops) is the larger part and not a change the replay "
                "models; CUDA graphs would remove only the launch work beside it")
    if cause == "dataloader":
        return "its cause is the DataLoader wait: dataloader-bound's change"
    return ("its gaps wait on dependencies (other streams, events, peers) or mix causes: "
            "no single change the replay models removes them")


SPEC = RuleSpec(
    id=RULE_ID,
    title="the GPU sits idle inside the training step",
    summary="the GPU idles inside steps: host-wait (launch came late) vs other, per device; "
            "names what every host thread did meanwhile (the autograd engine's launches, a "
            "pin-memory thread's hold, the optimizer step, cudaMalloc/cudaFree) and replays "
            "CUDA graphs for launch overhead or a steady allocator",
    check=gpu_idle,
    thresholds={"IDLE_THRESHOLD_PCT": IDLE_THRESHOLD_PCT, "DOMINANT_SHARE": DOMINANT_SHARE,
                "CPU_WORK_MIN_GAP_US": CPU_WORK_MIN_GAP_US, "REGION_MIN_PCT": REGION_MIN_PCT,
                "REGION_CAUSE_PCT": REGION_CAUSE_PCT},
    what_if=("cuda_graphs", "allocator"),
    changes=changes,
    no_change=no_change,
    order=60,
    metric=Metric("GPU idle", MS, evidence_key("idle_ms_per_step"), "idle_share_pct"),
    causes=(Cause("dataloader-bound", "idle_during_dataloader_pct"),
            Cause("host-device-sync", "idle_during_sync_pct")),
    verdict_metric=("idle_share_pct", "gpu_idle_pct"),
    idle_time=True,
    per_device=True,
)

"""report.json's `memory` and the report's memory section: each device's peak against its
capacity, each DataLoader worker's RAM over the run, the machine's available memory and the
container's limit; "not assessed", with why, where the recording holds none of it.

Every figure here is measured: read from the trace's profile_memory events or `stallscope
run`'s samples (diagnose/device_memory.py, diagnose/memory.py), never predicted.
"""

from __future__ import annotations

from typing import Any

from stallscope.diagnose import memory as host_memory
from stallscope.diagnose.device_memory import DeviceMemory, device_memory, not_assessed
from stallscope.trace.model import TraceModel
from stallscope.units import fixed_size, percent


def size_text(nbytes: float) -> str:
    """A memory size in binary units, as the page's GPU line gives capacity: "11.9 GiB",
    "512 MiB"."""
    return fixed_size(nbytes, "GiB") if abs(nbytes) >= 1 << 30 else fixed_size(nbytes, "MiB", 0)


def trace_memory(model: TraceModel) -> dict[str, Any]:
    """One trace's memory, for its traces[] entry (report/digest.py)."""
    devices = [device_row(d) for d in device_memory(model)]
    facts = host_memory.facts(model.trace.capture)
    workers: list[dict[str, Any]] = []
    host = None
    host_reason = facts if isinstance(facts, str) else None
    if not isinstance(facts, str):
        workers = [{"pid": w.pid, "worker_id": w.worker_id, "loader": w.loader,
                    "unique_start_bytes": w.first_uss, "unique_end_bytes": w.last_uss,
                    "resident_bytes": w.last_rss, "seconds": round(w.seconds, 1)}
                   for w in facts.workers]
        host = _host(model.trace.capture.get("memory") or {}, facts)
    return {"devices": devices, "workers": workers, "host": host,
            "device_reason": None if devices else not_assessed(model),
            "host_reason": host_reason}


def device_row(d: DeviceMemory) -> dict[str, Any]:
    share = d.peak_share
    return {
        "device": d.device, "source": d.source, "relative_to_start": d.relative,
        "peak_allocated_bytes": d.peak_allocated, "peak_reserved_bytes": d.peak_reserved,
        "capacity_bytes": d.capacity,
        "peak_pct_of_capacity": round(100 * share, 1) if share is not None else None,
        "held_bytes": d.held, "transient_bytes": d.transient, "alloc_retries": d.retries,
        "ooms": d.ooms, "inactive_split_bytes": d.inactive_split, "samples": d.samples,
    }


def _host(mem: dict[str, Any], facts: host_memory.MemoryFacts) -> dict[str, Any]:
    machine = mem.get("machine") if isinstance(mem.get("machine"), dict) else {}
    avail = [a for a in (machine or {}).get("available_bytes") or [] if isinstance(a, int)]
    limit = mem.get("limit") if isinstance(mem.get("limit"), dict) else None
    return {"total_bytes": (machine or {}).get("total_bytes"),
            "available_min_bytes": min(avail) if avail else None,
            "limit_bytes": facts.limit_bytes,
            "limit_source": (limit or {}).get("source") if facts.limit_bytes else None,
            "job_bytes": facts.tree_bytes if facts.main_pss is not None else None}


def report_memory(traces: list[dict[str, Any]]) -> dict[str, Any]:
    """report.json's `memory` from the traces[] entries' own (`trace_memory`)."""
    devices, workers, hosts, reasons = [], [], [], []
    for t in traces:
        mem = t.get("memory") or {}
        devices += [{"trace": t["label"], **d} for d in mem.get("devices") or []]
        workers += [{"trace": t["label"], **w} for w in mem.get("workers") or []]
        if mem.get("host"):
            hosts.append({"trace": t["label"], **mem["host"]})
        if mem.get("device_reason"):
            reasons.append(mem["device_reason"])
    assessed = bool(devices or workers or hosts)
    out = {"status": "measured" if assessed else "not_assessed", "devices": devices,
           "workers": workers, "host": hosts[0] if hosts else None,
           "not_assessed": None if devices else (reasons[0] if reasons else None)}
    out["sentence"] = sentence(out, several=len(traces) > 1)
    return out


def sentence(mem: dict[str, Any], several: bool = False) -> str:
    """The section's one sentence: the device peak nearest its capacity, or why none."""
    if not mem["devices"]:
        why = mem["not_assessed"] or "no trace was given"
        text = f"Device memory not assessed: {why}."
    else:
        d = max(mem["devices"], key=lambda r: (r["peak_pct_of_capacity"] or -1.0,
                                              r["peak_allocated_bytes"] or 0))
        who = f"{d['device']} ({d['trace']})" if several else d["device"]
        text = device_sentence(d, who)
    host = mem.get("host")
    if host and mem["workers"]:
        n = len(mem["workers"])
        top = max(w["unique_end_bytes"] for w in mem["workers"])
        text += (f" {n} DataLoader worker{'s' if n != 1 else ''} held at most "
                 f"{size_text(top)} of their own at the end of the run (measured)")
        budget = host.get("limit_bytes")
        text += (f", under a container limit of {size_text(budget)}." if budget
                 else ", with no container limit.")
    return text


def device_sentence(d: dict[str, Any], who: str) -> str:
    if d["relative_to_start"]:
        cap = f"its {size_text(d['capacity_bytes'])} capacity" if d["capacity_bytes"] else (
            "its capacity")
        return (f"{who}'s allocations rose by at most "
                f"{size_text(d['peak_allocated_bytes'] or 0)} above where they stood when the "
                "recording started (measured from the trace's memory events, which carry each "
                "allocation's size but not the device's total), so its peak against "
                f"{cap} is not assessed.")
    peak = d["peak_reserved_bytes"] or d["peak_allocated_bytes"] or 0
    kind = "reserved" if d["peak_reserved_bytes"] else "allocated"
    text = f"{who} peaked at {size_text(peak)} {kind}"
    if d["peak_reserved_bytes"] and d["peak_allocated_bytes"] is not None:
        text += f" ({size_text(d['peak_allocated_bytes'])} allocated)"
    if d["peak_pct_of_capacity"] is not None:
        text += (f", {percent(d['peak_pct_of_capacity'], 0)} of its "
                 f"{size_text(d['capacity_bytes'])}")
    text += f", measured from {d['source']}"
    if d["alloc_retries"] or d["ooms"]:
        text += (f"; the allocator retried {d['alloc_retries'] or 0} times after freeing its "
                 f"cache and raised {d['ooms'] or 0} out-of-memory errors")
    return text + "."


MAX_ROWS = 8  # device and worker rows the page and report.md show; report.json has every one


def device_items(mem: dict[str, Any], several: bool = False) -> list[str]:
    """One line per device for report.md (and the page's table rows, as cells): its peaks,
    capacity, what is held across steps and the step's transient peak."""
    rows = sorted(mem.get("devices") or [], key=lambda r: -(r["peak_pct_of_capacity"] or 0))
    return [_device_item(r, several) for r in rows[:MAX_ROWS]]


def device_cells(r: dict[str, Any]) -> dict[str, str]:
    """A device row as the page's table shows it."""
    def size(key: str) -> str:
        return size_text(r[key]) if r[key] is not None else "-"

    above = " (above the start)" if r["relative_to_start"] else ""
    return {"device": r["device"], "trace": r["trace"],
            "allocated": size("peak_allocated_bytes") + above,
            "reserved": size("peak_reserved_bytes"), "capacity": size("capacity_bytes"),
            "share": percent(r["peak_pct_of_capacity"], 0, missing="-"),
            # Held relative to the start says nothing alone; the transient peak above it does.
            "held": "-" if r["relative_to_start"] else size("held_bytes"),
            "transient": size("transient_bytes"),
            "retries": "-" if r["alloc_retries"] is None else
            f"{r['alloc_retries']} / {r['ooms'] or 0}",
            "source": r["source"]}


def _device_item(r: dict[str, Any], several: bool) -> str:
    c = device_cells(r)
    who = f"{c['device']} ({c['trace']})" if several else c["device"]
    text = f"{who}: peak {size_text(r['peak_allocated_bytes'] or 0)} allocated" + (
        " above the recording's start" if r["relative_to_start"] else "")
    if r["peak_reserved_bytes"] is not None:
        text += f", {c['reserved']} reserved"
    if r["capacity_bytes"] is not None:
        text += f", of {c['capacity']}" + (f" ({c['share']})" if r["peak_pct_of_capacity"]
                                           is not None else "")
    if r["held_bytes"] is not None and not r["relative_to_start"]:
        text += f"; held across steps {c['held']}"
    if r["transient_bytes"] is not None:
        text += f"; the step's transient peak {c['transient']}"
    if r["alloc_retries"] is not None:
        text += f"; allocator retries / out-of-memory errors {c['retries']}"
    return text + f" (measured, {r['source']})"


def worker_items(mem: dict[str, Any], several: bool = False) -> list[str]:
    """One line per DataLoader worker: its own memory at its first and last sample."""
    rows = sorted(mem.get("workers") or [], key=lambda w: -w["unique_end_bytes"])
    return [(f"{w['trace']}: " if several else "")
            + f"worker {w['worker_id'] if w['worker_id'] is not None else '?'} "
            f"(pid {w['pid']}): own memory {size_text(w['unique_start_bytes'])} -> "
            f"{size_text(w['unique_end_bytes'])} over {w['seconds']} s, resident "
            f"{size_text(w['resident_bytes'])} (measured)" for w in rows[:MAX_ROWS]]


def host_item(mem: dict[str, Any]) -> str | None:
    """The machine's memory in one line, where `run` sampled it."""
    h = mem.get("host")
    if not h:
        return None
    parts = []
    if h["job_bytes"] is not None:
        parts.append(f"the job held {size_text(h['job_bytes'])}")
    if h["available_min_bytes"] is not None:
        parts.append(f"the machine had {size_text(h['available_min_bytes'])} available at "
                     "the least" + (f" of {size_text(h['total_bytes'])}" if h["total_bytes"]
                                    else ""))
    parts.append(f"container limit {size_text(h['limit_bytes'])} ({h['limit_source']})"
                 if h["limit_bytes"] else "no container limit")
    return "Host memory: " + ", ".join(parts) + " (measured)."

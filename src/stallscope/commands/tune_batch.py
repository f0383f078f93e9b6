"""`tune --batch-sizes`: which batch sizes tune measures, the memory each run peaked at, and
which would not fit.

Why: a larger batch keeps the cores or the device busier per step, so its samples per second may
rise, but every sample of it is held at once: the batch, the step's activations, their gradients.
Lightning's batch-size finder grows the batch until the run fails; here a candidate runs only
when its predicted peak fits. Each measured run's peak is split, over the batch sizes measured so
far, into what the run holds whatever the batch (the interpreter and its libraries, the model,
the optimiser's state: `held`) and what grows with it (`per sample`), the line through the two
largest sizes measured (`fit_line` says why those); the line at a candidate's size is set
against MARGIN of the memory
the job may use: the container's limit where there is one (read as `worker-memory` reads it,
`STALLSCOPE_MEMORY_LIMIT_FILE` included), else the memory available on the machine before the
run. From one batch size alone the peak is taken as proportional to the batch (nothing held):
an upper bound for a larger batch, so a refusal then may be one a second size would lift.

A run's host peak is the training process's resident high-water mark (the kernel's, so a step's
transient allocations between two sweeps of the sampler count) plus each DataLoader worker's
largest unique memory (its shared pages are the training process's); the device's is its
largest peak reserved (else allocated) over the recorded steps, against its capacity.

Samples per second, not steps per second, compare batch sizes: a larger batch takes a longer
step. And the fastest batch is not the best training: the learning rate (and its warm-up) that
suits one batch size does not suit another, so a change of batch size is a change to the
training, to be validated as one (CAVEAT).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stallscope.capture.memory import container_limit, meminfo
from stallscope.diagnose.memory import MARGIN

# `--batch-sizes auto`: half, twice and four times the script's own batch size.
AUTO_FACTORS = (0.5, 2.0, 4.0)
CAVEAT = ("the learning rate follows the batch size (scale it with the batch, or re-tune it, "
          "and its warm-up): the batch with the most samples per second is not the best "
          "training until the loss curve says so")
MB = 1 << 20


@dataclass(frozen=True)
class Asked:
    """`--batch-sizes`: the sizes asked for, or None for AUTO_FACTORS of the script's."""

    sizes: tuple[int, ...] | None = None


def parse_sizes(text: str) -> Asked:
    """`--batch-sizes`: "auto" or whole numbers, comma-separated. Raises ValueError with what
    is wrong."""
    if text.strip().lower() == "auto":
        return Asked(None)
    sizes = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) < 1:
            raise ValueError(f"{part!r} is not a batch size: give whole numbers >= 1, "
                             "comma-separated (e.g. 16,64), or auto")
        sizes.append(int(part))
    return Asked(tuple(sorted(set(sizes))))


def candidate_sizes(asked: Sequence[int] | None, current: int) -> list[int]:
    """The batch sizes to try beside the script's `current`, smallest first: a smaller size
    measured first gives the fit its second point before any larger one is judged."""
    sizes = ([max(1, int(current * f)) for f in AUTO_FACTORS] if asked is None else asked)
    return sorted({b for b in sizes if b != current})


@dataclass(frozen=True)
class Peak:
    """One run's peak memory, measured (bytes; None where not measured)."""

    host_bytes: int | None
    device_bytes: int | None = None
    device_capacity_bytes: int | None = None

    def as_json(self) -> dict[str, int | None]:
        return {"host_bytes": self.host_bytes, "device_bytes": self.device_bytes,
                "device_capacity_bytes": self.device_capacity_bytes}


def run_peak(mem: Mapping[str, Any] | None) -> Peak | None:
    """The peak of a run's trace metadata `memory` (capture/memory.py); None without one."""
    if not isinstance(mem, Mapping) or "off" in mem:
        return None
    host = None
    procs = [p for p in mem.get("processes") or [] if isinstance(p, Mapping)]
    main = next((p for p in procs if p.get("role") == "main"), None)
    if main is not None:
        rss: list[int] = [v for v in main.get("rss_bytes") or [] if isinstance(v, int)]
        peak = main.get("peak_rss_bytes")
        main_peak = max([*rss, peak if isinstance(peak, int) else 0])
        workers = [max((v for v in p.get("uss_bytes") or [] if isinstance(v, int)), default=0)
                   for p in procs if p.get("role") == "worker"]
        host = main_peak + sum(workers) if main_peak > 0 else None
    steps = [s for s in mem.get("device") or [] if isinstance(s, Mapping)]
    device = [s.get("peak_reserved_bytes") or s.get("peak_allocated_bytes") for s in steps]
    capacity: list[int] = [s["total_bytes"] for s in steps
                           if isinstance(s.get("total_bytes"), int)]
    top = max((d for d in device if isinstance(d, int)), default=None)
    if host is None and top is None:
        return None
    return Peak(host, top, max(capacity) if capacity else None)


@dataclass(frozen=True)
class Fit:
    """Peak memory against the batch size: `held + per_sample * batch`, through the peaks of
    `sizes` (the two largest measured, or the one)."""

    held_bytes: float
    per_sample_bytes: float
    sizes: tuple[int, ...]

    @property
    def proportional(self) -> bool:
        """From one batch size: nothing held, all of it scaling (an upper bound above it)."""
        return len(self.sizes) < 2

    def at(self, batch: int) -> float:
        return self.held_bytes + self.per_sample_bytes * batch

    def as_json(self) -> dict[str, Any]:
        return {"held_bytes": round(self.held_bytes), "per_sample_bytes":
                round(self.per_sample_bytes), "batch_sizes": list(self.sizes),
                "proportional": self.proportional}


def fit_line(points: Sequence[tuple[int, int]]) -> Fit | None:
    """The line through (batch size, peak bytes) of the two largest sizes, each at its largest
    peak (its repeats). Not least squares over all: a peak is a high-water mark, the larger of
    the step's and anything else the process ever held (its start-up, the profiler's buffers),
    so at a small batch the step's part may not show and the curve is flat there (docs/usage.md
    has a measured case); the largest sizes are where the batch sets the peak, and nearest the
    sizes judged. Per sample
    never below zero (noise on a flat curve), held never below zero. One size: proportional.
    None without a point."""
    best: dict[int, int] = {}
    for batch, peak in points:
        if batch > 0 and peak > 0:
            best[batch] = max(peak, best.get(batch, 0))
    if not best:
        return None
    sizes = tuple(sorted(best))
    if len(sizes) == 1:
        return Fit(0.0, best[sizes[0]] / sizes[0], sizes)
    low, high = sizes[-2], sizes[-1]
    slope = max(0.0, (best[high] - best[low]) / (high - low))
    held = best[high] - slope * high if slope > 0 else max(best.values())  # flat: the top
    if held < 0:  # a line through the origin's side: all of it scales
        held, slope = 0.0, best[high] / high
    return Fit(held, slope, (low, high))


@dataclass(frozen=True)
class Limit:
    """What the job may use: its bytes and where that figure comes from."""

    bytes: int
    source: str

    def as_json(self) -> dict[str, Any]:
        return {"bytes": self.bytes, "source": self.source}


def host_limit(env: Mapping[str, str] | None = None,
               meminfo_path: str = "/proc/meminfo") -> Limit | None:
    """The container's limit (as the `worker-memory` rule reads it), else the memory available
    on the machine now, between runs; None when neither can be read."""
    limit = container_limit(env=env)
    if limit is not None:
        return Limit(int(limit["bytes"]), f"the container's limit ({limit['source']})")
    available = meminfo(meminfo_path).get("available")
    return Limit(available, "the memory available on the machine") if available else None


@dataclass(frozen=True)
class Prediction:
    """A batch size's predicted peak against a limit (`kind`: host or device memory)."""

    batch: int
    kind: str
    predicted_bytes: int
    limit: Limit
    fit: Fit
    # A batch no larger than one measured: at most that size's peak (a smaller batch holds no
    # more), the measured size; None: from the line.
    below: int | None = None

    @property
    def fits(self) -> bool:
        return self.predicted_bytes <= MARGIN * self.limit.bytes

    def text(self) -> str:
        how = (f"at most the peak measured at batch size {self.below}" if self.below else
               "proportional to the batch from batch size "
               f"{self.fit.sizes[0]} alone, an upper bound" if self.fit.proportional else
               f"{_mb(self.fit.held_bytes)} MB held + {self.fit.per_sample_bytes / MB:.2f} MB "
               f"per sample, through the peaks at batch sizes {self.fit.sizes[0]} and "
               f"{self.fit.sizes[1]}")
        verb = "fits within" if self.fits else "exceeds"
        return (f"batch size {self.batch}: {self.kind} peak predicted {_mb(self.predicted_bytes)}"
                f" MB ({how}), {verb} {round(100 * MARGIN)}% of {_mb(self.limit.bytes)} MB, "
                f"{self.limit.source}")

    def as_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "predicted_bytes": self.predicted_bytes,
                "limit": self.limit.as_json(), "margin": MARGIN, "fits": self.fits,
                "bounded_by_batch_size": self.below,
                "fit": self.fit.as_json(), "text": self.text()}


def predict(batch: int, points: Sequence[tuple[int, int]], limit: Limit | None,
            kind: str) -> Prediction | None:
    """`batch`'s peak from the measured `points` against `limit`; None when either is
    missing (nothing to judge: the candidate runs)."""
    fit = fit_line(points)
    if fit is None or limit is None:
        return None
    above = [(b, p) for b, p in points if b >= batch]
    if above:  # within what was measured: the nearest larger size's peak bounds it
        b = min(b for b, _ in above)
        return Prediction(batch, kind, max(p for s, p in above if s == b), limit, fit, b)
    return Prediction(batch, kind, round(fit.at(batch)), limit, fit)


def judge(batch: int, host: Sequence[tuple[int, int]], host_lim: Limit | None,
          device: Sequence[tuple[int, int]], device_lim: Limit | None
          ) -> tuple[list[Prediction], str | None]:
    """Each prediction for `batch` (host, then device), and the reason to refuse it: the first
    prediction that does not fit; None when it fits or cannot be judged."""
    found = [p for p in (predict(batch, host, host_lim, "host memory"),
                         predict(batch, device, device_lim, "device memory")) if p is not None]
    over = next((p for p in found if not p.fits), None)
    return found, (None if over is None else f"would not fit: {over.text()}")


def _mb(value: float) -> int:
    return round(value / MB)

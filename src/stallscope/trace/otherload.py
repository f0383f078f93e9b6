"""Other load on the machine, read back from a trace's `host` metadata: whether other processes
took a material share of the cores while the steps were recorded.

`stallscope run` measures it in the training process (capture/hostload.py `other_load`) and
writes the figures into the trace's `stallscope` metadata (or the run facts' environment); this
module only reads them, so the replay and the rules judge them without importing the capture.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stallscope.units import percent

# Share of the cores' capacity (wall time x cores, over the recorded window) that processes
# outside this run took, from which the report says CPU-dependent advice is less certain.
# A quarter: on 2 cores, half a core taken away, enough to slow loading workers or intra-op
# threads sized to the cores; busy loops on every core read far above it.
OTHER_LOAD_PCT = 25.0
# Below this much of others' CPU over the window the share is mostly the reads' 10 ms ticks
# (one per core and per process at each end), so no note is made however large the share.
MIN_OTHER_CPU_US = 100_000.0


@dataclass(frozen=True)
class OtherLoad:
    """Material other load: the share of the cores' capacity others took, and on how many."""

    share_pct: float
    cores: int | None

    @property
    def clause(self) -> str:
        on = f"the {self.cores} core(s) this run may use" if self.cores else "the cores"
        return (f"other processes took {percent(self.share_pct, 0)} of the capacity of {on} while "
                "the steps were recorded")

    @property
    def note(self) -> str:
        """The report's one note about it."""
        return (
            f"Other load: {self.clause} (this run's processes excluded; threshold "
            f"{percent(OTHER_LOAD_PCT, 0)}). Advice that sizes CPU work to the cores (DataLoader "
            "workers, threads, the replay's worker predictions) assumes they are this run's: it is "
            "less certain here; re-record on a quiet machine to confirm."
        )

    @property
    def caveat(self) -> str:
        """A sentence for a finding's precondition or basis."""
        return (f"Lower confidence: {self.clause}, so fewer cores were free than this advice "
                "assumes; re-measure on a quiet machine.")


def load_from(host: dict[str, Any]) -> OtherLoad | None:
    share = host.get("other_cpu_share_pct")
    if not isinstance(share, int | float) or isinstance(share, bool) or share < OTHER_LOAD_PCT:
        return None
    other = host.get("other_cpu_us")
    if isinstance(other, int | float) and other < MIN_OTHER_CPU_US:
        return None
    cores = host.get("load_cores")
    return OtherLoad(float(share), cores if isinstance(cores, int) and cores > 0 else None)

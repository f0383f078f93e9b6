"""Record `cpu-persistent-workers.pt.trace.json.gz`: the control for `cpu-worker-startup`, the
same loop with `DataLoader(..., persistent_workers=True)`. The workers are forked once; at the
next epoch boundaries the iterator is only reset (no seed ops, no fork), so the trace shows no
new iterator. Run from the repository root:

    python sample_traces/record_cpu_persistent_workers.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from record_cpu_worker_startup import HERE, record  # noqa: E402

if __name__ == "__main__":
    record(persistent=True, out=HERE / "cpu-persistent-workers.pt.trace.json.gz")

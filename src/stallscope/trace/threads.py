"""Which thread of the stepping process does what: the thread that steps, the autograd engine's
thread (it runs `loss.backward()` and launches the backward's kernels while the stepping thread
waits), a DataLoader pin-memory thread, and the rest.

Told apart by what each thread records rather than by thread-name metadata, which a trimmed or
re-exported trace may lose: the autograd engine runs `autograd::engine::evaluate_function: ...`
ops (older torch: the nodes alone, `MmBackward`); a pin-memory thread launches nothing and
makes the host allocator's and pinning's runtime calls (`cudaPointerGetAttributes` to ask
whether a tensor is pinned, `cudaHostAlloc`) or records the pinning ops themselves.
"""

from __future__ import annotations

import re

import numpy as np

from stallscope.trace.model import TraceModel
from stallscope.trace.names import name_flags, name_mask, regex_hit

STEPPING, AUTOGRAD, PIN_MEMORY, OTHER = (
    "stepping thread", "autograd engine", "pin-memory thread", "other thread")
# In this order a thread's launch work is named when several threads launch at once.
ROLE_ORDER = (STEPPING, AUTOGRAD, OTHER, PIN_MEMORY)
AUTOGRAD_OP = re.compile(r"^autograd::engine::evaluate_function: ")
# ...and its nodes as older torch records them, without that wrapper (`MmBackward`).
AUTOGRAD_NODE = re.compile(r"^(?:autograd::engine::evaluate_function: |torch::autograd::"
                           r"AccumulateGrad$|[A-Z]\w*Backward\d*$)")
# Runtime calls that issue GPU work: kernel and graph launches, copies, memsets.
ISSUING_CALL = re.compile(r"Launch|Memcpy|Memset")
# A thread that launches nothing and makes one of these calls, or records one of these ops,
# pins memory (DataLoader(pin_memory=True) runs it beside the stepping thread).
PINNING_CALL = re.compile(r"^(?:cuda|hip)(?:PointerGetAttributes|HostAlloc|HostRegister"
                          r"|MallocHost)$|^cuMem(?:HostAlloc|AllocHost)")
PINNING_OP = re.compile(r"^aten::(?:_?pin_memory|is_pinned)$")


def thread_roles(model: TraceModel) -> dict[str, str]:
    """Each thread of the stepping process that records ops or runtime calls -> its role."""
    ops, rt = model.ops, model.runtime
    op_tid = ops["tid"].astype(str).to_numpy() if len(ops) else np.empty(0, dtype=object)
    rt_tid = rt["tid"].astype(str).to_numpy() if len(rt) else np.empty(0, dtype=object)
    tids = sorted(set(op_tid.tolist()) | set(rt_tid.tolist()))
    if model.main_tid is not None and str(model.main_tid) not in tids:
        tids.append(str(model.main_tid))
    autograd = set(op_tid[name_mask(ops["name"], AUTOGRAD_NODE)].tolist()) if len(ops) else set()
    pin_ops = set(op_tid[name_mask(ops["name"], PINNING_OP)].tolist()) if len(ops) else set()
    if len(rt):
        issuing = set(rt_tid[name_flags(
            rt["name"], lambda n: regex_hit(ISSUING_CALL, n, anywhere=True))].tolist())
        pinning = set(rt_tid[name_mask(rt["name"], PINNING_CALL)].tolist())
    else:
        issuing, pinning = set(), set()
    roles = {}
    for tid in tids:
        if model.main_tid is not None and tid == str(model.main_tid):
            roles[tid] = STEPPING
        elif tid in autograd:
            roles[tid] = AUTOGRAD
        elif tid not in issuing and tid in (pinning | pin_ops):
            roles[tid] = PIN_MEMORY
        else:
            roles[tid] = OTHER
    return roles

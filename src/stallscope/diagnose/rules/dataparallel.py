"""`dataparallel`: training uses `torch.nn.DataParallel`, which re-copies the model every step.

DataParallel drives all GPUs from one Python process: each forward scatters the batch from GPU 0,
broadcasts every parameter to the other GPUs (replicate), runs one Python thread per GPU under a
shared GIL and gathers the outputs back on GPU 0; backward reduces every gradient onto GPU 0.
DistributedDataParallel runs one process per GPU, keeps replicas in place and overlaps the
gradient all-reduce with backward, and PyTorch recommends it over DataParallel even on one node.

Recognised by names torch itself records: the `DataParallel.forward` annotation
(`torch/nn/parallel/data_parallel.py`) and the autograd Functions of
`torch/nn/parallel/_functions.py`, recorded under their bare class names (`Broadcast`,
`ReduceAddCoalesced`, `Scatter`, `Gather`) and their backward nodes (`BroadcastBackward`, ...).
Generated nodes such as `GatherBackward0` (backward of `aten::gather`, common in DDP models) and
`DistributedDataParallel.forward` are different names and do not count.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from stallscope.diagnose.advice import for_torch, has
from stallscope.diagnose.common import ms, pct
from stallscope.diagnose.finding import Assessment, Finding
from stallscope.diagnose.spec import MS, Metric, RuleSpec, evidence_key
from stallscope.runfacts import RunContext
from stallscope.trace.model import TraceModel
from stallscope.trace.names import name_array
from stallscope.units import percent

RULE_ID = "dataparallel"
ANNOTATION = "DataParallel.forward"
# DataParallel's own data movement: forward Functions and the backward nodes that run them.
DP_FUNCTIONS = ("Broadcast", "ReduceAddCoalesced", "Scatter", "Gather")
DP_OPS = frozenset(
    DP_FUNCTIONS
    + tuple(f"{f}Backward" for f in DP_FUNCTIONS)
    + tuple(f"autograd::engine::evaluate_function: {f}Backward" for f in DP_FUNCTIONS)
)
DOCS = "https://pytorch.org/docs/stable/notes/cuda.html#cuda-nn-ddp-instead"


def dataparallel(model: TraceModel, context: RunContext | None = None) -> Assessment:
    if not model.has_gpu:
        return Assessment(RULE_ID, "not_assessed", "No GPU activity: DataParallel needs GPUs.")
    # Most traces hold neither name: look at the step ops' distinct names before slicing the
    # frame (a slice costs more than the look-up).
    in_steps = model.ops["step"].to_numpy() >= 0
    if not any(name_array(model.ops["name"], _dataparallel_name, in_steps)):
        return Assessment(
            RULE_ID, "clear",
            "No DataParallel.forward and no DataParallel Broadcast/Scatter/Gather ops in the "
            "steps.",
        )
    ops = model.ops[in_steps]
    annotated = ops[ops["name"] == ANNOTATION]
    dp_ops = ops[ops["name"].isin(list(DP_OPS))]
    gpu = model.gpu[(model.gpu["step"] >= 0) & (model.gpu["kind"] == "kernel")]
    devices = sorted(gpu["device"].unique().tolist())
    if annotated.empty and len(devices) < 2:
        # Bare Broadcast/Scatter/Gather names on one GPU: a user Function, not DataParallel.
        return Assessment(
            RULE_ID, "clear",
            "Ops named like DataParallel's, but no DataParallel.forward and kernels on one GPU.",
        )
    n = len(model.steps)
    total = model.total_step_us
    moved = _union_us(dp_ops["ts"].to_numpy(), dp_ops["end"].to_numpy())
    share = pct(moved, total)
    counts = dp_ops["name"].astype(str).value_counts()
    evidence: dict[str, Any] = {
        "gpus_with_kernels": devices,
        "dataparallel_forward_calls": len(annotated),
        "dataparallel_forward_ms_per_step": ms(float(annotated["dur"].sum()) / n),
        "replicate_scatter_gather_ms_per_step": ms(moved / n),
        "replicate_scatter_gather_share_pct": share,
        "ops": {name: int(c) for name, c in counts.items()},
        "peer_copy_mb_per_step": round(_peer_bytes(model) / n / 1e6, 2),
    }
    return Assessment.found(advise(model, evidence))


def advise(model: TraceModel, evidence: dict[str, Any]) -> Finding:
    """The finding: DistributedDataParallel, one process per GPU (or no wrapper on one GPU)."""
    devices, share = evidence["gpus_with_kernels"], evidence["replicate_scatter_gather_share_pct"]
    if len(devices) < 2:
        title = f"DataParallel wraps a model running on one GPU ({percent(share)} of step time)"
        recommendation = (
            "The model is wrapped in torch.nn.DataParallel but only one GPU runs kernels: the "
            "wrapper only adds its scatter/gather. Drop it, or move to DistributedDataParallel "
            "to use more GPUs."
        )
    else:
        title = (
            f"torch.nn.DataParallel across {len(devices)} GPUs: replicate/scatter/gather take "
            f"{percent(share)} of each step"
        )
        recommendation = (
            f"One process drives {len(devices)} GPUs with torch.nn.DataParallel: every step it "
            "broadcasts all parameters from GPU 0, scatters the batch, gathers the outputs and "
            "reduces every gradient back onto GPU 0, while the per-GPU forward threads share "
            "one GIL. DistributedDataParallel runs one process per GPU, keeps the replicas in "
            "place and overlaps the gradient all-reduce with backward; PyTorch recommends it "
            "over DataParallel even on a single machine."
        )
    return Finding(
        id=RULE_ID,
        title=title,
        evidence=evidence,
        recommendation=recommendation,
        snippet=(
            f"{for_torch(model)}\n"
            f"# train.py, launched with: {_launcher(model)} --nproc_per_node=<gpus> train.py\n"
            "import os, torch, torch.distributed as dist\n"
            "dist.init_process_group(\"nccl\")\n"
            "local_rank = int(os.environ[\"LOCAL_RANK\"])\n"
            "torch.cuda.set_device(local_rank)\n"
            "-model = torch.nn.DataParallel(model).cuda()\n"
            "+model = torch.nn.parallel.DistributedDataParallel(model.cuda(), "
            "device_ids=[local_rank])\n"
            "+sampler = torch.utils.data.distributed.DistributedSampler(dataset)\n"
            "+loader = torch.utils.data.DataLoader(dataset, batch_size=per_gpu_batch, "
            "sampler=sampler, ...)\n"
            "+# each epoch: sampler.set_epoch(epoch); save checkpoints on rank 0 only"
        ),
        precondition=(
            "Needs a launcher (torchrun) and a per-process data shard (DistributedSampler); the "
            "batch size becomes per GPU. Helps most when the model has many parameters or the "
            "per-GPU work is short, so the per-step copies and the GIL weigh most."
        ),
        estimated_saving_pct=share,
        saving_basis=(
            "upper bound on the measured part: the wall time (merged over threads) of "
            "DataParallel's Broadcast/Scatter/Gather/ReduceAddCoalesced ops and their backward "
            "nodes; DDP replaces them with an all-reduce that overlaps backward. Replica "
            "construction in Python and GIL contention are not in the trace and come on top"
        ),
        docs=DOCS,
    )


def _dataparallel_name(name: str) -> bool:
    """DataParallel's annotation or one of its data-movement ops."""
    return name == ANNOTATION or name in DP_OPS


def _union_us(starts: np.ndarray, ends: np.ndarray) -> float:
    """Total length of the union of intervals (nested op and backward-node ranges count once)."""
    if len(starts) == 0:
        return 0.0
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = s[1:] > reach[:-1]
    group = np.cumsum(new) - 1
    first = pd.Series(s).groupby(group).min().to_numpy()
    last = pd.Series(reach).groupby(group).max().to_numpy()
    return float((last - first).sum())


def _peer_bytes(model: TraceModel) -> float:
    """Bytes copied between GPUs inside the steps (the scatter/gather copies)."""
    g = model.gpu
    peer = g[(g["kind"] == "memcpy") & (g["step"] >= 0)
             & g["name"].str.match(r"^Memcpy (?:PtoP|DtoD)")]
    return float(peer["bytes"].fillna(0).sum())


def _launcher(model: TraceModel) -> str:
    """torchrun from torch 1.10; before, torch.distributed.launch setting LOCAL_RANK."""
    return "torchrun" if has(model, (1, 10)) else "python -m torch.distributed.launch --use_env"


SPEC = RuleSpec(
    id=RULE_ID,
    title="torch.nn.DataParallel re-copies the model and batch every step",
    summary="`torch.nn.DataParallel` replicate/scatter/gather in the step",
    check=dataparallel,
    order=80,
    metric=Metric("DataParallel replicate/scatter/gather", MS,
                  evidence_key("replicate_scatter_gather_ms_per_step"),
                  "replicate_scatter_gather_share_pct"),
    not_capped="it removes peer copies and broadcasts, GPU work the floor counts",
)

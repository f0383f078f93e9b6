"""Record `cpu-no-schedule.pt.trace.json.gz`: a script that profiles itself with no schedule.

A common way to profile: wrap the training loop in `torch.profiler.profile(...)` with no
`schedule` and no `prof.step()`, then `prof.export_chrome_trace(...)`. The trace has no
`ProfilerStep#N` markers; each of its 21 iterations holds one DataLoader `__next__` range and
one `Optimizer.step#SGD.step` range (the loader's 22nd `__next__` ends the loop).

The samples are token sequences batched by length (a bucketing batch sampler, as text training
does), so an iteration's time follows its batch's sequence length: the iterations are not
regular. Each sample is built from a fresh buffer (`torch.empty` + `random_`), so per-sample ops
repeat far more often, and more regularly, than the iteration: the trap of issue 31 (a trace cut
into hundreds of "steps" at `aten::empty`). Run from the repository root:

    python sample_traces/record_cpu_no_schedule.py
"""

from __future__ import annotations

import gzip
import json
import os
import sys
import tempfile
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

OUT = Path(__file__).resolve().parent / "cpu-no-schedule.pt.trace.json.gz"
ITERATIONS = 21
BATCH = 32
VOCAB = 1000
# One sequence length per batch (bucketed batches), in an order that mixes short and long.
LENGTHS = [int(n) for n in torch.randint(16, 1024, (ITERATIONS,),
                                         generator=torch.Generator().manual_seed(31))]


class Tokens(torch.utils.data.Dataset):
    """Random token sequences; sample i has its batch's length."""

    def __len__(self) -> int:
        return BATCH * ITERATIONS

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        tokens = torch.empty(LENGTHS[i // BATCH], dtype=torch.long)
        tokens.random_(0, VOCAB, generator=torch.Generator().manual_seed(i))
        return tokens, i % 4


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 32)
        self.mix = torch.nn.Linear(32, 64)
        self.head = torch.nn.Linear(64, 4)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.mix(self.embed(tokens))).mean(dim=1))


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    batches = [list(range(b * BATCH, (b + 1) * BATCH)) for b in range(ITERATIONS)]
    loader = torch.utils.data.DataLoader(Tokens(), batch_sampler=batches, num_workers=0)
    model = Model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "trace.json"
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for tokens, labels in loader:
                opt.zero_grad()
                loss_fn(model(tokens), labels).backward()
                opt.step()
        prof.export_chrome_trace(str(raw))
        trace = json.loads(raw.read_text())
    # Provenance for readers of the sample; the analysis ignores these keys.
    trace["stallscope_sample"] = {
        "recorded_by": "sample_traces/record_cpu_no_schedule.py",
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "pattern": f"profile() without a schedule or prof.step(): {ITERATIONS} iterations "
                   "of length-bucketed batches, each one DataLoader __next__ and one "
                   f"Optimizer.step#SGD.step; {BATCH} per-sample torch.empty per iteration",
        "iterations": ITERATIONS,
        "sequence_lengths": LENGTHS,
    }
    with gzip.open(OUT, "wt", encoding="utf-8") as fh:
        json.dump(trace, fh)
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()

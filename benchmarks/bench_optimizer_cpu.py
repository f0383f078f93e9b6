"""How much of a for-loop Adam step's time multi-tensor Adam keeps on a CPU: the replay's
OPTIMIZER_HOST_LEFT_CPU (replay/models/single_tensor_optimizer.py).

examples/python_heavy.py's model (48 small Linear layers: 97 parameter tensors of at most 16x16),
one intra-op thread; `optimizer.step()` alone is timed, median of 250 steps after 50, for the
for-loop (`foreach=False`), foreach and fused Adam, in `--rounds` alternating rounds.

    python benchmarks/bench_optimizer_cpu.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

KINDS = {"forloop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}


def step_ms(kind: str) -> float:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(48):
        layers += [nn.Linear(16, 16), nn.Tanh()]
    model = nn.Sequential(*layers, nn.Linear(16, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, **KINDS[kind])
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    times = []
    for _ in range(300):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        t = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times[50:])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    torch.set_num_threads(1)
    for _ in range(a.rounds):
        ms = {kind: step_ms(kind) for kind in KINDS}
        print("  ".join(f"{k} {v:.3f} ms" for k, v in ms.items())
              + f"  kept: foreach {ms['foreach'] / ms['forloop']:.2f}, "
              f"fused {ms['fused'] / ms['forloop']:.2f}", flush=True)


if __name__ == "__main__":
    main()

"""Capture: run a training script under torch.profiler and record what the trace cannot show.

The one stage that imports torch (in `session`, `loaders`, `facts`, `runner`); `target` does not,
so a missing script is refused before torch is loaded.
"""

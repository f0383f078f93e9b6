"""Trace: decode a Kineto trace into columns (`decode`, `load`), and model its steps, lanes and
CPU-GPU links (`model`, with interval arithmetic in `intervals`). No torch, no jinja2."""

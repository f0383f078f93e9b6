"""`stallscope.step()`: the step marker a training loop may call, and the hook behind it.

Outside stallscope it does nothing and costs one function call and one global read, so it can
stay in a loop for good. Under `stallscope run` or `stallscope.profile()` the capture installs
a hook here (capture/session.py) and each call places a step boundary: what loops with neither
a torch.optim optimizer nor a DataLoader need, and what any loop can use to say exactly where
its steps end. This module sits below every stage so that the package root can offer `step`
without importing torch.
"""

from __future__ import annotations

from collections.abc import Callable

_hook: Callable[[], None] | None = None


def step() -> None:
    """Mark the end of one training step (call it once per iteration, after the update).

    A no-op unless stallscope is profiling this process; then the first call makes these
    markers the only source of step boundaries (the loop knows its steps better than the
    optimizer and DataLoader hooks can guess them)."""
    hook = _hook
    if hook is not None:
        hook()


def install(hook: Callable[[], None]) -> None:
    """Route `step()` to `hook` (one profiling session at a time)."""
    global _hook
    _hook = hook


def uninstall(hook: Callable[[], None]) -> None:
    """Stop routing `step()` to `hook`; a hook installed since by someone else is kept."""
    global _hook
    if _hook == hook:
        _hook = None


def active() -> bool:
    """Whether a profiling session in this process is listening for `step()`."""
    return _hook is not None

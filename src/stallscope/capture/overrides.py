"""Overrides (`run --set KEY=VALUE`): the keys, their values, how to write them back.

`run` parses them before anything runs, the capture applies the DataLoader keys to every
DataLoader the script builds and `torch_threads` to the training process (capture/intraop.py),
`tune` generates them and its page shows the command that reproduces the best; one vocabulary
for all of them. Plain data, no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from stallscope.errors import StallscopeError

Overrides = dict[str, Any]
# The order commands and constructor changes list keys in: the order of DataLoader's signature.
KEY_ORDER = ("batch_size", "num_workers", "pin_memory", "prefetch_factor", "persistent_workers",
             "torch_threads")
# Keys that set the training process, not a DataLoader argument: torch.set_num_threads(N)
# before the script runs. tune measures a worker count with the threads it leaves the step,
# since dataloader-bound advises the two as one change when they would not fit the cores.
PROCESS_KEYS = frozenset({"torch_threads"})

# `run --set`: the DataLoader arguments that can be overridden, each with its value parser.
_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")


def _bool_value(text: str) -> bool:
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    raise ValueError("true or false (also 1/0, yes/no)")


def _int_value(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise ValueError(f"a whole number >= {minimum}")
        return value

    return parse


OVERRIDE_KEYS: dict[str, Callable[[str], Any]] = {
    "batch_size": _int_value(1),
    "drop_last": _bool_value,
    "num_workers": _int_value(0),
    "persistent_workers": _bool_value,
    "pin_memory": _bool_value,
    "prefetch_factor": _int_value(1),
    "torch_threads": _int_value(1),
}


def loader_overrides(overrides: Mapping[str, Any]) -> Overrides:
    """The keys passed to DataLoader constructors (all but PROCESS_KEYS)."""
    return {k: v for k, v in overrides.items() if k not in PROCESS_KEYS}


def parse_overrides(items: list[str]) -> Overrides:
    """`--set KEY=VALUE` options as typed values, checked before anything runs: a typo found
    after a minute of training would waste that minute. The last of a repeated key wins."""
    out: Overrides = {}
    for item in items:
        key, sep, text = item.partition("=")
        key, text = key.strip(), text.strip()
        if not sep or not key or not text:
            raise StallscopeError(f"--set {item!r}: expected KEY=VALUE, e.g. --set num_workers=4")
        parse = OVERRIDE_KEYS.get(key)
        if parse is None:
            raise StallscopeError(f"--set {item!r}: unknown option {key!r}; one of "
                                  f"{', '.join(OVERRIDE_KEYS)}")
        try:
            out[key] = parse(text)
        except ValueError as exc:
            raise StallscopeError(f"--set {item!r}: {key} takes {exc}") from None
    return out


def cli_value(value: Any) -> str:
    """How `stallscope run --set KEY=VALUE` spells a value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def set_arguments(overrides: Overrides) -> list[str]:
    """`--set k=v` pairs, in DataLoader signature order so commands read the same every time."""
    args: list[str] = []
    for key in sorted(overrides, key=key_rank):
        args += ["--set", f"{key}={cli_value(overrides[key])}"]
    return args


def label(overrides: Overrides) -> str:
    """A short human name: `num_workers=2, persistent_workers=true`, or `baseline`."""
    if not overrides:
        return "baseline"
    return ", ".join(f"{k}={cli_value(overrides[k])}" for k in sorted(overrides, key=key_rank))


def key_rank(key: str) -> tuple[int, str]:
    return (KEY_ORDER.index(key) if key in KEY_ORDER else len(KEY_ORDER), key)

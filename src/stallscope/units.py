"""How every writer prints a duration, a size or a share: one module, so a figure reads the same
wherever it appears and a change of precision is made once.

Durations arrive in microseconds (the trace's unit: `ms`) or already in milliseconds (`millis`)
and print as a bare number of milliseconds, the caller writing " ms" after it, unless `unit`.
Three precisions, each named for what the number is for:

- "adaptive" (the default, prose and tables): 0.1 ms from 1 ms up, 0.01 ms below, by
  magnitude ("12.3", "0.58", "-0.25"), so a sub-millisecond figure keeps two digits.
- "tenths": always 0.1 ms ("0.6", "12.3"): step times and predictions in notes, where every
  figure of a sentence has the same precision.
- "axis": whole milliseconds from 10 ms up, else 0.1 ms ("250", "7.5"): a chart's tick labels.

A missing figure (None) prints as `missing` ("?" unless the page says "n/a" or nothing). NaN
prints as "nan", as Python writes it: the writers pass measured numbers, never NaN on purpose.
"""

from __future__ import annotations

from typing import Literal

Precision = Literal["adaptive", "tenths", "axis"]


def millis(value_ms: float | None, precision: Precision = "adaptive", *, missing: str = "?",
           signed: bool = False, unit: bool = False) -> str:
    """Milliseconds at `precision` (module docstring); `signed` puts "+" before a positive
    value (a change), `unit` appends " ms". A missing value is `missing`, bare."""
    if value_ms is None:
        return missing
    if precision == "tenths":
        text = f"{value_ms:.1f}"
    elif precision == "axis":
        text = f"{value_ms:.0f}" if value_ms >= 10 else f"{value_ms:.1f}"
    else:
        text = f"{value_ms:.1f}" if abs(value_ms) >= 1 else f"{value_ms:.2f}"
    if signed and value_ms > 0:
        text = "+" + text
    return f"{text} ms" if unit else text


def ms(us: float | None, precision: Precision = "adaptive", *, missing: str = "?",
       signed: bool = False, unit: bool = False) -> str:
    """Microseconds printed as milliseconds: `millis` of `us / 1000`."""
    return millis(None if us is None else us / 1000, precision, missing=missing, signed=signed,
                  unit=unit)


def duration(us: float) -> str:
    """A span of time as a person reads it, with its unit: seconds (0.1 s) from 1 s up, else
    milliseconds (0.01 ms): "2.5 s", "12.34 ms"."""
    return f"{us / 1e6:.1f} s" if us >= 1e6 else f"{us / 1000:.2f} ms"


def size_text(nbytes: float) -> str:
    """A size in decimal units, as a file's size is read: "512 B", "12.3 kB", "4.0 MB",
    "1.5 GB" (GB is the largest unit: "2000.0 GB")."""
    for unit in ("B", "kB", "MB", "GB"):
        if nbytes < 1000 or unit == "GB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1000
    return f"{nbytes:.1f} GB"  # not reached: GB returns above


def binary_size(nbytes: int) -> str:
    """A limit counted in 2**20 or 2**30 bytes (`--max-buffer-mb`, `--max-text-gb`), as the user
    gave it: "512 MB", "1.5 GB" (no trailing zeros; GB from 2**30 up)."""
    return f"{nbytes / (1 << 30):g} GB" if nbytes >= 1 << 30 else f"{nbytes / (1 << 20):g} MB"


def percent(value: float | None, digits: int = 1, *, missing: str = "n/a") -> str:
    """A share already in percent: "12.3%" (`digits` decimals); `missing` for None."""
    return missing if value is None else f"{value:.{digits}f}%"


def share_text(pct: float) -> str:
    """A share of the step as every report writer prints it: "under 0.1%" where one decimal
    would print "0.0%", which reads as a measured size of nothing."""
    return "under 0.1%" if pct < 0.05 else percent(pct)


def points(value: float | None, *, missing: str = "n/a") -> str:
    """A change of a share, in percentage points, signed so a drop reads as one: "+1.2 pt",
    "-0.4 pt", "0.0 pt"."""
    if value is None:
        return missing
    return f"{'+' if value > 0 else ''}{value:.1f} pt"

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
- "hundredths": always 0.01 ms ("0.58", "12.34"): a cost per event or per copy in a finding's
  sentence, where most figures are well under a millisecond.
- "whole": always 1 ms ("250"): a figure of hundreds of milliseconds (a compilation, a stall)
  where a decimal would be noise.

Shares arrive in percent (`percent`, `share_text`) and print with "%" after them; a fraction is
multiplied by 100 by its caller (`percent(100 * share, 0)`), which Python's own "%" format does
the same way, so the figure is the one `f"{share:.0%}"` printed.

A missing figure (None) prints as `missing` ("?" unless the page says "n/a" or nothing). NaN
prints as "nan", as Python writes it: the writers pass measured numbers, never NaN on purpose.
"""

from __future__ import annotations

from typing import Literal

SizeUnit = Literal["kB", "MB", "GB", "KiB", "MiB", "GiB"]
_SIZE_UNITS: dict[str, float] = {"kB": 1e3, "MB": 1e6, "GB": 1e9, "KiB": 1024, "MiB": 1 << 20,
                                 "GiB": 1 << 30}
Precision = Literal["adaptive", "tenths", "axis", "hundredths", "whole"]


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
    elif precision == "hundredths":
        text = f"{value_ms:.2f}"
    elif precision == "whole":
        text = f"{value_ms:.0f}"
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


def fixed_size(nbytes: float, unit: SizeUnit, digits: int = 1) -> str:
    """A size in one unit whatever its magnitude, with `digits` decimals: "2.35 MB", "4.0 KiB",
    "80 GiB". For sentences that put a size beside a rate or a limit in that unit, where
    `size_text`'s choice of unit by magnitude would make the reader convert."""
    return f"{nbytes / _SIZE_UNITS[unit]:.{digits}f} {unit}"


def percent(value: float | None, digits: int | None = 1, *, signed: bool = False,
            missing: str = "n/a") -> str:
    """A share already in percent: "12.3%" with `digits` decimals (0 for a threshold or a rough
    share, 2 for a share that is often under 0.1%), or as short as it goes ("20%", "2.5%") when
    `digits` is None, for a setting the user typed. `signed` writes "+" before a value that is
    not negative ("+0.0%", "-3.1%"): a change. `missing` for None."""
    if value is None:
        return missing
    spec = "g" if digits is None else f".{digits}f"
    return f"{value:{'+' if signed else ''}{spec}}%"


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

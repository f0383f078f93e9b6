"""The one formatter for durations, sizes and shares (stallscope/units.py): what each precision
prints at its edges, since every page a user reads goes through it."""

from __future__ import annotations

import math

import pytest

from stallscope.units import (
    Precision,
    SizeUnit,
    binary_size,
    duration,
    fixed_size,
    millis,
    ms,
    percent,
    points,
    share_text,
    size_text,
)


@pytest.mark.parametrize(
    ("value_ms", "expected"),
    [
        (12.345, "12.3"),
        (1.0, "1.0"),  # 1 ms is the first value at 0.1 ms
        (0.999, "1.00"),  # below 1 ms: two decimals, even where they round up to 1
        (0.584, "0.58"),
        (0.004, "0.00"),
        (0.0, "0.00"),
        (1500.0, "1500.0"),  # >= 1 s stays in milliseconds
        (-0.25, "-0.25"),  # by magnitude: a small negative change keeps two digits
        (-5.0, "-5.0"),
        (math.nan, "nan"),
    ],
)
def test_adaptive_milliseconds_keep_two_digits_below_one_ms(value_ms: float, expected: str) -> None:
    assert millis(value_ms) == expected


@pytest.mark.parametrize(
    ("value_ms", "expected"),
    [(0.04, "0.0"), (0.58, "0.6"), (12.345, "12.3"), (2500.0, "2500.0"), (-3.21, "-3.2")],
)
def test_tenths_are_one_decimal_whatever_the_size(value_ms: float, expected: str) -> None:
    assert millis(value_ms, "tenths") == expected


@pytest.mark.parametrize(
    ("value_ms", "expected"),
    [(0.0, "0.0"), (7.5, "7.5"), (9.96, "10.0"), (10.0, "10"), (250.4, "250")],
)
def test_axis_ticks_drop_decimals_from_ten_ms(value_ms: float, expected: str) -> None:
    assert millis(value_ms, "axis") == expected


@pytest.mark.parametrize(
    ("value_ms", "precision", "expected"),
    [(0.584, "hundredths", "0.58"), (12.345, "hundredths", "12.35"), (0.0, "hundredths", "0.00"),
     (249.6, "whole", "250"), (0.4, "whole", "0"), (-3.7, "whole", "-4")],
)
def test_fixed_precisions_whatever_the_size(value_ms: float, precision: Precision,
                                            expected: str) -> None:
    assert millis(value_ms, precision) == expected


def test_microseconds_are_printed_as_milliseconds() -> None:
    assert ms(12_345.0) == "12.3"
    assert ms(580.0) == "0.58"
    assert ms(580.0, "tenths") == "0.6"
    assert ms(2_500_000.0) == "2500.0"
    assert ms(45_000.0, "axis") == "45"


def test_a_missing_figure_prints_as_the_page_asks() -> None:
    assert ms(None) == "?"
    assert ms(None, missing="n/a") == "n/a"
    assert ms(None, "tenths", missing="", unit=True) == ""  # nothing, not " ms"
    assert millis(None, signed=True) == "?"


def test_signed_changes_and_the_unit() -> None:
    assert ms(1500.0, signed=True) == "+1.5"
    assert ms(-1500.0, signed=True) == "-1.5"
    assert ms(0.0, signed=True) == "0.00"  # no change has no sign
    assert ms(-300.0, signed=True) == "-0.30"
    assert ms(12_345.0, "tenths", unit=True) == "12.3 ms"


@pytest.mark.parametrize(
    ("us", "expected"),
    [(0.0, "0.00 ms"), (450.0, "0.45 ms"), (999_999.0, "1000.00 ms"), (1_000_000.0, "1.0 s"),
     (2_540_000.0, "2.5 s")],
)
def test_a_span_reads_in_seconds_from_one_second(us: float, expected: str) -> None:
    assert duration(us) == expected


@pytest.mark.parametrize(
    ("nbytes", "expected"),
    [(0, "0 B"), (999, "999 B"), (1000, "1.0 kB"), (12_345, "12.3 kB"), (4_000_000, "4.0 MB"),
     (1.5e9, "1.5 GB"), (2e12, "2000.0 GB")],
)
def test_sizes_in_decimal_units(nbytes: float, expected: str) -> None:
    assert size_text(nbytes) == expected


@pytest.mark.parametrize(
    ("nbytes", "expected"),
    [(512 << 20, "512 MB"), (1 << 20, "1 MB"), ((1 << 30) - (1 << 20), "1023 MB"),
     (1 << 30, "1 GB"), (3 << 29, "1.5 GB")],
)
def test_limits_in_binary_units_as_the_user_gave_them(nbytes: int, expected: str) -> None:
    assert binary_size(nbytes) == expected


def test_shares_and_their_changes() -> None:
    assert percent(12.345) == "12.3%"
    assert percent(12.345, 0) == "12%"
    assert percent(None) == "n/a"
    assert percent(0.123, 2) == "0.12%"
    assert percent(20.0, None) == "20%"  # a setting the user typed, as short as it goes
    assert percent(2.5, None) == "2.5%"
    assert percent(3.14, signed=True) == "+3.1%"
    assert percent(0.0, signed=True) == "+0.0%"
    assert percent(-3.14, signed=True) == "-3.1%"
    assert percent(100 * 0.125, 0) == f"{0.125:.0%}"  # a fraction, as Python's "%" prints it
    assert points(1.25) == "+1.2 pt"  # 1.25 is 1.2499... in binary
    assert points(-0.44) == "-0.4 pt"
    assert points(0.0) == "0.0 pt"
    assert points(None) == "n/a"


@pytest.mark.parametrize(
    ("pct", "expected"),
    [(0.0, "under 0.1%"), (0.049, "under 0.1%"), (0.05, "0.1%"), (37.26, "37.3%"),
     (100.0, "100.0%")],
)
def test_a_share_of_the_step_is_never_a_measured_nothing(pct: float, expected: str) -> None:
    assert share_text(pct) == expected


@pytest.mark.parametrize(
    ("nbytes", "unit", "digits", "expected"),
    [(2_345_678, "MB", 2, "2.35 MB"), (120e9, "MB", 0, "120000 MB"), (4096, "KiB", 1, "4.0 KiB"),
     (80 * (1 << 30), "GiB", 0, "80 GiB"), (512, "kB", 1, "0.5 kB")],
)
def test_a_size_in_one_unit_whatever_its_magnitude(nbytes: float, unit: SizeUnit, digits: int,
                                                   expected: str) -> None:
    assert fixed_size(nbytes, unit, digits) == expected

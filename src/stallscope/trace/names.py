"""Per-name work on a trace's name columns: once per distinct name, not per row.

The model's name columns (event names, categories, thread ids) are categorical: hundreds of
names over up to millions of rows. A rule asks a question of each name (a regex, a class), so
it is asked once per category in use and read back through the codes; a pandas Series and
`factorize` per call cost more than that on the small frames of a rank file.

Also the names of the host events both a rule and its replay model select (device allocator
calls, the optimizer's step and zero_grad ranges), kept here so the replay models below the
rules read the same names.
"""

from __future__ import annotations

import functools
import re
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

# Device allocator calls (allocator-churn's signal, gpu-idle's allocator=steady model).
ALLOC_CALL = re.compile(r"^(?:(?:cuda|hip)Malloc|cuMemAlloc(?:_v2)?)$")
FREE_CALL = re.compile(r"^(?:(?:cuda|hip)Free|cuMemFree(?:_v2)?)$")
# The optimizer's step range, `Optimizer.step#Adam.step` (single-tensor-optimizer's).
OPTIMIZER_STEP = re.compile(r"^Optimizer\.step#(.+)\.step$")
# zero_grad's range, `Optimizer.zero_grad#Adam.zero_grad` (zero-grad-kernels').
ZERO_GRAD = "Optimizer.zero_grad#"
# A CUDA graph's launch (gpu-idle names the graphed spans; the cuda_graphs model refuses a
# trace that already launches graphs).
GRAPH_LAUNCH = re.compile(r"^(?:cuda|hip)GraphLaunch")


def per_name(names: pd.Series, fn: Callable[[str], Any]) -> pd.Series:
    """`fn` of each row's name, evaluated once per distinct name: tables have hundreds of
    thousands of rows but only hundreds of names, so string work per row would dominate.

    A categorical column (every name column of the model) is read through its codes, without
    factorizing; `fn` is still called only on the names present, so the values (and the
    result's dtype) are those of the names the rows hold. A module-level `fn` (not a lambda or
    closure, whose identity is new at every call) is remembered per category list."""
    if not isinstance(names.dtype, pd.CategoricalDtype):
        codes, uniques = pd.factorize(names, use_na_sentinel=True)
        missing = bool((codes < 0).any())
        values = np.array([fn(str(u)) for u in uniques] + ([fn("")] if missing else []))
        if len(values) == 0:
            return pd.Series(np.zeros(0, dtype=bool), index=names.index)
        return pd.Series(values[codes], index=names.index)  # code -1 (missing) takes fn("")
    codes, used, missing = _codes_used(names)
    if not len(used) and not missing:
        return pd.Series(np.zeros(0, dtype=bool), index=names.index)
    known = _per_category(names.dtype.categories, fn) if _stable(fn) else None
    text = _category_text(names.dtype.categories)
    found = []
    for code in used.tolist():
        value = known.get(code, _UNSET) if known is not None else _UNSET
        if value is _UNSET:
            value = fn(text[code])
            if known is not None:
                known[code] = value
        found.append(value)
    values = np.array(found + ([fn("")] if missing else []))
    position = np.full(len(text) + 1, len(used), dtype=np.intp)  # code -1 (missing) -> fn("")
    position[used] = np.arange(len(used))
    return pd.Series(values[position[codes]], index=names.index)


def name_matches(names: pd.Series, pattern: re.Pattern[str]) -> pd.Series:
    """Regex match at the start of each row's name, evaluated once per distinct name (and, for
    a categorical column, once per category list and pattern: the model and the rules match a
    dozen patterns against slices of the same few name columns)."""
    if not isinstance(names.dtype, pd.CategoricalDtype):
        return per_name(names, lambda n: regex_hit(pattern, n)).astype(bool)
    codes, used, missing = _codes_used(names)
    categories = names.dtype.categories
    table = _match_table(categories, pattern)
    todo = used[table[used] < 0]
    if len(todo):
        text = _category_text(categories)
        table[todo] = [regex_hit(pattern, text[c]) for c in todo.tolist()]
    if missing:
        table[-1] = regex_hit(pattern, "")
    return pd.Series(table[codes] > 0, index=names.index)


_UNSET = object()
# Per category list (held weakly: it belongs to one trace's columns) and key: what is known of
# it. Bounded: a worker analyses thousands of files, each with its own category lists.
_CATEGORY_CACHE: dict[tuple[int, Any], tuple[weakref.ref[pd.Index], Any]] = {}
_CATEGORY_CACHE_MAX = 512


def _cached(categories: pd.Index, key: Any, make: Callable[[], Any]) -> Any:
    """What `make` built for (`categories`, `key`), built once while `categories` lives."""
    slot = (id(categories), key)
    entry = _CATEGORY_CACHE.get(slot)
    if entry is not None and entry[0]() is categories:
        return entry[1]
    if len(_CATEGORY_CACHE) >= _CATEGORY_CACHE_MAX:
        for stale in [k for k, (ref, _) in _CATEGORY_CACHE.items() if ref() is None]:
            del _CATEGORY_CACHE[stale]
        if len(_CATEGORY_CACHE) >= _CATEGORY_CACHE_MAX:
            _CATEGORY_CACHE.clear()
    value = make()
    _CATEGORY_CACHE[slot] = (weakref.ref(categories), value)
    return value


def _category_text(categories: pd.Index) -> list[str]:
    """The categories as Python strings, as `per_name` passes them to `fn`."""
    return _cached(categories, "text", lambda: [str(c) for c in categories])


def _per_category(categories: pd.Index, fn: Callable[[str], Any]) -> dict[int, Any]:
    """fn's value per category code, filled in as codes are met."""
    return _cached(categories, ("fn", fn), dict)


def _match_table(categories: pd.Index, pattern: re.Pattern[str]) -> np.ndarray:
    """Per category code (and a last slot for a missing name): 1 match, 0 not, -1 not known."""
    return _cached(categories, ("match", pattern),
                   lambda: np.full(len(categories) + 1, -1, dtype=np.int8))


def _stable(fn: Callable[[str], Any]) -> bool:
    """Whether `fn` keeps its identity between calls (a module-level function): a lambda or a
    closure is made anew each time, so remembering its values would only fill the cache."""
    qualname = getattr(fn, "__qualname__", "<lambda>")
    try:
        hash(fn)
    except TypeError:
        return False
    return "<lambda>" not in qualname and "<locals>" not in qualname


def _codes_used(names: pd.Series) -> tuple[np.ndarray, np.ndarray, bool]:
    """A categorical column's codes, the codes present (ascending) and whether a name is
    missing (code -1)."""
    codes = names.array.codes
    present = np.bincount(codes.astype(np.intp) + 1, minlength=1)
    return codes, np.flatnonzero(present[1:]), bool(present[0])


def name_array(names: pd.Series, fn: Callable[[str], Any],
               rows: np.ndarray | None = None) -> np.ndarray:
    """`per_name` as an array, of the rows where `rows` is True when given: for a categorical
    column, `fn` once per category in use, read straight off the codes (a rule's whole budget
    is a few milliseconds; a Series and factorize per call cost more than the calls)."""
    return _per_code(names, fn, rows, object)


def name_flags(names: pd.Series, fn: Callable[[str], Any],
               rows: np.ndarray | None = None) -> np.ndarray:
    """`name_array` as booleans: a mask over the rows. A categorical column's table is made of
    booleans before the rows are read from it: an object array of the rows turned into
    booleans after cost more than every call of `fn`."""
    return _per_code(names, fn, rows, bool)


def _per_code(names: pd.Series, fn: Callable[[str], Any], rows: np.ndarray | None,
              dtype: type) -> np.ndarray:
    """`name_array` (dtype object) or `name_flags` (bool, each value's truth)."""
    if not isinstance(names.dtype, pd.CategoricalDtype):
        out = per_name(names, fn).to_numpy()
        out = out if rows is None else out[rows]
        return out.astype(bool) if dtype is bool else out
    codes = names.array.codes.astype(np.intp) + 1  # 0: missing
    if rows is not None:
        codes = codes[rows]
    cats = _category_text(names.dtype.categories)
    table = np.zeros(len(cats) + 1, dtype=bool) if dtype is bool else \
        np.empty(len(cats) + 1, dtype=object)
    for c in np.flatnonzero(np.bincount(codes, minlength=len(cats) + 1)).tolist():
        value = fn(cats[c - 1] if c else "")
        table[c] = bool(value) if dtype is bool else value
    return table[codes]


def name_mask(names: pd.Series, pattern: re.Pattern[str],
              rows: np.ndarray | None = None) -> np.ndarray:
    """`name_matches` as a boolean array, of the rows where `rows` is True when given."""
    return name_flags(names, lambda n: regex_hit(pattern, n), rows)


@functools.lru_cache(maxsize=1 << 17)
def regex_hit(pattern: re.Pattern[str], name: str, anywhere: bool = False) -> bool:
    """`pattern` matched at the start of `name` (or searched anywhere in it). Cached: the rules
    match the same patterns against the same op and kernel names in every rank file of a job,
    and a long kernel name costs tens of microseconds per pattern."""
    return bool(pattern.search(name) if anywhere else pattern.match(name))


def column_isin(series: pd.Series, values: tuple[Any, ...]) -> np.ndarray:
    """`series.isin(values)` as an array; for a categorical, one test per category."""
    if isinstance(series.dtype, pd.CategoricalDtype):
        table = np.append(series.dtype.categories.isin(list(values)), False)
        return table[series.array.codes]  # code -1 (missing) is in nothing
    return series.isin(list(values)).to_numpy()


def column_equals_text(series: pd.Series, text: str) -> np.ndarray:
    """`series.astype(str) == text` as an array; for a categorical, one test per category."""
    if isinstance(series.dtype, pd.CategoricalDtype):
        table = category_strings(series.dtype.categories) == text  # NaN (missing): False
        return table[series.array.codes]
    return (series.astype(str) == text).to_numpy()


def category_strings(categories: pd.Index) -> np.ndarray:
    """The categories as Python strings, then NaN (what code -1, a missing value, reads as)."""
    return _cached(categories, "text-array",
                   lambda: np.array([*(str(c) for c in categories), np.nan], dtype=object))

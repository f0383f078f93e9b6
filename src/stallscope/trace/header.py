"""The text before a trace's event list: where the list begins, and the metadata it holds.

Kineto writes a few short keys there. A hostile file can hold megabytes of nested objects, the
`"traceEvents"` key among them at every depth. Whether a key is the top-level one is a matter of
nesting and strings, so the header is scanned, never decoded as objects to find it out: strings,
escapes and brackets are tracked with numpy over the bytes, a slice at a time, and every
candidate key is judged at once by the depth and string state before its first byte. Time and
memory are linear in the header, whatever it nests.

The metadata is read once, with each value kept as raw text (msgspec skips the keys the
analysis does not read without building them) and decoded only when it is of a sane size.
A stray byte or a lone surrogate escape in the header is mended, and said; it changes nothing
else.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np

_SLICE = 1 << 20  # bytes scanned per numpy pass: a few MB of temporary arrays at most
_BATCH = 4096  # candidate keys judged per numpy pass
_BACKSLASH, _QUOTE = 0x5C, 0x22
_NOT_SPACE = re.compile(rb"[^ \t\r\n]")
# Per byte: +1 for `{` and `[`, -1 for `}` and `]`, 0 for the rest.
_BRACKET = np.zeros(256, np.int8)
_BRACKET[[0x7B, 0x5B]], _BRACKET[[0x7D, 0x5D]] = 1, -1
KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
# Bytes left unscanned at the end of the text read so far: a key and its `[` may straddle the
# next read (whitespace between them beyond this is not looked for).
KEY_REACH = 64
BOM = b"\xef\xbb\xbf"
# A metadata value longer than this is not decoded (Kineto's longest, `deviceProperties` or
# stallscope's own with every loader's anatomy, are kilobytes): it would be built as Python
# objects at tens of bytes per byte.
MAX_VALUE_BYTES = 16 << 20
LONE_SURROGATE = re.compile(
    rb"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
    rb"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}"
)


@dataclass
class Scan:
    """The nesting and string state of the text scanned so far (`done` bytes)."""

    done: int = 0
    depth: int = 0
    in_string: bool = False
    backslashes: int = 0  # the run of backslashes the scanned text ends with
    deepest: int = 0

    def advance(self, text: bytes | bytearray, upto: int,
                marks: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Scan `text[done:upto]`; for each of `marks` (sorted offsets in that range), the
        depth, whether a string is open, and the deepest nesting so far, just before it."""
        marks = np.empty(0, np.int64) if marks is None else marks
        out = (np.empty(len(marks), np.int64), np.empty(len(marks), bool),
               np.empty(len(marks), np.int64))
        view = memoryview(text)
        while self.done < upto:
            lo = self.done
            hi = min(upto, lo + _SLICE)
            a = np.frombuffer(view[lo:hi], dtype=np.uint8)
            first, last = np.searchsorted(marks, [lo, hi])
            for into, got in zip(out, self._slice(a, marks[first:last] - lo), strict=True):
                into[first:last] = got
            self.done = hi
        view.release()
        return out

    def _slice(self, a: np.ndarray,
               marks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        toggles = self._toggles(a)
        parity = int(self.in_string)
        kind = _BRACKET[a]
        brackets = np.flatnonzero(kind)
        if len(toggles):
            brackets = brackets[(np.searchsorted(toggles, brackets) + parity) % 2 == 0]
        elif parity:
            brackets = brackets[:0]  # the whole slice is inside one string
        level = self.depth + np.cumsum(kind[brackets], dtype=np.int64)
        depths = strings = deepest = np.empty(0, np.int64)
        if len(marks):
            at = np.searchsorted(brackets, marks)  # brackets before each mark
            before = np.maximum(at - 1, 0)
            peak = np.maximum.accumulate(level) if len(level) else level
            depths = np.where(at > 0, level[before] if len(level) else 0, self.depth)
            deepest = np.where(at > 0, np.maximum(peak[before], self.deepest)
                               if len(peak) else 0, self.deepest)
            strings = (np.searchsorted(toggles, marks) + parity) % 2 == 1
        if len(level):
            self.deepest = max(self.deepest, int(level.max()))
            self.depth = int(level[-1])
        self.in_string = (parity + len(toggles)) % 2 == 1
        return depths, strings, deepest

    def _toggles(self, a: np.ndarray) -> np.ndarray:
        """The quotes that open or close a string: those not escaped by an odd run of
        backslashes just before them (runs may begin in the slice before). Keeps the run the
        slice ends with."""
        quotes = np.flatnonzero(a == _QUOTE)
        slashes = np.flatnonzero(a == _BACKSLASH)
        carry = self.backslashes
        self.backslashes = 0
        if not len(slashes):  # only the run carried in can escape (the slice's first byte)
            return quotes[1:] if len(quotes) and quotes[0] == 0 and carry % 2 else quotes
        # Where each run of consecutive backslashes starts, for each backslash.
        first = np.r_[True, np.diff(slashes) != 1]
        starts = slashes[np.maximum.accumulate(np.where(first, np.arange(len(slashes)), 0))]

        def run(ends: np.ndarray) -> np.ndarray:  # the run ending at each of `ends`
            idx = np.searchsorted(slashes, ends)
            begin = starts[idx]
            return ends - begin + 1 + np.where(begin == 0, carry, 0)

        if slashes[-1] == len(a) - 1:
            self.backslashes = int(run(slashes[-1:])[0])
        after = quotes[quotes > 0]
        escapable = after[a[after - 1] == _BACKSLASH]
        escaped = escapable[run(escapable - 1) % 2 == 1]
        if len(quotes) and quotes[0] == 0 and carry % 2 == 1:
            escaped = np.r_[0, escaped]
        return np.setdiff1d(quotes, escaped, assume_unique=True)


@dataclass
class KeyFinder:
    """Finds the top-level `"traceEvents": [` as the header is read, block by block."""

    start: int = 0  # where the top-level value begins (its first byte, once `opened`)
    opened: bool = False
    bom: bool = False  # the text begins with a UTF-8 byte-order mark (skipped)
    deepest: int = 0  # the deepest nesting before the key, once found
    scan: Scan = field(default_factory=Scan)

    def open(self, head: bytes | bytearray) -> int | None:
        """The offset of the text's first byte past a byte-order mark and whitespace (`{`
        or `[` in a trace), or None while only whitespace has been read."""
        if not self.bom and self.start == 0 and head.startswith(BOM):
            self.bom, self.start = True, len(BOM)
        found = _NOT_SPACE.search(head, self.start)
        if found is None:
            self.start = max(self.start, len(head))  # whitespace: not searched again
            return None
        self.start, self.opened = found.start(), True
        return self.start

    def find(self, head: bytes | bytearray, final: bool = False) -> re.Match[bytes] | None:
        """The top-level key in `head` (the text read so far), or None while not read yet.
        `final`: no more text comes, scan to the end."""
        if self.scan.done < self.start:
            self.scan.done = self.start
        upto = len(head) if final else max(self.scan.done, len(head) - KEY_REACH)
        keys = KEY.finditer(head, self.scan.done)
        while True:
            # Candidates a batch at a time: a header of nested keys holds one every 19 bytes,
            # and a match object each for a whole block would be several bytes per byte.
            found = list(itertools.islice(keys, _BATCH))
            marks = np.fromiter((m.start() for m in found), np.int64, len(found))
            inside_upto = int(np.searchsorted(marks, upto))
            last = inside_upto < _BATCH
            found, marks = found[:inside_upto], marks[:inside_upto]
            if not found:
                self.scan.advance(head, upto)
                return None
            depths, strings, deepest = self.scan.advance(
                head, upto if last else int(marks[-1]) + 1, marks)
            top = np.flatnonzero((depths == 1) & ~strings)
            if len(top):
                self.deepest = int(deepest[top[0]])
                return found[int(top[0])]
            if last:
                return None


_ABSENT = msgspec.Raw()  # a key not in the text (no JSON value is empty)


class _RawMetadata(msgspec.Struct):
    """The metadata keys the analysis reads, each as its text (see decode.Metadata)."""

    schemaVersion: msgspec.Raw = _ABSENT  # noqa: N815 (the file's own keys)
    deviceProperties: msgspec.Raw = _ABSENT  # noqa: N815
    distributedInfo: msgspec.Raw = _ABSENT  # noqa: N815
    traceName: msgspec.Raw = _ABSENT  # noqa: N815
    stallscope: msgspec.Raw = _ABSENT
    stallscope_sample: msgspec.Raw = _ABSENT
    stallscope_recording: msgspec.Raw = _ABSENT
    host_name: msgspec.Raw = _ABSENT


_RAW_META = msgspec.json.Decoder(_RawMetadata)
_ANY = msgspec.json.Decoder()
FIELDS = tuple(_RawMetadata.__struct_fields__)


@dataclass
class HeaderMetadata:
    """The metadata values read, and what reading them left out or mended."""

    values: dict[str, Any] = field(default_factory=dict)
    mended: bool = False  # stray bytes or lone surrogate escapes replaced
    dropped: list[str] = field(default_factory=list)  # keys too long to decode
    unreadable: bool = False  # the text is not JSON even once mended


def read_metadata(text: bytes | bytearray) -> HeaderMetadata:
    """The metadata in `text`, a whole JSON object (the header closed, or the keys after the
    event list); an unreadable text gives no values and says so."""
    out = HeaderMetadata()
    raw = _decoded(_RAW_META, text, out)
    if raw is None:
        out.unreadable = True
        return out
    for name in FIELDS:
        value = getattr(raw, name)
        if not len(value):
            continue
        if len(value) > MAX_VALUE_BYTES:
            out.dropped.append(name)
            continue
        got = _decoded(_ANY, bytes(value), out)
        if got is None:
            out.dropped.append(name)
        else:
            out.values[name] = got[0]
    return out


def _decoded(decoder: msgspec.json.Decoder, text: bytes | bytearray,
             out: HeaderMetadata) -> Any:
    """`text` decoded (a value wrapped in a 1-tuple for `_ANY`, whose values may be None),
    mended once when stray bytes or lone surrogate escapes are all that stop it; None when
    it does not read. RecursionError goes to the caller (the depth limit)."""
    for attempt in range(2):
        try:
            got = decoder.decode(text)
        except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError):
            if attempt:
                return None
            mended = mend(text)
            if mended == text:
                return None
            text = mended
            continue
        out.mended = out.mended or attempt == 1
        return (got,) if decoder is _ANY else got
    return None


# A byte no escape sequence or multi-byte character holds (ASCII, not a backslash, `u` or a
# hex digit): text cut just before one mends in pieces exactly as it does whole.
_SAFE_CUT = re.compile(rb"[\x00-\x2f\x3a-\x40\x47-\x5b\x5d-\x60\x67-\x74\x76-\x7f]")


def mend(text: bytes | bytearray, piece: int = _SLICE) -> bytearray:
    """`text` with each stray byte replaced by U+FFFD and each lone surrogate escape by
    `\\ufffd`, a piece of about `piece` bytes at a time: a hostile header of hundreds of MB is
    mended in one copy of itself (decoding it whole built a string of twice its size, then an
    encoded copy and a substituted one)."""
    out = bytearray()
    lo = 0
    while lo < len(text):
        cut = _SAFE_CUT.search(text, lo + piece) if lo + piece < len(text) else None
        hi = cut.start() if cut else len(text)
        part = bytes(text[lo:hi]).decode("utf-8", "replace").encode("utf-8")
        out += LONE_SURROGATE.sub(rb"\\ufffd", part) if b"\\u" in part else part
        lo = hi
    return out

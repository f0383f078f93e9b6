"""The text before a trace's event list is scanned, never decoded as objects to find the list:
a header that nests the `traceEvents` key a thousand times, holds megabytes of tiny objects, or
carries a stray byte, a lone surrogate escape or a byte-order mark costs linear time and memory
and changes nothing but a note. Hostile sizes run in a subprocess with a deadline or a memory
reading, so that the old behaviour fails the test instead of hanging the suite."""

from __future__ import annotations

import gzip
import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from stallscope.trace import decode
from stallscope.trace.decode import Limits, stream_decode
from stallscope.trace.header import KeyFinder, Scan
from stallscope.trace.load import load_trace
from tests.conftest import run_cli

MB = 1 << 20
EVENTS = [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s}", "pid": 1, "tid": 1,
           "ts": 1000.0 * s, "dur": 900.0} for s in range(4)]
EVENTS_TEXT = json.dumps(EVENTS).encode()


def _trace(header: bytes, tail: bytes = b"}") -> bytes:
    """A trace whose text before `"traceEvents": [` is `header` (an open object's keys)."""
    return header + b'"traceEvents": ' + EVENTS_TEXT + tail


def _read(text: bytes, **limits: int) -> decode.Decoded:
    decoded = stream_decode(io.BytesIO(text), limits=Limits(**limits))
    assert decoded is not None, "not streamed"
    return decoded


def _in_subprocess(path: Path, timeout: float = 120) -> list[str]:
    """`load_trace(path)` in a fresh process: its events, notes count and peak RSS in MB."""
    code = ("import resource, sys; from pathlib import Path;"
            "from stallscope.trace.load import load_trace;"
            "t = load_trace(Path(sys.argv[1]));"
            "print(len(t.events), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)")
    proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.split()


# --------------------------------------------------------------------- the scanner itself


def _depths_by_hand(text: bytes) -> list[tuple[int, bool]]:
    """(depth, inside a string) before each byte: the reference the scanner must match. A
    backslash escapes the quote after it (JSON has backslashes only in strings; in damaged text
    the scanner reads one outside a string the same way)."""
    out, depth, inside, escaped = [], 0, False, False
    for c in text:
        out.append((depth, inside))
        if c == 0x22 and not escaped:
            inside = not inside
        elif not inside and c in b"{[":
            depth += 1
        elif not inside and c in b"}]":
            depth -= 1
        escaped = c == 0x5C and not escaped
    return out


def test_the_scan_agrees_with_the_reference_on_random_text(monkeypatch: pytest.MonkeyPatch):
    import random

    from stallscope.trace import header

    rnd = random.Random(1)
    for _ in range(2000):
        text = bytes(rnd.choice(b'\\\\"{}[]a ') for _ in range(rnd.randint(1, 40)))
        monkeypatch.setattr(header, "_SLICE", rnd.choice([1, 2, 3, 5, 64]))
        depths, strings, _ = Scan().advance(text, len(text), np.arange(len(text)))
        got = list(zip(depths.tolist(), strings.tolist(), strict=True))
        assert got == _depths_by_hand(text), (text, header._SLICE)


@pytest.mark.parametrize("slice_bytes", [3, 7, 64, 1 << 20])
def test_the_scan_agrees_with_a_byte_by_byte_reading_across_slices(
        monkeypatch: pytest.MonkeyPatch, slice_bytes: int) -> None:
    """Escapes split across slices (`\\\\` then `"`), brackets inside strings, odd runs of
    backslashes: depth and string state at every byte as a plain reading gives them."""
    from stallscope.trace import header

    monkeypatch.setattr(header, "_SLICE", slice_bytes)
    text = (b'{"a\\\\": "x\\"}]", "b": [{"c": "\\\\\\"[{"}, [1, {"d": "}"}]],'
            b' "e\\\\\\\\": "\\\\", "traceEvents": [')
    marks = np.arange(len(text), dtype=np.int64)
    scan = Scan()
    depths, strings, _ = scan.advance(text, len(text), marks)
    assert list(zip(depths.tolist(), strings.tolist(), strict=True)) == _depths_by_hand(text)
    assert scan.depth == 2 and not scan.in_string and scan.deepest == 4


def test_only_the_top_level_key_opens_the_event_list() -> None:
    text = (b'{"x": {"traceEvents": [1]}, "s": "\\"traceEvents\\": [", '
            b'"l": [{"traceEvents": []}], "traceEvents": [')
    finder = KeyFinder()
    finder.open(text)
    found = finder.find(text, final=True)
    assert found is not None and found.start() == text.rindex(b'"traceEvents"')


# ------------------------------------------------------------------------- hostile headers


def test_a_header_nesting_the_key_thousands_of_times_reads_in_one_pass(tmp_path: Path) -> None:
    """0.4 MB of nested `{"traceEvents": []}` keys took 259 s (the header decoded again for
    each); its events are read at once now."""
    fakes = b'"k": [' + b", ".join([b'{"traceEvents": []}'] * 20_000) + b"], "
    path = tmp_path / "synthetic-nested-keys.pt.trace.json.gz"
    path.write_bytes(gzip.compress(_trace(b'{"schemaVersion": 1, ' + fakes)))
    events, _ = _in_subprocess(path, timeout=60)
    assert int(events) == len(EVENTS)


@pytest.mark.slow
def test_a_header_of_tiny_objects_takes_no_memory_to_skip(tmp_path: Path) -> None:
    """A 100 MB header of tiny objects in a small .gz took 2.97 GB (decoded as Python objects,
    ~30 bytes a byte); skipped and scanned, it costs the text and a few MB. One as an unknown
    key, one as a metadata key the analysis reads (too long to decode: left out, said)."""
    tiny = b"{}, " * (12 * MB)  # 48 MB of objects
    path = tmp_path / "synthetic-tiny-objects.pt.trace.json.gz"
    path.write_bytes(gzip.compress(_trace(b'{"junk": [' + tiny + b'{}], "deviceProperties": ['
                                          + tiny + b"{}], ", ), compresslevel=1))
    events, peak_mb = _in_subprocess(path)
    assert int(events) == len(EVENTS)
    # The 96 MB of text, held while it is read, and copies of it (about 0.4 GB in a quiet
    # process); the objects decoded took 2.1 GB.
    assert int(peak_mb) < 1500, peak_mb
    trace = load_trace(path)
    assert any("metadata deviceProperties was not read" in n for n in trace.notes), trace.notes


@pytest.mark.parametrize("stray", [b"\xff\xfe", b"\\ud800"], ids=["bad-utf8", "lone-surrogate"])
def test_a_stray_byte_in_the_header_changes_nothing_but_a_note(tmp_path: Path,
                                                                stray: bytes) -> None:
    """One bad byte in the GPU's name sent the file to the whole-document reader (2.5x the
    memory, refused over the buffer limit); the stream reads it, metadata and all."""
    header = (b'{"schemaVersion": 1, "deviceProperties": [{"name": "GPU ' + stray + b'"}], '
              b'"distributedInfo": {"rank": 3, "world_size": 8}, ')
    decoded = _read(_trace(header))
    assert decoded.columns.seen == len(EVENTS) and decoded.columns.repaired == 1
    assert decoded.metadata.distributedInfo == {"rank": 3, "world_size": 8}
    assert decoded.metadata.deviceProperties[0]["name"].startswith("GPU \ufffd")
    path = tmp_path / "synthetic-stray.pt.trace.json"
    path.write_bytes(_trace(header))
    trace = load_trace(path)
    assert any("not valid UTF-8" in n for n in trace.notes), trace.notes


def test_a_byte_order_mark_at_the_start_is_skipped_and_said(tmp_path: Path) -> None:
    text = b"\xef\xbb\xbf" + _trace(b'{"schemaVersion": 1, ')
    decoded = _read(text)
    assert decoded.columns.seen == len(EVENTS) and decoded.metadata.schemaVersion == 1
    path = tmp_path / "synthetic-bom.pt.trace.json"
    path.write_bytes(text)
    assert any("byte-order mark" in n for n in load_trace(path).notes)
    array = _read(b"\xef\xbb\xbf  " + EVENTS_TEXT)
    assert array.array and array.columns.seen == len(EVENTS)


def test_a_header_that_is_not_json_keeps_its_events_and_says_the_metadata_is_lost() -> None:
    decoded = _read(_trace(b'{"schemaVersion": 1, "deviceProperties": [1 2], '))
    assert decoded.columns.seen == len(EVENTS)
    assert any("keys before the event list are not JSON" in n for n in decoded.notes)


def test_keys_after_the_event_list_are_read_beside_the_header() -> None:
    decoded = _read(_trace(b'{"schemaVersion": 1, ',
                           b', "traceName": "t", "distributedInfo": {"rank": 1}}'))
    meta = decoded.metadata
    assert (meta.schemaVersion, meta.traceName, meta.distributedInfo) == (1, "t", {"rank": 1})


# ------------------------------------------------------------------------- buffer limits


def test_the_buffer_limit_holds_before_the_memory_is_taken(tmp_path: Path) -> None:
    """Whitespace with no event boundary was read to twice the limit before it was refused
    (621 MB for 256); now at most one read block past it."""
    text = b'{"traceEvents": [' + json.dumps(EVENTS[0]).encode() + b"," + b" " * (40 * MB)
    seen: list[int] = []
    with pytest.raises(decode.LimitExceeded, match="without an event boundary"):
        stream_decode(io.BytesIO(text + b"]}"), seen.append, Limits(max_buffer_bytes=8 * MB))
    assert sum(seen) <= 8 * MB + decode.BLOCK_BYTES, sum(seen) / MB


def test_a_header_past_the_limit_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "synthetic-long-header.pt.trace.json.gz"
    path.write_bytes(gzip.compress(_trace(b'{"junk": "' + b"x" * (40 * MB) + b'", ')))
    proc = run_cli("analyze", str(path), "-o", str(tmp_path / "out"), "--max-buffer-mb", "16")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "no event list in its first 16 MB" in proc.stderr


# ------------------------------------------------------------------------- mending, memory


def _mended_whole(text: bytes) -> bytes:
    """The reference: the whole text decoded with replacement, then lone surrogates replaced."""
    from stallscope.trace.header import LONE_SURROGATE

    return LONE_SURROGATE.sub(rb"\\ufffd", text.decode("utf-8", "replace").encode("utf-8"))


def test_mending_in_pieces_is_mending_the_whole_text() -> None:
    """Stray bytes, characters of several bytes, cut characters, lone and paired surrogate
    escapes and escaped backslashes, cut into pieces of any size: the same text as mending it
    whole (which built a string of twice the header's size)."""
    import random

    from stallscope.trace.header import mend

    parts = [b"\xff", b"\xfe", b"\xc3\xa9", b"\xe2\x82", b"\xe2\x82\xac", b"\xf0\x9f", b"\\ud83d",
             b"\\udc00", b"\\ud83d\\ude00", b"\\\\", b"\\", b'"', b"u", b"d", b"8", b"c",
             b"a", b"F", b" ", b",", b"{", b"}", b"x"]
    rnd = random.Random(3)
    for _ in range(3000):
        text = b"".join(rnd.choice(parts) for _ in range(rnd.randint(0, 60)))
        piece = rnd.choice([1, 2, 3, 5, 8, 1 << 20])
        assert bytes(mend(text, piece)) == _mended_whole(text), (text, piece)
        assert bytes(mend(bytearray(text), piece)) == _mended_whole(text)


def test_a_hostile_header_with_a_stray_byte_is_read_in_about_two_copies_of_itself() -> None:
    """6 MB of nested `traceEvents` keys with a stray byte and a lone surrogate in the GPU's
    name: a match object per key for a whole block, then the header copied, closed, decoded
    into a string of twice its size and encoded again took 12x its size (a 250 MB header in a
    small .gz: 1.6 GB); the key is now judged a batch of candidates at a time and the header
    cut and mended in place of the text read."""
    import tracemalloc

    nested = b'{"traceEvents": []}, ' * (6 * MB // 21)
    header = (b'{"schemaVersion": 1, "deviceProperties": [{"name": "GPU \xff\\ud83d"}], "k": ['
              + nested + b'{}], "distributedInfo": {"rank": 3, "world_size": 8}, ')
    text = _trace(header)
    _read(_trace(b"{"))  # imports and first-call allocations are not the header's
    tracemalloc.start()
    try:
        decoded = _read(text)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert decoded.columns.seen == len(EVENTS) and decoded.columns.repaired == 1
    assert decoded.metadata.distributedInfo == {"rank": 3, "world_size": 8}
    assert decoded.metadata.deviceProperties[0]["name"] == "GPU \ufffd\ufffd"
    assert peak < 3 * len(header), peak / len(header)

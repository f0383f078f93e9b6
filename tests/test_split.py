"""A large trace read in parts on several cores (trace/split.py) is the trace read whole.

The size thresholds are lowered so committed traces (1-30 MB of JSON) are cut into several
parts; every test compares against the sequential reader, which is the definition.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pandas as pd
import pytest

from stallscope.trace import split
from stallscope.trace.load import load_trace

ROOT = Path(__file__).resolve().parents[1]
PUBLIC = ROOT / "sample_traces" / "public"
TRACES = [  # small, so the suite stays fast: the parts are made small too
    PUBLIC / "hta" / "a100_alexnet_pageable_htod.pt.trace.json.gz",  # traceName after events
    PUBLIC / "hta" / "amd_mi250_rocm62_minitoy.pt.trace.json.gz",  # ROCm: ids written as text
    PUBLIC / "hta" / "legacy_schema_inference_rank1.pt.trace.json.gz",  # distributedInfo after
]


@pytest.fixture(autouse=True)
def small_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(split, "PARALLEL_MIN_BYTES", 1)
    monkeypatch.setattr(split, "MIN_PART_BYTES", 2 << 10)


def plain_copy(src: Path, tmp_path: Path) -> Path:
    out = tmp_path / src.name.removesuffix(".gz")
    out.write_bytes(gzip.decompress(src.read_bytes()))
    return out


def assert_same(a: object, b: object) -> None:
    pd.testing.assert_frame_equal(a.events, b.events)  # type: ignore[attr-defined]
    for key, value in vars(a).items():
        if isinstance(value, pd.DataFrame):
            pd.testing.assert_frame_equal(value, getattr(b, key))
        else:
            assert getattr(b, key) == value, key


@pytest.mark.parametrize("src", TRACES, ids=lambda p: p.name.split(".")[0])
@pytest.mark.parametrize("cores", [2, 5])
def test_parts_read_the_same_trace_as_the_whole(src: Path, cores: int, tmp_path: Path) -> None:
    path = plain_copy(src, tmp_path)
    parts = split.plan_parts(path, path.stat().st_size, cores)
    assert parts is not None and len(parts) == cores  # it really was cut
    assert_same(load_trace(path, cores=1), load_trace(path, cores=cores))


def test_the_array_form_and_a_missing_close_read_alike(tmp_path: Path) -> None:
    doc = json.loads(gzip.decompress(TRACES[0].read_bytes()))
    array = tmp_path / "array.json"
    text = json.dumps(doc["traceEvents"])
    array.write_text(text)
    assert_same(load_trace(array, cores=1), load_trace(array, cores=3))
    unclosed = tmp_path / "unclosed.json"  # the Chrome format allows a missing `]`
    unclosed.write_text(text.rstrip()[:-1])
    whole, parts = load_trace(unclosed, cores=1), load_trace(unclosed, cores=3)
    assert_same(whole, parts)
    assert len(parts.events) == len(load_trace(array, cores=1).events)


def test_a_file_cut_off_keeps_the_events_before_the_cut(tmp_path: Path) -> None:
    path = plain_copy(TRACES[0], tmp_path)
    data = path.read_bytes()
    cut = tmp_path / "cut.json"
    cut.write_bytes(data[: int(len(data) * 0.9)])  # a job killed while writing its trace
    whole, parts = load_trace(cut, cores=1), load_trace(cut, cores=3)
    assert whole.truncated and parts.truncated
    assert_same(whole, parts)


def test_boundaries_inside_names_never_split_an_event(tmp_path: Path) -> None:
    """Names full of `}, {` put the nominal cuts inside strings: the part that ends or starts
    there is not clean, so the file is read whole again, and reads the same."""
    doc = json.loads(gzip.decompress(TRACES[0].read_bytes()))
    for i, event in enumerate(doc["traceEvents"]):
        if event.get("ph") == "X" and i % 3 == 0:
            event["name"] = event["name"] + '}, {"ph": "X", "name": "fake"}, {' * 40
    path = tmp_path / "tricky.json"
    path.write_text(json.dumps(doc))
    whole = load_trace(path, cores=1)
    assert (whole.events["name"].astype(str).str.contains("fake")).any()
    assert_same(whole, load_trace(path, cores=4))


def test_damage_in_a_part_reads_the_whole_file_again(tmp_path: Path) -> None:
    path = plain_copy(TRACES[0], tmp_path)
    data = bytearray(path.read_bytes())
    for at in range(len(data) // 7, len(data), len(data) // 7):  # not JSON here and there
        data[at:at + 4] = b"\x00#!~"
    damaged = tmp_path / "damaged.json"
    damaged.write_bytes(bytes(data))
    assert split.decode_parallel(damaged, 3) is None  # not clean: the parts prove nothing
    whole, parts = load_trace(damaged, cores=1), load_trace(damaged, cores=3)
    assert whole.skipped_events == 6 and "not JSON" in " ".join(whole.notes)
    assert_same(whole, parts)


def test_progress_counts_every_byte_once(tmp_path: Path) -> None:
    path = plain_copy(TRACES[0], tmp_path)
    seen: list[int] = []
    reading = split.start(path, 3)
    assert reading is not None
    decoded = reading.result(seen.append)
    assert decoded is not None
    # Each part is a document of its own (its lead and trail counted), less the two commas cut.
    lead = len(b'{"traceEvents":[') * 2 + len(b"]}") * 2
    assert sum(seen) == path.stat().st_size - 2 + lead


def test_small_and_gzip_files_are_read_in_one_process(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    assert split.start(TRACES[0], 4) is None  # gzip cannot be entered mid-stream
    monkeypatch.setattr(split, "PARALLEL_MIN_BYTES", 64 << 20)
    assert split.start(plain_copy(TRACES[0], tmp_path), 4) is None


def test_analyze_reads_one_large_file_on_every_core(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the command line: the parts start before the analysis is imported and the
    report is the one a single process writes."""
    from stallscope.cli import main

    path = plain_copy(TRACES[0], tmp_path)
    started: list[int] = []
    real_start = split.start

    def spy(p: Path, cores: int, limits: object = None) -> split.Reading | None:
        reading = real_start(p, cores, limits) if limits else real_start(p, cores)
        started.append(cores if reading else 0)
        return reading

    monkeypatch.setattr(split, "start", spy)
    assert main(["analyze", str(path), "-q", "--jobs", "3", "-o", str(tmp_path / "par")]) == 0
    assert started == [3]
    assert main(["analyze", str(path), "-q", "--jobs", "1", "-o", str(tmp_path / "one")]) == 0
    one = json.loads((tmp_path / "one" / "report.json").read_text())
    par = json.loads((tmp_path / "par" / "report.json").read_text())
    for report in (one, par):
        report.pop("source", None)
        report.pop("generated", None)
    assert par["verdict"] == one["verdict"]
    assert par["findings"] == one["findings"]


def test_parts_keep_the_memory_events(tmp_path: Path) -> None:
    """profile_memory's `[memory]` instant events survive the cut, in order, none twice."""
    src = PUBLIC / "kineto" / "resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz"
    path = plain_copy(src, tmp_path)
    whole, parted = load_trace(path, cores=1), load_trace(path, cores=3)
    assert len(whole.memory) > 1000
    assert_same(whole, parted)

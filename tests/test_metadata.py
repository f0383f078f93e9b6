"""stallscope's facts travel in the trace's metadata; Kineto turns every backslash in it into a
slash, so a call site or a sampled source line holding a quote used to break the trace file."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from stallscope.capture.metadata import metadata_text

NASTY = {"call_site": 'C:\\data\\train.py:12', "line": 'img.convert("RGB")\tx\n',
         "name": "données_✓", "nested": [{"q": '"'}], "n": 1.5}


def test_metadata_text_has_no_backslash_and_keeps_the_facts() -> None:
    text = metadata_text(NASTY)
    assert "\\" not in text
    back = json.loads(text)
    assert back["call_site"] == "C:/data/train.py:12"
    assert back["line"] == "img.convert('RGB') x "
    assert back["name"] == "données_✓" and back["nested"] == [{"q": "'"}] and back["n"] == 1.5


def test_the_trace_kineto_writes_stays_valid_json(tmp_path: Path) -> None:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.ones(4).add_(1)
        prof.add_metadata_json("stallscope", metadata_text(NASTY))
    path = tmp_path / "t.json"
    prof.export_chrome_trace(str(path))
    data = json.loads(path.read_text(encoding="utf-8"))
    meta = data["stallscope"]
    meta = json.loads(meta) if isinstance(meta, str) else meta
    assert meta["name"] == "données_✓" and meta["line"] == "img.convert('RGB') x "

"""The small ways a careless operator or a hostile neighbour breaks a command: a malformed Dask
address, a typo in an input, a symlink planted where -o points, a trace name holding control
characters. Each is one line and a documented exit code, and leaves nothing behind."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import SAMPLES, run_cli

TRACE = SAMPLES / "cpu-loader-bound.pt.trace.json.gz"
RANKS = [SAMPLES / f"cpu-gloo-ddp-rank{r}.pt.trace.json.gz" for r in (0, 1)]


@pytest.mark.parametrize("address", ["tcp://host:notaport", "::::", "foo bar", "tcp://",
                                     "http://host:8786", "local:0"])
def test_a_malformed_scheduler_address_is_a_usage_error(tmp_path: Path, address: str) -> None:
    done = run_cli("analyze", *map(str, RANKS), "-o", str(tmp_path / "out"), "--scheduler",
                   address)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "not a Dask scheduler address" in done.stderr
    assert "internal error" not in done.stderr
    assert not (tmp_path / "out").exists()  # refused before any work, nothing left behind


def test_a_malformed_dask_scheduler_address_variable_is_a_usage_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DASK_SCHEDULER_ADDRESS", "tcp://host:notaport")
    done = run_cli("analyze", *map(str, RANKS), "-o", str(tmp_path / "out"))
    assert done.returncode == 2 and "$DASK_SCHEDULER_ADDRESS" in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1


def test_a_typo_in_an_input_leaves_no_empty_output_folder(tmp_path: Path) -> None:
    done = run_cli("analyze", "trcae.json.gz", cwd=tmp_path)
    assert done.returncode == 2 and "trcae.json.gz" in done.stderr
    assert list(tmp_path.iterdir()) == []  # no ./stallscope-trcae/
    nested = tmp_path / "new" / "deeper"
    assert run_cli("analyze", "missing.json", "-o", str(nested)).returncode == 2
    assert list(tmp_path.iterdir()) == []  # the parents it made went too


def test_a_refused_input_keeps_a_folder_that_was_there(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    assert run_cli("analyze", "missing.json", "-o", str(tmp_path / "out")).returncode == 2
    assert (tmp_path / "out").is_dir()  # not this command's to remove


def test_a_symlink_planted_in_a_shared_folder_is_refused(tmp_path: Path) -> None:
    shared, victim = tmp_path / "shared", tmp_path / "victim"
    shared.mkdir()
    victim.mkdir()
    shared.chmod(0o1777)  # a /tmp: anyone can plant a link there
    (shared / "out").symlink_to(victim)
    done = run_cli("analyze", str(TRACE), "-o", str(shared / "out"))
    assert done.returncode == 2 and "symlink" in done.stderr and str(victim) in done.stderr
    assert done.stderr.count("\n") == 1
    assert list(victim.iterdir()) == []  # nothing written where the link leads


def test_a_symlink_of_ones_own_is_followed_and_said(tmp_path: Path) -> None:
    mine, real = tmp_path / "mine", tmp_path / "real"
    mine.mkdir(mode=0o755)
    real.mkdir()
    (mine / "latest").symlink_to(real)
    done = run_cli("analyze", str(TRACE), "-o", str(mine / "latest"))
    assert done.returncode == 0, done.stderr
    assert f"writing to {real}" in done.stderr
    assert (real / "report.json").is_file()


def test_control_characters_never_reach_the_tensorboard_copys_name(tmp_path: Path) -> None:
    hostile = tmp_path / "a\x1b[2J\u202egpj.\nrank0.pt.trace.json.gz"
    shutil.copy(TRACE, hostile)
    done = run_cli("analyze", str(hostile), "-o", str(tmp_path / "out"), "--tensorboard")
    assert done.returncode == 0, done.stderr
    names = [p.name for p in (tmp_path / "out" / "tensorboard").rglob("*")]
    assert any(n.endswith(".pt.trace.json.gz") for n in names)
    unsafe = [n for n in names if any(ord(c) < 32 or 0x7f <= ord(c) < 0xa0 or c == "\u202e"
                                      for c in n)]
    assert unsafe == []



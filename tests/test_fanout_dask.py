"""The executor seam (fanout): a job's rank files analysed on a real Dask cluster make the same
report.json, byte for byte, as the local process pool; `--scheduler` without Dask says how to
get it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from stallscope.cli import main
from tests.conftest import real_trace


def _job(tmp_path: Path) -> Path:
    """Two real rank files of one job, copied under names that say which rank they are."""
    job = tmp_path / "job"
    job.mkdir()
    for r in (0, 1):
        src = real_trace(f"hta/rank{r}of128_sampled.pt.trace.json.gz")
        shutil.copy(src, job / f"rank{r}of128_sampled.pt.trace.json.gz")
    return job


@pytest.mark.slow
def test_dask_cluster_gives_the_local_pools_report_json(tmp_path: Path) -> None:
    pytest.importorskip("distributed", reason="the [dask] extra is not installed")
    job = _job(tmp_path)
    local, dask = tmp_path / "local", tmp_path / "dask"
    assert main(["analyze", str(job), "-q", "-o", str(local), "--jobs", "2"]) == 0
    # A real scheduler and two worker processes on loopback (LocalCluster(processes=True)).
    assert main(["analyze", str(job), "-q", "-o", str(dask), "--scheduler", "local:2"]) == 0
    a = (local / "report.json").read_bytes()
    b = (dask / "report.json").read_bytes()
    assert a == b
    assert len(json.loads(b)["traces"]) == 2


def test_scheduler_without_dask_says_how_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import builtins

    real_import = builtins.__import__

    def no_distributed(name: str, *args: object, **kwargs: object) -> object:
        if name == "distributed" or name.startswith("distributed."):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_distributed)
    job = _job(tmp_path)
    status = main(["analyze", str(job), "-q", "-o", str(tmp_path / "o"), "--scheduler",
                   "tcp://127.0.0.1:1"])
    assert status != 0
    assert "stallscope[dask]" in capsys.readouterr().err

"""DataLoader advice under Hugging Face Trainer, Lightning and accelerate, run for real.

Under a framework the line that calls `DataLoader(...)` is the framework's, and advice pointing
there cannot be pasted. Each test runs a tiny training script under `stallscope run` with a
dataset that sleeps in `__getitem__` (so the step waits on the loader) and checks that the
recommendation names the knob the user writes, at the line in their own script. Models are
built in the script (no downloads), with no loggers or progress bars. A test skips, saying why,
when its framework is not installed (`pip install -e '.[frameworks]'`).
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from stallscope.capture import frameworks
from stallscope.diagnose.knobs import Knobs
from stallscope.diagnose.rules.pageable_h2d_copy import pageable_h2d_copy
from stallscope.diagnose.rules.worker_startup import worker_startup
from stallscope.runfacts import LoaderInfo, RunContext
from stallscope.trace.load import load_trace
from stallscope.trace.model import build_model
from tests.conftest import SAMPLES, real_trace

SLOW_DATASET = textwrap.dedent(
    """
    import time
    import torch
    from torch.utils.data import Dataset

    class SlowDataset(Dataset):
        # Each item waits 4 ms, as a read from slow storage would: the step waits on loading.
        def __len__(self):
            return 512

        def __getitem__(self, i):
            time.sleep(0.004)
            g = torch.Generator().manual_seed(i)
            return torch.randn(16, generator=g), torch.tensor([float(i % 2)])
    """
)

HF_TRAINER = SLOW_DATASET + textwrap.dedent(
    """
    from transformers import Trainer, TrainingArguments

    class DictDataset(SlowDataset):
        def __getitem__(self, i):
            x, y = super().__getitem__(i)
            return {"x": x, "labels": y}

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(16, 1)

        def forward(self, x, labels=None):
            out = self.lin(x)
            return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}

    def main():
        args = TrainingArguments(  # ARGS
            output_dir="hf-out", per_device_train_batch_size=8, num_train_epochs=1,
            report_to=[], disable_tqdm=True, save_strategy="no", logging_strategy="no",
            use_cpu=True,
        )
        trainer = Trainer(model=Tiny(), args=args, train_dataset=DictDataset())
        trainer.train()  # TRAIN

    main()
    """
)

LIGHTNING = SLOW_DATASET + textwrap.dedent(
    """
    import lightning.pytorch as L
    from torch.utils.data import DataLoader

    class Model(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(16, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.lin(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def train_dataloader(self):
            return DataLoader(SlowDataset(), batch_size=8, num_workers=0)  # LOADER

    trainer = L.Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(Model())
    """
)

ACCELERATE = SLOW_DATASET + textwrap.dedent(
    """
    from accelerate import Accelerator
    from torch.utils.data import DataLoader

    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(16, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(SlowDataset(), batch_size=8, shuffle=True)  # LOADER
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for x, y in loader:
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
    """
)


def line_of(script: str, marker: str) -> int:
    return next(i for i, text in enumerate(script.splitlines(), 1) if f"# {marker}" in text)


def stallscope(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stallscope", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300, check=False)


def run_script(tmp_path: Path, script: str, *options: str) -> dict:
    (tmp_path / "train.py").write_text(script)
    proc = stallscope("run", "-q", "-o", "out", *options, "train.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((tmp_path / "out" / "report.json").read_text())


def training_loader(report: dict) -> dict:
    return max(report["dataloaders"], key=lambda d: d["batches_recorded"])


def finding(report: dict, rule: str) -> dict:
    found = [f for f in report["findings"] if f["id"] == rule]
    assert found, [f["id"] for f in report["findings"]]
    return found[0]


# ------------------------------------------------------------------------- real runs


@pytest.mark.slow
def test_hf_trainer_advice_is_training_arguments_at_the_users_line(tmp_path: Path) -> None:
    """Trainer builds `DataLoader(...)` in transformers/trainer.py and accelerate rebuilds it:
    the user's knob is `TrainingArguments(dataloader_num_workers=...)`, at their line."""
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    report = run_script(tmp_path, HF_TRAINER)
    args_line = f"train.py:{line_of(HF_TRAINER, 'ARGS')}"
    top = finding(report, "dataloader-bound")
    assert top["recommendation"].startswith(
        f"{args_line} TrainingArguments(dataloader_num_workers=0, dataloader_pin_memory=False)"
        " -> TrainingArguments(..., dataloader_num_workers="), top["recommendation"]
    workers = top["evidence"]["suggested_num_workers"]
    assert (f"+TrainingArguments(..., dataloader_num_workers={workers}, "
            "dataloader_persistent_workers=True)") in top["snippet"]
    assert top["snippet"].startswith(f"# {args_line}")
    assert "DataLoader(..., num_workers" not in top["recommendation"] + top["snippet"]
    assert "site-packages" not in top["recommendation"] + top["snippet"]
    verdict = report["verdict"]  # the first line names the same knob, at the same line
    assert verdict["id"] == "dataloader-bound", verdict
    assert f"Fix first: TrainingArguments(..., dataloader_num_workers={workers}) at " \
        f"{args_line}" in verdict["text"], verdict
    loader = training_loader(report)
    assert loader["framework"] == "transformers.Trainer"
    assert loader["configured_in"] == "TrainingArguments"
    assert loader["settings_site"] == args_line
    assert loader["call_site"] == f"train.py:{line_of(HF_TRAINER, 'TRAIN')}"  # trainer.train()
    assert loader["user_site"].endswith(" in main")
    assert loader["built_at"].startswith("accelerate/data_loader.py:")  # the rebuild's line
    html = (tmp_path / "out" / "report.html").read_text()
    assert f"<code>{loader['call_site']}</code> <span class=\"muted\">via transformers.Trainer" \
        in html


@pytest.mark.slow
def test_lightning_advice_names_the_users_train_dataloader(tmp_path: Path) -> None:
    """Lightning wraps DataLoader's constructor: the call site is still the `DataLoader(...)`
    inside the user's `train_dataloader()`, not Lightning's wrapper."""
    pytest.importorskip("lightning")
    report = run_script(tmp_path, LIGHTNING)
    site = f"train.py:{line_of(LIGHTNING, 'LOADER')}"
    top = finding(report, "dataloader-bound")
    assert top["recommendation"].startswith(
        f"{site} DataLoader(num_workers=0, pin_memory=False) -> DataLoader(..., num_workers="
    ), top["recommendation"]
    assert "Model.train_dataloader()" in top["recommendation"]
    assert top["snippet"].startswith(f"# {site}")
    assert "lightning" not in top["snippet"].split("\n")[1]  # the diff lines are the user's call
    loader = training_loader(report)
    assert (loader["framework"], loader["call_site"]) == ("lightning", site)
    assert loader["user_site"] == f"{site} in Model.train_dataloader"


@pytest.mark.slow
def test_accelerate_advice_names_the_loader_passed_to_prepare(tmp_path: Path) -> None:
    """accelerate's prepare builds a new DataLoader inside a DataLoaderShard: the loader the
    step draws from keeps the call site of the one the user wrote."""
    pytest.importorskip("accelerate")
    report = run_script(tmp_path, ACCELERATE)
    site = f"train.py:{line_of(ACCELERATE, 'LOADER')}"
    top = finding(report, "dataloader-bound")
    assert top["recommendation"].startswith(f"{site} DataLoader(num_workers=0"), \
        top["recommendation"]
    assert "accelerator.prepare" in top["recommendation"]
    assert "site-packages" not in top["recommendation"] + top["snippet"]
    loader = training_loader(report)
    assert loader["framework"] == "accelerate"
    assert loader["call_site"] == site
    assert loader["built_at"].startswith("accelerate/data_loader.py:")
    assert loader["batch_size"] == 8  # the rebuild passes a batch sampler; the size is the user's


@pytest.mark.slow
def test_set_num_workers_reaches_the_loader_trainer_builds(tmp_path: Path) -> None:
    """`--set` acts on the DataLoader constructor: the one Trainer builds and the one accelerate
    rebuilds from it both run 2 workers, and the report says what the script asked for."""
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    report = run_script(tmp_path, HF_TRAINER, "--set", "num_workers=2")
    loader = training_loader(report)
    assert loader["num_workers"] == 2
    assert loader["overrides"] == {"num_workers": 2}
    assert loader["built_with"] == {"num_workers": 0}  # TrainingArguments' own value
    assert loader["framework"] == "transformers.Trainer"
    assert report["run"]["overrides"] == {"num_workers": 2}
    md = (tmp_path / "out" / "report.md").read_text()
    assert "Overridden run" in md and "num_workers=2" in md


@pytest.mark.slow
def test_workers_of_the_loader_accelerate_rebuilds_are_measured(tmp_path: Path) -> None:
    """accelerate hands the rebuilt loader the original's collate_fn and worker_init_fn, which
    stallscope had wrapped already: its workers must report into the rebuilt loader's anatomy
    (measured in the workers, waiting on the sleep), and `--set` must say the script's 0."""
    pytest.importorskip("accelerate")
    report = run_script(tmp_path, ACCELERATE, "--set", "num_workers=2")
    loader = training_loader(report)
    assert loader["framework"] == "accelerate"
    assert (loader["num_workers"], loader["built_with"]) == (2, {"num_workers": 0})
    anatomy = loader["anatomy"]
    assert "lost" not in anatomy, anatomy
    assert anatomy["where"] == "workers" and anatomy["workers_reporting"] >= 1
    assert loader["bound"] == "waiting"


@pytest.mark.slow
def test_tune_under_trainer_proposes_training_arguments(tmp_path: Path) -> None:
    """tune measures with `--set` and writes the winning change as the user writes it."""
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    (tmp_path / "train.py").write_text(HF_TRAINER)
    proc = subprocess.run(
        [sys.executable, "-m", "stallscope", "tune", "-q", "-o", "tune", "--repeats", "1",
         "--budget", "600", "train.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=900, check=False)
    # A budget no busy machine exhausts (transformers alone takes seconds to import in each
    # run): tune ends when its candidates are measured, not at the budget.
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "tune" / "tune.json").read_text())
    assert [c for c in result["candidates"] if c["status"] == "measured"], result["skipped"]
    assert result["call_site"] == f"train.py:{line_of(HF_TRAINER, 'ARGS')}"
    assert result["best"]["overrides"]["num_workers"] >= 1  # the loader sleeps: workers help
    assert result["change"].startswith("TrainingArguments(..., dataloader_num_workers=")
    assert result["before"].startswith("TrainingArguments(..., dataloader_num_workers=0")
    md = (tmp_path / "tune" / "tune.md").read_text()
    assert result["change"] in md


# ------------------------------------------------- the other rules' advice, same knobs


def _trainer_context(workers: int = 2) -> RunContext:
    loader = LoaderInfo(
        call_site="train.py:50", num_workers=workers, pin_memory=False, batch_size=16,
        prefetch_factor=2 if workers else None, persistent_workers=False,
        dataset="ImageDataset (96 items)", dataset_len=96, batches=18, batches_recorded=14,
        framework="transformers.Trainer", user_site="train.py:50 in main",
        configured_in="TrainingArguments", settings_site="train.py:31",
        built_at="accelerate/data_loader.py:441",
    )
    return RunContext(command=["stallscope", "run", "train.py"], target="train.py",
                      dataloaders=[loader],
                      environment={"cpu": {"cores_per_process": 2, "torch_threads": 1}})


def test_worker_startup_under_trainer_sets_dataloader_persistent_workers() -> None:
    model = build_model(load_trace(SAMPLES / "cpu-worker-startup.pt.trace.json.gz"))
    a = worker_startup(model, _trainer_context())
    assert a.status == "finding"
    assert a.finding.recommendation.startswith("train.py:31 (transformers.Trainer builds")
    assert "+TrainingArguments(..., dataloader_num_workers=2, " \
           "dataloader_persistent_workers=True)" in a.finding.snippet
    assert "DataLoader(..." not in a.finding.snippet


def test_pageable_copies_under_trainer_pin_through_training_arguments() -> None:
    # ResNet-50 on a V100 with 4 workers: its input copies come from pageable memory.
    path = real_trace("kineto/resnet50_num_workers_4__worker0.1623212756351.pt.trace.json.gz")
    model = build_model(load_trace(path))
    a = pageable_h2d_copy(model, _trainer_context())
    assert a.status == "finding"
    assert "dataloader_pin_memory=True" in a.finding.snippet
    assert '"non_blocking": True' in a.finding.snippet
    assert a.finding.snippet.startswith("# train.py:31")
    assert "TrainingArguments at train.py:31" in a.finding.recommendation
    # Without a run context (a trace analysed alone) the advice is the generic one.
    plain = pageable_h2d_copy(model)
    assert plain.finding.snippet.startswith("loader = torch.utils.data.DataLoader(")


# ------------------------------------------------- a loader another library builds


def test_a_loader_built_by_an_installed_helper_names_the_users_call(tmp_path: Path,
                                                                    monkeypatch) -> None:
    """A helper in an installed package (timm's create_loader, say) calls DataLoader(...): the
    call site is the user's line that called the helper, and the advice says where the loader
    is really built, so the user passes the settings through their own call."""
    torch = pytest.importorskip("torch")
    from stallscope.capture.loaders import LoaderWatcher

    libs = tmp_path / "site-packages"
    (libs / "loaderlib").mkdir(parents=True)
    (libs / "loaderlib" / "__init__.py").write_text(
        "from torch.utils.data import DataLoader\n\n"
        "def make(ds, **kw):\n    return DataLoader(ds, batch_size=4, **kw)\n")
    real_dirs = frameworks._library_dirs()
    monkeypatch.setattr(frameworks, "_library_dirs",
                        lambda: (*real_dirs, os.path.join(str(libs), "")))
    spec = importlib.util.spec_from_file_location(
        "loaderlib", libs / "loaderlib" / "__init__.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    watcher = LoaderWatcher(lambda info, it: None)
    watcher.install()
    try:
        line = inspect.currentframe().f_lineno + 1
        module.make(torch.utils.data.TensorDataset(torch.zeros(8, 2)), num_workers=0)
    finally:
        watcher.uninstall()
    [info] = watcher.loaders
    assert info.call_site.endswith(f"test_frameworks.py:{line}")
    assert info.built_at == "loaderlib/__init__.py:4"
    assert info.framework is None and info.configured_in == "DataLoader"
    knobs = Knobs.of(info)
    assert knobs.where == info.call_site
    assert knobs.how == ("the DataLoader is built at loaderlib/__init__.py:4, from this call's "
                         "arguments")


def test_the_verdicts_change_is_spelled_in_training_arguments_under_trainer() -> None:
    """The report's first line is what users act on: under Trainer it must name the field
    they set (`dataloader_num_workers`) and their line, not `num_workers=4`, which they never
    wrote; a plain DataLoader user keeps the --what-if spelling their own call takes."""
    from dataclasses import asdict

    from stallscope.diagnose.knobs import as_written
    from stallscope.diagnose.registry import BY_ID

    trainer = [asdict(d) for d in _trainer_context().dataloaders]
    assert as_written("num_workers=4 + pin_memory=true", BY_ID["dataloader-bound"], trainer) == (
        "TrainingArguments(..., dataloader_num_workers=4, dataloader_pin_memory=True) "
        "at train.py:31")
    pageable = BY_ID["pageable-h2d-copy"]
    assert as_written("pin_memory=true + non_blocking=true", pageable, trainer) == (
        "TrainingArguments(..., dataloader_pin_memory=True) at train.py:31 + non_blocking=true")
    assert as_written("sync=off", BY_ID["host-device-sync"], trainer) == "sync=off"
    plain = [{**trainer[0], "configured_in": None, "framework": None}]
    assert as_written("num_workers=4", BY_ID["dataloader-bound"], plain) == "num_workers=4"

"""The framework callbacks: a tiny Lightning fit and a tiny Hugging Face Trainer run on the CPU,
each with stallscope's callback, write a report of the batches it recorded and train on."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

import stallscope

REPORT_FILES = {"report.json", "report.html", "report.md"}


def _report(out: Path) -> dict:
    assert {p.name for p in out.iterdir()} >= REPORT_FILES
    return json.loads((out / "report.json").read_text())


# ---------------------------------------------------------------------------- Lightning


def _lightning_fit(tmp_path: Path, batches: int, **callback: object):
    L = pytest.importorskip("lightning")  # noqa: N806 (lightning's own spelling)
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from stallscope.integrations.lightning import StallscopeCallback

    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(16, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.lin(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def train_dataloader(self):
            data = TensorDataset(torch.randn(8 * batches, 16), torch.randn(8 * batches, 1))
            return DataLoader(data, batch_size=8)

    cb = StallscopeCallback(**callback)
    trainer = L.Trainer(max_epochs=1, callbacks=[cb], accelerator="cpu", logger=False,
                        enable_progress_bar=False, enable_checkpointing=False,
                        enable_model_summary=False, default_root_dir=str(tmp_path / "root"))
    trainer.fit(Tiny())
    return cb, trainer


@pytest.mark.slow
def test_lightning_callback_writes_a_report_and_training_goes_on(tmp_path: Path) -> None:
    out = tmp_path / "out"
    cb, trainer = _lightning_fit(tmp_path, batches=12, steps=3, skip=2, out_dir=out)
    assert trainer.global_step == 12  # every batch trained: profiling stopped nothing
    data = _report(out)
    assert (data["run"]["step_source"], data["run"]["steps_recorded"]) == ("marker", 3)
    assert not data["run"]["partial"]
    assert isinstance(cb.report, stallscope.Report)
    assert data["verdict"]["text"] == cb.report.verdict
    # the hooks went in before Lightning built the DataLoader: its settings are in the report
    assert [d["batch_size"] for d in data["dataloaders"]] == [8]
    assert not stallscope.marker.active()


@pytest.mark.slow
def test_lightning_callback_in_watch_mode_times_every_batch(tmp_path: Path) -> None:
    out = tmp_path / "out"
    cb, trainer = _lightning_fit(tmp_path, batches=40, steps=3, skip=2, out_dir=out, watch=True)
    assert trainer.global_step == 40
    data = _report(out)
    # Boundaries: as batch `skip` starts, then as each batch from it on ends: 39 of them, so
    # the 38 batches from `skip` on are each one step, the recorded window among them.
    assert data["watch"]["n_steps"] == 38
    assert sum(s["profiled"] for s in data["watch"]["steps"]) >= 3
    assert data["run"]["steps_recorded"] == 3
    assert not stallscope.marker.active()  # the hooks are gone once training ended


@pytest.mark.slow
def test_lightning_callback_with_too_few_batches_warns_and_trains(tmp_path: Path) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cb, trainer = _lightning_fit(tmp_path, batches=2, steps=3, skip=2)
    assert trainer.global_step == 2
    assert cb.report is None
    assert any("stallscope recorded no step" in str(w.message) for w in caught)
    assert not stallscope.marker.active()


# ---------------------------------------------------------------------------- transformers


@pytest.mark.slow
def test_transformers_callback_writes_a_report(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    import torch

    from stallscope.integrations.transformers import StallscopeCallback

    config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, intermediate_size=64,
                                     max_position_embeddings=32, num_labels=2)
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(config)  # built here: no download

    class Tokens(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 64

        def __getitem__(self, i: int) -> dict:
            ids = torch.randint(0, 100, (16,), generator=torch.Generator().manual_seed(i))
            return {"input_ids": ids, "labels": torch.tensor(i % 2)}

    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "hf"), per_device_train_batch_size=8, max_steps=7,
        report_to=[], use_cpu=True, save_strategy="no", logging_strategy="no",
        disable_tqdm=True,
    )
    cb = StallscopeCallback(steps=3, skip=2)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Tokens(),
                                   callbacks=[cb])
    trainer.train()
    assert trainer.state.global_step == 7
    data = _report(tmp_path / "hf" / "stallscope")  # the default: <output_dir>/stallscope
    assert (data["run"]["step_source"], data["run"]["steps_recorded"]) == ("marker", 3)
    assert cb.report is not None and data["verdict"]["text"] == cb.report.verdict
    assert not stallscope.marker.active()

"""DataLoader advice spelled in the knobs the user actually writes.

`stallscope run` records who built each DataLoader (capture/frameworks.py): the script itself,
or Hugging Face `Trainer` from its `TrainingArguments`, or a loader the script wrote and
Lightning or accelerate took over. A change phrased as `DataLoader(num_workers=2)` is useless
to a Trainer user, who never wrote that call; the same change is
`TrainingArguments(..., dataloader_num_workers=2)` at the line that builds the arguments. Every
rule that writes DataLoader advice (dataloader-bound, pageable-h2d-copy, worker-startup) and
`tune` phrase it through `Knobs`, so they name the same call and the same line.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stallscope.diagnose.spec import RuleSpec
from stallscope.runfacts import LoaderInfo

TRAINING_ARGUMENTS = "TrainingArguments"
# DataLoader argument -> the TrainingArguments field Trainer passes it from.
TRAINER_FIELDS = {
    "batch_size": "per_device_train_batch_size",
    "num_workers": "dataloader_num_workers",
    "pin_memory": "dataloader_pin_memory",
    "persistent_workers": "dataloader_persistent_workers",
    "prefetch_factor": "dataloader_prefetch_factor",
    "drop_last": "dataloader_drop_last",
}


@dataclass(frozen=True)
class Knobs:
    """Where and how one loader's settings are changed."""

    call: str  # "DataLoader" or "TrainingArguments"
    site: str | None  # that call's file:line; None when it was not found
    framework: str | None
    call_site: str  # the user's own line that led to the loader
    function: str | None  # the user's function around it ("Model.train_dataloader")
    built_at: str | None = None  # another library's line that called DataLoader(...)

    @classmethod
    def of(cls, info: LoaderInfo | Mapping[str, Any] | None) -> Knobs | None:
        """From a LoaderInfo, or its report.json form (a loader of `dataloaders`)."""
        if info is None:
            return None
        get = info.get if isinstance(info, Mapping) else lambda k: getattr(info, k, None)
        call_site = str(get("call_site") or "unknown")
        call = TRAINING_ARGUMENTS if get("configured_in") == TRAINING_ARGUMENTS else "DataLoader"
        site = get("settings_site") if call == TRAINING_ARGUMENTS else (
            get("settings_site") or call_site)
        user_site = get("user_site")
        function = None
        if isinstance(user_site, str) and " in " in user_site:
            function = user_site.rpartition(" in ")[2]
            function = None if function == "<module>" else function
        framework, built_at = get("framework"), get("built_at")
        return cls(call, site if isinstance(site, str) else None,
                   framework if isinstance(framework, str) else None, call_site, function,
                   built_at if isinstance(built_at, str) else None)

    @property
    def trainer(self) -> bool:
        return self.call == TRAINING_ARGUMENTS

    def key(self, name: str) -> str:
        """The argument's name in this call: `dataloader_num_workers` for Trainer."""
        return TRAINER_FIELDS.get(name, name) if self.trainer else name

    def args(self, values: Mapping[str, Any], spell: Any = str) -> str:
        return ", ".join(f"{self.key(k)}={spell(v)}" for k, v in values.items())

    def call_text(self, values: Mapping[str, Any], lead: str = "..., ", spell: Any = str) -> str:
        """`DataLoader(..., num_workers=2)`, `TrainingArguments(..., dataloader_num_workers=2)`."""
        return f"{self.call}({lead}{self.args(values, spell)})"

    @property
    def where(self) -> str:
        """The line to edit, as a user reads it."""
        if self.site:
            return self.site
        return f"the script's {TRAINING_ARGUMENTS}(...) (the Trainer runs from {self.call_site})"

    @property
    def how(self) -> str:
        """A clause on why that line: empty for a DataLoader the script built and iterates."""
        if self.trainer:
            return ("transformers.Trainer builds its DataLoader from them, called from "
                    f"{self.call_site}")
        inside = f" in {self.function}()" if self.function else ""
        if self.framework == "lightning":
            return f"the DataLoader{inside} that Lightning trains on"
        if self.framework == "accelerate":
            return f"the DataLoader{inside} passed to accelerator.prepare, which rebuilds it " \
                   "with these settings"
        if self.framework == "transformers.Trainer":
            return f"the DataLoader{inside} your Trainer trains on"
        if self.built_at:  # a helper of another library built it from this line's arguments
            return f"the DataLoader is built at {self.built_at}, from this call's arguments"
        return ""

    def change_line(self, now: Mapping[str, Any], change: Mapping[str, Any] | None) -> str:
        """`train.py:42 DataLoader(num_workers=0, ...) -> DataLoader(..., num_workers=2)`."""
        text = f"{self.where} {self.call_text(now, lead='')}"
        if change is not None:
            text += f" -> {self.call_text(change)}"
        return text + (f" ({self.how})" if self.how else "")

    def diff(self, header: str, before: Mapping[str, Any], after: Mapping[str, Any],
             spell: Any = str) -> str:
        """A pasteable diff at the line: a comment naming it, then - and + of the call."""
        how = f"; {self.how}" if self.how else ""
        return (f"# {self.where}  ({header}{how})\n"
                f"-{self.call_text(before, spell=spell)}\n"
                f"+{self.call_text(after, spell=spell)}")

    def pin_snippet(self) -> str:
        """Pinned batches copied asynchronously, in this framework's settings."""
        if self.trainer:
            return (f"# {self.where}: Trainer pins the batches and copies them to the device\n"
                    f"{TRAINING_ARGUMENTS}(\n    ...,\n    dataloader_pin_memory=True,\n"
                    "    accelerator_config={\"non_blocking\": True},\n)")
        head = f"# {self.where}" + (f": {self.how}" if self.how else "") + "\n"
        if self.framework == "accelerate":
            return (head + "loader = DataLoader(dataset, ..., pin_memory=True)\n"
                    "accelerator = Accelerator(\n"
                    "    dataloader_config=DataLoaderConfiguration(non_blocking=True))")
        if self.framework == "lightning":
            return (head + "return DataLoader(dataset, ..., pin_memory=True)\n"
                    "# Lightning already copies batches to a CUDA device with non_blocking=True")
        return (head + "loader = torch.utils.data.DataLoader(dataset, ..., pin_memory=True)\n"
                "for inputs, targets in loader:\n"
                "    inputs = inputs.to(device, non_blocking=True)\n"
                "    targets = targets.to(device, non_blocking=True)")

    def pin_sentence(self) -> str:
        """Where to pin, in a sentence; empty for a plain script (the snippet says it)."""
        if self.trainer:
            return (f" Under transformers.Trainer set dataloader_pin_memory=True and "
                    f"accelerator_config={{\"non_blocking\": True}} in the {TRAINING_ARGUMENTS}"
                    f" at {self.where}.")
        if self.framework == "accelerate":
            return (f" The DataLoader at {self.where} goes through accelerator.prepare: pass "
                    "pin_memory=True there and Accelerator(dataloader_config="
                    "DataLoaderConfiguration(non_blocking=True)).")
        if self.framework == "lightning":
            return (f" Pass pin_memory=True to the DataLoader at {self.where}; Lightning copies "
                    "batches with non_blocking=True.")
        return f" The DataLoader is built at {self.where}."


def as_written(change: str, rule: RuleSpec | None, loaders: list[dict[str, Any]]) -> str:
    """A plan entry's change (`num_workers=4 + pin_memory=true`, the --what-if vocabulary) as
    the user writes it when Trainer builds the training loader:
    `TrainingArguments(..., dataloader_num_workers=4, dataloader_pin_memory=True) at
    train.py:31`, for a rule whose replayed change is a DataLoader setting
    (`RuleSpec.loader_setting`). Unchanged for every other rule and loader: a DataLoader user
    writes `num_workers=4` in their own call, which the finding names."""
    if rule is None or not rule.loader_setting or not loaders:
        return change
    loader = max(loaders, key=lambda d: (d.get("batches_recorded") or 0, d.get("batches") or 0))
    knobs = Knobs.of(loader)
    if knobs is None or not knobs.trainer:
        return change
    values: dict[str, str] = {}
    rest: list[str] = []
    for part in change.split(" + "):
        key, _, value = part.partition("=")
        if key in TRAINER_FIELDS:
            values[key] = {"true": "True", "false": "False"}.get(value, value)
        else:
            rest.append(part)  # non_blocking=true: the copy call, not TrainingArguments
    if not values:
        return change
    return " + ".join([f"{knobs.call_text(values)} at {knobs.where}", *rest])

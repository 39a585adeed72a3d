"""A profile in the formats of the tools people train with: Lightning, Hugging Face, accelerate.

Pure functions from a ``Profile`` to keyword arguments (dicts) and to the text of a file
(``render_*``). Nothing here imports Lightning, transformers or accelerate: the output is
checked against their real APIs in the tests, and a user needs only the library they use.
PyYAML (a dependency) is imported when a YAML renderer runs.

Each tool covers part of a profile; what it has no setting for is said in the rendered
file's comments (beside the file for JSON), never silently dropped. What a tool writes for a
setting is its entry in ``EXPORTS`` (one table per tool, by the setting's record); a setting a
tool has no entry for gets its record's generated line, so a new setting is said everywhere:

- ``lightning``: a ``trainer:`` section for ``LightningCLI`` (``--config FILE``), also usable
  as ``Trainer(**yaml.safe_load(text)["trainer"])``, and a ``data:`` section with the batch
  size and the DataLoader settings when the profile was measured on a ``LightningDataModule``
  whose ``__init__`` takes them (``lightning_data_kwargs``). ``torch.compile``, channels_last,
  the fused optimizer and the DataLoader settings no DataModule argument takes belong in the
  LightningModule or DataModule; the comments give their values.
- ``hf``: JSON keyword arguments for ``transformers.TrainingArguments`` (add ``output_dir``).
  JSON has no comments, and TrainingArguments refuses unknown keys: ``hf_notes`` lists what
  it has no argument for, and ``autotune export`` prints that list on stderr.
- ``accelerate``: an accelerate config file (``accelerate launch --config_file FILE``).
- ``env``: POSIX shell ``export`` lines for the profile's environment variables, to source
  before Python starts (each is read once: OpenMP's and MKL's when torch is imported, the
  CUDA allocator's and cuBLAS's at their first use); the other settings are its comments.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from torch_autotune.integrations.accelerate import ACCELERATE, accelerate_config, render_accelerate
from torch_autotune.integrations.common import arguments, notes, process_count
from torch_autotune.integrations.env import ENV, render_env
from torch_autotune.integrations.hf import HF, hf_notes, hf_optim, hf_training_arguments, render_hf
from torch_autotune.integrations.lightning import (
    LIGHTNING,
    lightning_data_kwargs,
    lightning_notes,
    lightning_trainer_kwargs,
    render_lightning,
)
from torch_autotune.records import Export, Tool

if TYPE_CHECKING:
    from torch_autotune.profile import Profile

__all__ = [
    "EXPORTS",
    "EXPORT_FORMATS",
    "accelerate_config",
    "hf_notes",
    "hf_optim",
    "hf_training_arguments",
    "lightning_data_kwargs",
    "lightning_notes",
    "lightning_trainer_kwargs",
    "process_count",
    "render_accelerate",
    "render_env",
    "render_hf",
    "render_lightning",
    "tool_arguments",
    "tool_notes",
]

EXPORTS: Mapping[Tool, Mapping[str, Export]] = {
    "lightning": LIGHTNING,
    "hf": HF,
    "accelerate": ACCELERATE,
    "env": ENV,
}
"""What each tool writes for a setting, by record name: its arguments, its own line, or the
record that carries it. A setting a tool has no entry for gets its record's generated line
(``SettingRecord.note``): a new setting is said in every export without a line here."""


def tool_arguments(profile: Profile, tool: Tool) -> dict[str, Any]:
    """Every argument ``tool`` has for the profile's settings, in the records' order."""
    return arguments(profile, EXPORTS[tool])


def tool_notes(profile: Profile, tool: Tool) -> list[str]:
    """A line for each setting ``tool`` has no argument for, where the profile changes it."""
    return notes(profile, EXPORTS[tool])


EXPORT_FORMATS: Mapping[str, Callable[[Profile], str]] = {
    "lightning": render_lightning,
    "hf": render_hf,
    "accelerate": render_accelerate,
    "env": render_env,
}
"""``autotune export --format NAME``: the renderer for each integration format."""

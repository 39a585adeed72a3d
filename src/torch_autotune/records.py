"""What a setting is, apart from its value: one declarative record per setting.

``settings.RECORDS`` holds one ``SettingRecord`` for every setting a profile holds, beside the
fields it owns; everything that used to list the settings by hand reads them from there:

- the bench: which settings it switches (``bench``, by the name of the knob that switches it),
  how a value shows in its tables, and why it leaves the others alone (``not_ablated``);
- couplings: what goes back with a setting when the bench drops it, and why (``couples``:
  channels_last goes with AMP, rule H1); a setting that takes effect only under another
  (``only_with``: compile's memory budget, under compile) is off in that one's "off" arm too;
- the run's summary: a row for each record with ``summary`` set, shown by ``show`` (and by
  its measured decision's reason, with ``summary_reason``: the numbers behind it);
- the exporters: a tool with an argument for the setting names it in ``integrations``' table
  (``Export``); every other tool writes the record's generated line (``note``), naming the
  profile's helper that applies it (``applied_by``), so a new setting is never left unsaid.
  What a helper applies that ``Settings`` does not hold, the profile derives from its evidence
  (``drop_last``: batch 1 raised): a ``DerivedSetting`` in ``DERIVED``, which the exporters walk
  beside the records, so it is never left unsaid either;
- the environment: settings read once when a process starts (``fresh_process``);
- memory: settings that change how much memory a batch needs (``memory``). A batch that ran
  with one value may not fit with another, so the invariant accepts the profile's batch only
  where it ran with the profile's values of these (``invariants.batch_problems``), and the
  probe's variants that change one get a search of their own (``probe.variants``).

The ground floor of the data model: the standard library only (a record's functions take
``Settings``, a ``Profile`` or a ``TrainConfig`` and return plain values). A test holds that
every leaf of ``Settings`` belongs to exactly one record.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from torch_autotune.profile import Profile
    from torch_autotune.settings import Settings

__all__ = [
    "DERIVED",
    "TOOLS",
    "AppliedBy",
    "DerivedSetting",
    "Export",
    "SettingRecord",
    "Tool",
    "last_batches",
    "on_off",
    "small_batch_error",
]

Tool = Literal["hf", "lightning", "accelerate", "env"]
TOOLS: tuple[Tool, ...] = ("hf", "lightning", "accelerate", "env")
"""The tools ``autotune export`` writes for, as the records name them."""

AppliedBy = Literal[
    "apply",
    "prepare_model",
    "dataloader_kwargs",
    "optimizer_kwargs",
    "autocast",
    "environment",
    "parallelize",
]
"""The profile's helper that applies a setting in a training script (``Profile.apply()``,
``Profile.prepare_model()``, ...; ``environment``: ``autotune export --format env``)."""

_HOW_APPLIED: Mapping[str, str] = {
    "apply": "call profile.apply()",
    "prepare_model": "model = profile.prepare_model(model)",
    "dataloader_kwargs": "DataLoader(..., **profile.dataloader_kwargs())",
    "optimizer_kwargs": "the optimizer's **profile.optimizer_kwargs(its class)",
    "autocast": "with profile.autocast():",
    "environment": "source 'autotune export --format env' first",
    "parallelize": "model = profile.prepare_model(model) in each torchrun process (or"
    " profile.parallelize(model))",
}


def on_off(value: object) -> str:
    """A switch as the reports show it: 'on', 'off', or 'default' for torch's (None)."""
    if value is None:
        return "default"
    return "on" if value else "off"


@dataclass(frozen=True)
class Export:
    """How one tool writes a setting (``integrations``' tables, by record name).

    ``args(profile)``: its arguments for the tool (empty where it writes none for this
    profile). ``note(profile)``: the line that tells the user where to set what the tool has no
    argument for (None where nothing needs saying). ``covered_by``: the record whose arguments
    or note carry this setting too (Lightning's DataLoader line carries pin_memory).
    ``itself``: why the tool needs nothing for it (the Trainer seeds its workers itself). A
    setting a tool has no entry for gets its record's generated ``note``.
    """

    args: Callable[[Profile], dict[str, Any]] | None = None
    note: Callable[[Profile], str | None] | None = None
    covered_by: str | None = None
    itself: str | None = None


@dataclass(frozen=True)
class SettingRecord:
    """One setting: the leaves of ``Settings`` it owns, and what everything else needs to know
    about it (see the module docstring).

    ``changed(settings)`` says whether the setting differs from torch's default: the bench
    explains why it leaves alone only what changed, and an exporter says where to set only that.
    """

    name: str
    paths: tuple[str, ...]
    label: str
    show: Callable[[Settings], str]
    applied_by: AppliedBy | None
    summary: bool = True
    summary_reason: bool = False
    bench: str | None = None
    not_ablated: str | None = None
    couples: Mapping[str, str] = field(default_factory=dict)
    only_with: str | None = None
    fresh_process: bool = False
    memory: bool = False
    changed: Callable[[Settings], bool] | None = None

    def note(self, settings: Settings) -> str | None:
        """The line an exporter without an argument for this setting writes: "{label}: {value}
        ({the profile's helper that applies it})", where the setting is not torch's default."""
        if self.applied_by is None or self.changed is None or not self.changed(settings):
            return None
        return f"{self.label}: {self.show(settings)} ({_HOW_APPLIED[self.applied_by]})"


@dataclass(frozen=True)
class DerivedSetting:
    """A setting one of the profile's helpers applies that ``Settings`` does not hold: the
    profile derives it from its evidence. The exporters walk these beside ``RECORDS`` (a tool's
    table names one as it names a record), and a tool without an entry writes its ``note``.

    ``show(profile)``: its value as the line says it, None where the profile does not set it.
    """

    name: str
    label: str
    show: Callable[[Profile], str | None]
    applied_by: AppliedBy

    def note(self, profile: Profile) -> str | None:
        """The line an exporter without an entry for it writes, as a record's ``note``."""
        shown = self.show(profile)
        return None if shown is None else f"{self.label}: {shown} ({_HOW_APPLIED[self.applied_by]})"


def small_batch_error(profile: Profile) -> str | None:
    """Why the profile's training loader drops an epoch's last batch ('batch 1 raised
    ValueError: ...', from the probe's search), None where it keeps it."""
    details = None if profile.evidence is None else profile.evidence.details
    if details is None or not profile.drops_last:
        return None
    return (details.min_batch_reason or "").split("; batch ", 1)[0]


def last_batches(profile: Profile) -> str:
    """The last batches that raise: below the smallest batch that trained."""
    details = None if profile.evidence is None else profile.evidence.details
    smallest = 2 if details is None else details.min_batch_size
    return "1 sample" if smallest == 2 else f"fewer than {smallest} samples"


def _drop_last(profile: Profile) -> str | None:
    """drop_last=True in the training loader, where the probe found that batch 1 raises."""
    raised = small_batch_error(profile)
    if raised is None:
        return None
    return (
        f"True, in the training DataLoader only: {raised}, and so would an epoch's last batch of"
        f" {last_batches(profile)}; an evaluation loader keeps every sample"
    )


def _batch_sampler(profile: Profile) -> str | None:
    """What a loader built with the user's batch_sampler needs for the profile's batch size,
    where the probe was given one (``WorkloadDetails.batch_sampler``)."""
    details = None if profile.evidence is None else profile.evidence.details
    size = profile.settings.batch.batch_size
    if details is None or details.batch_sampler is None or size is None:
        return None
    return (
        f"your DataLoader's {details.batch_sampler} fixes its batch size, and torch refuses"
        f" batch_size beside a batch_sampler: build the {details.batch_sampler} with batch size"
        f" {size}{' and drop_last=True' if profile.drops_last else ''}, and give it to the"
        " profile's arguments: profile.dataloader_kwargs(batch_sampler=yours)"
    )


DERIVED: tuple[DerivedSetting, ...] = (
    DerivedSetting("drop_last", "drop_last", _drop_last, applied_by="dataloader_kwargs"),
    DerivedSetting("batch_sampler", "batch_sampler", _batch_sampler, "dataloader_kwargs"),
)
"""Every setting a profile's helpers apply beyond ``Settings``, derived from its evidence."""

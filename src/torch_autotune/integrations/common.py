"""What every exporter shares: the process count, the file header, YAML, and the two walks
over the records (``settings.RECORDS``, then ``records.DERIVED``: what the profile's helpers
apply beyond ``Settings``) that give a tool's arguments and its notes from its table of
``Export``s."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from torch_autotune.records import DERIVED, Export
from torch_autotune.settings import RECORDS, Settings

if TYPE_CHECKING:
    from torch_autotune.profile import Profile


def process_count(profile: Profile) -> int:
    """Training processes on this node, as the profile's topology says (one per target GPU,
    one on the CPU and on MPS, or the DDP ranks asked for)."""
    return profile.topology.processes_per_node


def header(profile: Profile, tool: str) -> list[str]:
    snapshot = profile.provenance.snapshot
    machine = ", ".join(a.name for a in snapshot.accelerators) or snapshot.host.cpu_model or "CPU"
    return [
        f"# {tool}, from torch-autotune's {profile.mode.value} profile "
        f"(fingerprint {profile.provenance.fingerprint}).",
        f"# Machine: {machine}; device {profile.settings.device}.",
    ]


def to_yaml(data: Mapping[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(dict(data), sort_keys=False, default_flow_style=False)


def arguments(profile: Profile, table: Mapping[str, Export]) -> dict[str, Any]:
    """Every argument a tool's ``table`` has for the profile's settings, in the records' order."""
    args: dict[str, Any] = {}
    for name in [*(record.name for record in RECORDS), *(derived.name for derived in DERIVED)]:
        entry = table.get(name)
        if entry is not None and entry.args is not None:
            args.update(entry.args(profile))
    return args


def notes(profile: Profile, table: Mapping[str, Export]) -> list[str]:
    """A line for each setting a tool has no argument for, where the profile changes it: the
    tool's own wording where its ``table`` has one, else the record's generated line (a
    derived setting's, after the records')."""
    generated = [
        *((record.name, record.note(profile.settings)) for record in RECORDS),
        *((derived.name, derived.note(profile)) for derived in DERIVED),
    ]
    lines = []
    for name, own in generated:
        entry = table.get(name)
        note = own if entry is None else entry.note(profile) if entry.note is not None else None
        if note is not None:
            lines.append(note)
    return lines


def always(make: Callable[[Settings], dict[str, Any]]) -> Export:
    """An argument the tool always writes, from the settings alone."""
    return Export(args=lambda profile: make(profile.settings))


def line(make: Callable[[Settings], str | None]) -> Export:
    """A line in the tool's own words, from the settings alone."""
    return Export(note=lambda profile: make(profile.settings))


def with_workers(make: Callable[[Settings], dict[str, Any]]) -> Export:
    """An argument the tool writes only with workers (torch refuses it without)."""
    return always(lambda s: make(s) if s.dataloader.num_workers > 0 else {})


def memory_budget_note(tool: str) -> Export:
    """Compile's activation memory budget, which no tool has an argument for: torch's global
    setting, read when each compiled graph is partitioned, so set before the first step."""

    def note(settings: Settings) -> str | None:
        budget = settings.compile.memory_budget
        if budget is None or not settings.compile.enabled:
            return None
        return (
            f"activation memory budget: {budget:g}: {tool} has no argument for it; set"
            f" torch._functorch.config.activation_memory_budget = {budget:g} before the first"
            " training step (it is read when a compiled graph is partitioned; the profile's"
            " batch was measured with it)"
        )

    return line(note)


def tf32_note(on: str) -> Callable[[Profile], str | None]:
    """TF32 on (``on``: where else the tool's users set it) or off, through profile.apply()."""

    def note(profile: Profile) -> str | None:
        matmul = profile.settings.matmul
        if matmul.tf32:
            return f"TF32: call profile.apply(){on}"
        if matmul.api is not None:
            return "TF32 off: call profile.apply() (tf32 is left unset here)"
        return None

    return note


def channels_last_note(where: str) -> Export:
    """The channels_last line, ``where`` the tool's users convert the model."""
    return line(
        lambda s: (
            f"model.to(memory_format=torch.channels_last) {where}"
            if s.memory_format == "channels_last"
            else None
        )
    )

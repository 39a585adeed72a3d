"""Which of the GPUs NVML lists this process sees: ``CUDA_VISIBLE_DEVICES`` applied as the
CUDA runtime applies it, and one MIG device a process; warnings follow each GPU to the index it
ends up with."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from torch_autotune.hardware import Accelerator, DetectionWarning

__all__ = ["Device", "cuda_visible", "one_mig_device", "renumber_warnings"]


@dataclass
class Device:
    """A GPU (or MIG device) as NVML read it: NVML's index and the warnings' field prefix."""

    accelerator: Accelerator
    nvml_index: int
    field_prefix: str


def cuda_visible(
    devices: list[Device], env: Mapping[str, str], warnings: list[DetectionWarning]
) -> list[Device]:
    """Apply CUDA_VISIBLE_DEVICES the way the CUDA runtime does.

    Entries are indices or UUID prefixes (``GPU-...``, ``MIG-...``); the list ends at the first
    entry that matches nothing. Indices count in CUDA's order, which equals NVML's PCI order
    when ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` or when all GPUs are alike.
    """
    spec = env.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        return devices
    physical: dict[int, list[Device]] = {}
    for device in devices:
        physical.setdefault(device.nvml_index, []).append(device)
    ordered = [group[0] for group in physical.values()]
    names = {device.accelerator.name for device in ordered}
    chosen: list[Device] = []
    for token in (t.strip() for t in spec.split(",")):
        match = _match_visible(token, ordered, devices)
        if match is None:
            break
        if match not in chosen:
            chosen.append(match)
    if (
        len(names) > 1
        and env.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID"
        and any(t.strip().isdigit() for t in spec.split(","))
    ):
        warnings.append(
            DetectionWarning(
                field="accelerators",
                reason="CUDA_VISIBLE_DEVICES uses indices on a machine with different GPUs; "
                "CUDA numbers them fastest first, NVML by PCI bus. Set "
                "CUDA_DEVICE_ORDER=PCI_BUS_ID so both agree",
            )
        )
    return chosen


def one_mig_device(visible: list[Device], warnings: list[DetectionWarning]) -> list[Device]:
    """A CUDA process enumerates one MIG device, however many it is shown (NVIDIA's MIG user
    guide, "CUDA Device Enumeration"; pytorch/pytorch#102715, #130181): the first one shown.
    The others are not this process's to train on, so not several ranks' either."""
    slices = [device for device in visible if device.accelerator.mig is not None]
    if len(slices) < 2:
        return visible
    warnings.append(
        DetectionWarning(
            field="accelerators",
            reason=f"{len(slices)} MIG devices are visible, but a CUDA process enumerates only "
            f"one ({slices[0].accelerator.name}); to train on another, set CUDA_VISIBLE_DEVICES "
            "to its MIG UUID (nvidia-smi -L)",
        )
    )
    return [device for device in visible if device.accelerator.mig is None or device is slices[0]]


def _match_visible(token: str, ordered: list[Device], every: list[Device]) -> Device | None:
    if token.isdigit():
        position = int(token)
        return ordered[position] if position < len(ordered) else None
    if token.startswith(("GPU-", "MIG-")):
        hits = [d for d in every if d.accelerator.uuid and d.accelerator.uuid.startswith(token)]
        return hits[0] if len(hits) == 1 else None
    return None


def renumber_warnings(warnings: list[DetectionWarning], positions: Mapping[str, int]) -> None:
    """Point 'accelerators[nvml:N]' paths at the index the GPU ended up with.

    Warnings about GPUs that CUDA_VISIBLE_DEVICES hides are dropped: this process cannot use them.
    """
    pattern = re.compile(r"^accelerators\[(nvml:[^\]]+)\]")
    kept: list[DetectionWarning] = []
    for warning in warnings:
        match = pattern.match(warning.field)
        if match is None:
            kept.append(warning)
            continue
        position = positions.get(f"accelerators[{match.group(1)}]")
        if position is not None:
            path = f"accelerators[{position}]{warning.field[match.end() :]}"
            kept.append(warning.model_copy(update={"field": path}))
    warnings[:] = kept

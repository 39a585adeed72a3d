"""When a stored profile no longer serves: what changed on the machine since it was made, and
how to measure its workload again, the one remedy every message about a stored profile prints
(a stale one, a corrupt one, one of another mode, one never measured).

``autotune -m W`` builds a built-in or a ``package.module:factory`` again from its name. A
profile that ``tune()`` measured on objects in hand (a model, an optimizer and a dataset,
stored under the model's class or ``name=``) has no such name: ``autotune -m BNNet`` exits 5,
so the remedy is to call ``tune()`` with the objects again. Importing this module is cheap
(``recommend()`` imports it).
"""

from __future__ import annotations

from torch_autotune.hardware import HardwareSnapshot
from torch_autotune.profile import Profile


def from_objects(workload: str, profile: Profile | None = None) -> bool:
    """Whether ``workload`` was measured on objects given to ``tune()`` (``profile``'s
    evidence says so where it is at hand), which ``autotune -m`` cannot build again: it takes
    a built-in's name or a ``package.module:factory``, and nothing else."""
    details = None if profile is None or profile.evidence is None else profile.evidence.details
    if details is not None:
        return details.source == "objects"
    from torch_autotune.probe.workloads.builtins import BUILTIN_WORKLOADS

    return ":" not in workload and workload not in BUILTIN_WORKLOADS


def measure_again(
    workload: str | None,
    profile: Profile | None = None,
    *,
    mode: str | None = None,
    where: str = "",
    purpose: str = "to measure again",
) -> str:
    """The remedy that measures ``workload`` (in ``mode`` where one is named; ``where``: "on
    that machine" for another one), in words: ``autotune -m W`` for a built-in or a factory,
    a call of ``tune()`` with its objects for a profile measured on them (``from_objects``),
    where ``autotune -m W`` exits 5; ``autotune`` alone without a workload."""
    flag = "" if mode is None else f" --mode {mode}"
    there = f" {where}" if where else ""
    if workload is None:
        return f"run 'autotune{flag}'{there} {purpose}"
    if not from_objects(workload, profile):
        return f"run 'autotune{flag} -m {workload}'{there} {purpose}"
    also = "" if mode is None else f", mode='{mode}'"
    return (
        f"call torch_autotune.tune(){there} with the objects of '{workload}' "
        f"(name='{workload}'{also}) and save() the profile"
    )


def changes_since(stored: Profile, now: HardwareSnapshot) -> str:
    """What changed between the machine a profile was made on and ``now``, in words."""
    before = stored.provenance.snapshot
    changes: list[str] = []

    def compare(label: str, old: object, new: object) -> None:
        if old != new:
            changes.append(f"{label} {old} -> {new}")

    compare("GPUs", [a.name for a in before.accelerators], [a.name for a in now.accelerators])
    compare("driver", before.software.nvidia_driver_version, now.software.nvidia_driver_version)
    compare("torch", before.software.torch_version, now.software.torch_version)
    compare("CUDA", before.software.torch_cuda_version, now.software.torch_cuda_version)
    compare("Python", before.software.python_version, now.software.python_version)
    compare("usable CPUs", before.host.cpus_usable, now.host.cpus_usable)
    return ", ".join(changes) or "the hardware or software fingerprint"

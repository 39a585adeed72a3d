"""Test helpers around the simulated machine (``torch_autotune.probe.simulated``): recorded
snapshots of ``tests/fixtures/snapshots``, the machines the tests simulate most, ``tune()`` on
a simulated machine (``tune_on``), and ``tune()`` with real training steps on a clock that
ticks the same on any machine (``tune_ticking``).
"""

from __future__ import annotations

from pathlib import Path

from torch_autotune.api import tune
from torch_autotune.hardware import HardwareSnapshot
from torch_autotune.probe.simulated import SimulatedMachine
from torch_autotune.probe.trials import StepSettings
from torch_autotune.probe.workloads import Workload
from torch_autotune.profile import Profile

SNAPSHOT_DIR = Path(__file__).parent.parent / "fixtures" / "snapshots"


def recorded(name: str) -> HardwareSnapshot:
    """A recorded machine from ``tests/fixtures/snapshots``."""
    return HardwareSnapshot.model_validate_json((SNAPSHOT_DIR / f"{name}.json").read_text())


def cpu_machine(**timings: float) -> SimulatedMachine:
    """This 2-core CPU with the small conv net: memory never limits below the cap; 300 MiB
    plus 2.3 MiB a sample (measured: 983 MiB at 256, 1575 MiB at 512). The other timings are
    ``SimulatedMachine``'s defaults unless given (the preset ``cpu-conv`` has them all)."""
    return SimulatedMachine(
        limit=10**6,
        leaves=1,
        fixed_bytes=300 << 20,
        per_sample_bytes=int(2.3 * 2**20),
        **timings,  # type: ignore[arg-type]
    )


def mlp_machine() -> SimulatedMachine:
    """The mlp workload on a CPU: 0.05 s a step plus 2 ms a sample. A loader at 0 workers
    keeps well ahead of it, so the workers phase measures 0 alone."""
    return cpu_machine(fixed_s=0.05, per_sample_s=0.002, first_s=0.3, autotune_s=0.0)


def tiny_mlp_on_two_busy_cores(**loading: float) -> SimulatedMachine:
    """A tiny MLP on 2 busy cores: torch's 2 threads cost more to synchronise than the work
    they split; ``loading``: the DataLoader's timings, where it has one (``load_s``, ...)."""
    return cpu_machine(
        first_s=0.3,
        autotune_s=0.0,
        shares_cpus=True,
        host_cpus=2,
        fixed_s=0.0004,
        per_sample_s=2e-6,
        thread_sync_s=0.003,
        **loading,
    )


def tune_on(
    machine: SimulatedMachine,
    workload: str | Workload,
    snapshot: HardwareSnapshot,
    **options: object,
) -> Profile:
    """``tune()`` with its training steps and its clock on ``machine``. A workload with a
    dataset still measures real DataLoaders in the workers phase unless the machine simulates
    loading (``load_s``; ``mlp_machine``: real, in ms)."""
    return tune(
        workload,
        snapshot=snapshot,
        clock=machine.clock,
        trials=machine.trials,
        **options,  # type: ignore[arg-type]
    )


class Ticks:
    """Simulated time for real training steps: each reading is ``tick`` seconds after the
    last, so a run takes the same number of steps on any machine, however loaded."""

    def __init__(self, tick: float = 0.1) -> None:
        self.tick = tick
        self.now = 0.0

    def __call__(self) -> float:
        self.now += self.tick
        return self.now


def tune_ticking(
    workload: object = None, *, snapshot: HardwareSnapshot, tick: float = 0.1, **options: object
) -> Profile:
    """``tune()`` with real training steps (``FedRunner``, the seam ``tune()`` uses) on
    ``Ticks``: with a budget of 30 s and ticks of 0.1 s, a few dozen real steps of the user's
    model."""
    from torch_autotune.probe.loop import FedRunner

    clock = Ticks(tick)

    def trials(workload: Workload, step: StepSettings) -> FedRunner:
        return FedRunner(workload, step, clock=clock)

    return tune(
        workload,
        snapshot=snapshot,
        clock=clock,
        trials=trials,
        **options,  # type: ignore[arg-type]
    )

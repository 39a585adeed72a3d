"""DataLoader arguments and CPU threads on recorded machines (catalog F, G, S7, S21, S22)."""

from __future__ import annotations

from typing import Any, NamedTuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torch_autotune.hardware import HardwareSnapshot
from torch_autotune.profile import ALLOWED_ENVIRONMENT, Mode, Source, settings_paths
from torch_autotune.rules.context import Finding, Measurements
from torch_autotune.rules.dataloader import cpu_threads, dataloader

from .helpers import ALL_FIXTURES, context_with, run, snapshot, values, with_host

SNAPSHOTS = {name: snapshot(name) for name in ALL_FIXTURES}

DATALOADER_SETTINGS = {
    "dataloader.num_workers",
    "dataloader.pin_memory",
    "dataloader.persistent_workers",
    "dataloader.prefetch_factor",
    "dataloader.seed_workers",
}
THREAD_SETTINGS = {"cpu_threads", "environment.OMP_NUM_THREADS", "environment.MKL_NUM_THREADS"}


_ctx = context_with


def _findings(
    machine: str | HardwareSnapshot, measurements: Measurements | None = None, **prefs: Any
) -> dict[str, Finding]:
    return run(_ctx(machine, measurements, **prefs), dataloader, cpu_threads)


def _with_start_method(name: str, method: str) -> HardwareSnapshot:
    snap = SNAPSHOTS[name]
    software = snap.software.model_copy(update={"multiprocessing_start_method": method})
    return snap.model_copy(update={"software": software})


# --- one finding per owned setting, every time --------------------------------------------------


@pytest.mark.parametrize("machine", ALL_FIXTURES)
@pytest.mark.parametrize("mode", list(Mode), ids=lambda m: m.value)
def test_every_owned_setting_gets_exactly_one_reasoned_finding(machine: str, mode: Mode) -> None:
    ctx = _ctx(machine, mode=mode)
    for rule, owned in ((dataloader, DATALOADER_SETTINGS), (cpu_threads, THREAD_SETTINGS)):
        findings = list(rule(ctx))
        assert sorted(f.setting for f in findings) == sorted(owned)
        for finding in findings:
            ctx.decided[finding.setting] = finding.value
            assert finding.setting in settings_paths()
            assert finding.reason.strip()
            assert finding.rule


# --- the machines -------------------------------------------------------------------------------


class Expected(NamedTuple):
    """What the speed mode's rules give a machine, and a fact the workers' reason must state."""

    workers: int
    pin: bool
    persistent: bool
    threads: int | None
    fact: str


MACHINE_CASES = [
    pytest.param(
        "cpu-container-quota-4", Expected(1, False, False, 3, "4 usable"), id="cpu-quota-4"
    ),
    pytest.param("cpu-laptop-linux", Expected(2, False, False, None, "8 usable"), id="cpu-laptop"),
    pytest.param("rtx-3060-windows", Expected(0, True, False, None, "Windows"), id="rtx-3060-win"),
    pytest.param(
        "a100-sxm4-80gb-8x", Expected(8, True, False, 32, "8 training processes"), id="a100-8x"
    ),
    pytest.param("h100-80gb-hbm3", Expected(8, True, False, None, "26 usable"), id="h100"),
    pytest.param("h200", Expected(8, True, False, 16, "quota 16"), id="h200-quota-16"),
    pytest.param("tesla-t4", Expected(3, True, False, None, "4 usable"), id="tesla-t4"),
    pytest.param("gtx-1660-ti", Expected(5, True, False, None, "6 usable"), id="gtx-1660-ti"),
    pytest.param("jetson-agx-orin-32gb", Expected(7, True, False, None, "8 usable"), id="jetson"),
    pytest.param("mi300x-rocm", Expected(8, True, False, 24, "quota 24"), id="mi300x-rocm"),
    pytest.param("apple-m2-pro-mps", Expected(8, False, True, None, "12 usable"), id="apple-m2"),
    pytest.param("tesla-v100-sxm2-16gb", Expected(7, True, False, None, "8 usable"), id="v100"),
    pytest.param(
        "rtx-4090-plus-rtx-3060",
        Expected(8, True, False, None, "2 training processes"),
        id="rtx-4090-plus-rtx-3060",
    ),
    pytest.param(
        "a100-sxm4-40gb-mig-1g5gb", Expected(7, True, False, 8, "quota 8"), id="a100-mig-quota-8"
    ),
]


@pytest.mark.parametrize(("machine", "expected"), MACHINE_CASES)
def test_machine_settings(machine: str, expected: Expected) -> None:
    found = _findings(machine)
    assert found["dataloader.num_workers"].value == expected.workers
    assert expected.fact in found["dataloader.num_workers"].reason
    assert found["dataloader.num_workers"].source is Source.INFERRED
    assert found["dataloader.pin_memory"].value is expected.pin
    assert found["dataloader.persistent_workers"].value is expected.persistent
    assert found["dataloader.prefetch_factor"].value is None
    assert found["dataloader.seed_workers"].value is False
    assert found["cpu_threads"].value == expected.threads
    expected_env = None if expected.threads is None else str(expected.threads)
    assert found["environment.OMP_NUM_THREADS"].value == expected_env
    assert found["environment.MKL_NUM_THREADS"].value == expected_env


def test_quota_container_sizes_from_the_quota_not_the_host() -> None:
    found = _findings("cpu-container-quota-4")
    workers, threads = found["dataloader.num_workers"], found["cpu_threads"]
    assert "quota 4 of the host's 64" in workers.reason
    assert "64 usable" not in workers.reason
    assert threads.rule == "G2"
    assert "4 usable" in threads.reason
    assert "1 DataLoader worker" in threads.reason
    assert workers.value + threads.value == 4


def test_a_gpu_with_one_cpu_gets_one_worker_and_a_reason_that_is_true_of_one_cpu() -> None:
    one_cpu = with_host("tesla-t4", cpu_affinity_count=1, cpus_usable=1, cpu_quota_cores=None)
    workers = _findings(one_cpu)["dataloader.num_workers"]
    assert workers.value == 1
    assert "leaving a CPU" not in workers.reason
    assert "shares the one CPU with the training process" in workers.reason


def test_eight_gpus_divide_the_cpus() -> None:
    found = _findings("a100-sxm4-80gb-8x")
    assert "256 usable" in found["dataloader.num_workers"].reason
    assert "32 CPU(s) each" in found["dataloader.num_workers"].reason
    assert found["cpu_threads"].rule == "G3"
    assert "32 CPU(s) each" in found["cpu_threads"].reason


def test_processes_per_node_preference_divides_the_cpus() -> None:
    found = _findings("h100-80gb-hbm3", processes_per_node=4)
    assert found["dataloader.num_workers"].value == 5  # 26 // 4 = 6 each, one for the process
    assert found["cpu_threads"].value == 6
    assert found["cpu_threads"].rule == "G3"


def test_windows_has_no_workers_and_explains_the_override() -> None:
    found = _findings("rtx-3060-windows")
    reason = found["dataloader.num_workers"].reason
    assert found["dataloader.num_workers"].rule == "F9"
    assert "spawn" in reason
    assert "__main__" in reason
    assert "12 usable" in reason
    assert found["dataloader.persistent_workers"].rule == "F3"
    assert found["dataloader.prefetch_factor"].rule == "F3"


def test_spawn_workers_mention_the_main_guard() -> None:
    reason = _findings("apple-m2-pro-mps")["dataloader.num_workers"].reason
    assert "'spawn'" in reason
    assert '`if __name__ == "__main__":`' in reason
    assert "picklable" in reason


def test_fork_workers_say_nothing_about_the_guard() -> None:
    assert "__main__" not in _findings("h100-80gb-hbm3")["dataloader.num_workers"].reason


def test_forkserver_on_linux_keeps_workers_and_needs_the_guard() -> None:
    found = _findings(_with_start_method("h100-80gb-hbm3", "forkserver"))
    assert found["dataloader.persistent_workers"].value is True
    assert found["dataloader.persistent_workers"].rule == "F4"
    assert "forkserver" in found["dataloader.num_workers"].reason
    assert "__main__" in found["dataloader.num_workers"].reason


def test_fork_explains_why_workers_are_not_kept() -> None:
    found = _findings("h100-80gb-hbm3")["dataloader.persistent_workers"]
    assert found.rule == "S22"
    assert "fork" in found.reason
    assert "RAM" in found.reason


def test_prefetch_keeps_the_torch_default_and_counts_the_batches() -> None:
    found = _findings("h100-80gb-hbm3")["dataloader.prefetch_factor"]
    assert found.value is None
    assert found.rule == "F5"
    assert "16 in all" in found.reason


# --- CPU training -------------------------------------------------------------------------------


def test_tiny_cpu_machine_loads_in_the_main_process() -> None:
    tiny = with_host("cpu-laptop-linux", cpus_usable=2, cpu_affinity_count=2)
    found = _findings(tiny)
    assert found["dataloader.num_workers"].value == 0
    assert "2 usable" in found["dataloader.num_workers"].reason
    assert "affinity mask of 2" in found["dataloader.num_workers"].reason
    assert found["dataloader.persistent_workers"].value is False
    assert found["cpu_threads"].value == 2  # below torch's 4 physical cores
    assert found["environment.OMP_NUM_THREADS"].value == "2"


def test_laptop_keeps_torch_default_threads() -> None:
    found = _findings("cpu-laptop-linux")["cpu_threads"]
    assert found.value is None
    assert found.rule == "G1"
    assert "4 physical cores" in found.reason


def test_cpu_threads_leave_room_for_measured_workers() -> None:
    found = _findings("cpu-container-quota-4", Measurements(num_workers=2))
    assert found["dataloader.num_workers"].value == 2
    assert found["cpu_threads"].value == 2


def test_workers_that_take_every_cpu_leave_one_thread_and_say_so() -> None:
    # "4 usable CPUs, less 4 DataLoader worker(s): 1 thread(s) for compute": 4 - 4 is not 1
    found = _findings("cpu-container-quota-4", Measurements(num_workers=4))["cpu_threads"]
    assert found.value == 1
    assert "all taken by 4 DataLoader worker(s): 1 thread for compute, the fewest" in found.reason


def test_threads_the_fed_passes_measured_are_the_profiles_with_their_reason() -> None:
    measured = Measurements(num_workers=0, cpu_threads=1, threads_reason="1 thread: fed fastest")
    found = _findings("cpu-container-quota-4", measured)
    assert found["cpu_threads"].value == 1
    assert found["cpu_threads"].reason == "1 thread: fed fastest"
    assert found["cpu_threads"].source is Source.MEASURED
    assert found["environment.OMP_NUM_THREADS"].value == "1"


# --- pinning ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("available_gib", "pin"),
    [pytest.param(2, False, id="2-gib"), pytest.param(3.9, False, id="3.9-gib"), (64, True)],
)
def test_pin_memory_off_when_host_ram_is_tight(available_gib: float, pin: bool) -> None:
    tight = with_host("h100-80gb-hbm3", memory_available_bytes=int(available_gib * 1024**3))
    found = _findings(tight)["dataloader.pin_memory"]
    assert found.value is pin
    assert found.rule == "F6"
    if not pin:
        assert f"{available_gib:.1f} GiB" in found.reason


def test_pin_memory_counts_the_container_memory_limit() -> None:
    limited = with_host("h100-80gb-hbm3", memory_limit_bytes=3 * 1024**3)
    assert _findings(limited)["dataloader.pin_memory"].value is False


def test_pin_memory_never_on_mps() -> None:
    found = _findings("apple-m2-pro-mps")["dataloader.pin_memory"]
    assert found.value is False
    assert found.rule == "N4"
    assert "'mps'" in found.reason


# --- measured values and modes ------------------------------------------------------------------


@pytest.mark.parametrize("machine", ["h100-80gb-hbm3", "rtx-3060-windows", "cpu-laptop-linux"])
def test_measured_workers_flow_through(machine: str) -> None:
    found = _findings(machine, Measurements(num_workers=3))["dataloader.num_workers"]
    assert found.value == 3
    assert found.source is Source.MEASURED
    assert "measured" in found.reason


def test_measured_zero_workers_turn_off_persistence_and_prefetch() -> None:
    found = _findings("apple-m2-pro-mps", Measurements(num_workers=0))
    assert found["dataloader.num_workers"].value == 0
    assert found["dataloader.persistent_workers"].value is False
    assert found["dataloader.prefetch_factor"].value is None


def test_measurements_without_workers_fall_back_to_the_rule() -> None:
    found = _findings("h100-80gb-hbm3", Measurements(batch_size=64))["dataloader.num_workers"]
    assert found.value == 8
    assert found.source is Source.INFERRED


@pytest.mark.parametrize(
    ("mode", "seeded"),
    [(Mode.REPRODUCIBLE, True), (Mode.SPEED, False), (Mode.BALANCED, False)],
    ids=lambda v: v.value if isinstance(v, Mode) else str(v),
)
def test_reproducible_mode_seeds_workers(mode: Mode, seeded: bool) -> None:
    found = _findings("h100-80gb-hbm3", mode=mode)["dataloader.seed_workers"]
    assert found.value is seeded
    assert found.rule == "F12"


# --- properties ---------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    machine=st.sampled_from(ALL_FIXTURES),
    mode=st.sampled_from(list(Mode)),
    model_kind=st.sampled_from(["conv", "transformer", "mlp", "other"]),
    fixed_shapes=st.booleans(),
    processes=st.one_of(st.none(), st.integers(min_value=1, max_value=16)),
)
def test_findings_keep_the_profile_invariants(
    machine: str, mode: Mode, model_kind: str, fixed_shapes: bool, processes: int | None
) -> None:
    ctx = _ctx(
        machine,
        mode=mode,
        model_kind=model_kind,
        fixed_shapes=fixed_shapes,
        processes_per_node=processes,
    )
    found = run(ctx, dataloader, cpu_threads)
    host = ctx.snapshot.host
    workers = found["dataloader.num_workers"].value
    threads = found["cpu_threads"].value
    assert 0 <= workers <= host.cpus_usable
    assert not found["dataloader.persistent_workers"].value or workers > 0
    assert found["dataloader.prefetch_factor"].value is None or workers > 0
    assert not found["dataloader.pin_memory"].value or ctx.device == "cuda"
    assert found["dataloader.seed_workers"].value is (mode is Mode.REPRODUCIBLE)
    if host.os_name == "windows":
        assert workers == 0
    assert threads is None or 1 <= threads <= host.cpus_usable
    one_process = ctx.topology.processes_per_node == 1
    if threads is not None and ctx.device == "cpu" and one_process and workers > 0:
        assert workers + threads <= host.cpus_usable
    for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        assert variable in ALLOWED_ENVIRONMENT
        assert found[f"environment.{variable}"].value == (None if threads is None else str(threads))


@settings(max_examples=200, deadline=None)
@given(
    machine=st.sampled_from(ALL_FIXTURES),
    measured=st.integers(min_value=0, max_value=32),
)
def test_measured_workers_keep_the_invariants(machine: str, measured: int) -> None:
    ctx = _ctx(machine, Measurements(num_workers=measured))
    found = run(ctx, dataloader, cpu_threads)
    assert found["dataloader.num_workers"].value == measured
    assert found["dataloader.num_workers"].source is Source.MEASURED
    assert not found["dataloader.persistent_workers"].value or measured > 0
    assert found["dataloader.prefetch_factor"].value is None
    threads = found["cpu_threads"].value
    assert threads is None or threads >= 1


def test_windows_keeps_zero_workers_unless_the_user_sets_a_count() -> None:
    assert values(_findings("rtx-3060-windows"))["dataloader.num_workers"] == 0
    chosen = _findings("rtx-3060-windows", num_workers=2)["dataloader.num_workers"]
    assert (chosen.value, chosen.source) == (2, Source.USER)


def _threads_read(machine: HardwareSnapshot, threads: int | None) -> HardwareSnapshot:
    software = machine.software.model_copy(update={"torch_num_threads": threads})
    return machine.model_copy(update={"software": software})


@pytest.mark.parametrize("machine", ["cpu-laptop-linux", "h100-80gb-hbm3"])
def test_threads_left_to_torch_say_the_count_the_process_had_where_it_was_not_the_default(
    machine: str,
) -> None:
    """A script's torch.set_num_threads(1) before tune(): the reason said torch's default
    pool of the host's cores, the count every pass was said to run at, where they ran at 1."""
    snap = SNAPSHOTS[machine]
    default = snap.host.cpu_cores_physical
    assert default is not None
    assert default > 1
    for threads in (None, default):
        found = _findings(_threads_read(snap, threads))["cpu_threads"]
        assert (found.value, found.rule) == (None, "G1")
        assert "torch.get_num_threads()" not in found.reason
    found = _findings(_threads_read(snap, 1))["cpu_threads"]
    assert (found.value, found.rule) == (None, "G1")
    assert found.reason.startswith(
        "left to torch: torch's pool has 1 thread in the process that read the machine "
        f"(torch.get_num_threads(), against a default of {default}: OMP_NUM_THREADS, "
        "torch.set_num_threads or the CPUs it may run on change it), the count a script that "
        "sets none trains at, "
    )


@pytest.mark.parametrize("machine", ["cpu-laptop-linux", "h100-80gb-hbm3"])
def test_a_process_pool_larger_than_the_cpus_is_capped_to_them(machine: str) -> None:
    """torch.set_num_threads(8) on 2 usable CPUs: the threads were left to torch (its default
    of the cores fits), the passes halved from the process's 8 and the profile took 4, more
    than the machine can run, and its validation failed after the whole run."""
    snap = with_host(machine, cpus_usable=2, cpu_affinity_count=2)
    found = _findings(_threads_read(snap, 8))["cpu_threads"]
    assert found.value == 2
    assert "torch's pool has 8 threads in the process that read the machine" in found.reason

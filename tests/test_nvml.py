"""The NVML adapter against a fake binding: every failure costs one field or one GPU, never more."""

from __future__ import annotations

from pathlib import Path

import pynvml
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fake_nvml import (
    MIB,
    FakeGpu,
    FakeMig,
    FakeNvml,
    a100_40gb,
    gtx_1080_ti_old_driver,
    gtx_1660_ti,
    h100,
    jetson_orin,
    rtx_3060,
    rtx_4090,
    tesla_t4,
)
from torch_autotune.detect import nvml as nvml_module
from torch_autotune.detect.nvml import NvidiaReading, nvidia_driver_present, read_nvidia_gpus
from torch_autotune.hardware import Architecture, Backend, Vendor

NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
FUNCTION_NOT_FOUND = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
GPU_IS_LOST = pynvml.NVML_ERROR_GPU_IS_LOST
PCI_ORDER = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def read(*gpus: FakeGpu, env: dict[str, str] | None = None, **options: object) -> NvidiaReading:
    return read_nvidia_gpus(FakeNvml(list(gpus), **options), env=env or {})  # type: ignore[arg-type]


def fields_warned(reading: NvidiaReading) -> set[str]:
    return {w.field for w in reading.warnings}


def test_h100_is_read_completely_without_warnings() -> None:
    binding = FakeNvml([h100()])
    reading = read_nvidia_gpus(binding, env={})

    (gpu,) = reading.accelerators
    assert (gpu.vendor, gpu.backend, gpu.architecture) == (
        Vendor.NVIDIA,
        Backend.CUDA,
        Architecture.HOPPER,
    )
    assert gpu.name == "NVIDIA H100 80GB HBM3"
    assert gpu.compute_capability == (9, 0)
    assert gpu.tensor_cores is True
    assert gpu.memory_total_bytes == 81559 * MIB
    assert gpu.memory_free_bytes == (81559 - 512) * MIB
    assert gpu.sm_count == 132  # 16896 CUDA cores / 128 per Hopper SM (catalog §R #33)
    assert gpu.unified_memory is False
    assert gpu.pci_bus_id == "00000000:10:00.0"  # bytes from the binding, decoded
    assert (reading.driver_version, reading.cuda_driver_version) == ("570.133.20", "12.8")
    assert reading.warnings == []
    assert binding.shut_down


@pytest.mark.parametrize(
    ("gpu", "sm_count", "architecture", "tensor_cores"),
    [
        pytest.param(a100_40gb(), 108, Architecture.AMPERE, True, id="a100"),
        pytest.param(tesla_t4(), 40, Architecture.TURING, True, id="t4"),
        pytest.param(gtx_1660_ti(), 24, Architecture.TURING, False, id="gtx1660ti-no-tensor-cores"),
        pytest.param(gtx_1080_ti_old_driver(), 28, Architecture.PASCAL, False, id="gtx1080ti"),
        pytest.param(rtx_3060(), 28, Architecture.AMPERE, True, id="rtx3060"),
        pytest.param(rtx_4090(), 128, Architecture.ADA, True, id="rtx4090"),
    ],
)
def test_sm_count_and_features_follow_the_compute_capability(
    gpu: FakeGpu, sm_count: int, architecture: Architecture, tensor_cores: bool
) -> None:
    (accelerator,) = read(gpu).accelerators
    assert accelerator.sm_count == sm_count
    assert accelerator.architecture is architecture
    assert accelerator.tensor_cores is tensor_cores


def test_no_driver_means_no_gpus_and_nothing_to_warn_about() -> None:
    reading = read(h100(), init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    assert reading.accelerators == []
    assert reading.warnings == []
    assert reading.nvml_available is False


def test_driver_installed_but_not_loaded_is_reported() -> None:
    reading = read(h100(), init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    assert reading.accelerators == []
    assert [w.field for w in reading.warnings] == ["accelerators"]
    assert "Driver Not Loaded" in reading.warnings[0].reason


def test_binding_not_installed_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setattr(nvml_module, "nvidia_driver_present", lambda: True)
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes 'import pynvml' raise ImportError
    reading = read_nvidia_gpus(env={})
    assert reading.accelerators == []
    assert "pip install nvidia-ml-py" in reading.warnings[0].reason


def test_jetson_memory_not_supported_costs_only_the_memory_fields() -> None:
    reading = read(jetson_orin())
    (orin,) = reading.accelerators
    assert orin.memory_total_bytes is None
    assert orin.memory_free_bytes is None
    assert orin.unified_memory is True
    assert orin.sm_count == 14
    assert fields_warned(reading) == {
        "accelerators[0].memory_total_bytes",
        "accelerators[0].memory_free_bytes",
    }
    assert "Not Supported" in reading.warnings[0].reason


def test_unsupported_core_count_leaves_sm_count_unknown_with_the_reason() -> None:
    gpu = tesla_t4()
    gpu.failures["nvmlDeviceGetNumGpuCores"] = NOT_SUPPORTED
    reading = read(gpu)
    assert reading.accelerators[0].sm_count is None
    assert reading.accelerators[0].memory_total_bytes == 15360 * MIB
    assert [(w.field, w.reason) for w in reading.warnings] == [
        ("accelerators[0].sm_count", "NVML: Not Supported")
    ]


def test_lost_gpu_is_left_out_and_the_others_renumbered() -> None:
    gpus = [a100_40gb() for _ in range(8)]
    gpus[3].lost = True
    reading = read(*gpus)
    assert [a.index for a in reading.accelerators] == list(range(7))
    assert "00000000:13:00.0" not in {a.pci_bus_id for a in reading.accelerators}
    (warning,) = reading.warnings
    assert warning.field == "accelerators (NVML GPU 3)"
    assert "GPU is lost" in warning.reason


def test_gpu_lost_in_the_middle_of_reading_is_left_out() -> None:
    lost = rtx_4090()
    lost.failures["nvmlDeviceGetMemoryInfo"] = GPU_IS_LOST
    reading = read(lost, rtx_3060())
    assert [a.name for a in reading.accelerators] == ["NVIDIA GeForce RTX 3060"]
    assert reading.accelerators[0].index == 0


def test_old_driver_falls_back_to_the_older_function() -> None:
    reading = read(
        gtx_1080_ti_old_driver(),
        driver=b"390.48",  # old bindings hand back bytes
        cuda_version=9010,
        system_failures={"nvmlSystemGetCudaDriverVersion_v2": FUNCTION_NOT_FOUND},
    )
    assert (reading.driver_version, reading.cuda_driver_version) == ("390.48", "9.1")
    assert reading.warnings == []
    assert reading.accelerators[0].name == "GeForce GTX 1080 Ti"


def test_old_driver_without_core_count_says_the_driver_is_too_old() -> None:
    gpu = gtx_1080_ti_old_driver()
    gpu.failures["nvmlDeviceGetNumGpuCores"] = FUNCTION_NOT_FOUND
    reading = read(gpu)
    assert reading.accelerators[0].sm_count is None
    assert "too old" in reading.warnings[0].reason


def test_old_binding_missing_a_function_costs_that_field() -> None:
    reading = read(tesla_t4(), absent=frozenset({"nvmlDeviceGetNumGpuCores"}))
    assert reading.accelerators[0].sm_count is None
    assert reading.accelerators[0].compute_capability == (7, 5)
    assert "has no nvmlDeviceGetNumGpuCores" in reading.warnings[0].reason


def test_unreadable_compute_capability_keeps_the_gpu_with_unknown_features() -> None:
    gpu = h100()
    gpu.failures["nvmlDeviceGetCudaComputeCapability"] = pynvml.NVML_ERROR_UNKNOWN
    reading = read(gpu)
    (accelerator,) = reading.accelerators
    assert accelerator.compute_capability is None
    assert accelerator.architecture is Architecture.UNKNOWN
    assert accelerator.tensor_cores is None
    assert "accelerators[0].compute_capability" in fields_warned(reading)


def test_device_count_failure_gives_no_gpus_but_still_shuts_nvml_down() -> None:
    binding = FakeNvml([h100()], system_failures={"nvmlDeviceGetCount": pynvml.NVML_ERROR_UNKNOWN})
    reading = read_nvidia_gpus(binding, env={})
    assert reading.accelerators == []
    assert fields_warned(reading) == {"accelerators"}
    assert binding.shut_down


def _mig_uuid(gpu: FakeGpu, *, slot: int) -> str:
    """The UUID NVML gives the MIG device in ``slot`` of ``gpu``, the only GPU."""
    binding = FakeNvml([gpu])
    handle = binding.nvmlDeviceGetMigDeviceHandleByIndex(
        binding.nvmlDeviceGetHandleByIndex(0), slot
    )
    return binding.nvmlDeviceGetUUID(handle)


def test_a_mig_enabled_gpu_is_the_one_mig_device_a_cuda_process_enumerates() -> None:
    """However many MIG devices it is shown, a CUDA process enumerates one (NVIDIA's MIG
    guide; torch.cuda.device_count() is 1): the first, read as a GPU of its own; the others
    are neither this process's GPUs nor ranks to plan, and the warning says how to pick one."""
    gpu = a100_40gb()
    gpu.mig = [FakeMig("1g.5gb", 4864, 14, slot=0), FakeMig("3g.20gb", 19968, 42, slot=2)]
    reading = read(gpu)
    assert [a.name for a in reading.accelerators] == ["NVIDIA A100-SXM4-40GB MIG 1g.5gb"]
    (warning,) = reading.warnings
    assert "2 MIG devices are visible, but a CUDA process enumerates only one" in warning.reason
    assert "CUDA_VISIBLE_DEVICES to its MIG UUID" in warning.reason
    small = reading.accelerators[0]
    assert small.mig is not None
    assert (small.mig.profile, small.mig.parent_name) == ("1g.5gb", "NVIDIA A100-SXM4-40GB")
    assert small.memory_total_bytes == 4864 * MIB
    assert small.sm_count == 14
    assert small.compute_capability == (8, 0)
    assert small.uuid is not None
    assert small.uuid.startswith("MIG-")
    big = _mig_uuid(gpu, slot=2)
    (chosen,) = read(gpu, env={"CUDA_VISIBLE_DEVICES": big}).accelerators
    assert (chosen.mig and chosen.mig.profile, chosen.sm_count) == ("3g.20gb", 42)


def test_a_mig_instance_id_no_gpu_has_costs_that_id() -> None:
    gpu = a100_40gb()
    gpu.mig = [FakeMig("1g.5gb", 4864, 14, slot=0, gpu_instance_id=2_000_000)]
    reading = read(gpu)
    (slice_,) = reading.accelerators
    assert slice_.mig is not None
    assert (slice_.mig.gpu_instance_id, slice_.mig.compute_instance_id) == (None, 0)
    assert fields_warned(reading) == {"accelerators[0].mig.gpu_instance_id"}


class TestCudaVisibleDevices:
    def test_order_and_numbering_follow_the_variable(self) -> None:
        reading = read(h100(), a100_40gb(), env={"CUDA_VISIBLE_DEVICES": "1,0", **PCI_ORDER})
        assert [(a.index, a.name) for a in reading.accelerators] == [
            (0, "NVIDIA A100-SXM4-40GB"),
            (1, "NVIDIA H100 80GB HBM3"),
        ]

    def test_uuid_prefix_selects_a_gpu(self) -> None:
        binding = FakeNvml([h100(), h100()])
        reading = read_nvidia_gpus(binding, env={"CUDA_VISIBLE_DEVICES": binding.gpus[1].uuid[:12]})
        assert [a.uuid for a in reading.accelerators] == [binding.gpus[1].uuid]

    def test_list_ends_at_the_first_invalid_entry(self) -> None:
        reading = read(h100(), h100(), env={"CUDA_VISIBLE_DEVICES": "0,7,1"})
        assert len(reading.accelerators) == 1

    @pytest.mark.parametrize("value", ["", "-1", "NoDevFiles"])
    def test_hiding_every_gpu(self, value: str) -> None:
        assert read(h100(), env={"CUDA_VISIBLE_DEVICES": value}).accelerators == []

    def test_warnings_about_hidden_gpus_are_dropped(self) -> None:
        hidden = tesla_t4()
        hidden.failures["nvmlDeviceGetNumGpuCores"] = NOT_SUPPORTED
        reading = read(h100(), hidden, env={"CUDA_VISIBLE_DEVICES": "0", **PCI_ORDER})
        assert reading.warnings == []

    def test_warning_follows_its_gpu_to_its_new_index(self) -> None:
        unreadable = tesla_t4()
        unreadable.failures["nvmlDeviceGetNumGpuCores"] = NOT_SUPPORTED
        reading = read(h100(), unreadable, env={"CUDA_VISIBLE_DEVICES": "1", **PCI_ORDER})
        assert fields_warned(reading) == {"accelerators[0].sm_count"}

    def test_indices_on_mixed_gpus_warn_unless_pci_order_is_set(self) -> None:
        mixed = {"CUDA_VISIBLE_DEVICES": "0"}
        assert fields_warned(read(rtx_4090(), rtx_3060(), env=mixed)) == {"accelerators"}
        pci = {**mixed, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
        assert read(rtx_4090(), rtx_3060(), env=pci).warnings == []

    def test_mig_uuids_give_the_first_one_listed(self) -> None:
        gpu = a100_40gb()
        gpu.mig = [FakeMig("1g.5gb", 4864, 14, slot=0), FakeMig("1g.5gb", 4864, 14, slot=1)]
        first, second = _mig_uuid(gpu, slot=0), _mig_uuid(gpu, slot=1)
        chosen = read(gpu, env={"CUDA_VISIBLE_DEVICES": second}).accelerators
        assert [a.uuid for a in chosen] == [second]
        both = read(gpu, env={"CUDA_VISIBLE_DEVICES": f"{second},{first}"}).accelerators
        assert [a.uuid for a in both] == [second]


_DEVICE_FUNCTIONS = [
    "nvmlDeviceGetName",
    "nvmlDeviceGetCudaComputeCapability",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetNumGpuCores",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetPciInfo",
]
# A lost GPU fails every call, so it is the `lost` flag below, not a per-function failure.
_ERRORS = [NOT_SUPPORTED, FUNCTION_NOT_FOUND, pynvml.NVML_ERROR_UNKNOWN]


@pytest.mark.parametrize(
    ("memory_mib", "cores", "left_out"),
    [
        (1 << 41, 16896, {"memory_total_bytes", "memory_free_bytes"}),  # 2 EiB: a vGPU's answer
        (81559, 128 * 10_000, {"sm_count"}),  # 10,000 SMs
        (0, 16896, {"memory_total_bytes"}),  # 0 bytes
    ],
    ids=["2 EiB", "10000 SMs", "0 bytes"],
)
def test_a_number_no_gpu_has_costs_that_field_not_the_gpu(
    memory_mib: int, cores: int, left_out: set[str]
) -> None:
    reading = read(FakeGpu("NVIDIA H100 80GB HBM3", (9, 0), memory_mib, cores))
    (gpu,) = reading.accelerators
    assert {key for key in left_out if getattr(gpu, key) is None} == left_out
    assert fields_warned(reading) == {f"accelerators[0].{key}" for key in left_out}
    assert gpu.compute_capability == (9, 0)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([h100, a100_40gb, tesla_t4, gtx_1660_ti, jetson_orin, rtx_3060]),
            st.dictionaries(st.sampled_from(_DEVICE_FUNCTIONS), st.sampled_from(_ERRORS)),
            st.booleans(),
        ),
        max_size=8,
    )
)
def test_any_mix_of_failures_costs_only_what_failed(
    plan: list[tuple[object, dict[str, int], bool]],
) -> None:
    gpus = []
    for make, failures, lost in plan:
        gpu = make()  # type: ignore[operator]
        gpu.failures, gpu.lost = failures, lost
        gpus.append(gpu)
    reading = read(*gpus)

    survivors = [g for g in gpus if not g.lost and "nvmlDeviceGetName" not in g.failures]
    assert [a.name for a in reading.accelerators] == [g.name for g in survivors]
    warned = fields_warned(reading)
    for accelerator in reading.accelerators:
        for name in ("compute_capability", "memory_total_bytes", "sm_count", "uuid", "pci_bus_id"):
            if getattr(accelerator, name) is None:
                assert f"accelerators[{accelerator.index}].{name}" in warned, name


@pytest.mark.parametrize(
    ("platform", "files", "present"),
    [
        pytest.param("linux", ["proc/driver/nvidia/version"], True, id="linux-driver"),
        pytest.param("linux", ["dev/nvidiactl"], True, id="container-with-gpus"),
        pytest.param("linux", ["dev/dxg"], True, id="wsl2"),
        pytest.param("linux", [], False, id="linux-without-driver"),
        pytest.param("darwin", ["dev/nvidiactl"], False, id="macos"),
        pytest.param("win32", [], True, id="windows-asks-nvml"),
    ],
)
def test_driver_presence_is_judged_from_files(
    tmp_path: Path, platform: str, files: list[str], present: bool
) -> None:
    for name in files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    assert nvidia_driver_present(tmp_path, platform) is present


def test_without_a_driver_the_binding_is_not_even_imported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys

    monkeypatch.setattr(nvml_module, "nvidia_driver_present", lambda: False)
    monkeypatch.setitem(sys.modules, "pynvml", None)  # an import would raise ImportError
    reading = read_nvidia_gpus(env={})
    assert (reading.accelerators, reading.warnings) == ([], [])

"""Deep detection (``torch_autotune.detect.torch_env``) against fake torch modules.

Every build kind torch ships is faked with the real API shape (``tests/fake_torch.py``): a CUDA
build with two different GPUs, one GPU torch cannot query, a CUDA build on a machine without a
GPU, ROCm (whose (major, minor) pairs collide with NVIDIA's), Apple MPS and a CPU build. One test
feeds the real CPU torch's own version and thread count through ``read_torch`` without touching
CUDA.
"""

from __future__ import annotations

import builtins
import sys
from types import SimpleNamespace

import pytest

from tests.fake_torch import (
    CudaNotBuilt,
    FakeGpu,
    gtx_1660_ti,
    make_torch,
    mi250,
    mi300x,
    rtx_4090,
)
from torch_autotune.detect.torch_env import cudnn_version_text, import_torch, read_torch
from torch_autotune.hardware import NO_GPU_FOR_TORCH, Accelerator, Architecture, Backend, Vendor

CU128_ARCHS = ("sm_70", "sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120")
ROCM_ARCHS = ("gfx900", "gfx906", "gfx908", "gfx90a", "gfx942", "gfx1030", "gfx1100")


def cuda_torch(
    *gpus: FakeGpu, cudnn: int | None = 91002, available: bool = True
) -> SimpleNamespace:
    return make_torch(
        cuda="12.8", gpus=gpus, arch_list=CU128_ARCHS, cudnn=cudnn, available=available
    )


def rocm_torch(*gpus: FakeGpu) -> SimpleNamespace:
    # A ROCm build answers cudnn.version() with MIOpen's version: detection must not take it.
    return make_torch(hip="6.4.43482", gpus=gpus, arch_list=ROCM_ARCHS, cudnn=3_004_000)


# --- cuDNN version numbers ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("number", "text"),
    [
        pytest.param(7605, "7.6.5", id="cudnn7"),
        pytest.param(8902, "8.9.2", id="cudnn8"),
        pytest.param(90000, "9.0.0", id="cudnn9.0"),
        pytest.param(90100, "9.1.0", id="cudnn9.1"),
        pytest.param(91002, "9.10.2", id="cudnn9.10-two-digit-minor"),
    ],
)
def test_cudnn_version_text_decodes_both_encodings(number: int, text: str) -> None:
    """cuDNN < 9 encodes major*1000 + minor*100 + patch, cuDNN 9 major*10000 + minor*100."""
    assert cudnn_version_text(number) == text


@pytest.mark.parametrize(
    ("number", "text"),
    [pytest.param(90100, "9.1.0", id="9.1.0"), pytest.param(8902, "8.9.2", id="8.9.2")],
)
def test_read_torch_reports_cudnn_from_torch(number: int, text: str) -> None:
    reading = read_torch(cuda_torch(FakeGpu(rtx_4090()), cudnn=number))

    assert reading.cudnn_version == text


def test_read_torch_leaves_cudnn_none_when_torch_has_none() -> None:
    reading = read_torch(cuda_torch(FakeGpu(rtx_4090()), cudnn=None))

    assert reading.cudnn_version is None


# --- CUDA builds --------------------------------------------------------------------------------


def test_cuda_build_with_two_different_gpus_reads_each() -> None:
    torch = cuda_torch(
        FakeGpu(rtx_4090(), free_bytes=24_000_000_000),
        FakeGpu(gtx_1660_ti(), free_bytes=5_800_000_000),
        cudnn=90100,
    )

    reading = read_torch(torch)

    assert reading.accelerators == [
        Accelerator(
            index=0,
            vendor=Vendor.NVIDIA,
            backend=Backend.CUDA,
            name="NVIDIA GeForce RTX 4090",
            architecture=Architecture.ADA,
            compute_capability=(8, 9),
            tensor_cores=True,
            memory_total_bytes=25_393_692_672,
            memory_free_bytes=24_000_000_000,
            sm_count=128,
            unified_memory=False,
            uuid="GPU-5d7ee2f0-6c43-4d3a-9bd6-0c2b7f6f1a01",
        ),
        Accelerator(
            index=1,
            vendor=Vendor.NVIDIA,
            backend=Backend.CUDA,
            name="NVIDIA GeForce GTX 1660 Ti",
            architecture=Architecture.TURING,
            compute_capability=(7, 5),
            tensor_cores=False,  # TU116: cc 7.5 without Tensor Cores (catalog A7)
            memory_total_bytes=6_226_378_752,
            memory_free_bytes=5_800_000_000,
            sm_count=24,
            unified_memory=False,
            uuid="GPU-a3c1e9b2-7f00-4e11-8c2d-9e8f7a6b5c40",
        ),
    ]
    assert reading.arch_list == CU128_ARCHS
    assert reading.cudnn_version == "9.1.0"
    assert reading.num_threads == 8
    assert reading.warnings == []


def test_gpu_torch_cannot_query_is_left_out_with_a_warning() -> None:
    broken = FakeGpu(RuntimeError("CUDA error: unspecified launch failure"))
    torch = cuda_torch(broken, FakeGpu(rtx_4090(), free_bytes=1 << 30))

    reading = read_torch(torch)

    assert [(a.index, a.name) for a in reading.accelerators] == [(1, "NVIDIA GeForce RTX 4090")]
    assert [w.field for w in reading.warnings] == ["accelerators[0]"]
    assert "unspecified launch failure" in reading.warnings[0].reason


def test_cuda_build_without_a_gpu_still_reads_the_build() -> None:
    reading = read_torch(cuda_torch(cudnn=90100, available=False))

    assert reading.accelerators == []
    assert reading.arch_list == CU128_ARCHS
    assert reading.cudnn_version == "9.1.0"
    # torch said it sees no GPU: the rules' driver gate reads it (NVML may list GPUs still)
    assert [w.reason for w in reading.warnings] == [NO_GPU_FOR_TORCH]


def test_arch_list_torch_cannot_read_becomes_a_warning() -> None:
    torch = make_torch(
        cuda="12.8",
        gpus=(FakeGpu(rtx_4090()),),
        arch_list=RuntimeError("CUDA driver initialization failed"),
    )

    reading = read_torch(torch)

    assert reading.accelerators == []
    assert reading.arch_list is None
    assert [w.field for w in reading.warnings] == ["accelerators"]
    assert "driver initialization failed" in reading.warnings[0].reason


# --- ROCm builds: the (major, minor) pair is not an NVIDIA compute capability -----------------


@pytest.mark.parametrize(
    ("props", "architecture", "cc"),
    [
        pytest.param(mi300x(), Architecture.CDNA3, (9, 4), id="mi300x-gfx942"),
        pytest.param(mi250(), Architecture.CDNA2, (9, 0), id="mi250-gfx90a-looks-like-hopper"),
    ],
)
def test_rocm_gpu_family_comes_from_gfx_target(
    props: SimpleNamespace, architecture: Architecture, cc: tuple[int, int]
) -> None:
    reading = read_torch(rocm_torch(FakeGpu(props, free_bytes=10 * 1024**3)))

    (gpu,) = reading.accelerators
    assert gpu.vendor is Vendor.AMD
    assert gpu.backend is Backend.ROCM
    assert gpu.architecture is architecture
    assert gpu.architecture is not Architecture.HOPPER
    assert gpu.compute_capability == cc
    assert gpu.tensor_cores is True  # MFMA matrix cores on CDNA
    assert gpu.sm_count == props.multi_processor_count
    assert gpu.memory_free_bytes == 10 * 1024**3
    assert reading.arch_list == ROCM_ARCHS
    assert reading.cudnn_version is None  # MIOpen's number is not a cuDNN version


# --- builds without CUDA --------------------------------------------------------------------------


def test_mps_build_reports_one_apple_gpu_with_unified_memory() -> None:
    reading = read_torch(make_torch(mps=True))

    (gpu,) = reading.accelerators
    assert gpu.vendor is Vendor.APPLE
    assert gpu.backend is Backend.MPS
    assert gpu.architecture is Architecture.APPLE
    assert gpu.unified_memory is True
    assert gpu.compute_capability is None
    assert reading.arch_list == ()
    assert reading.cudnn_version is None


def test_cpu_build_reports_no_accelerators_and_no_gpu_kernels() -> None:
    reading = read_torch(make_torch(num_threads=4))

    assert reading.accelerators == []
    assert reading.arch_list == ()
    assert reading.num_threads == 4
    assert reading.warnings == []


# --- importing torch ------------------------------------------------------------------------------


def test_import_torch_returns_the_installed_module() -> None:
    torch = pytest.importorskip("torch")

    assert import_torch() is torch


def test_import_torch_returns_none_when_torch_is_not_installed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` raise ImportError

    assert import_torch() is None


def test_import_torch_returns_none_when_a_broken_install_raises(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_import = builtins.__import__

    def broken_torch(name: str, *args: object, **kwargs: object) -> object:
        if name == "torch":
            raise OSError("libtorch_cuda.so: cannot open shared object file")
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", broken_torch)

    assert import_torch() is None


# --- the real torch, on the CPU -----------------------------------------------------------------


def test_real_cpu_torch_build_facts_read_as_a_cpu_build() -> None:
    """The real module's version, backends and thread count, with torch.cuda out of reach.

    ``read_torch(torch)`` itself would call ``torch.cuda.is_available`` on a CUDA build, which
    the unit-test guard refuses; on a CPU build it never touches ``torch.cuda``, and replacing it
    with an object that fails when touched proves that.
    """
    torch = pytest.importorskip("torch")
    if torch.version.cuda or torch.version.hip or torch.backends.mps.is_available():
        pytest.skip("needs a CPU-only build of torch (no CUDA, ROCm or MPS)")
    facade = SimpleNamespace(
        version=torch.version,
        get_num_threads=torch.get_num_threads,
        backends=torch.backends,
        cuda=CudaNotBuilt(),
    )

    reading = read_torch(facade)

    assert reading.num_threads == torch.get_num_threads()
    assert reading.arch_list == ()
    assert reading.arch_list == tuple(torch.cuda.get_arch_list())  # [] on a CPU build
    assert reading.accelerators == []
    assert reading.warnings == []

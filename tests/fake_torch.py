"""A fake torch module with the API shape ``torch_autotune.detect.torch_env`` reads.

Only what deep detection touches is modelled: ``torch.version.cuda/hip``,
``torch.get_num_threads()``, ``torch.cuda.is_available/device_count/get_arch_list/
get_device_properties/mem_get_info``, ``torch.backends.cudnn.version()`` and
``torch.backends.mps.is_available()``. Device properties carry the attributes real
``_CudaDeviceProperties`` have (``gcnArchName`` only on ROCm builds), and a GPU can be given as an
exception to model one that torch cannot query.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

GIB = 1024**3


def nvidia_props(
    name: str,
    cc: tuple[int, int],
    *,
    total_memory: int,
    sms: int,
    uuid: str = "5d7ee2f0-6c43-4d3a-9bd6-0c2b7f6f1a01",
    is_integrated: bool = False,
) -> SimpleNamespace:
    """What ``torch.cuda.get_device_properties(i)`` returns on a CUDA build."""
    return SimpleNamespace(
        name=name,
        major=cc[0],
        minor=cc[1],
        total_memory=total_memory,
        multi_processor_count=sms,
        is_integrated=is_integrated,
        uuid=uuid,
    )


def rocm_props(
    name: str,
    gcn_arch_name: str,
    cc: tuple[int, int],
    *,
    total_memory: int,
    compute_units: int,
) -> SimpleNamespace:
    """What ``torch.cuda.get_device_properties(i)`` returns on a ROCm build."""
    return SimpleNamespace(
        name=name,
        gcnArchName=gcn_arch_name,
        major=cc[0],
        minor=cc[1],
        total_memory=total_memory,
        multi_processor_count=compute_units,
        is_integrated=False,
        uuid="58ff4b1c-2d7e-9a0b-c3d4-e5f60718293a",
    )


def rtx_4090() -> SimpleNamespace:
    return nvidia_props(
        "NVIDIA GeForce RTX 4090",
        (8, 9),
        total_memory=25_393_692_672,
        sms=128,
        uuid="5d7ee2f0-6c43-4d3a-9bd6-0c2b7f6f1a01",
    )


def gtx_1660_ti() -> SimpleNamespace:
    return nvidia_props(
        "NVIDIA GeForce GTX 1660 Ti",
        (7, 5),
        total_memory=6_226_378_752,
        sms=24,
        uuid="a3c1e9b2-7f00-4e11-8c2d-9e8f7a6b5c40",
    )


def mi300x() -> SimpleNamespace:
    return rocm_props(
        "AMD Instinct MI300X",
        "gfx942:sramecc+:xnack-",
        (9, 4),
        total_memory=192 * GIB,
        compute_units=304,
    )


def mi250() -> SimpleNamespace:
    """One GCD of an MI250: gfx90a reports (9, 0), the same pair as an H100."""
    return rocm_props(
        "AMD Instinct MI250X/MI250",
        "gfx90a:sramecc+:xnack-",
        (9, 0),
        total_memory=64 * GIB,
        compute_units=104,
    )


@dataclass
class FakeGpu:
    """One device as torch sees it: its properties, or the error querying it raises."""

    props: SimpleNamespace | Exception
    free_bytes: int = 0


class FakeCuda:
    """``torch.cuda`` of a CUDA or ROCm build (ROCm builds keep the name "cuda")."""

    def __init__(
        self,
        gpus: tuple[FakeGpu, ...],
        arch_list: tuple[str, ...] | Exception,
        *,
        available: bool,
    ) -> None:
        self._gpus = gpus
        self._arch_list = arch_list
        self._available = available

    def is_available(self) -> bool:
        return self._available

    def device_count(self) -> int:
        return len(self._gpus) if self._available else 0

    def get_arch_list(self) -> list[str]:
        if isinstance(self._arch_list, Exception):
            raise self._arch_list
        return list(self._arch_list)

    def get_device_properties(self, index: int) -> SimpleNamespace:
        props = self._gpus[index].props
        if isinstance(props, Exception):
            raise props
        return props

    def mem_get_info(self, index: int) -> tuple[int, int]:
        gpu = self._gpus[index]
        assert not isinstance(gpu.props, Exception)
        return gpu.free_bytes, gpu.props.total_memory


class CudaNotBuilt:
    """``torch.cuda`` of a CPU or MPS build: deep detection must not query it."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"torch.cuda.{name} queried on a build without CUDA")


def make_torch(
    *,
    cuda: str | None = None,
    hip: str | None = None,
    gpus: tuple[FakeGpu, ...] = (),
    arch_list: tuple[str, ...] | Exception = (),
    available: bool = True,
    cudnn: int | None = None,
    mps: bool = False,
    num_threads: int = 8,
) -> SimpleNamespace:
    """A torch module: a CUDA build (``cuda=``), a ROCm one (``hip=``) or a CPU/MPS one."""
    gpu_build = cuda is not None or hip is not None
    return SimpleNamespace(
        __version__="2.8.0",
        version=SimpleNamespace(cuda=cuda, hip=hip),
        get_num_threads=lambda: num_threads,
        cuda=FakeCuda(gpus, arch_list, available=available) if gpu_build else CudaNotBuilt(),
        backends=SimpleNamespace(
            cudnn=SimpleNamespace(version=lambda: cudnn),
            mps=SimpleNamespace(is_available=lambda: mps),
        ),
    )

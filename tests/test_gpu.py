"""GPU tier: fast (NVML) and deep (torch) detection agree on a real GPU.

Skipped where no NVIDIA driver is loaded; run it wherever a GPU is available.
"""

from __future__ import annotations

import pytest

from torch_autotune import detect

pytestmark = pytest.mark.gpu


def test_nvml_and_torch_agree_on_every_gpu() -> None:
    fast = detect()
    deep = detect(deep=True)
    assert fast.accelerators, "a GPU machine shows at least one accelerator"
    assert len(fast.accelerators) == len(deep.accelerators)
    import torch

    for index, accelerator in enumerate(fast.accelerators):
        props = torch.cuda.get_device_properties(index)
        assert accelerator.name == props.name
        assert accelerator.compute_capability == (props.major, props.minor)
        assert accelerator.sm_count == props.multi_processor_count
        assert accelerator.memory_total_bytes is not None
        # NVML's total includes memory the driver reserves; torch's does not.
        assert abs(accelerator.memory_total_bytes - props.total_memory) < 0.03 * props.total_memory
    assert fast.software.torch_cuda_arch_list is not None
    real_arch_list = deep.software.torch_cuda_arch_list or ()
    assert set(fast.software.torch_cuda_arch_list) <= set(real_arch_list) | {"sm_37"}


def test_the_probe_measures_the_gpu_with_allocator_readings() -> None:
    from torch_autotune.probe.run import tune

    profile = tune("conv", budget_s=120)
    evidence = profile.evidence
    assert evidence is not None
    assert profile.settings.device == "cuda"
    readings = [t.peak_memory_bytes for t in evidence.search if t.fits]
    assert all(r is not None and r > 0 for r in readings)  # the CUDA allocator's peak
    ran = {t.batch_size for t in evidence.search if t.fits}
    assert evidence.batch_size in ran
    if profile.settings.precision.autocast and profile.settings.precision.dtype == "float16":
        assert evidence.batch_size % 8 == 0 or evidence.batch_size < 8  # catalog K4

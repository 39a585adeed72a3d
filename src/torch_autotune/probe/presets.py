"""Recorded machines for the simulation (``probe.simulated``): the ResNet-50 and GPT-2 runs on
an H100, GPT-2 large on an H200 under a memory limit, and the conv net on a 2-core CPU, each
a ``SimulatedMachine`` with the timings and memory the real run showed. No torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from torch_autotune.probe.simulated import MIB, SimulatedMachine

__all__ = ["PRESETS", "cpu_conv", "h100_gpt2", "h100_resnet50", "h200_gpt2_large", "preset"]


def h100_resnet50() -> SimulatedMachine:
    """ResNet-50 (bf16, channels_last, fused AdamW) on an H100 80GB, 2026-11-23: eager 4,250,
    4,213 and 4,096 samples/s at 1672, 832 and 416 (a step of 4.9 ms plus 0.232 ms a sample);
    1865 the largest batch (1866 ran out of memory); peaks of 0.87 GB at 8 and 84.0 GB at
    1865; compiled 1.18x after a 53 s compile; cuDNN autotuning 5-12 s a shape; the first
    step 5.7 s after start-up; the DataLoader at 4,688 samples/s with 16 workers."""
    return SimulatedMachine(
        limit=1865,
        fixed_s=0.0049,
        per_sample_s=0.000232,
        first_s=5.7,
        new_shape_s=0.1,
        autotune_s=8.1,
        compile_s=53.2,
        compiled_speedup=1.18,
        fixed_bytes=500_000_000,
        per_sample_bytes=44_800_000,
        memory_bytes=84_465_090_560,
        load_s=16 / 4688,
        host_cpus=16,
        leaves=137,
    )


def h100_gpt2() -> SimulatedMachine:
    """GPT-2 small (124M parameters, 512 tokens, bf16, fused AdamW) on an H100 80GB,
    2026-11-23: eager 481, 455 and 434 samples/s at 136, 64 and 32 (a step of 9.5 ms plus
    2.0 ms a sample); 155 the largest batch (156 ran out of memory); peaks of 6.4 GB at 8 and
    83.9 GB at 155; compiled 1.40x after a 33 s compile; no cuDNN autotuner (not a conv
    net); the first step 6.5 s after start-up; the DataLoader at 48,709 samples/s in the
    main process."""
    return SimulatedMachine(
        limit=155,
        fixed_s=0.0095,
        per_sample_s=0.0020076,
        first_s=6.5,
        new_shape_s=0.1,
        autotune_s=0.1,
        compile_s=32.6,
        compiled_speedup=1.40,
        fixed_bytes=2_210_000_000,
        per_sample_bytes=526_800_000,
        memory_bytes=84_465_090_560,
        load_s=1 / 48709,
        host_cpus=16,
        leaves=76,
    )


def h200_gpt2_large(limit_gib: int = 24) -> SimulatedMachine:
    """GPT-2 large (774M parameters, 1,024 tokens, bf16, fused AdamW) on an H200 held to
    ``--memory-limit`` 24 or 16 GiB, 2026-11-28 (``benchmarks/results/h200-2026-11-28``):
    eager 14.0, 27.8, 54.3 and 54.8 samples/s at 1, 2, 4 and 5, about 56-91 ms a step, most of
    it a fixed cost (here 45 ms plus 9 ms a sample); checkpointed 18.8, 38.7, 50.7 and 55.4 at
    3, 6, 8 and 16, about 1.5 times the step. The largest batch: 5 under 24 GiB (6 ran out of
    memory), 16 checkpointed (17 did not); under 16 GiB, 2 and 6. Peaks of 12.5 GiB at 1 and
    14.6 at 2 (10.4 GiB of weights, gradients and AdamW's state, 2.1 GiB a sample); the first
    step 19 s after start-up; a model of its own, built on the host, about 10 s (the check of
    the recomputed step took 15-16 s, the checkpointed model's first trial 8 s)."""
    under_16 = limit_gib <= 16
    return SimulatedMachine(
        limit=2 if under_16 else 5,
        checkpointed_limit=6 if under_16 else 16,
        recompute_factor=1.5,
        fixed_s=0.045,
        per_sample_s=0.009,
        first_s=19.0,
        new_shape_s=0.3,
        autotune_s=0.3,
        fixed_bytes=int(10.4 * 2**30),
        per_sample_bytes=int(2.1 * 2**30),
        memory_bytes=limit_gib << 30,  # what the trials could use: the limit
        host_cpus=16,
        leaves=220,
        build_s=10.0,
    )


def cpu_conv() -> SimulatedMachine:
    """The built-in conv net (0.7M parameters, 64x64 images, float32) on a 2-core CPU:
    recorded at 208, 265, 299 and 306 samples/s at 512, 256, 128 and 64, throughput falling
    with the batch; here a step of 80 ms plus 0.383 ms a sample to the power 1.4 (208, 261,
    304 and 306). Memory never limits below the CPU cap (300 MiB plus 2.3 MiB a sample: 983
    MiB at 256, 1575 MiB at 512). Loading is the data-bound benchmark's dataset, 3.7 ms a
    sample on one core, the workers sharing the 2 cores with the step (``load_s=None``: the
    workload's own DataLoader, measured for real)."""
    return SimulatedMachine(
        limit=10**6,
        fixed_s=0.08,
        per_sample_s=0.000383,
        exponent=1.4,
        first_s=0.3,
        new_shape_s=0.1,
        autotune_s=0.0,
        fixed_bytes=300 * MIB,
        per_sample_bytes=int(2.3 * MIB),
        memory_bytes=None,  # torch reads no device memory on a CPU: the host's RAM holds the search
        load_s=0.0037,
        host_cpus=2,
        shares_cpus=True,
        leaves=1,
    )


PRESETS: dict[str, Callable[[], SimulatedMachine]] = {
    "h100-resnet50": h100_resnet50,
    "h100-gpt2": h100_gpt2,
    "h200-gpt2-large-24gib": h200_gpt2_large,
    "h200-gpt2-large-16gib": lambda: h200_gpt2_large(16),
    "cpu-conv": cpu_conv,
}
"""Recorded machines by name: ``benchmarks/results/h100-2026-11-23`` (the two H100 runs),
``benchmarks/results/h200-2026-11-28`` (GPT-2 large under two memory limits) and
``benchmarks/results/cpu_autotune_runs.md`` with ``data_bound_conv.md`` (the CPU)."""


def preset(name: str, **changes: object) -> SimulatedMachine:
    """A fresh ``PRESETS[name]``, with ``changes`` to its fields (``preset("h100-gpt2",
    load_s=None)``: the workload's real DataLoader). ValueError for an unknown name."""
    if name not in PRESETS:
        raise ValueError(f"no simulated machine {name!r}; the presets are {', '.join(PRESETS)}")
    return replace(PRESETS[name](), **changes)  # type: ignore[arg-type]

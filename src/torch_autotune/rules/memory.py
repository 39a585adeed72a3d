"""cuDNN autotuner and determinism, memory format, and the CUDA caching allocator.

Rules catalog C1-C7 (``cudnn.benchmark`` and the deterministic switches), H1-H5
(``channels_last``), J1-J4 and M4 (``expandable_segments``), with surprises S11 and S18. Every
rule yields one finding per setting it owns, every time, so each setting carries its reason.
Environment findings with the value ``None`` are decisions to leave the variable unset.
"""

from __future__ import annotations

from collections.abc import Iterator

from torch_autotune.profile import Mode
from torch_autotune.rules.context import Context, Finding
from torch_autotune.settings import Source

WORKSPACE_CONFIG = ":4096:8"
"""cuBLAS/hipBLAS workspace for deterministic GEMMs (catalog C4, C7): 8 buffers of 4 MiB."""

EXPANDABLE_SEGMENTS = "expandable_segments:True"


# --- cuDNN: benchmark and determinism (C1-C4) ---------------------------------------------------


def _benchmark_off_reason(ctx: Context) -> tuple[str, str] | None:
    """(catalog id, why) the cuDNN autotuner stays off in a fast mode, or None to turn it on."""
    kind = ctx.preferences.model_kind
    if ctx.device != "cuda":
        return "C1", (
            f"the cuDNN autotuner only runs on CUDA/ROCm GPUs and this profile trains on "
            f"'{ctx.device}': nothing to benchmark"
        )
    if kind != "conv":
        return "C3", (
            f"the model is '{kind}', not convolutional: the autotuner only times cuDNN "
            "convolutions, so turning it on gains nothing"
        )
    if not ctx.preferences.fixed_shapes:
        return "C2", (
            "input shapes vary: every new shape would be benchmarked again, which costs more "
            "than the faster kernel saves"
        )
    return None


def cudnn(ctx: Context) -> Iterator[Finding]:
    """C1-C4: cudnn.benchmark for fixed-shape conv nets on a GPU; determinism when asked."""
    if ctx.mode is Mode.REPRODUCIBLE:
        yield Finding(
            "backends.cudnn_benchmark",
            False,
            "C4",
            "reproducible mode: the autotuner picks convolution algorithms by timing them, so two "
            "runs can pick different ones; off (costs the speed of the fastest algorithm)",
        )
        yield Finding(
            "backends.cudnn_deterministic",
            True,
            "C4",
            "reproducible mode: cuDNN convolutions use deterministic algorithms only (slower; "
            "has no effect where no cuDNN runs)",
        )
        yield Finding(
            "backends.deterministic_algorithms",
            True,
            "C4",
            "reproducible mode: torch.use_deterministic_algorithms(True) makes every op with a "
            "nondeterministic kernel use a deterministic one or raise (warn_only=False), "
            "including the flash/efficient attention backward (C5); slower, and an op with no "
            "deterministic kernel stops the run with an error that names it",
        )
        return

    off = _benchmark_off_reason(ctx)
    if off is None:
        yield Finding(
            "backends.cudnn_benchmark",
            True,
            "C1",
            "convolutional model with fixed input shapes on a GPU: cuDNN times the convolution "
            "algorithms for each new input shape once and keeps the fastest (the first steps "
            "are slower; a last batch of another size is benchmarked once more)",
        )
    else:
        rule, why = off
        yield Finding("backends.cudnn_benchmark", False, rule, f"off: {why}")
    yield Finding(
        "backends.cudnn_deterministic",
        False,
        "C4",
        f"{ctx.mode.value} mode does not ask for bit-identical runs, and deterministic "
        "convolutions are slower; choose the reproducible mode to turn it on",
    )
    yield Finding(
        "backends.deterministic_algorithms",
        False,
        "C4",
        f"{ctx.mode.value} mode does not ask for bit-identical runs; deterministic kernels are "
        "slower and some ops raise without one (choose the reproducible mode to turn it on)",
    )


# --- memory format: channels_last (H1-H5, S18) --------------------------------------------------


def _contiguous_reason(ctx: Context) -> tuple[str, str] | None:
    """(catalog id, why) the model stays NCHW, or None when channels_last pays off (H1)."""
    kind = ctx.preferences.model_kind
    if kind != "conv":
        return "H4", (
            f"the model is '{kind}': channels_last only reorders 4-D (NCHW) conv activations"
        )
    if ctx.device == "cpu":
        return "H5", (
            "CPU training: oneDNN supports NHWC but the gain depends on the model; opt in after "
            "measuring"
        )
    if ctx.device == "mps":
        return "H1", "the channels_last gains measured by PyTorch are for NVIDIA Tensor Cores"
    if not ctx.nvidia:
        return "M1", (
            "AMD GPU: the channels_last evidence (H1) is for NVIDIA Tensor Cores; opt in after "
            "measuring on this GPU"
        )
    lacking = sorted({a.name for a in ctx.gpus if a.tensor_cores is not True})
    if lacking:
        return "H2", (
            f"{', '.join(lacking)} has no Tensor Cores, and without them NHWC convolutions run "
            "no faster and in fp32 up to 2.4x slower"
        )
    if ctx.get("precision.autocast") is not True:
        return "H2", (
            "training runs in fp32 (no autocast): NHWC convolutions are only faster in reduced "
            "precision, and in fp32 they measured 1.6-2.4x slower"
        )
    return None


def memory_format(ctx: Context) -> Iterator[Finding]:
    """H1-H5: channels_last for conv nets with AMP on NVIDIA Tensor-Core GPUs, else contiguous.

    Reads ``precision.autocast``, so the precision rule must run first.
    """
    kept = _contiguous_reason(ctx)
    if kept is None:
        names = ", ".join(sorted({a.name for a in ctx.gpus}))
        yield Finding(
            "memory_format",
            "channels_last",
            "H1",
            f"conv model with autocast on {names} (Tensor Cores): NHWC feeds the Tensor Cores "
            "directly, ~20-30% faster for ResNet-class nets; move the model and each input "
            "batch to channels_last. Grouped/depthwise convs (MobileNet, ResNeXt) can be slower "
            "in NHWC (H3): measure, or set contiguous_format",
        )
        return
    rule, why = kept
    yield Finding("memory_format", "contiguous_format", rule, f"contiguous (NCHW): {why}")


# --- allocator and workspace environment (J1-J4, M4, C4, C7) ------------------------------------


def _expandable_segments_blocker(ctx: Context) -> tuple[str, str] | None:
    """(catalog id, why) expandable_segments is left off, or None when it is safe to set."""
    host = ctx.snapshot.host
    torch_version = ctx.snapshot.software.torch_version
    if ctx.device != "cuda":
        return "J1", f"device is '{ctx.device}': there is no CUDA caching allocator to configure"
    if host.os_name == "windows":
        return "J2", (
            "Windows: torch is built without the CUDA driver API there, so expandable_segments "
            "is ignored with a warning"
        )
    if host.os_name != "linux":
        return "J1", f"expandable_segments is only known to work on Linux, not {host.os_name}"
    if host.wsl:
        # Not in the catalog: WSL2's GPU driver refused the VMM calls behind expandable
        # segments (cuMemSetAccess -> CUDA_ERROR_UNKNOWN, pytorch/pytorch#192330, fixed only
        # in the R615 Windows driver), failing the first allocation.
        return "J1", (
            "WSL2: some Windows drivers fail the CUDA virtual-memory calls behind "
            "expandable_segments at the first allocation (pytorch#192330)"
        )
    unified = sorted({a.name for a in ctx.gpus if a.unified_memory})
    if unified:
        return "J4", (
            f"{', '.join(unified)} is an integrated GPU sharing system RAM: on Jetson/Tegra "
            "expandable_segments can fail at allocation time with 'CUDA driver error'"
        )
    if ctx.rocm:
        if ctx.torch_at_least(2, 11):
            return None
        return "J3", (
            f"ROCm with torch {torch_version}: the HIP allocator ignores expandable_segments "
            "before torch 2.11 (M4)"
        )
    if not ctx.nvidia:
        return "J1", "the GPUs are not all NVIDIA or all AMD: no one allocator setting fits"
    if not ctx.torch_at_least(2, 1):
        return "J1", f"expandable_segments needs torch 2.1 or newer, this is {torch_version}"
    return None


def _expandable_segments(ctx: Context) -> Finding:
    setting = "environment.PYTORCH_CUDA_ALLOC_CONF"
    blocker = _expandable_segments_blocker(ctx)
    if blocker is not None:
        rule, why = blocker
        return Finding(setting, None, rule, f"not set: {why}")
    platform = (
        f"ROCm with torch {ctx.snapshot.software.torch_version} (supported from 2.11, M4; the "
        "HIP allocator reads the CUDA variable name too)"
        if ctx.rocm
        else f"Linux, NVIDIA, torch {ctx.snapshot.software.torch_version}"
    )
    why = (
        f"{platform}: the allocator grows segments instead of leaving slivers of unusable "
        "memory when tensor sizes change (batch-size probing, variable batches or sequence "
        "lengths), so more of the GPU is usable. Must be set before the first CUDA allocation; "
        "still marked experimental; combine it with max_split_size_mb only on torch 2.5+ (J5)"
    )
    rule = "M4" if ctx.rocm else "J1"
    measured = ctx.measurements.allocator if ctx.measurements is not None else None
    if measured is None or measured.value != EXPANDABLE_SEGMENTS:
        return Finding(setting, EXPANDABLE_SEGMENTS, rule, why)
    if not measured.measured:  # the rule's, with why it was not measured (probe's record)
        return Finding(setting, EXPANDABLE_SEGMENTS, rule, f"{why}; {measured.reason}")
    if measured.kept:
        return Finding(
            setting, EXPANDABLE_SEGMENTS, rule, f"{why}; {measured.reason}", Source.MEASURED
        )
    return Finding(setting, None, rule, f"not set: {measured.reason}", Source.MEASURED)


def _workspace_config(ctx: Context, *, variable: str, vendor: str, rule: str) -> Finding:
    """CUBLAS/HIPBLAS_WORKSPACE_CONFIG: set in reproducible mode on the matching GPUs."""
    setting = f"environment.{variable}"
    on_vendor = ctx.nvidia if vendor == "NVIDIA" else ctx.rocm
    if ctx.mode is not Mode.REPRODUCIBLE:
        return Finding(
            setting,
            None,
            rule,
            f"not set: {ctx.mode.value} mode does not ask for deterministic GEMMs",
        )
    if not on_vendor:
        return Finding(
            setting, None, rule, f"not set: only {vendor} GPUs read it, and none is trained on"
        )
    library = "cuBLAS" if vendor == "NVIDIA" else "hipBLAS"
    return Finding(
        setting,
        WORKSPACE_CONFIG,
        rule,
        f"reproducible mode on {vendor} GPUs: {library} needs a fixed workspace for "
        f"deterministic GEMMs, else deterministic mode raises on the first matmul. Set before "
        "the first matmul; costs a few MiB of GPU memory per stream (':16:8' uses less but can "
        "be slower)",
    )


def allocator(ctx: Context) -> Iterator[Finding]:
    """J1-J4, M4, C4, C7: allocator and BLAS workspace variables, set before torch starts CUDA."""
    yield _expandable_segments(ctx)
    yield _workspace_config(ctx, variable="CUBLAS_WORKSPACE_CONFIG", vendor="NVIDIA", rule="C4")
    yield _workspace_config(ctx, variable="HIPBLAS_WORKSPACE_CONFIG", vendor="AMD", rule="C7")


def checkpointing(ctx: Context) -> Iterator[Finding]:
    """L2: activation checkpointing, only where the probe measured that it is needed (not even
    the smallest batch trains without it) or faster (it trains a larger batch faster); the
    classes of the blocks it recomputes, where the workload names them."""
    yield Finding(
        "blocks",
        ctx.preferences.blocks,
        "L2",
        "given: the classes the workload names as its blocks, what activation checkpointing"
        " recomputes and FSDP2 shards in place of the repeated blocks found in the model"
        if ctx.preferences.blocks is not None
        else "found in the model: the outermost kind of module that repeats and holds most of"
        " its weights (a decoder's layers), what activation checkpointing recomputes and FSDP2"
        " shards; a workload's blocks name them where that is not right",
        Source.USER if ctx.preferences.blocks is not None else Source.INFERRED,
    )
    measured = ctx.measurements.checkpointing_reason if ctx.measurements is not None else None
    if measured is not None:
        yield Finding("activation_checkpointing", True, "L2", f"on: {measured}", Source.MEASURED)
        return
    note = ctx.measurements.checkpointing_note if ctx.measurements is not None else None
    if note is not None:  # measured and not kept, or why not measured
        source = Source.INFERRED if note.startswith("not measured") else Source.MEASURED
        yield Finding("activation_checkpointing", False, "L2", f"off: {note}", source)
        return
    yield Finding(
        "activation_checkpointing",
        False,
        "L2",
        "off: recomputing each block's forward in backward costs about a third more compute "
        "(Hugging Face measures about 20% slower); it is kept only where the probe measured "
        "that the batch needs it, or that the larger batch it allows trains faster",
    )

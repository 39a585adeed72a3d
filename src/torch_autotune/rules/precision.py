"""Mixed precision (AMP dtype, GradScaler) and TF32 for float32 matmuls.

Rules catalog §A (AMP and dtype), §B (TF32), §M (ROCm), §N (MPS), §P (compute-capability
feature matrix) and §S1-S6, S13, S17 (where the obvious rule is wrong). Every NVIDIA threshold
is a compute capability read from the snapshot, never ``torch.cuda.is_bf16_supported()``, whose
meaning changed across releases (catalog A3, S1). A box with different GPUs gets what its
weakest GPU runs (``Context.weakest_cc``). ROCm GPUs report a gfx-derived pseudo compute
capability that must never meet an NVIDIA threshold (catalog D2, M1, S6), so the ROCm branch
reads the architecture family instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from torch_autotune.hardware import Architecture
from torch_autotune.profile import Mode
from torch_autotune.rules.context import Context, Finding
from torch_autotune.thresholds import BF16_MIN_CC, FP32_PRECISION_API_MIN_TORCH, TF32_MIN_CC

Dtype = Literal["float32", "float16", "bfloat16"]

# Catalog A2, P: fp16 Tensor Cores start with Volta.
TENSOR_CORE_MIN_CC = (7, 0)
# Catalog A5, P: GP100 (Tesla P100, Quadro GP100) has fast fp16 (2x fp32) without Tensor Cores.
P100_CC = (6, 0)
# Catalog N2: MPS bf16 autocast arrived in torch 2.6 (PR #139390) and needs macOS 14.
MPS_BF16_MIN_TORCH = (2, 6)
MPS_BF16_MIN_MACOS = 14
# Catalog M2: ROCm families with bf16 matrix units (MI200 = CDNA2, MI300 = CDNA3, MI350 = CDNA4).
ROCM_BF16_FAMILIES = frozenset({Architecture.CDNA2, Architecture.CDNA3, Architecture.CDNA4})


@dataclass(frozen=True)
class _Plan:
    """A precision choice: the dtype, the catalog id behind it, and why."""

    dtype: Dtype
    rule: str
    detected: str  # what was detected, e.g. "Tesla T4 (cc 7.5)"
    why: str  # the trade-off behind the dtype


def _cc_text(cc: tuple[int, int] | None) -> str:
    return "cc unknown" if cc is None else f"cc {cc[0]}.{cc[1]}"


def _describe_weakest(ctx: Context) -> str:
    """The GPU the decision is made for: the only one, or the weakest of a mixed box."""
    gpus = ctx.gpus
    weakest = min(gpus, key=lambda a: a.compute_capability or (0, 0))
    text = f"{weakest.name} ({_cc_text(weakest.compute_capability)})"
    if len({a.name for a in gpus}) > 1:
        return f"the weakest GPU, {text}"
    return text


# --- AMP: one plan per device kind ----------------------------------------------------------------


def _nvidia_plan(ctx: Context) -> _Plan:
    """Catalog A1-A8: the dtype the weakest NVIDIA GPU runs well."""
    cc = ctx.weakest_cc
    if cc is None:
        unread = ", ".join(a.name for a in ctx.gpus if a.compute_capability is None)
        return _Plan(
            "float32",
            "A3",
            f"{unread} (cc unknown)",
            "the compute capability could not be read, and it alone decides between bf16 (cc "
            "8.0+), fp16 (Tensor Cores, cc 7.x) and fp32; fp32 runs everywhere, only slower "
            "(run 'autotune detect --deep' to read it through torch)",
        )
    detected = _describe_weakest(ctx)
    if cc >= BF16_MIN_CC:
        return _Plan(
            "bfloat16",
            "A1",
            detected,
            "native bf16 Tensor Cores from cc 8.0: bf16 autocast runs matmuls and convolutions "
            "at Tensor Core speed and keeps fp32's exponent range (smallest normal 1.2e-38 vs "
            "fp16's 6.1e-5), so no loss scaling is needed; the cost is 8 mantissa bits, which "
            "training tolerates",
        )
    if cc >= TENSOR_CORE_MIN_CC:
        return _turing_volta_plan(ctx, detected)
    return _pre_volta_plan(ctx, cc, detected)


def _turing_volta_plan(ctx: Context, detected: str) -> _Plan:
    """Catalog A2, A7: fp16 on Tensor Cores, except on the Turing parts that have none."""
    if not ctx.all_tensor_cores:
        lacking = [a.name for a in ctx.gpus if a.tensor_cores is not True]
        return _Plan(
            "float32",
            "A7",
            detected,
            f"no Tensor Cores on {', '.join(sorted(set(lacking)))} (TU116/TU117 parts such as "
            "the GTX 16xx are cc 7.5 without them, or they could not be confirmed): fp16 "
            "brings little speed there and NaNs have been reported (PyTorch #58123), so training "
            "stays in fp32",
        )
    return _Plan(
        "float16",
        "A2",
        detected,
        "fp16 Tensor Cores from cc 7.0 (up to 3x faster training, PyTorch tuning guide); bf16 "
        "is only emulated below cc 8.0, so fp16 it is, with a GradScaler so that small "
        "gradients do not underflow to zero",
    )


def _pre_volta_plan(ctx: Context, cc: tuple[int, int], detected: str) -> _Plan:
    """Catalog A4-A6, A8: no Tensor Cores below cc 7.0, so fp32 unless the user opts in."""
    if all(a.compute_capability == P100_CC for a in ctx.gpus):
        if ctx.preferences.allow_p100_fp16:
            return _Plan(
                "float16",
                "A5",
                detected,
                "you opted in (allow_p100_fp16): GP100 runs fp16 at 2x its fp32 rate, without "
                "Tensor Cores; NVIDIA warns its numerical stability is 'much less reliable', so "
                "fp16 runs with a GradScaler: benchmark it and check the loss curve",
            )
        return _Plan(
            "float32",
            "A5",
            detected,
            "GP100 runs fp16 at 2x fp32 but has no Tensor Cores, and NVIDIA calls fp16 on it "
            "'much less reliable' numerically: fp32 by default (set allow_p100_fp16 to try fp16 "
            "with a GradScaler after a benchmark)",
        )
    if cc == (6, 1):
        return _Plan(
            "float32",
            "A4",
            detected,
            "cc 6.1 Pascal (GTX 10xx, Tesla P40/P4) runs fp16 arithmetic at 1/64 of its fp32 "
            "rate and has no Tensor Cores: AMP would make training slower (P40 reports ~4x), "
            "so training stays in fp32",
        )
    if cc in ((6, 2), (5, 3)):
        return _Plan(
            "float32",
            "A6",
            detected,
            "this Jetson has fast fp16 but no Tensor Cores, so AMP gains only memory bandwidth: "
            "fp32 by default",
        )
    return _Plan(
        "float32",
        "A8",
        detected,
        "no Tensor Cores below cc 7.0, and AMP needs them to pay off: training stays in fp32",
    )


def _rocm_plan(ctx: Context) -> _Plan:
    """Catalog M2: bf16 on MI200/MI300-class Instinct GPUs, fp16 + GradScaler elsewhere."""
    families = {a.architecture for a in ctx.gpus}
    names = ", ".join(sorted({f"{a.name} ({a.architecture.value})" for a in ctx.gpus}))
    if families <= ROCM_BF16_FAMILIES:
        return _Plan(
            "bfloat16",
            "M2",
            names,
            "AMD CDNA2/CDNA3/CDNA4 (MI200/MI300 class) have bf16 matrix cores: bf16 autocast "
            "without loss scaling; NVIDIA compute-capability rules do not apply on ROCm",
        )
    return _Plan(
        "float16",
        "M2",
        names,
        "this AMD architecture is not known to have fast bf16 matrix units (only CDNA2 and "
        "newer Instinct GPUs are), so AMP uses fp16 with a GradScaler; ROCm accepts bf16 on "
        "every GPU, but that says nothing about its speed",
    )


def _macos_major(ctx: Context) -> int | None:
    """macOS major version from host.os_version ('14.5' -> 14), None when unknown."""
    version = ctx.snapshot.host.os_version
    if ctx.snapshot.host.os_name != "darwin" or not version:
        return None
    head = version.split(".", 1)[0]
    return int(head) if head.isdigit() else None


def _mps_plan(ctx: Context) -> _Plan:
    """Catalog N1-N3, S17, U6: bf16 autocast only where torch and macOS both support it."""
    torch_version = ctx.snapshot.software.torch_version
    macos = _macos_major(ctx)
    os_version = ctx.snapshot.host.os_version or "unknown"
    detected = f"Apple GPU (MPS), torch {torch_version}, macOS {os_version}"
    if ctx.torch_at_least(*MPS_BF16_MIN_TORCH) and (macos or 0) >= MPS_BF16_MIN_MACOS:
        return _Plan(
            "bfloat16",
            "N2",
            detected,
            "bf16 autocast on MPS needs torch 2.6+ and macOS 14+, both present; no GradScaler. "
            "MPS autocast still misses ops (SDPA under autocast failed in PyTorch #141774; "
            "ConvTranspose3d has no bf16, catalog U6): if the model fails, set "
            "precision.dtype to float32",
        )
    if not ctx.torch_at_least(2, 5):
        why = "MPS has no autocast before torch 2.5 (PR #99272): fp32"
        return _Plan("float32", "N1", detected, why)
    return _Plan(
        "float32",
        "N3",
        detected,
        "bf16 autocast on MPS needs torch 2.6+ on macOS 14+, not both present; fp16 autocast "
        "would need a GradScaler, which MPS only has from torch 2.8 and which remains "
        "limited, so training stays in fp32",
    )


def _cpu_plan(_ctx: Context) -> _Plan:
    """Catalog A12: CPU AMP pays only with AVX512_BF16/AMX, which detection does not read."""
    return _Plan(
        "float32",
        "A12",
        "training on the CPU",
        "bf16 autocast on a CPU is faster only with AVX512_BF16 or AMX, which is not detected, "
        "and slower without them: AMP off by default",
    )


def _plan(ctx: Context) -> _Plan:
    if ctx.device == "mps":
        return _mps_plan(ctx)
    if ctx.device != "cuda" or not ctx.gpus:
        return _cpu_plan(ctx)
    if ctx.nvidia:
        return _nvidia_plan(ctx)
    if ctx.rocm:
        return _rocm_plan(ctx)
    names = ", ".join(sorted({a.name for a in ctx.gpus}))
    return _Plan(
        "float32",
        "M1",
        names,
        "NVIDIA and AMD GPUs together: no precision rule covers both, so training stays in fp32",
    )


def precision(ctx: Context) -> Iterator[Finding]:
    """A1-A12, M2, N1-N3: autocast on or off, its dtype, and whether a GradScaler is needed."""
    plan = _plan(ctx)
    autocast = plan.dtype != "float32"
    # fp16 needs loss scaling on every device we enable it on (catalog A2, A9, S13); bf16 never
    # does, and GradScaler fails on bf16 gradients (catalog A1).
    scaler = plan.dtype == "float16"
    yield Finding("precision.dtype", plan.dtype, plan.rule, f"{plan.detected}: {plan.why}")
    if autocast:
        autocast_reason = f"{plan.detected}: autocast on with dtype={plan.dtype} passed explicitly"
        if ctx.device == "cuda":
            autocast_reason += " (a bare torch.autocast('cuda') picks float16, catalog A9)"
    else:
        autocast_reason = f"{plan.detected}: autocast off, training runs in float32"
    yield Finding("precision.autocast", autocast, plan.rule, autocast_reason)
    yield Finding("precision.grad_scaler", scaler, plan.rule, _scaler_reason(plan))


def _scaler_reason(plan: _Plan) -> str:
    if plan.dtype == "float16":
        return (
            f"{plan.detected}: GradScaler on: fp16's smallest normal is 6.1e-5, so small "
            "gradients underflow to zero without loss scaling"
        )
    if plan.dtype == "bfloat16":
        return (
            f"{plan.detected}: no GradScaler: bf16 has fp32's exponent range, so gradients do "
            "not underflow, and GradScaler fails on bf16 gradients"
        )
    return f"{plan.detected}: no GradScaler: nothing to scale in float32"


# --- TF32 -----------------------------------------------------------------------------------------


def _tf32_api(ctx: Context) -> Literal["allow_tf32", "fp32_precision"]:
    """Catalog B1, B2, S5: the one TF32 API the installed torch wants (never both)."""
    return "fp32_precision" if ctx.torch_at_least(*FP32_PRECISION_API_MIN_TORCH) else "allow_tf32"


_API_TEXT = {
    "allow_tf32": "torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32 "
    "(torch < 2.9)",
    "fp32_precision": "torch.backends.*.fp32_precision (torch 2.9+; the old allow_tf32 flags "
    "must not be mixed in, that raises)",
}


def _no_tf32(ctx: Context) -> tuple[str, str] | None:
    """Why TF32 cannot be set here (catalog id, reason), or None when it can."""
    if ctx.device in ("cpu", "mps") or not ctx.gpus:
        return "B8", f"training on {ctx.device.upper()}: there is no TF32, nothing to set"
    if not ctx.nvidia:
        return "B7", (
            "AMD GPU on ROCm: PyTorch's HIP docs say TF32 is not supported on ROCm (hipBLASLt "
            "TF32 is an opt-in, version-dependent experiment), so nothing is set"
        )
    cc = ctx.weakest_cc
    detected = _describe_weakest(ctx)
    if cc is None:
        return "B5", (
            f"{detected}: the compute capability could not be read, and TF32 exists only "
            "from cc 8.0, so nothing is set"
        )
    if cc < TF32_MIN_CC:
        return "B5", (
            f"{detected}: TF32 Tensor Cores exist only from cc 8.0 (Ampere); the flags would "
            "be no-ops, so nothing is set"
        )
    if ctx.torch is None:
        return "B2", (
            f"{detected}: the torch version could not be read, so neither TF32 API can be "
            "chosen (allow_tf32 before 2.9, fp32_precision from 2.9; mixing them raises)"
        )
    return None


def tf32(ctx: Context) -> Iterator[Finding]:
    """B1-B8: TF32 for float32 matmuls and convolutions, through exactly one API."""
    refusal = _no_tf32(ctx)
    if refusal is not None:
        rule, reason = refusal
        yield Finding("matmul.tf32", False, rule, reason)
        yield Finding("matmul.api", None, rule, reason)
        return
    api = _tf32_api(ctx)
    detected = _describe_weakest(ctx)
    if ctx.mode is Mode.REPRODUCIBLE:
        # Catalog S4: cudnn.allow_tf32 defaults to True, so convolutions already use TF32 on
        # Ampere+; strict fp32 has to switch it off explicitly, which is why the API is set.
        reason = (
            f"{detected}, reproducible mode: TF32 off, set explicitly to IEEE fp32 through "
            f"{_API_TEXT[api]}, because cuDNN convolutions use TF32 by default; fp32 matmuls "
            "keep a relative error near 4e-5 instead of TF32's ~2e-3, at ~7x the time on A100"
        )
        yield Finding("matmul.tf32", False, "B6", reason)
        yield Finding("matmul.api", api, "B6", reason)
        return
    rule = "B2" if api == "fp32_precision" else "B1"
    reason = (
        f"{detected}: TF32 on through {_API_TEXT[api]}: float32 matmuls and convolutions (work "
        "outside autocast, or an fp32 model) run on Tensor Cores, ~7x faster on A100 (10240^2 "
        "matmul 0.016 s vs 0.11 s), with fp32's range but a relative error of ~2e-3 instead "
        "of ~4e-5; the reproducible mode turns it off"
    )
    yield Finding("matmul.tf32", True, rule, reason)
    yield Finding("matmul.api", api, rule, reason)

"""torch.compile: whether it can run on this machine (catalog D.1) and in which mode (D.2).

Every availability gate of catalog §D.1 must pass, else compile is off and the reason names the
gate that failed: torch 2.0+ (D1), a CPython build whose version the installed torch compiles
for (D2, §Q.1, S20), a GIL build (D3), Windows support (D4, D6, S19), Triton's compute-capability
floor (D7), the fp16-only rule for cc 7.x (D8), MPS (D9), CPU (D10) and ROCm (D11). When it is
on, the mode is always ``"default"`` (D12); ``max-autotune`` is never chosen, and on GPUs below
68 SMs it would not even autotune GEMMs (D13, S9). The balanced and reproducible modes leave
compile off. Runs after ``precision``: the cc 7.x gate reads the decided dtype.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

from torch_autotune.hardware import Accelerator, Vendor
from torch_autotune.profile import Mode, Source
from torch_autotune.rules.context import Context, Finding, Measurements
from torch_autotune.thresholds import COMPILE_MIN_TORCH, FULL_TRITON_CC, MAX_AUTOTUNE_MIN_SMS

# Catalog D7: "Triton only supports devices of CUDA Capability >= 7.0".
TRITON_MIN_CC = (7, 0)

# Catalog D2 and §Q.1: the newest Python each torch release compiles for, newest release first.
# Each row is backed by the error the release before it raised on that Python:
_PYTHON_CEILING: tuple[tuple[tuple[int, int], tuple[int, int]], ...] = (
    # 2.6 release: "torch.compile can now be used with Python 3.13"; 2.9 still refuses 3.14
    # ("torch.compile is not supported on Python 3.14+").
    ((2, 6), (3, 13)),
    # 2.4 release adds 3.12; 2.5 on 3.13: "Dynamo is not supported on Python 3.13+".
    ((2, 4), (3, 12)),
    # 2.1 compiles on 3.11; 2.2/2.3 on 3.12: "Dynamo is not supported on Python 3.12+".
    ((2, 1), (3, 11)),
    # 2.0.1 on 3.11: "Python 3.11+ not yet supported for torch.compile".
    ((2, 0), (3, 10)),
)
# Catalog D2 (U), U1: torch 2.10 is expected to compile on 3.14 (RFC #169875), unconfirmed.
_UNVERIFIED_PYTHON = ((2, 10), (3, 14))

Off = tuple[str, str]
"""Why compile is off: (catalog id, reason)."""

Gate = Callable[[Context], Off | None]


def _python(ctx: Context) -> tuple[int, int] | None:
    """'3.11.13' -> (3, 11); None when unparsable."""
    found = re.match(r"(\d+)\.(\d+)", ctx.snapshot.software.python_version)
    return (int(found[1]), int(found[2])) if found else None


def _gpu_text(gpu: Accelerator) -> str:
    """'Tesla T4 (cc 7.5)'; ROCm pseudo compute capabilities are left out (catalog S6)."""
    cc = gpu.compute_capability
    if gpu.vendor is not Vendor.NVIDIA or cc is None:
        return gpu.name
    return f"{gpu.name} (cc {cc[0]}.{cc[1]})"


def _torch_text(ctx: Context) -> str:
    return f"torch {ctx.snapshot.software.torch_version}"


# --- D.1 gates, in the order they are checked -----------------------------------------------------


def _torch_gate(ctx: Context) -> Off | None:
    """D1: torch.compile arrived in torch 2.0."""
    if ctx.torch is None:
        return "D1", "the torch version could not be read, and torch.compile needs torch 2.0+"
    if not ctx.torch_at_least(*COMPILE_MIN_TORCH):
        return "D1", f"{_torch_text(ctx)} has no torch.compile: it arrived in torch 2.0"
    return None


def _python_ceiling(release: tuple[int, int]) -> tuple[int, int]:
    """Newest verified Python for torch.compile in a torch release (catalog D2)."""
    for first, ceiling in _PYTHON_CEILING:
        if release >= first:
            return ceiling
    return (0, 0)  # unreachable after the D1 gate


def _python_gate(ctx: Context) -> Off | None:
    """D2, D3: a CPython GIL build, on a Python version the installed torch compiles for."""
    software = ctx.snapshot.software
    if software.python_implementation != "CPython":
        return "D2", (
            f"{software.python_implementation} {software.python_version}: TorchDynamo works "
            "only on CPython"
        )
    if not software.python_gil_enabled:
        return "D3", (
            f"free-threaded Python {software.python_version} (GIL off): Dynamo support for "
            "free-threaded builds is recent and experimental, so compile stays off"
        )
    python, release = _python(ctx), ctx.torch
    if python is None or release is None:
        return "D2", f"Python version {software.python_version!r} could not be read"
    ceiling = _python_ceiling(release)
    if python <= ceiling:
        return None
    py, top = f"{python[0]}.{python[1]}", f"{ceiling[0]}.{ceiling[1]}"
    if release >= _UNVERIFIED_PYTHON[0] and python == _UNVERIFIED_PYTHON[1]:
        # Catalog U1 suggests "try compile, fall back to eager". A profile cannot fall back at
        # run time, so the conservative reading applies: off until a release note confirms it.
        return "D2", (
            f"{_torch_text(ctx)} on Python {py}: compile support for Python 3.14 is expected "
            f"from torch 2.10 but not confirmed (catalog U1), and verified only up to {top}; "
            "off by default, enable it yourself to try (it fails with 'not supported on "
            "Python 3.14+' where missing)"
        )
    return "D2", (
        f"{_torch_text(ctx)} compiles only up to Python {top}, this is Python {py} (Dynamo "
        "raises 'not supported on Python ...'); a newer torch supports it"
    )


def _windows_gate(ctx: Context) -> Off | None:
    """D4, D6: Windows Inductor from torch 2.5; on a GPU only with the triton-windows wheel."""
    if ctx.snapshot.host.os_name != "windows":
        return None
    if not ctx.torch_at_least(2, 5):
        return "D4", (
            f"Windows with {_torch_text(ctx)}: torch.compile is not supported on Windows "
            "before torch 2.5 ('Windows not yet supported for torch.compile')"
        )
    if ctx.device != "cuda":
        return None
    if not ctx.snapshot.software.triton_available:
        return "D6", (
            f"Windows with {_torch_text(ctx)} and no Triton: PyTorch's Windows wheels ship no "
            "Triton, so compiling for the GPU fails with 'Cannot find a working triton "
            "installation'; install the triton-windows build matching torch (and MSVC) to use it"
        )
    if not ctx.torch_at_least(2, 6):
        return "D6", (
            f"Windows with {_torch_text(ctx)}: the first triton-windows release (3.2) pairs with "
            "torch 2.6, so there is no working Triton for this torch"
        )
    return None


def _nvidia_gate(ctx: Context) -> Off | None:
    """D7, D8: Triton's cc floor, and fp16 only on cc 7.x."""
    cc = ctx.weakest_cc
    if cc is None:
        return "D7", (
            "the GPU's compute capability could not be read, and Triton needs cc 7.0 or newer"
        )
    gpu = _gpu_text(min(ctx.gpus, key=lambda a: a.compute_capability or (0, 0)))
    if cc < TRITON_MIN_CC:
        return "D7", (
            f"{gpu}: Triton, Inductor's GPU compiler, only supports cc 7.0 and newer ('too old "
            "to be supported by the triton GPU compiler'); training runs eagerly"
        )
    dtype = ctx.get("precision.dtype")
    if cc < FULL_TRITON_CC and dtype != "float16":
        return "D8", (
            f"{gpu} with {dtype}: below cc 8.0 Triton is not officially supported and bf16 "
            "cannot compile, so compile is used only with fp16 AMP, the combination known to "
            "work there"
        )
    return None


def _device_gate(ctx: Context) -> Off | None:
    """D6-D11: what the chosen device needs from the compiler stack."""
    if ctx.device == "mps":
        if not ctx.torch_at_least(2, 8):
            return "D9", (
                f"Apple GPU with {_torch_text(ctx)}: torch.compile for MPS (MPSInductor) "
                "arrived in torch 2.8; earlier releases fail with 'Device mps not supported'"
            )
        return "D9", (
            f"Apple GPU with {_torch_text(ctx)}: MPSInductor (torch 2.8+, macOS 14+) is new, "
            "so compile stays an opt-in you enable yourself"
        )
    if ctx.device != "cuda" or not ctx.gpus:
        compiler = "MSVC (cl.exe)" if ctx.snapshot.host.os_name == "windows" else "g++ or clang"
        return "D10", (
            f"on the CPU torch.compile needs a C++ compiler ({compiler}) and the Python "
            "development headers, which detection does not check: off by default, enable it "
            "yourself if they are installed"
        )
    if not ctx.snapshot.software.triton_available:
        return "D6", (
            "no Triton installed: Inductor generates GPU kernels with Triton, and compiling "
            "fails with 'Cannot find a working triton installation' (install the triton "
            "package matching torch)"
        )
    if ctx.nvidia:
        return _nvidia_gate(ctx)
    if ctx.rocm:
        return None  # D11: the ROCm build of torch ships a ROCm Triton
    return "D11", "NVIDIA and AMD GPUs together: one compiled model cannot serve both"


def _mode_gate(ctx: Context) -> Off | None:
    """Profile modes: only the speed mode pays torch.compile's start-up cost."""
    if ctx.mode is Mode.BALANCED:
        return "D12", (
            "balanced: no compile start-up cost (compiling takes tens of seconds to minutes, "
            "plus recompiles on new shapes); choose the speed mode to compile"
        )
    if ctx.mode is Mode.REPRODUCIBLE:
        return "D12", (
            "reproducible: compile off, so results do not depend on generated kernels that "
            "change with the compiler version; eager kernels are the ones "
            "torch.use_deterministic_algorithms governs"
        )
    return None


_GATES: tuple[Gate, ...] = (_torch_gate, _python_gate, _windows_gate, _device_gate, _mode_gate)


# --- the rule -------------------------------------------------------------------------------------


def _enabled_rule(ctx: Context) -> str:
    """Catalog id that allows compile here: ROCm (D11), cc 7.x (D8), else default mode (D12)."""
    if ctx.rocm:
        return "D11"
    cc = ctx.weakest_cc
    if ctx.nvidia and cc is not None and cc < FULL_TRITON_CC:
        return "D8"
    return "D12"


def _enabled_reason(ctx: Context) -> str:
    software = ctx.snapshot.software
    python = f"Python {software.python_version}"
    triton = f"Triton {software.triton_version or '(version unknown)'}"
    gpus = ", ".join(sorted({_gpu_text(a) for a in ctx.gpus}))
    reason = (
        f"{gpus}, {_torch_text(ctx)}, {python}, {triton}: every torch.compile gate passes; "
        "compiled training usually runs faster after a one-off compile of tens of seconds to "
        "minutes per shape"
    )
    if _enabled_rule(ctx) == "D8":
        reason += (
            "; below cc 8.0 the gain comes mostly from fusing pointwise ops (Triton's tl.dot "
            "uses no Tensor Cores there), so keep fp16"
        )
    if ctx.snapshot.host.os_name == "windows":
        reason += "; on Windows triton-windows also needs MSVC (cl.exe) on PATH"
    return reason


def _mode_finding(ctx: Context) -> Finding:
    """D12, D13: 'default' always; say why max-autotune is not used."""
    sms = ctx.fewest_sms
    if sms is not None and sms < MAX_AUTOTUNE_MIN_SMS:
        small = min(ctx.gpus, key=lambda a: a.sm_count or MAX_AUTOTUNE_MIN_SMS)
        return Finding(
            "compile.mode",
            "default",
            "D13",
            f"'default': max-autotune is never used here: {small.name} has {sms} SMs, below "
            f"the {MAX_AUTOTUNE_MIN_SMS} Inductor's is_big_gpu() needs for GEMM autotuning "
            "('Not enough SMs to use max_autotune_gemm mode'), so it would only compile longer",
        )
    return Finding(
        "compile.mode",
        "default",
        "D12",
        "'default', a good balance between performance and overhead: max-autotune benchmarks "
        "kernels, compiles much longer and turns on CUDA graphs (more memory); try it yourself "
        "for long runs with fixed shapes",
    )


def compile_settings(ctx: Context) -> Iterator[Finding]:
    """D1-D13: torch.compile on or off, and its mode (None when off); L2: its activation
    memory budget."""
    for gate in _GATES:
        off = gate(ctx)
        if off is not None:
            rule, reason = off
            reason = f"torch.compile off: {reason}"
            yield Finding("compile.enabled", False, rule, reason)
            yield Finding("compile.mode", None, rule, reason)
            yield Finding("compile.memory_budget", None, "L2", _NO_COMPILE)
            return
    measured = ctx.measurements
    if measured is not None and measured.compile_enabled is not None:
        reason = measured.compile_reason or "measured on this machine"
        if not measured.compile_enabled:
            yield Finding("compile.enabled", False, "M3", reason, Source.MEASURED)
            yield Finding("compile.mode", None, "M3", reason, Source.MEASURED)
            yield Finding("compile.memory_budget", None, "L2", _NO_COMPILE, Source.MEASURED)
            return
        yield Finding("compile.enabled", True, "M3", reason, Source.MEASURED)
        yield _mode_finding(ctx)
        yield _memory_budget(measured)
        return
    reason = _enabled_reason(ctx)
    if measured is not None and measured.compile_reason:
        reason += f"; not measured: {measured.compile_reason}"
    yield Finding("compile.enabled", True, _enabled_rule(ctx), reason)
    yield _mode_finding(ctx)
    yield _memory_budget(measured)


_NO_COMPILE = "default: only compiled graphs read the activation memory budget"

_BUDGET_DEFAULT = (
    "default (torch's, 1.0: the compiled graphs save what the fastest partition saves): a lower "
    "budget recomputes part of it in backward, so it is set only where the probe measured that "
    "the larger batch it allows trains faster"
)


def _memory_budget(measured: Measurements | None) -> Finding:
    """L2 inside compiled graphs: the activation memory budget the probe kept, else torch's
    default, with why it was not measured or not kept (``probe.compile_budget``)."""
    setting = "compile.memory_budget"
    if measured is None or measured.memory_budget_reason is None:
        return Finding(setting, None, "L2", _BUDGET_DEFAULT)
    why = measured.memory_budget_reason
    if measured.memory_budget is not None:
        kept = f"{measured.memory_budget:g}: {why}"
        return Finding(setting, measured.memory_budget, "L2", kept, Source.MEASURED)
    source = Source.INFERRED if why.startswith("not measured") else Source.MEASURED
    return Finding(setting, None, "L2", f"default: {why}", source)

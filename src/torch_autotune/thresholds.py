"""Hardware and torch thresholds that both the rules and the profile's invariants read.

Each is written once, here, with the rules-catalog entry behind it: a rule decides with it, and
an invariant refuses a hand-edited profile that crosses it. Pure data: imports nothing.
"""

from __future__ import annotations

BF16_MIN_CC = (8, 0)
"""Catalog A1, D12, P: native bf16 Tensor Cores start at sm_80 (Ampere)."""

TF32_MIN_CC = (8, 0)
"""Catalog B1, B5, P: TF32 Tensor Cores start at sm_80 (Ampere); below, the flags are no-ops."""

FULL_TRITON_CC = (8, 0)
"""Catalog D8, P: below cc 8.0 bf16 cannot compile and tl.dot uses no Tensor Cores."""

MAX_AUTOTUNE_MIN_SMS = 68
"""Catalog D13: Inductor's is_big_gpu(): ``min_sms = 16 if device.type == "xpu" else 68``."""

COMPILE_MIN_TORCH = (2, 0)
"""Catalog D1: torch.compile exists from torch 2.0."""

MEMORY_BUDGET_MIN_TORCH = (2, 4)
"""torch._functorch.config.activation_memory_budget, the partitioner's memory budget, arrived in
torch 2.4 (PyTorch blog, "Activation checkpointing techniques in torch.compile"): setting it on
an older torch raises."""

FP32_PRECISION_API_MIN_TORCH = (2, 9)
"""Catalog B2, Q: torch 2.9 introduced torch.backends.*.fp32_precision (mixing it with the old
allow_tf32 flags raises)."""

BASELINE_WORKERS_PER_CPU = 4
"""The most DataLoader workers a bench baseline or ``autotune --workers`` may ask for, per usable
CPU of the machine that runs it. torch's DataLoader already warns above one worker per CPU of
the process's affinity mask (``_check_worker_number_rationality``); a loader that waits on
storage or the network can use a few per CPU, so the user's own count may go past one. Beyond
four every worker is a process holding a copy of the dataset and its prefetched batches with no
CPU to run on, and at thousands the bench hung starting them."""

BASELINE_THREADS_PER_CPU = 1
"""The most CPU (intra-op) threads a bench baseline may ask for, per usable CPU. Unlike a worker,
a compute thread never waits on storage: a thread beyond one per CPU only takes turns with the
others on it, the oversubscription that slows torch's CPU kernels down, and a baseline slowed
so would flatter the profile it is held against. torch's own default (no ``cpu_threads``) is
left alone: it is what the user's script gets."""

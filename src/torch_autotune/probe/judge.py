"""One A/B judgement: a variant's fastest steady point against the base's, with its numbers.
No torch.

A variant is kept only when its steady point beats the base's beyond noise (the larger of
``NOISE`` and either point's own spread); a noisy point is not trusted either way. The
judgement states the speedup, both rates and batches, the one-off cost the variant paid, and
the training time after which that cost has paid for itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch_autotune.probe.variants import Variant
from torch_autotune.profile import ThroughputRecord

NOISE = 0.03  # a variant must be at least this much faster (and beyond the points' spread)


@dataclass(frozen=True)
class Judgement:
    """A variant measured against the base: kept or not, why, and the numbers."""

    kept: bool
    reason: str
    batch_size: int  # the variant's point
    base_samples_per_s: float
    samples_per_s: float
    paid_s: float  # the one-off cost the variant paid (its first step's warm-up)
    payoff_minutes: float | None


def payoff_minutes(paid_s: float, base: float, faster: float) -> float | None:
    """Minutes of training after which a one-off cost has paid for itself (None: never).

    The base makes ``base * t`` samples in ``t`` seconds, the variant ``faster * (t - C)``:
    they are equal at ``t = C * faster / (faster - base)``.
    """
    if faster <= base:
        return None
    return paid_s * faster / (faster - base) / 60


def minutes_text(minutes: float) -> str:
    return f"{minutes * 60:.0f} s" if minutes < 1 else f"{minutes:.1f} minutes"


def judge(
    variant: Variant, base: ThroughputRecord, point: ThroughputRecord, paid_s: float
) -> Judgement:
    """Keep ``variant`` only when its steady ``point`` beats the base's ``base`` point beyond
    noise, and say so with the numbers."""
    speedup = point.samples_per_s / base.samples_per_s
    noise = max(NOISE, point.relative_spread, base.relative_spread)
    kept = point.steady and speedup > 1 + noise
    training = variant.costs_training  # else only the probe paid it: no payoff to wait for
    minutes = payoff_minutes(paid_s, base.samples_per_s, point.samples_per_s) if training else None
    numbers = (
        f"{speedup:.2f}x ({point.samples_per_s:,.0f} samples/s {variant.name} at batch "
        f"{point.batch_size} against {base.samples_per_s:,.0f} {base.variant} at batch "
        f"{base.batch_size})" + (f", {paid_s:.0f} s {variant.paid_for}" if training else "")
    )
    if kept:
        reason = f"{variant.label} measured faster: {numbers}"
        if minutes is not None:
            reason += f"; it pays off after {minutes_text(minutes)} of training"
    elif not point.steady:
        reason = (
            f"{variant.label} off: the {variant.name} point stayed noisy, so {numbers} is not "
            "trusted"
        )
    else:
        reason = (
            f"{variant.label} off: measured {numbers}, not faster beyond the {noise:.0%} noise"
            + (f"; {base.variant} training avoids {variant.warmup_noun}" if training else "")
        )
    return Judgement(
        kept=kept,
        reason=reason,
        batch_size=point.batch_size,
        base_samples_per_s=base.samples_per_s,
        samples_per_s=point.samples_per_s,
        paid_s=paid_s,
        payoff_minutes=None if minutes is None else round(minutes, 2),
    )

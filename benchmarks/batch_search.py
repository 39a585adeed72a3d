"""Trials and time of the memory-guided batch search against doubling-then-bisect.

Both strategies search the same simulated memory curves (families below, 300 seeded curves
each). A trial's simulated cost is 0.5 s plus 20 ms per sample (compile, warm-up and a few
steps; a trial that runs out of memory costs as much as one that fits). Both must return the
exact limit on every curve. Prints a table; writes benchmarks/results/batch_search.json.

    python benchmarks/batch_search.py [--curves 300]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "probe"))

from curves import MemoryCurve  # the test suite's simulated curves

from torch_autotune.probe.search import (
    SearchResult,
    doubling_then_bisect,
    find_max_batch_size,
)

MIB = 1 << 20
CAP = 1 << 16


def _linear(rng: random.Random) -> MemoryCurve:
    per = rng.randint(1, 64) * MIB
    return MemoryCurve(rng.randint(0, 2 << 30), per, rng.randint(4 << 30, 80 << 30))


FAMILIES: dict[str, Callable[[random.Random], MemoryCurve]] = {
    "linear": _linear,
    "noisy readings (1%)": lambda r: MemoryCurve(**{**_linear(r).__dict__, "noise": 0.01}),
    "large fixed overhead": lambda r: MemoryCurve(
        r.randint(20 << 30, 60 << 30), r.randint(1, 32) * MIB, 79 << 30
    ),
    "fragmentation steps": lambda r: MemoryCurve(
        **{
            **_linear(r).__dict__,
            "step_bytes": r.choice([8, 64, 256]) * MIB,
            "step_every": r.randint(4, 64),
        }
    ),
    "limit of 1": lambda r: MemoryCurve(1 << 30, 512 * MIB, (1 << 30) + 700 * MIB),
    "limit above the cap": lambda r: MemoryCurve(0, 1024, 80 << 30),
}


def _cost(result: SearchResult) -> float:
    return sum(0.5 + 0.02 * t.batch_size for t in result.trials)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--curves", type=int, default=300)
    parser.add_argument("--output", type=Path, default=Path("benchmarks/results/batch_search.json"))
    args = parser.parse_args()

    rows = []
    exact = True
    for family, make in FAMILIES.items():
        rng = random.Random(family)
        ours_trials, base_trials, ours_cost, base_cost = [], [], [], []
        for seed in range(args.curves):
            curve = make(rng)
            curve = MemoryCurve(**{**curve.__dict__, "seed": seed})
            expected = curve.limit(CAP) or None
            ours = find_max_batch_size(curve, cap=CAP, memory_limit_bytes=curve.limit_bytes)
            base = doubling_then_bisect(curve, cap=CAP)
            exact &= ours.max_batch_size == expected == base.max_batch_size
            ours_trials.append(ours.trial_count)
            base_trials.append(base.trial_count)
            ours_cost.append(_cost(ours))
            base_cost.append(_cost(base))
        rows.append(
            {
                "family": family,
                "curves": args.curves,
                "ours_mean_trials": round(statistics.mean(ours_trials), 2),
                "ours_max_trials": max(ours_trials),
                "doubling_mean_trials": round(statistics.mean(base_trials), 2),
                "doubling_max_trials": max(base_trials),
                "ours_mean_time_s": round(statistics.mean(ours_cost), 1),
                "doubling_mean_time_s": round(statistics.mean(base_cost), 1),
            }
        )
    header = f"{'curve family':22} {'trials ours':>12} {'doubling':>9} {'max ours':>9} "
    header += f"{'max dbl':>8} {'time ours s':>12} {'doubling s':>11}"
    print(header)
    for r in rows:
        print(
            f"{r['family']:22} {r['ours_mean_trials']:12.1f} {r['doubling_mean_trials']:9.1f} "
            f"{r['ours_max_trials']:9d} {r['doubling_max_trials']:8d} "
            f"{r['ours_mean_time_s']:12.1f} {r['doubling_mean_time_s']:11.1f}"
        )
    print(f"exact limit on every curve, both strategies: {exact}")
    result = {
        "benchmark": "batch_search",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "cap": CAP,
        "trial_cost_model_s": "0.5 + 0.02 * batch_size",
        "rows": rows,
        "exact": exact,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())

"""Objects in hand without a dataset, on this CPU: the tuned profile against threads by hand.

A model, an optimizer and an example batch (``tune(model=..., optimizer=...,
example_batch=...)``) have no DataLoader, so the probe measures torch's CPU threads on the
workload's own batch (``probe.own_threads``) and, where fewer threads win, the batch at them.
For each model of ``--models`` (``tiny``: an MLP of 6.9k parameters on 32 features, where a
thread pool's synchronisation outweighs the work; ``wide``: an MLP of 1.3M parameters on 256,
where it does not):

1. **Tune** with the real probe (``--budget`` seconds, balanced mode).
2. **By hand**, in the same run: the bench's loop on the example batch (no DataLoader), at
   torch's default threads and each halving down to 1, at the profile's batch and at the
   example's (64: the plain loop a user runs), and the tuned profile as it is (an arm of the
   same settings is that row), all in ``--rounds`` rounds of ``--seconds`` each, in a new
   order each round (the median counts): an arm that always follows another pays for what
   that one leaves (torch's thread pool resized: an identical arm after a 1-thread one ran 6%
   slower here).

Targets, per model: the profile reaches at least 0.95 of the best arm at its batch; and it is
not slower, beyond 2%, than the plain loop (the example's batch at torch's default threads).
The CPU time other processes took is recorded (``neighbour_cpu_share``): on a shared VM it moves
every number.

    python benchmarks/own_threads.py [--models tiny wide] [--budget 60] [--rounds 5]
        [--seconds 1.5]

Writes benchmarks/results/own_threads.json and .md; exit 0 when every target holds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from torch import nn

from data_bound import _cpu_seconds, _machine, _median, _neighbours, _share, interleaved
from torch_autotune.api import tune
from torch_autotune.bench import TrainConfig, tuned_config
from torch_autotune.probe.fed_threads import halved
from torch_autotune.probe.loop import TrainingLoop
from torch_autotune.probe.workloads import resolve_workload
from torch_autotune.profile import Profile

RESULTS = Path(__file__).parent / "results"
TARGET = 0.95
PLAIN_WITHIN = 0.02  # the profile may be this far below the plain loop (the bench's noise)
EXAMPLE_BATCH = 64
WIDTHS = {"tiny": (32, 64), "wide": (256, 1024)}  # (features, hidden)


def objects(model: str) -> dict[str, Any]:
    """A user's objects in hand: an MLP, AdamW over it, an example batch and the loss."""
    features, hidden = WIDTHS[model]
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU()
    )
    net.append(nn.Linear(hidden, 10))
    return {
        "model": net,
        "optimizer": torch.optim.AdamW(net.parameters(), lr=1e-3),
        "example_batch": (
            torch.randn(EXAMPLE_BATCH, features),
            torch.randint(0, 10, (EXAMPLE_BATCH,)),
        ),
        "loss_fn": nn.functional.cross_entropy,
    }


def _by_hand(
    profile: Profile, given: dict[str, Any], rounds: int, seconds: float
) -> tuple[dict[str, TrainConfig], dict[str, list[float | None]]]:
    """Torch's default threads and each halving, at the profile's batch and the example's,
    and the tuned profile itself, interleaved: samples/s per round (None: the arm failed)."""
    workload = resolve_workload(objects=given, name="own-threads")
    batch = profile.settings.batch.batch_size or EXAMPLE_BATCH
    configs: dict[str, TrainConfig] = {"tuned": tuned_config(profile)}
    for size in dict.fromkeys((batch, EXAMPLE_BATCH)):
        for count in (None, *halved(torch.get_num_threads())):
            name = f"batch {size}, " + (f"{count} thread(s)" if count else "torch's threads")
            config = TrainConfig(batch_size=size, num_workers=0, cpu_threads=count)
            if config != configs["tuned"]:  # the profile's own is its row, measured once
                configs[name] = config
    loop = TrainingLoop(workload, "cpu", settings=profile.settings)
    return configs, interleaved(loop, configs, rounds, seconds)


def _model_result(model: str, budget: float, rounds: int, seconds: float) -> dict[str, Any]:
    """Tune one model, then every arm by hand; the targets' numbers."""
    began = time.perf_counter()
    profile = tune(**objects(model), budget_s=budget, mode="balanced")
    tune_s = time.perf_counter() - began
    tuned = tuned_config(profile)
    print(f"{model}: tuned in {tune_s:.0f} s: {tuned.describe()}", file=sys.stderr)
    configs, rates = _by_hand(profile, objects(model), rounds, seconds)
    medians = {name: _median(values) for name, values in rates.items()}
    at_batch = [
        v for k, v in medians.items() if k == "tuned" or k.startswith(f"batch {tuned.batch_size},")
    ]
    best = max((v for v in at_batch if v is not None), default=None)
    plain = medians.get(f"batch {EXAMPLE_BATCH}, torch's threads", medians["tuned"])
    mine = medians["tuned"]
    threads = profile.decision("cpu_threads")
    batch = profile.decision("batch.batch_size")
    assert profile.evidence is not None
    return {
        "model": model,
        "parameters": sum(p.numel() for p in objects(model)["model"].parameters()),
        "tune_s": round(tune_s, 1),
        "tuned": tuned.describe(),
        "passes": [r.model_dump() for r in profile.evidence.fed],
        "threads_reason": threads.reason if threads else None,
        "batch_reason": batch.reason if batch else None,
        "by_hand": [
            {
                "arm": name if name != "tuned" else f"tuned ({configs[name].describe()})",
                "samples_per_s": rates[name],
                "median": medians[name],
            }
            for name in configs
        ],
        "tuned_of_best": round(mine / best, 4) if mine and best else 0.0,
        "tuned_of_plain": round(mine / plain, 4) if mine and plain else 0.0,
    }


def _verdict(row: dict[str, Any]) -> bool:
    return row["tuned_of_best"] >= TARGET and row["tuned_of_plain"] >= 1 - PLAIN_WITHIN


def _markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = [
        "# Objects in hand without a dataset: the tuned profile against threads by hand",
        "",
        f"{m['cpu_model']}, {m['usable_cpus']} usable CPUs ({m['cpu_cores_physical']} "
        f"physical), torch {m['torch']} ({m['torch_threads']} threads by default), Python "
        f"{m['python']}, torch-autotune {m['torch_autotune']}; {result['date']}. Other "
        f"processes took {_share(result['neighbour_cpu_share'])} of the CPU time during the run."
        f" By hand: the bench's loop on the example batch, {result['rounds']} interleaved rounds"
        f" of {result['seconds']} s, median samples/s.",
    ]
    for row in result["models"]:
        lines += [
            "",
            f"## {row['model']} ({row['parameters']:,} parameters)",
            "",
            f"Tuned in {row['tune_s']:.0f} s of {result['budget_s']:.0f}: **{row['tuned']}**.",
            "",
            "| arm | samples/s (median) | rounds |",
            "|---|---|---|",
        ]
        for arm in row["by_hand"]:
            rate = "failed" if arm["median"] is None else f"{arm['median']:,.0f}"
            runs = ", ".join("-" if v is None else f"{v:,.0f}" for v in arm["samples_per_s"])
            lines.append(f"| {arm['arm']} | {rate} | {runs} |")
        lines += [
            "",
            f"The profile: {row['tuned_of_best']:.1%} of the best arm at its batch (>= "
            f"{TARGET:.0%}), {row['tuned_of_plain']:.2f}x the plain loop (batch "
            f"{EXAMPLE_BATCH}, torch's threads; >= {1 - PLAIN_WITHIN:.2f}): "
            f"**{'PASS' if _verdict(row) else 'FAIL'}**.",
            "",
            f"- threads: {row['threads_reason']}",
            f"- batch: {row['batch_reason']}",
        ]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=sorted(WIDTHS), default=sorted(WIDTHS))
    parser.add_argument("--budget", type=float, default=60.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=1.5)
    args = parser.parse_args()
    started = time.perf_counter()
    cpu_before = _cpu_seconds()
    machine = _machine()
    models = [_model_result(m, args.budget, args.rounds, args.seconds) for m in args.models]
    result = {
        "benchmark": "own_threads",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine,
        "budget_s": args.budget,
        "rounds": args.rounds,
        "seconds": args.seconds,
        "models": models,
        "neighbour_cpu_share": _neighbours(
            cpu_before, time.perf_counter() - started, machine["usable_cpus"]
        ),
        "elapsed_s": round(time.perf_counter() - started, 1),
    }
    text = _markdown(result)
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "own_threads.json").write_text(json.dumps(result, indent=2) + "\n")
    (RESULTS / "own_threads.md").write_text(text)
    return 0 if all(_verdict(row) for row in models) else 1


if __name__ == "__main__":
    sys.exit(main())

"""Data-bound training on this machine: the tuned profile against every worker count by hand.

The workload (``make_workload``): a small conv net (~7k parameters, 64x64 images, 10 classes)
that steps far faster on the CPU than its data loads (``--model conv``: the built-in conv net,
whose step costs about what loading does, so workers and the step compete for the cores).
``CpuHeavyDataset`` items cost a few ms of CPU each (``--passes`` decode rounds; ~3.7 ms at 8
on one thread of this 2-core VM), like decoding and augmenting a JPEG. It is the case behind
the issue's worst defect: the profile chose 0 workers after trying 0 and 1, and trained at
0.51x a plain 2-worker loop.

1. **Tune** with the real probe (``torch_autotune.tune("data_bound:make_workload")``,
   ``--budget`` seconds).
2. **By hand**, in the same run: the end-to-end training rate (the bench's loop: the real step
   fed by the real DataLoader) at every worker count 0..usable CPUs, with torch's default
   threads as a user's loop has them and with 1 thread, at the profile's batch and at the
   baseline's (32), and the tuned profile as it is, all interleaved in ``--rounds`` rounds of
   ``--seconds`` each (the median counts). Target: the profile reaches at least 0.95 of the
   best of those arms at its batch.
3. **The bench** (``torch_autotune.bench``, as ``autotune bench --baseline FILE`` with
   ``num_workers: <usable CPUs>`` runs it): the profile against the plain alternative a user
   would try. Target: after the bench's drops (rule M1/M2), the profile is not slower than
   that baseline.

The CPU time other processes took during the run is recorded (``neighbour_cpu_share``, from
/proc/stat, as in ``benchmarks/workers.py``): on a shared VM it moves every number.

    python benchmarks/data_bound.py [--budget 120] [--rounds 3] [--seconds 2]
        [--bench-rounds 5] [--passes 8] [--model small|conv]

Writes benchmarks/results/data_bound.json and .md (data_bound_conv.* with ``--model conv``);
exit status 0 when both targets hold.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import random
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from torch import nn

from torch_autotune import __version__, detect
from torch_autotune.api import bench, tune
from torch_autotune.bench import TrainConfig, tuned_config
from torch_autotune.probe.loop import TrainingLoop
from torch_autotune.probe.workloads import CpuHeavyDataset, resolve_workload
from torch_autotune.profile import Profile

RESULTS = Path(__file__).parent / "results"
TARGET = 0.95
BASELINE_BATCH = 32
PASSES = 8  # decode rounds a sample (--passes sets the workload's through the environment)


def small_cnn() -> nn.Module:
    """Two strided convolutions and a linear head: ~7k parameters, cheap next to its data."""
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 10),
    )


def conv_net() -> nn.Module:
    """The built-in ``conv`` workload's ResNet-style net (0.7M parameters): on this CPU its step
    costs about what loading does, so workers and the step compete for the two cores."""
    from torch_autotune.probe.workloads.models import ResNetLike

    return ResNetLike(num_classes=10)


def make_workload() -> dict[str, Any]:
    """The data-bound workload, as a user's factory returns it."""
    passes = int(os.environ.get("DATA_BOUND_PASSES", PASSES))
    model = conv_net if os.environ.get("DATA_BOUND_MODEL") == "conv" else small_cnn
    return {
        "model": model,
        "optimizer": functools.partial(torch.optim.AdamW, lr=1e-3),
        "dataset": CpuHeavyDataset(20_000, passes=passes),
        "kind": "conv",
    }


# --- the machine ---------------------------------------------------------------------------


def _machine() -> dict[str, Any]:
    host = detect().host
    return {
        "cpu_model": host.cpu_model,
        "cpu_cores_physical": host.cpu_cores_physical,
        "cpu_cores_logical": host.cpu_cores_logical,
        "usable_cpus": host.cpus_usable,
        "os": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "torch_autotune": __version__,
        "start_method": torch.multiprocessing.get_start_method(),
    }


def _cpu_seconds() -> tuple[float, float] | None:
    """(CPU-seconds all processes have used, CPU-seconds this process and its reaped children
    have used), or None where /proc/stat is missing."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return None
    ticks = [int(f) for f in fields]
    busy = (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")
    own = os.times()
    return busy, own.user + own.system + own.children_user + own.children_system


def _neighbours(before: tuple[float, float] | None, wall_s: float, cpus: int) -> float | None:
    """Fraction of the usable CPU time other processes took since ``before``."""
    after = _cpu_seconds()
    if before is None or after is None:
        return None
    others = (after[0] - before[0]) - (after[1] - before[1])
    return round(max(0.0, others) / (wall_s * cpus), 3)


def _per_item_ms(dataset: Any, items: int = 40) -> float:
    """Median cost of one item on one thread (as in a DataLoader worker), in ms."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        dataset[0]
        times = []
        for i in range(items):
            start = time.perf_counter()
            dataset[i]
            times.append(time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
    return statistics.median(times) * 1000


# --- by hand ---------------------------------------------------------------------------------


def _by_hand(
    profile: Profile, usable: int, rounds: int, seconds: float
) -> tuple[dict[str, TrainConfig], dict[str, list[float | None]]]:
    """Every worker count at the profile's batch and the baseline's, at torch's default threads
    and at 1 thread (where the default is more), and the tuned profile itself, interleaved:
    samples/s per round (None: the arm failed)."""
    workload = resolve_workload("data_bound:make_workload")
    batch = profile.settings.batch.batch_size or BASELINE_BATCH
    configs: dict[str, TrainConfig] = {"tuned": tuned_config(profile)}
    threads = (None, 1) if torch.get_num_threads() > 1 else (None,)
    for size in dict.fromkeys((batch, BASELINE_BATCH)):
        for workers in range(usable + 1):
            for count in threads:
                name = f"{workers} workers, batch {size}" + (", 1 thread" if count else "")
                configs[name] = TrainConfig(batch_size=size, num_workers=workers, cpu_threads=count)
    loop = TrainingLoop(workload, "cpu", settings=profile.settings)
    return configs, interleaved(loop, configs, rounds, seconds)


def interleaved(
    loop: TrainingLoop, configs: dict[str, TrainConfig], rounds: int, seconds: float
) -> dict[str, list[float | None]]:
    """Every arm of ``configs`` for ``seconds`` in each of ``rounds`` rounds, in a new order
    each round (no arm always follows the same one): samples/s per round (None: it failed)."""
    rates: dict[str, list[float | None]] = {name: [] for name in configs}
    shuffled = random.Random(0)
    for r in range(rounds):
        order = list(configs)
        shuffled.shuffle(order)
        for name in order:
            print(f"  round {r + 1}/{rounds}: {name}", file=sys.stderr, flush=True)
            try:
                rates[name].append(loop.measure(configs[name], seconds))
            except Exception as error:  # an arm that cannot run is a row without a number
                print(f"    failed: {error}", file=sys.stderr)
                rates[name].append(None)
    return rates


def _median(values: list[float | None]) -> float | None:
    ran = [v for v in values if v is not None]
    return statistics.median(ran) if ran else None


# --- the report ------------------------------------------------------------------------------


def _markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    tuned = result["tuned"]
    lines = [
        "# Data-bound training: the tuned profile against every worker count",
        "",
        f"{m['cpu_model']}, {m['usable_cpus']} usable CPUs ({m['cpu_cores_physical']} "
        f"physical), torch {m['torch']}, Python {m['python']}, torch-autotune "
        f"{m['torch_autotune']}; {result['date']}. Dataset: CpuHeavyDataset, "
        f"{result['per_item_ms']:.1f} ms a sample on one thread; model: "
        f"{'a small conv net' if result['model'] == 'small' else 'the built-in conv net'}. "
        f"Other processes took {_share(result['neighbour_cpu_share'])} of the CPU time "
        "during the run.",
        "",
        f"Tuned ({result['tune_s']:.0f} s of a {result['budget_s']:.0f} s budget): "
        f"**{tuned['describe']}**.",
        "",
        f"By hand: the bench's loop, {result['rounds']} interleaved rounds of "
        f"{result['seconds']} s, median samples/s (each count at torch's default threads, as a "
        "user's loop has them, and at 1 thread).",
        "",
        "| arm | samples/s (median) | rounds | of the best at the profile's batch |",
        "|---|---|---|---|",
    ]
    for row in result["by_hand"]:
        rate = "failed" if row["median"] is None else f"{row['median']:.1f}"
        share = "" if row["of_best"] is None else f"{row['of_best']:.1%}"
        runs = ", ".join("-" if v is None else f"{v:.0f}" for v in row["samples_per_s"])
        lines.append(f"| {row['arm']} | {rate} | {runs} | {share} |")
    bench_row = result["bench"]
    lines += [
        "",
        f"Target 1: the tuned profile reaches {result['tuned_of_best']:.1%} of the best arm by "
        f"hand at its batch (>= {TARGET:.0%}): **{result['verdict_by_hand']}**. Of the best "
        f"arm by hand at either batch: {result['tuned_of_best_anywhere']:.1%}.",
        "",
        f"The bench against a `num_workers: {m['usable_cpus']}` baseline ({bench_row['rounds']}"
        f" rounds of {bench_row['seconds']} s): the profile as tuned "
        f"{bench_row['tuned_vs_baseline']}; after the drops {bench_row['final_vs_baseline']};"
        f" dropped: {', '.join(bench_row['dropped']) or 'nothing'}.",
        "",
        "| setting | baseline -> tuned | on alone | in the profile | outcome |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {s['setting']} | {s['baseline']} -> {s['tuned']} | {s['on_alone']} | "
        f"{s['in_profile']} | {s['outcome']} |"
        for s in bench_row["settings"]
    ]
    lines += [
        "",
        f"Target 2: after the bench, the profile is not slower than the baseline: "
        f"**{result['verdict_bench']}**.",
        "",
        "The probe's own decisions:",
        "",
        f"- workers: {result['workers_reason']}",
        f"- batch: {result['batch_reason']}",
    ]
    return "\n".join(lines) + "\n"


def _share(value: float | None) -> str:
    return "an unknown share" if value is None else f"{value:.0%}"


def _effect(effect: Any) -> str:
    if effect is None:
        return "not measured"
    return f"{effect.speedup:.2f}x ({effect.low:.2f}-{effect.high:.2f}, {effect.verdict})"


def _bench(profile: Profile, usable: int, rounds: int, seconds: float) -> dict[str, Any]:
    """``autotune bench --baseline`` with ``num_workers: <usable>``, through the API."""
    benched = bench(
        profile, baseline=TrainConfig(num_workers=usable), rounds=rounds, seconds=seconds
    )
    assert benched.evidence is not None
    evidence = benched.evidence.bench
    assert evidence is not None
    overall = evidence.final or evidence.tuned
    return {
        "rounds": rounds,
        "seconds": seconds,
        "tuned_vs_baseline": _effect(evidence.tuned),
        "final_vs_baseline": _effect(overall),
        "reverted": evidence.reverted,
        "slower": overall is not None and overall.verdict == "slower",
        "dropped": [s.setting for s in evidence.settings if s.outcome == "dropped"],
        "settings": [
            {
                "setting": s.setting,
                "baseline": s.baseline_value,
                "tuned": s.tuned_value,
                "on_alone": _effect(s.on_alone),
                "in_profile": _effect(s.off_alone),
                "outcome": s.outcome,
            }
            for s in evidence.settings
        ],
        "arms": [
            {"names": list(a.names), "config": a.config.describe(), "median": a.median}
            for a in evidence.arms
        ],
        "final_profile": tuned_config(benched).describe(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=120.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--bench-rounds", type=int, default=5)
    parser.add_argument("--passes", type=int, default=PASSES)
    parser.add_argument(
        "--model", choices=["small", "conv"], default="small", help="conv: the built-in's net"
    )
    args = parser.parse_args()
    os.environ["DATA_BOUND_PASSES"] = str(args.passes)
    os.environ["DATA_BOUND_MODEL"] = args.model
    name = "data_bound" if args.model == "small" else f"data_bound_{args.model}"

    started = time.perf_counter()
    cpu_before = _cpu_seconds()
    machine = _machine()
    usable = machine["usable_cpus"]
    item_ms = _per_item_ms(make_workload()["dataset"])
    print(f"{item_ms:.1f} ms a sample on one thread; {usable} usable CPUs", file=sys.stderr)

    tune_started = time.perf_counter()
    profile = tune("data_bound:make_workload", budget_s=args.budget)
    tune_s = time.perf_counter() - tune_started
    assert profile.evidence is not None
    tuned = tuned_config(profile)
    print(f"tuned in {tune_s:.0f} s: {tuned.describe()}", file=sys.stderr)

    configs, rates = _by_hand(profile, usable, args.rounds, args.seconds)
    medians = {name: _median(values) for name, values in rates.items()}
    at_batch = [
        v for k, v in medians.items() if k.split(", ")[1:2] == [f"batch {tuned.batch_size}"]
    ]
    best = max((v for v in at_batch if v is not None), default=None)
    tuned_rate = medians["tuned"]
    of_best = tuned_rate / best if tuned_rate and best else 0.0
    anywhere = max((v for k, v in medians.items() if k != "tuned" and v is not None), default=0)
    of_any = tuned_rate / anywhere if tuned_rate and anywhere else 0.0

    benched = _bench(profile, usable, args.bench_rounds, args.seconds)
    batch_decision = profile.decision("batch.batch_size")
    workers_decision = profile.decision("dataloader.num_workers")
    result = {
        "benchmark": "data_bound",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine,
        "per_item_ms": round(item_ms, 2),
        "passes": args.passes,
        "model": args.model,
        "budget_s": args.budget,
        "tune_s": round(tune_s, 1),
        "tuned": {
            "describe": tuned.describe(),
            "config": tuned.model_dump(),
            "fed": [r.model_dump() for r in profile.evidence.fed],
            "loader": [r.model_dump() for r in profile.evidence.loader],
            "phases": [p.model_dump() for p in profile.evidence.phases],
            "elapsed_s": profile.evidence.elapsed_s,
        },
        "rounds": args.rounds,
        "seconds": args.seconds,
        "by_hand": [
            {
                "arm": name if name != "tuned" else f"tuned ({configs[name].describe()})",
                "samples_per_s": rates[name],
                "median": medians[name],
                "of_best": None if medians[name] is None or not best else medians[name] / best,
            }
            for name in configs
        ],
        "tuned_of_best": round(of_best, 4),
        "tuned_of_best_anywhere": round(of_any, 4),
        "verdict_by_hand": "PASS" if of_best >= TARGET else "FAIL",
        "bench": benched,
        "verdict_bench": "FAIL" if benched["slower"] else "PASS",
        "workers_reason": workers_decision.reason if workers_decision else None,
        "batch_reason": batch_decision.reason if batch_decision else None,
        "neighbour_cpu_share": _neighbours(cpu_before, time.perf_counter() - started, usable),
        "elapsed_s": round(time.perf_counter() - started, 1),
    }
    text = _markdown(result)
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    (RESULTS / f"{name}.md").write_text(text)
    return 0 if result["verdict_by_hand"] == result["verdict_bench"] == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())

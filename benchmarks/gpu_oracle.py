"""The tuned profile against the baseline and against the best of a grid of settings, on a GPU.

For each realistic built-in workload (``resnet50``: ResNet-50 at 224x224, ``gpt2``: GPT-2 small
at 512 tokens), one run of one training loop (``probe.loop.TrainingLoop``, the loop
``autotune bench`` uses, with the data already on the device so that only the model-side
settings count) measures:

- the baseline of speed guides: fp32, batch 32, eager, torch's default backends;
- the tuned profile (``--profile NAME=FILE``, as ``autotune export`` writes it; without one,
  ``tune()`` makes it first, in ``--mode`` with ``--budget``);
- a grid: fp32 with TF32 and bf16 (x channels_last for the conv net) at the tuned batch;
  the tuned settings, eager, at half the tuned batch and at the largest batch the probe ran;
  the settings of the fastest eager arm compiled (one dynamic-batch compile) at every batch
  size of the grid.

The oracle is the fastest arm of the grid. It prints tuned/oracle and tuned/baseline (targets:
at least 0.95, and never below 1.0) and writes benchmarks/results/gpu_oracle_<device>.json and
.md with the device and the versions.

    python benchmarks/gpu_oracle.py [--workloads resnet50 gpt2] [--profile resnet50=r.yaml]
        [--seconds 2] [--mode speed] [--budget 180]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import re
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from torch_autotune import __version__
from torch_autotune.api import tune
from torch_autotune.bench import ArmFailed, TrainConfig, tuned_config
from torch_autotune.probe.loop import TrainingLoop
from torch_autotune.probe.workloads import Workload, resolve_workload
from torch_autotune.profile import Profile
from torch_autotune.profile_io import load_profile

RESULTS = Path(__file__).parent / "results"
TARGET_ORACLE = 0.95


def _profile(name: str, given: dict[str, str], mode: str, budget: float) -> Profile:
    if name in given:
        return load_profile(given[name])
    began = time.perf_counter()
    return tune(
        name,
        mode=mode,
        budget_s=budget,
        progress=lambda phase, what: print(
            f"  [{time.perf_counter() - began:6.1f} s] {phase}: {what}", flush=True
        ),
    )


def _grid(tuned: TrainConfig, profile: Profile, conv: bool) -> list[tuple[str, TrainConfig]]:
    """(label, config) for every arm, the baseline and the tuned profile first."""
    arms: list[tuple[str, TrainConfig]] = [("baseline", TrainConfig()), ("tuned", tuned)]
    eager = tuned.model_copy(update={"compile_mode": None, "cudnn_benchmark": True})
    # fp32 without TF32 is left out: on an H100 its cuDNN autotuning alone took a minute per
    # arm, and it is the baseline's precision, far from the fastest.
    precisions = [("fp32+tf32", "float32", True), ("bf16", "bfloat16", True)]
    for label, dtype, tf32 in precisions:
        for channels_last in (False, True) if conv else (False,):
            name = label + (" channels_last" if channels_last else "")
            config = eager.model_copy(
                update={"precision": dtype, "tf32": tf32, "channels_last": channels_last}
            )
            arms.append((f"{name} @ {tuned.batch_size}", config))
    evidence = profile.evidence
    largest = evidence.max_batch_size if evidence is not None else tuned.batch_size
    for size in sorted({max(1, tuned.batch_size // 2), largest} - {tuned.batch_size}):
        arms.append((f"tuned, eager @ {size}", eager.model_copy(update={"batch_size": size})))
    return arms


def _measure(loop: TrainingLoop, config: TrainConfig, seconds: float) -> float | str:
    try:
        return loop.measure(config, seconds)
    except ArmFailed as failure:
        return str(failure)


def _timed_arm(loop: TrainingLoop, label: str, config: TrainConfig, seconds: float) -> float | str:
    """Measure one arm and print it with the seconds it took (warm-up and compile included)."""
    began = time.perf_counter()
    rate = _measure(loop, config, seconds)
    shown = rate if isinstance(rate, str) else f"{rate:,.0f} samples/s"
    print(f"  {label:<44} {shown} ({time.perf_counter() - began:.0f} s)", flush=True)
    return rate


def _resolve_best(
    arms: list[tuple[str, TrainConfig]], rates: dict[str, float | str]
) -> TrainConfig | None:
    """The eager arm of the grid that measured fastest."""
    grid = [(rates[label], config) for label, config in arms[2:] if isinstance(rates[label], float)]
    if not grid:
        return None
    return max(grid, key=lambda pair: float(pair[0]))[1]


def _run_workload(name: str, args: argparse.Namespace, given: dict[str, str]) -> dict[str, Any]:
    print(f"{name}: tuning" if name not in given else f"{name}: profile {given[name]}", flush=True)
    profile = _profile(name, given, args.mode, args.budget)
    return compare(name, profile, resolve_workload(name), args.device, args.seconds)


def compare(
    name: str,
    profile: Profile,
    workload: Workload,
    device: str,
    seconds: float,
    *,
    compiled: bool = True,
) -> dict[str, Any]:
    """The baseline, the tuned profile and the grid, each trained for ``seconds`` by one
    training loop of ``workload`` with its data on the device; the result as the JSON holds
    it. ``compiled`` False leaves out the compiled arms (a smoke run on a CPU, where one
    compile of GPT-2 takes over a minute). ``benchmarks/hf_gpt2.py`` calls it with a Hugging
    Face model tuned as it is."""
    workload = dataclasses.replace(workload, dataset=None)  # data on the device
    tuned = tuned_config(profile).model_copy(
        update={"num_workers": 0, "prefetch_factor": None, "pin_memory": False}
    )
    arms = _grid(tuned, profile, conv=workload.kind == "conv")
    loop = TrainingLoop(workload, device)
    rates: dict[str, float | str] = {}
    for label, config in arms:
        rates[label] = _timed_arm(loop, label, config, seconds)
    best = _resolve_best(arms, rates) if compiled else None
    if best is not None:  # one dynamic-batch compile, measured at every size of the grid
        sizes = sorted({config.batch_size for _, config in arms[2:]}, reverse=True)
        for size in sizes:
            compiled = best.model_copy(update={"compile_mode": "default", "batch_size": size})
            label = f"fastest eager settings, compiled @ {size}"
            arms.append((label, compiled))
            rates[label] = _timed_arm(loop, label, compiled, seconds)
    measured = {k: v for k, v in rates.items() if isinstance(v, float)}
    oracle_label = max(measured, key=lambda k: measured[k])
    tuned_rate = rates["tuned"]
    baseline_rate = rates["baseline"]
    result: dict[str, Any] = {
        "workload": name,
        "mode": profile.mode.value,
        "tuned": tuned.describe(),
        "arms": [
            {"arm": label, "config": config.describe(), "samples_per_s": rates[label]}
            for label, config in arms
        ],
        "oracle": oracle_label,
        "oracle_samples_per_s": measured[oracle_label],
    }
    if isinstance(tuned_rate, float):
        result["tuned_over_oracle"] = tuned_rate / measured[oracle_label]
        if isinstance(baseline_rate, float):
            result["tuned_over_baseline"] = tuned_rate / baseline_rate
    wanted = profile.settings.environment  # read when CUDA starts: not set per arm
    here = {name: os.environ.get(name) for name in wanted}
    result["environment"] = {"profile": dict(wanted), "this_process": here}
    evidence = profile.evidence
    if evidence is not None:
        result["probe"] = {
            "max_batch_size": evidence.max_batch_size,
            "limited_by": evidence.limited_by,
            "batch_size": evidence.batch_size,
            "elapsed_s": evidence.elapsed_s,
            "budget_s": evidence.budget_s,
            "phases": {p.name: p.seconds for p in evidence.phases},
            "compile": None if evidence.compile is None else evidence.compile.reason,
        }
    return result


def _versions() -> dict[str, Any]:
    from torch_autotune import detect

    accelerators = detect().accelerators
    return {
        "device": accelerators[0].name if accelerators else "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "python": platform.python_version(),
        "torch_autotune": __version__,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def _markdown(versions: dict[str, Any], results: list[dict[str, Any]]) -> str:
    lines = [
        f"# Tuned profile against the oracle grid on {versions['device']}",
        "",
        f"torch {versions['torch']}, CUDA {versions['cuda']}, cuDNN {versions['cudnn']}, "
        f"Python {versions['python']}, torch-autotune {versions['torch_autotune']}, "
        f"{versions['date']}. Data already on the device; one training loop for every arm.",
    ]
    for result in results:
        lines += ["", f"## {result['workload']} ({result['mode']} mode)", ""]
        if "probe" in result:
            probe = result["probe"]
            lines.append(
                f"Probe: largest batch {probe['max_batch_size']} (limited by "
                f"{probe['limited_by']}), recommended {probe['batch_size']}, "
                f"{probe['elapsed_s']:.0f} s of {probe['budget_s']:.0f} s; compile: "
                f"{probe['compile']}."
            )
            lines.append("")
        environment = result.get("environment", {})
        unset = {
            k: v
            for k, v in environment.get("profile", {}).items()
            if environment.get("this_process", {}).get(k) != v
        }
        if unset:
            shown = ", ".join(f"{k}={v}" for k, v in unset.items())
            lines += [
                f"Every arm, the tuned one too, ran without the profile's {shown} (read once,"
                " when CUDA starts; this process started without it).",
                "",
            ]
        lines += ["| arm | settings | samples/s |", "|---|---|---:|"]
        for arm in result["arms"]:
            rate = arm["samples_per_s"]
            shown = f"{rate:,.0f}" if isinstance(rate, float) else f"failed: {rate}"
            lines.append(f"| {arm['arm']} | {arm['config']} | {shown} |")
        ratios = []
        for key, label in (
            ("tuned_over_oracle", "tuned/oracle"),
            ("tuned_over_baseline", "tuned/baseline"),
        ):
            if key in result:
                ratios.append(f"{label} {result[key]:.2f}")
        lines += ["", f"Oracle: {result['oracle']}. " + ", ".join(ratios) + "."]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="+", default=["resnet50", "gpt2"])
    parser.add_argument("--profile", action="append", default=[], metavar="NAME=FILE")
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--mode", default="speed")
    parser.add_argument("--budget", type=float, default=180.0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--device", default="cuda", help="cpu: a smoke run of the script")
    args = parser.parse_args()
    versions = _versions()
    if versions["device"] == "cpu" and args.device != "cpu":
        print("gpu_oracle: no GPU here; this benchmark needs one", file=sys.stderr)
        return 2
    given = dict(item.split("=", 1) for item in args.profile)
    results = [_run_workload(name, args, given) for name in args.workloads]
    slug = re.sub(r"[^a-z0-9]+", "-", versions["device"].lower()).strip("-")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"gpu_oracle_{slug}.json").write_text(
        json.dumps({"versions": versions, "results": results}, indent=2) + "\n"
    )
    (args.out / f"gpu_oracle_{slug}.md").write_text(_markdown(versions, results))
    print(_markdown(versions, results))
    worst = [r for r in results if r.get("tuned_over_baseline", 0) < 1.0]
    short = [r for r in results if r.get("tuned_over_oracle", 0) < TARGET_ORACLE]
    return 1 if worst or short else 0


if __name__ == "__main__":
    sys.exit(main())

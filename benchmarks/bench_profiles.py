"""`autotune bench` on the built-in workloads: is each tuned profile faster than the baseline?

For every workload: tune it (the full probe, ``--budget`` seconds), then bench the profile
against the baseline of speed guides (fp32, batch 32, no workers, no pinning, eager, torch's
default backends) in ``--rounds`` interleaved rounds of ``--seconds`` per arm, with each
setting on alone and off alone. The table shows the baseline's and the profile's samples/s
(medians), the speedup with its range over the rounds, and what the bench dropped.

``--demo-drop`` also benches the conv profile with one folklore tip forced in by hand,
``torch.set_num_threads(1)`` ("one thread per process, leave the cores to the workers"): on a
machine where it costs speed, the bench must drop it and say why.

    python benchmarks/bench_profiles.py [--workloads conv transformer mlp] [--budget 90]
        [--rounds 5] [--seconds 2] [--demo-drop]

Writes benchmarks/results/bench_<device>.json and .md (device: the GPU's name, or "cpu").
Exit status 0 when no benched profile is slower than its baseline beyond noise, 1 otherwise.
"""

from __future__ import annotations

import argparse
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
from torch_autotune.api import bench, tune
from torch_autotune.bench import BenchEvidence, Effect
from torch_autotune.profile import Decision, Profile, Source

RESULTS = Path(__file__).parent / "results"


def _device_name() -> str:
    """The first GPU's name as detection reports it, or "cpu"."""
    from torch_autotune import detect

    accelerators = detect().accelerators
    return accelerators[0].name if accelerators else "cpu"


def _speedup(effect: Effect | None) -> str:
    if effect is None:
        return "not measured"
    return f"{effect.speedup:.2f}x ({effect.low:.2f}-{effect.high:.2f}) {effect.verdict}"


def _with_one_thread(profile: Profile) -> Profile:
    """The profile with torch.set_num_threads(1) forced in, as a speed tip would have it."""
    data = profile.model_dump(mode="python")
    data["settings"]["cpu_threads"] = 1
    tip = Decision(
        setting="cpu_threads",
        value=1,
        rule="user",
        reason="forced by hand for the demo: 'one thread per process' speed tip",
        source=Source.USER,
    )
    data["decisions"] = [*data["decisions"], tip.model_dump(mode="python")]
    return Profile.model_validate(data)


def _row(name: str, result: Profile) -> dict[str, Any]:
    assert result.evidence is not None
    evidence: BenchEvidence | None = result.evidence.bench
    assert evidence is not None
    arms = {names: arm for arm in evidence.arms for names in arm.names}
    overall = evidence.final or evidence.tuned
    return {
        "workload": name,
        "baseline": arms["baseline"].config.describe(),
        "tuned": arms["tuned"].config.describe(),
        "baseline_samples_per_s": arms["baseline"].median,
        "tuned_samples_per_s": arms["tuned"].median,
        "tuned_vs_baseline": None if evidence.tuned is None else evidence.tuned.model_dump(),
        "final_vs_baseline": None if evidence.final is None else evidence.final.model_dump(),
        "slower_than_baseline": overall is not None and overall.verdict == "slower",
        "reverted": evidence.reverted,
        "settings": [
            {
                "setting": s.setting,
                "baseline": s.baseline_value,
                "tuned": s.tuned_value,
                "on_alone": _speedup(s.on_alone),
                "in_profile": _speedup(s.off_alone),
                "outcome": s.outcome,
                "reason": s.reason,
            }
            for s in evidence.settings
        ],
        "elapsed_s": evidence.elapsed_s,
    }


def _markdown(header: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    lines = [
        f"# autotune bench on {header['device']}",
        "",
        f"torch {header['torch']} (CUDA {header['cuda']}), torch-autotune {header['tool']}, "
        f"Python {header['python']}, {header['cpus']} CPUs; {header['rounds']} interleaved "
        f"rounds of {header['seconds']} s per arm; {header['date']}.",
        "",
        "| workload | baseline samples/s | tuned samples/s | tuned vs baseline | dropped |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        tuned = row["tuned_vs_baseline"]
        speed = "not measured"
        if tuned is not None:
            speed = f"{tuned['speedup']:.2f}x ({tuned['low']:.2f}-{tuned['high']:.2f})"
            speed += f" {tuned['verdict']}"
        dropped = [s["setting"] for s in row["settings"] if s["outcome"] == "dropped"]
        base, best = row["baseline_samples_per_s"], row["tuned_samples_per_s"]
        lines.append(
            f"| {row['workload']} | {base:.1f} | {best:.1f} | {speed} | "
            f"{', '.join(dropped) or '-'} |"
        )
    for row in rows:
        lines += [
            "",
            f"## {row['workload']}",
            "",
            f"baseline: {row['baseline']}; tuned: {row['tuned']}",
            "",
            "| setting | baseline -> tuned | on alone | in the profile | outcome |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {s['setting']} | {s['baseline']} -> {s['tuned']} | {s['on_alone']} | "
            f"{s['in_profile']} | {s['outcome']} |"
            for s in row["settings"]
        ]
        if row["final_vs_baseline"] is not None:
            final = row["final_vs_baseline"]
            lines += [
                "",
                f"without the dropped settings: {final['speedup']:.2f}x the baseline "
                f"({final['low']:.2f}-{final['high']:.2f}, {final['verdict']})",
            ]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=["conv", "transformer", "mlp"])
    parser.add_argument("--budget", type=float, default=90.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--demo-drop", action="store_true")
    args = parser.parse_args()

    device = _device_name()
    header = {
        "device": device,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "tool": __version__,
        "python": platform.python_version(),
        "cpus": len(os.sched_getaffinity(0)),
        "rounds": args.rounds,
        "seconds": args.seconds,
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
    }
    rows: list[dict[str, Any]] = []
    profiles: dict[str, Profile] = {}
    for name in args.workloads:
        started = time.perf_counter()
        profile = tune(name, budget_s=args.budget)
        profiles[name] = profile
        print(f"{name}: tuned in {time.perf_counter() - started:.0f} s", file=sys.stderr)
        result = bench(profile, rounds=args.rounds, seconds=args.seconds)
        rows.append(_row(name, result))
        print(f"{name}: benched in {rows[-1]['elapsed_s']:.0f} s", file=sys.stderr)
    if args.demo_drop and "conv" in profiles:
        forced = _with_one_thread(profiles["conv"])
        result = bench(forced, rounds=args.rounds, seconds=args.seconds)
        rows.append(_row("conv + set_num_threads(1) forced", result))
        decision = result.decision("cpu_threads")
        print(
            f"demo: cpu_threads = {decision.value if decision else '?'}: "
            f"{decision.reason if decision else ''}",
            file=sys.stderr,
        )

    text = _markdown(header, rows)
    print(text)
    slug = re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"bench_{slug}.json").write_text(
        json.dumps({**header, "results": rows}, indent=2) + "\n"
    )
    (RESULTS / f"bench_{slug}.md").write_text(text)
    # The demo row is meant to start slower: judge only the built-in workloads.
    slower = [r["workload"] for r in rows[: len(args.workloads)] if r["slower_than_baseline"]]
    if slower:
        print(f"slower than the baseline: {', '.join(slower)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The tuned profile where memory is the limit, against a grid of memory settings, on a GPU.

For each workload under each memory limit (default: ``gpt2-large``, 1,024 tokens, under 24 and
16 GiB; ``llama-1b``, 2,048 tokens, under 24 GiB), the allocator held to the limit as
``--memory-limit`` holds it (``torch.cuda.set_per_process_memory_fraction``, in every process),
one training loop (``probe.loop.TrainingLoop``, data on the device) measures:

- the tuned profile (``tune(workload, memory_limit_gib=...)`` in ``--mode`` with ``--budget``,
  or ``--profile NAME@LIMIT=FILE``) at its batch; where not even batch 1 fits, the tuner's
  ``DoesNotFitError`` (the plan it gives) is the result;
- a grid at the profile's precision and optimizer: activation checkpointing off/on x eager,
  compiled (default mode), compiled under each activation memory budget of
  ``--memory-budgets`` (default 0.8 and 0.5: the plain compiled arm is torch's 1.0; the
  profile's ``compile.memory_budget``, as the tuner would keep it) x the allocator
  (``PYTORCH_CUDA_ALLOC_CONF`` unset or ``expandable_segments:True``, read when CUDA starts:
  an arm whose value is not this process's runs in a fresh child, this script with ``--arm
  JSON``, which prints one JSON line back).
  Each arm finds its largest batch (doubling from 1 to out-of-memory, then bisecting, each
  trial a short training run), measured there, at K2's size where memory stopped it (90% of
  it, rounded down: the margin the tuner keeps for fixed shapes) and at half. ``--quick``: no
  allocator axis, no memory-budget arms. Each measurement is also appended, as it finishes, to
  ``memory_regime.progress.jsonl`` in ``--out``: a run cut short still leaves what it measured.

The oracle is the fastest measurement of the grid. Targets: tuned/oracle at least 0.95; tuned
no slower than the best arm without checkpointing (1.0, ``NOISE`` allowed); where the tuner
says nothing fits, no arm fits either. Beside them, the same among the rows that keep K2's
margin (``headroom_oracle``, ``tuned_over_headroom_oracle``: at most 90% of the arm's largest
batch where memory stopped its search, as the tuner takes its margin in samples): at the edge
the grid's best can be a batch the tuner never recommends (GPT-2 large checkpointed under 16
GiB on the H200: batch 6, its peak 0.6% below the limit), and the two say what that margin
costs. Writes results/memory_regime_<device>.json and .md (device, versions, date, every arm:
settings, largest batch, samples/s, peak memory, whether it keeps the margin). Exit 0 when the
targets held, 1 if not, 2 for usage errors and without a CUDA GPU (``--device cpu`` is a smoke
run for the tests: the limits recorded, not applied).

    python benchmarks/memory_regime.py [--workloads gpt2-large llama-1b] [--limits 24 16]
        [--profile gpt2-large@24=p.yaml] [--seconds 3] [--mode speed] [--budget 300]
        [--quick] [--max-batch 1024] [--memory-budgets 0.8 0.5]
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import suppress
from datetime import datetime, timezone
from functools import partial
from itertools import product
from pathlib import Path
from typing import Any

import torch

from torch_autotune import __version__
from torch_autotune.api import detect, rules_profile, tune
from torch_autotune.bench import ArmFailed, TrainConfig, tuned_config
from torch_autotune.errors import DoesNotFitError
from torch_autotune.probe.loop import TrainingLoop
from torch_autotune.probe.memory import memory_capped
from torch_autotune.probe.oom import release_memory
from torch_autotune.probe.points import margin_for
from torch_autotune.probe.search import apply_margin
from torch_autotune.probe.workloads import BUILTIN_WORKLOADS, resolve_workload
from torch_autotune.profile import Mode, Preferences, Profile
from torch_autotune.profile_io import load_profile
from torch_autotune.settings import Settings
from torch_autotune.wrapping import NotCheckpointable

RESULTS = Path(__file__).parent / "results"
TARGET_ORACLE = 0.95
NOISE = 0.02  # tuned / best arm without checkpointing may be this far below 1.0
K2 = margin_for("memory", fixed_shapes=True)  # the headroom the tuner keeps (fixed shapes)
ALLOC = "PYTORCH_CUDA_ALLOC_CONF"
BUDGET = "compile.memory_budget"  # the profile's setting: torch._functorch's, for its compiles
EXPANDABLE = "expandable_segments:True"
DEFAULT_LIMITS = {"gpt2-large": (24.0, 16.0), "llama-1b": (24.0,)}
RESULT_LINE = "MEMORY_REGIME_ARM "  # a child's one line of JSON on stdout starts so
CHILD_LIMIT_S = 3600.0
PARENT_ENV = {ALLOC: os.environ.get(ALLOC)}  # what this process starts CUDA with
TABLE = "| arm | process | settings | largest batch | batch | samples/s | peak GiB | K2 margin |"


@dataclasses.dataclass
class Spec:
    """One arm: what trains, the cap, the environment (None unsets), ``batch`` (None: search)."""

    label: str
    workload: str
    device: str
    limit_gib: float
    base: dict[str, Any]
    config: dict[str, Any]
    checkpointing: bool
    memory_budget: float | None
    env: dict[str, str | None]
    seconds: float
    max_batch: int
    batch: int | None = None


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)  # stdout is the child's answer


def _fits(loop: TrainingLoop, config: TrainConfig, size: int) -> bool:
    """One short training run at ``size`` (the loop's warm-up and its fewest steps)."""
    with suppress(ArmFailed, torch.OutOfMemoryError):
        loop.measure(config.model_copy(update={"batch_size": size}), 0.0)
        return True
    release_memory(loop.device)  # out of memory: its frames are gone once the block is left
    return False


def largest_batch(fits: Callable[[int], bool], max_batch: int) -> tuple[int, list[list[Any]]]:
    """The largest size that fits (0: none), doubling from 1 to the first that does not (or
    ``max_batch``), then bisecting; with every (size, fits) trial in order."""
    trials: list[list[Any]] = []

    def trial(size: int) -> bool:
        ok = fits(size)
        trials.append([size, ok])
        _say(f"      batch {size}: {'fits' if ok else 'out of memory'}")
        return ok

    good, bad, size = 0, None, 1
    while bad is None and good < max_batch:
        if trial(size):
            good, size = size, min(2 * size, max_batch)
        else:
            bad = size
    while bad is not None and bad - good > 1 and good > 0:
        middle = (good + bad) // 2
        good, bad = (middle, bad) if trial(middle) else (good, middle)
    return good, trials


def _measurement(
    loop: TrainingLoop, config: TrainConfig, spec: Spec, cap: int | None
) -> dict[str, Any]:
    """Samples/s at ``config`` for ``spec.seconds``, and the peak memory it took."""
    if cuda := spec.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    began = time.perf_counter()
    row: dict[str, Any] = {"batch": config.batch_size, "samples_per_s": None, "error": None}
    try:
        row["samples_per_s"] = loop.measure(config, spec.seconds)
    except (ArmFailed, torch.OutOfMemoryError) as failure:
        row["error"] = str(failure).splitlines()[0][:300]
    if row["error"] is not None:
        release_memory(spec.device)
    row["peak_allocated_bytes"] = int(torch.cuda.max_memory_allocated()) if cuda else None
    row["peak_reserved_bytes"] = reserved = int(torch.cuda.max_memory_reserved()) if cuda else None
    row["over_cap"] = bool(cap and reserved and reserved > cap)  # not honoured: out of the oracle
    rate = row["samples_per_s"]
    shown = row["error"] if rate is None else f"{rate:,.1f} samples/s"
    _say(f"    {spec.label} @ {config.batch_size}: {shown} ({time.perf_counter() - began:.0f} s)")
    return row


def run_arm(spec: Spec) -> dict[str, Any]:
    """The arm in this process: its largest batch (unless ``spec.batch``), then measured."""
    workload = dataclasses.replace(resolve_workload(spec.workload), dataset=None)
    base = Settings.model_validate(spec.base)
    config = TrainConfig.model_validate(spec.config)
    cap = int(spec.limit_gib * 2**30) if spec.device == "cuda" else None
    loop = TrainingLoop(workload, spec.device, settings=base)  # type: ignore[arg-type]
    result: dict[str, Any] = {
        **{k: v for k, v in dataclasses.asdict(spec).items() if k not in ("base", "config")},
        "settings": config.describe().replace(f"batch {config.batch_size}, ", ""),
        "env_seen": {name: os.environ.get(name) for name in spec.env},
        "pid": os.getpid(),
        "held_before_bytes": int(torch.cuda.memory_allocated()) if cap else None,  # should be 0
        **dict.fromkeys(("largest_batch", "error")),
        "trials": [],
        "measurements": [],
    }
    _say(f"  {spec.label}")
    try:
        with memory_capped(spec.device, cap):
            sizes = [spec.batch] if spec.batch is not None else []
            if spec.batch is None:
                fits = partial(_fits, loop, config)
                largest, result["trials"] = largest_batch(fits, spec.max_batch)
                result["largest_batch"] = largest or None
                kept = _kept(largest, result["trials"])
                sizes = sorted({largest, kept or 0, largest // 2} - {0}, reverse=True)
                result["error"] = None if largest else "does not fit"
            for size in sizes:
                sized = config.model_copy(update={"batch_size": size})
                row = _measurement(loop, sized, spec, cap)
                row["headroom"] = spec.batch is not None or size <= (kept or size)
                result["measurements"].append(row)
    except NotCheckpointable as refused:
        result["error"] = f"not checkpointable: {refused}"
    return result


def _kept(largest: int, trials: list[list[Any]]) -> int | None:
    """K2's size for an arm whose search ``memory`` stopped (a size ran out of memory): 90% of
    its largest batch, rounded down, as the tuner takes its margin in samples; None where no
    size ran out (the batch cap stopped it: no margin, as the tuner takes none) or none fit."""
    if not largest or all(ok for _size, ok in trials):
        return None
    return apply_margin(largest, K2)


def _release(device: str) -> None:
    """Nothing of one arm left for the next: its compiled graphs, its model, its cache."""
    torch._dynamo.reset()
    gc.collect()
    release_memory(device)


def run_in_child(spec: Spec) -> dict[str, Any]:
    """The arm in a fresh interpreter with ``spec.env`` set: this script with ``--arm``."""
    env = {k: v for k, v in {**os.environ, **spec.env}.items() if v is not None}
    command = [sys.executable, str(Path(__file__).resolve()), "--arm", json.dumps(spec.__dict__)]
    try:
        done = subprocess.run(
            command, env=env, stdout=subprocess.PIPE, text=True, timeout=CHILD_LIMIT_S, check=False
        )
        lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT_LINE)]
        why = f"exited with {done.returncode}"
    except subprocess.TimeoutExpired:
        lines, why = [], f"ran past {CHILD_LIMIT_S:g} s"
    if not lines:
        failed = {k: v for k, v in spec.__dict__.items() if k not in ("base", "config")}
        return {**failed, "process": "child", "measurements": [], "error": f"the child {why}"}
    return {**json.loads(lines[-1][len(RESULT_LINE) :]), "process": "child"}


def run(spec: Spec) -> dict[str, Any]:
    """The arm here where this process's environment is the arm's, else in a child."""
    if all(PARENT_ENV.get(name, os.environ.get(name)) == v for name, v in spec.env.items()):
        result = {**run_arm(spec), "process": "parent"}
        _release(spec.device)  # the arm's loop and model are gone with ``run_arm``'s frame
        return result
    return run_in_child(spec)


def grid(template: Spec, args: argparse.Namespace) -> list[Spec]:
    """Checkpointing x compile (x its memory budgets) x the allocator, each its own batches."""
    compiles: list[tuple[str | None, float | None]] = [(None, None)]
    if not args.eager_only:
        budgets = [] if args.quick else [("default", b) for b in args.memory_budgets]
        compiles += [("default", None), *budgets]
    allocators = args.allocators or (["default"] if args.quick else ["default", EXPANDABLE])
    specs = []
    for checkpointing, (mode, budget), allocator in product((False, True), compiles, allocators):
        how = "eager" if mode is None else f"compiled ({mode})"
        how += "" if budget is None else f", activation_memory_budget {budget}"
        settings = {
            **{k: v for k, v in template.config["settings"].items() if k != BUDGET},
            "activation_checkpointing": checkpointing,
            **({} if budget is None else {BUDGET: budget}),  # the profile's own setting
        }
        arm: dict[str, Any] = {
            "label": f"checkpointing {'on' if checkpointing else 'off'}, {how}, {allocator}",
            "config": {**template.config, "compile_mode": mode, "settings": settings},
            "checkpointing": checkpointing,
            "memory_budget": budget,
            "env": {ALLOC: None if allocator == "default" else allocator},
        }
        specs.append(dataclasses.replace(template, batch=None, **arm))
    return specs


def _profile(name: str, limit: float, args: argparse.Namespace) -> Profile | str:
    """The profile given for ``NAME@LIMIT``, else ``tune()``'s; its plan where nothing fits."""
    given = args.given.get(f"{name}@{limit:g}")
    _say(f"{name} under {limit:g} GiB: {'tuning' if given is None else 'profile ' + given}")
    if given is not None:
        return load_profile(given)
    began = time.perf_counter()

    def progress(step: str, what: str) -> None:
        _say(f"  [{time.perf_counter() - began:6.1f} s] {step}: {what}")

    limits = {"memory_limit_gib": limit, "max_batch_size": args.max_batch}
    try:
        return tune(name, mode=args.mode, budget_s=args.budget, progress=progress, **limits)
    except DoesNotFitError as error:
        _say(f"  does not fit: {error}")
        return str(error)


def _template(name: str, limit: float, profile: Profile | None, args: argparse.Namespace) -> Spec:
    """The tuned arm; without a profile (nothing fits), the rules' settings for the grid."""
    if profile is None:
        wanted = Preferences(mode=Mode(args.mode), model_kind=resolve_workload(name).kind)
        profile = rules_profile(detect(), wanted)
    settings = profile.settings.model_copy(update={"device": args.device})
    loader = {"num_workers": 0, "prefetch_factor": None, "pin_memory": False}  # data on device
    config = tuned_config(profile).model_copy(update=loader)
    base, train = settings.model_dump(mode="json"), config.model_dump(mode="json")
    env: dict[str, str | None] = {ALLOC: None, **base["environment"]}
    on = "on" if settings.activation_checkpointing else "off"
    return Spec(
        f"tuned: checkpointing {on}, {env[ALLOC] or 'default'}",
        name,
        args.device,
        limit,
        base,
        train,
        settings.activation_checkpointing,
        None,
        env,
        args.seconds,
        args.max_batch,
        config.batch_size,
    )


def _rate(row: dict[str, Any]) -> float:
    return 0.0 if row.get("over_cap") else float(row["samples_per_s"] or 0.0)


def _best(rows: list[tuple[dict[str, Any], dict[str, Any]]]) -> dict[str, Any] | None:
    if not rows:
        return None
    arm, row = max(rows, key=lambda pair: _rate(pair[1]))
    return {"arm": arm.get("label"), "batch": row.get("batch"), "samples_per_s": _rate(row)}


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """Oracle, best arm without checkpointing, the ratios and whether the targets held (every
    row); and the same among the rows that keep K2's margin (``headroom_``), for the record."""
    rows = [(arm, row) for arm in result["arms"] for row in arm["measurements"] if _rate(row) > 0]
    kept = [(arm, row) for arm, row in rows if row.get("headroom", True)]
    best: dict[str, Any] = {}
    for prefix, chosen in (("", rows), ("headroom_", kept)):
        best[f"{prefix}oracle"] = _best(chosen)
        unchecked = [(arm, row) for arm, row in chosen if not arm["checkpointing"]]
        best[f"{prefix}best_without_checkpointing"] = _best(unchecked)
    tuned = result["tuned"]["measurements"] if result["tuned"] else []
    rate = _rate(tuned[0]) if tuned else 0.0
    if result["does_not_fit"] is not None:  # the tuner found no fit: neither may the grid
        return {**best, "targets_held": best["oracle"] is None}
    if not rate or best["oracle"] is None:  # the tuned arm did not train under the cap
        return {**best, "targets_held": False}
    ratios = {}
    for prefix in ("", "headroom_"):
        if (oracle := best[f"{prefix}oracle"]) is not None:
            ratios[f"tuned_over_{prefix}oracle"] = rate / oracle["samples_per_s"]
        if (unchecked_best := best[f"{prefix}best_without_checkpointing"]) is not None:
            ratios[f"tuned_over_{prefix}no_checkpointing"] = rate / unchecked_best["samples_per_s"]
    held = ratios["tuned_over_oracle"] >= TARGET_ORACLE
    held = held and ratios.get("tuned_over_no_checkpointing", 1.0) >= 1.0 - NOISE
    return {**best, **ratios, "targets_held": held}


DECIDED = (  # the tuned profile's reasons kept with its numbers: why it chose what it did
    "batch.batch_size",
    "activation_checkpointing",
    "compile.enabled",
    "compile.memory_budget",
    "optimizer.fused",
    "environment.PYTORCH_CUDA_ALLOC_CONF",
)


def reasons(profile: Profile) -> dict[str, str]:
    """The tuned profile's decisions that shape memory and speed, each its setting's reason."""
    decided = {name: profile.decision(name) for name in DECIDED}
    return {name: d.reason for name, d in decided.items() if d is not None}


def _run_workload(name: str, limit: float, args: argparse.Namespace) -> dict[str, Any]:
    profile = _profile(name, limit, args)
    _release(args.device)  # what the probe compiled and cached
    fitted = profile if isinstance(profile, Profile) else None
    template = _template(name, limit, fitted, args)
    result: dict[str, Any] = {
        "workload": name,
        "limit_gib": limit,
        "cap_applied": args.device == "cuda",
        "profile": args.given.get(f"{name}@{limit:g}", "tune()"),
        "does_not_fit": None if fitted is not None else profile,
        "reasons": reasons(fitted) if fitted is not None else {},
        "tuned": run(template) if fitted is not None else None,
    }
    for setting, reason in result["reasons"].items():
        _say(f"  {setting}: {reason}")
    _progress(args, {k: v for k, v in result.items() if k != "does_not_fit"})
    result["arms"] = []
    for spec in grid(template, args):
        result["arms"].append(run(spec))
        _progress(args, {"workload": name, "limit_gib": limit, "arm": result["arms"][-1]})
    return {**result, **summarize(result)}


def _progress(args: argparse.Namespace, done: dict[str, Any]) -> None:
    """One JSON line a measurement as it finishes (``memory_regime.progress.jsonl``): what a
    run cut short by its time limit still leaves."""
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "memory_regime.progress.jsonl").open("a") as lines:
        lines.write(json.dumps(done, default=str) + "\n")


def _versions(device: str) -> dict[str, Any]:
    cuda = torch.cuda.get_device_properties(0) if device == "cuda" else None
    return {
        "device": cuda.name if cuda else "cpu",
        "memory_total_bytes": int(cuda.total_memory) if cuda else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "torch_autotune": __version__,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def _rows(label: str, arm: dict[str, Any]) -> list[str]:
    head = f"| {label} | {arm.get('process', '?')} | {arm.get('settings', '')} |"
    if not arm["measurements"]:
        return [f"{head} | | {arm['error']} | | |"]
    lines = []
    for row in arm["measurements"]:
        rate = row["samples_per_s"]
        shown = f"{rate:,.1f}" if rate is not None else f"failed: {row['error']}"
        shown += " (over the cap)" if row.get("over_cap") else ""
        peak = f"{row['peak_allocated_bytes'] / 2**30:.2f}" if row["peak_allocated_bytes"] else ""
        margin = "yes" if row.get("headroom", True) else "no"
        largest = arm.get("largest_batch") or ""
        lines.append(f"{head} {largest} | {row['batch']} | {shown} | {peak} | {margin} |")
    return lines


_KEPT = ("tuned_over_headroom_oracle", "tuned_over_headroom_no_checkpointing")


def _named(best: dict[str, Any] | None) -> str:
    return "none fits" if best is None else f"{best['arm']} @ {best['batch']}"


def _markdown(versions: dict[str, Any], results: list[dict[str, Any]]) -> str:
    lines = [
        f"# Tuned profile against the memory-regime grid on {versions['device']}",
        "",
        f"torch {versions['torch']}, CUDA {versions['cuda']}, Python {versions['python']}, "
        f"torch-autotune {versions['torch_autotune']}, {versions['date']}. Data on the device; "
        "one training loop for every arm; the allocator capped at the limit.",
    ]
    for result in results:
        cap = "" if result["cap_applied"] else " (not applied: CPU smoke run)"
        lines += ["", f"## {result['workload']} under {result['limit_gib']:g} GiB{cap}", ""]
        if result["does_not_fit"] is not None:
            lines += [f"The tuner: does not fit. {result['does_not_fit']}", ""]
        lines += [TABLE, "|---|---|---|---:|---:|---:|---:|---|"]
        lines += (
            _rows(f"**{result['tuned']['label']}**", result["tuned"]) if result["tuned"] else []
        )
        for arm in result["arms"]:
            lines += _rows(arm["label"], arm)
        keys = ("tuned_over_oracle", "tuned_over_no_checkpointing")
        said = ", ".join(f"{k} {result[k]:.3f}" for k in keys if k in result) or "no ratio"
        kept = ", ".join(f"{k} {result[k]:.3f}" for k in _KEPT if k in result) or "no ratio"
        oracle = _named(result.get("oracle"))
        held = "held" if result["targets_held"] else "MISSED"
        lines += [
            "",
            f"Oracle (every row): {oracle}. {said}; targets {held}. Among the rows that keep "
            f"K2's margin, as the tuner does: {_named(result.get('headroom_oracle'))}; {kept}.",
        ]
        if result.get("reasons"):
            lines += ["", "The tuned profile's reasons:", ""]
            lines += [f"- `{name}`: {reason}" for name, reason in result["reasons"].items()]
    return "\n".join(lines) + "\n"


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--workloads", nargs="+", default=["gpt2-large", "llama-1b"])
    parser.add_argument("--limits", nargs="+", type=float, help="GiB; default per workload")
    parser.add_argument("--profile", action="append", default=[], metavar="NAME@LIMIT=FILE")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--mode", default="speed", choices=[m.value for m in Mode])
    parser.add_argument("--budget", type=float, default=None, help="tune()'s; default its own")
    parser.add_argument("--max-batch", type=int, default=1024)
    parser.add_argument("--memory-budgets", nargs="+", type=float, default=[0.8, 0.5])
    parser.add_argument("--quick", action="store_true", help="no allocator axis, no budget arms")
    parser.add_argument("--eager-only", action="store_true", help="no compiled arm (smoke runs)")
    parser.add_argument("--allocators", nargs="+", help="'default' or PYTORCH_CUDA_ALLOC_CONF")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--arm", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if bad := [n for n in args.workloads if ":" not in n and n not in BUILTIN_WORKLOADS]:
        parser.error(f"no such workload: {', '.join(bad)} (a built-in or package.module:factory)")
    args.given = {}
    for item in args.profile:
        key, _, path = item.partition("=")
        name, _, limit = key.partition("@")
        if not re.fullmatch(r"\d+(\.\d*)?", limit) or not path:
            parser.error(f"--profile takes NAME@LIMIT=FILE (gpt2-large@24=p.yaml), not {item}")
        args.given[f"{name}@{float(limit):g}"] = path
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.arm is not None:  # a child: one arm, its result as one line on stdout
        print(RESULT_LINE + json.dumps(run_arm(Spec(**json.loads(args.arm)))), flush=True)
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        print("memory_regime: no CUDA GPU here; this benchmark needs one", file=sys.stderr)
        return 2
    versions = _versions(args.device)
    runs = [(n, lim) for n in args.workloads for lim in args.limits or DEFAULT_LIMITS.get(n, (24,))]
    results = [_run_workload(name, float(limit), args) for name, limit in runs]
    slug = re.sub(r"[^a-z0-9]+", "-", versions["device"].lower()).strip("-")
    args.out.mkdir(parents=True, exist_ok=True)
    document = {"versions": versions, "quick": args.quick, "mode": args.mode, "results": results}
    (args.out / f"memory_regime_{slug}.json").write_text(json.dumps(document, indent=2) + "\n")
    (args.out / f"memory_regime_{slug}.md").write_text(_markdown(versions, results))
    print(_markdown(versions, results))
    return 0 if all(result["targets_held"] for result in results) else 1


if __name__ == "__main__":
    sys.exit(main())

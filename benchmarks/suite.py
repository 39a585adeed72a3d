"""Run the test suite tier by tier and record what passed, on which machine, in how long.

Each tier runs as its own ``python -m pytest -m EXPR`` in a fresh interpreter, so its wall
time is what a developer waits for that command; together the four tiers are exactly the tests
of a plain ``python -m pytest``. The machine (GPU, driver, torch, CUDA, cuDNN, Python) comes
from torch-autotune's own fast detection.

    python benchmarks/suite.py [--tiers quick slow system gpu] [--out benchmarks/results]
                               [--name NAME] [-- PYTEST_ARGS]

Writes ``suite_<machine>.json`` and ``.md`` (machine: ``--name``, else the first GPU's name,
else ``cpu``) and each tier's pytest log beside them. Exit status 0 when no test failed in any
tier (skips are allowed: the GPU tier skips where there is no GPU), 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

RESULTS = Path(__file__).parent / "results"

# The README's development section names these; the four selections partition the suite.
TIERS = {
    "quick": "not slow and not system and not gpu",
    "slow": "slow and not system and not gpu",
    "system": "system and not gpu",
    "gpu": "gpu",
}
QUICK_TARGET_S = 60.0  # issue 10: the quick loop on 2 cores


def _machine() -> dict[str, Any]:
    """The machine the tests ran on, as torch-autotune detects it (no torch import)."""
    import torch_autotune
    from torch_autotune import __version__, detect

    snapshot = detect()
    software = snapshot.software
    gpus = [a.name for a in snapshot.accelerators]
    return {
        "device": gpus[0] if gpus else "cpu",
        "gpus": gpus,
        "cpus_usable": snapshot.host.cpus_usable,
        "memory_total_bytes": snapshot.host.memory_total_bytes,
        "os": platform.platform(),
        "python": software.python_version,
        "torch": software.torch_version,
        "cuda": software.torch_cuda_version,
        "cudnn": software.cudnn_version,
        "driver": software.nvidia_driver_version,
        "triton": software.triton_version,
        "torch_autotune": __version__,
        # this checkout's src/ (an editable install), or a built wheel installed elsewhere
        "installed": "checkout"
        if Path(torch_autotune.__file__).parents[1] == Path(__file__).resolve().parents[1] / "src"
        else "wheel",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def _outcome(case: ElementTree.Element) -> tuple[str, str]:
    """A JUnit test case's outcome and, for a failure, the first line of its message."""
    for tag, outcome in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
        found = case.find(tag)
        if found is not None:
            message = (found.get("message") or found.text or "").strip()
            return outcome, message.splitlines()[0] if message else ""
    return "passed", ""


def _run_tier(name: str, selection: str, extra: list[str], log: Path) -> dict[str, Any]:
    """Run one tier, keep its log, and summarise its JUnit report."""
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "junit.xml"
        command = [sys.executable, "-m", "pytest", "-m", selection, "-q"]
        command += ["-p", "no:cacheprovider", f"--junitxml={report}", *extra]
        started = time.perf_counter()
        with log.open("w") as out:
            done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, check=False)
        wall_s = time.perf_counter() - started
        cases = ElementTree.parse(report).getroot().iter("testcase") if report.exists() else []
        tests = [(case, *_outcome(case)) for case in cases]
    counts = dict.fromkeys(("passed", "failed", "error", "skipped"), 0)
    for _, outcome, _ in tests:
        counts[outcome] += 1

    def test_id(case: ElementTree.Element) -> str:
        return f"{case.get('classname')}::{case.get('name')}"

    ran = [(float(case.get("time") or 0), test_id(case)) for case, o, _ in tests if o != "skipped"]
    return {
        "tier": name,
        "selection": selection,
        "exit_status": done.returncode,  # 5: nothing selected, as for the GPU tier on a CPU
        "wall_s": round(wall_s, 1),
        **counts,
        "slowest": [{"test": t, "s": round(s, 2)} for s, t in sorted(ran, reverse=True)[:5]],
        "not_passed": [
            {"test": test_id(case), "outcome": outcome, "message": message}
            for case, outcome, message in tests
            if outcome in ("failed", "error")
        ],
        "log": log.name,
    }


def _markdown(machine: dict[str, Any], tiers: list[dict[str, Any]], extra: list[str]) -> str:
    gpus = ", ".join(machine["gpus"]) or "none"
    lines = [
        f"# The test suite on {machine['device']}",
        "",
        f"GPUs: {gpus}; driver {machine['driver']}; {machine['cpus_usable']} usable CPUs; "
        f"{machine['os']}. Python {machine['python']}, torch {machine['torch']}, CUDA "
        f"{machine['cuda']}, cuDNN {machine['cudnn']}, Triton {machine['triton']}, "
        f"torch-autotune {machine['torch_autotune']} (from the {machine['installed']}); "
        f"{machine['date']}.",
        *(
            ["", f"Every tier ran with `{' '.join(extra)}` (the GPU tier without `-n`)."]
            if extra
            else []
        ),
        "",
        "| tier | `-m` | passed | failed | errors | skipped | wall s |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for t in tiers:
        lines.append(
            f"| {t['tier']} | `{t['selection']}` | {t['passed']} | {t['failed']} | "
            f"{t['error']} | {t['skipped']} | {t['wall_s']:.1f} |"
        )
    for t in tiers:
        if t["not_passed"]:
            lines += ["", f"## Failures in the {t['tier']} tier", ""]
            lines += [f"- `{f['test']}` ({f['outcome']}): {f['message']}" for f in t["not_passed"]]
    lines += ["", "## Slowest tests of each tier", ""]
    for t in tiers:
        slowest = ", ".join(f"`{s['test']}` {s['s']:.1f} s" for s in t["slowest"]) or "none ran"
        lines.append(f"- {t['tier']}: {slowest}")
    return "\n".join(lines) + "\n"


def _serial(extra: list[str]) -> list[str]:
    """``extra`` without pytest-xdist's ``-n N``: the GPU tier's tests share one device, and
    one's allocations would move another's memory limit and timings."""
    kept: list[str] = []
    skip = False
    for word in extra:
        if skip:
            skip = False
        elif word in ("-n", "--numprocesses"):
            skip = True
        elif not word.startswith(("-n=", "--numprocesses=")) and not re.fullmatch(r"-n\d+", word):
            kept.append(word)
    return kept


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiers", nargs="+", choices=list(TIERS), default=list(TIERS))
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--name", help="names the result files (default: the first GPU's name, else cpu)"
    )
    parser.add_argument("pytest_args", nargs="*", help="passed to each pytest run (after --)")
    args = parser.parse_args()
    machine = _machine()
    slug = re.sub(r"[^a-z0-9.]+", "-", (args.name or machine["device"]).lower()).strip("-.")
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    tiers = []
    for name in args.tiers:
        print(f"suite: {name} tier (-m '{TIERS[name]}') ...", file=sys.stderr, flush=True)
        log = args.out / f"suite_{slug}_{name}.log"
        extra = _serial(args.pytest_args) if name == "gpu" else args.pytest_args
        tiers.append(_run_tier(name, TIERS[name], extra, log))
    result = {"benchmark": "suite", "machine": machine, "pytest_args": args.pytest_args}
    result["tiers"] = tiers
    (args.out / f"suite_{slug}.json").write_text(json.dumps(result, indent=2) + "\n")
    text = _markdown(machine, tiers, args.pytest_args)
    (args.out / f"suite_{slug}.md").write_text(text)
    print(text)
    quick = next((t for t in tiers if t["tier"] == "quick"), None)
    if quick is not None:
        verdict = "met" if quick["wall_s"] <= QUICK_TARGET_S else "missed"
        print(f"quick tier: {quick['wall_s']:.1f} s (target <= {QUICK_TARGET_S:g} s): {verdict}")
    failed = any(t["failed"] or t["error"] or t["exit_status"] not in (0, 5) for t in tiers)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

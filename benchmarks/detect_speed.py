"""Time `autotune detect --json` against `python -m torch.utils.collect_env` in one run.

Both commands run interleaved (A, B, A, B, ...) after one untimed warm-up each, so machine noise
hits both alike; the table shows median and spread, and the ratio of medians must be >= 8
(issue: detection must be at least 8x faster than collect_env, which imports torch).

    python benchmarks/detect_speed.py [--repeats 9] [--output benchmarks/results/detect_speed.json]

Exit status 0 when the target holds, 1 when it does not.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import sysconfig
import time
from datetime import datetime, timezone
from pathlib import Path

TARGET_RATIO = 8.0


def _command(name: str) -> list[str]:
    if name == "autotune detect --json":
        # the script installed for this interpreter: the first on PATH may run another torch
        executable = shutil.which("autotune", path=sysconfig.get_path("scripts"))
        return (
            [executable, "detect", "--json"]
            if executable
            else [sys.executable, "-m", "torch_autotune", "detect", "--json"]
        )
    return [sys.executable, "-m", "torch.utils.collect_env"]


def _children_cpu() -> float:
    """CPU seconds used by finished child processes so far (0 where the OS cannot say)."""
    try:
        import resource
    except ImportError:  # Windows
        return 0.0
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _time(command: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds of one run of ``command``."""
    cpu_before = _children_cpu()
    started = time.perf_counter()
    subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - started, _children_cpu() - cpu_before


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--output", type=Path, default=Path("benchmarks/results/detect_speed.json"))
    args = parser.parse_args()

    # An installed wheel has its bytecode compiled at install time; an editable install under
    # PYTHONDONTWRITEBYTECODE never has, and would be timed compiling its own source.
    import torch_autotune

    compileall.compile_dir(Path(torch_autotune.__file__).parent, quiet=1)
    names = ["autotune detect --json", "python -m torch.utils.collect_env"]
    commands = {name: _command(name) for name in names}
    for command in commands.values():
        _time(command)  # warm the file cache; not counted
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    for _ in range(args.repeats):
        for name in names:
            samples[name].append(_time(commands[name]))

    rows = []
    for name in names:
        wall = [w for w, _ in samples[name]]
        cpu = [c for _, c in samples[name]]
        rows.append(
            {
                "command": name,
                "median_s": round(statistics.median(wall), 4),
                "min_s": round(min(wall), 4),
                "max_s": round(max(wall), 4),
                "median_cpu_s": round(statistics.median(cpu), 4),
            }
        )
    ratio = rows[1]["median_s"] / rows[0]["median_s"]
    cpu_ratio = rows[1]["median_cpu_s"] / max(rows[0]["median_cpu_s"], 1e-9)
    print(f"{'command':36} {'median s':>9} {'min s':>7} {'max s':>7} {'median CPU s':>13}")
    for row in rows:
        print(
            f"{row['command']:36} {row['median_s']:9.3f} {row['min_s']:7.3f} "
            f"{row['max_s']:7.3f} {row['median_cpu_s']:13.3f}"
        )
    verdict = "PASS" if ratio >= TARGET_RATIO else "FAIL"
    target = f"target >= {TARGET_RATIO:g}x"
    print(f"detection is {ratio:.1f}x faster than collect_env ({target}): {verdict}")
    print(f"(CPU time ratio {cpu_ratio:.1f}x; the verdict uses wall time, what a user waits)")

    result = {
        "benchmark": "detect_speed",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "os": platform.platform(),
            "python": platform.python_version(),
            "torch_autotune": torch_autotune.__version__,
        },
        "repeats": args.repeats,
        "rows": rows,
        "ratio": round(ratio, 2),
        "cpu_ratio": round(cpu_ratio, 2),
        "target_ratio": TARGET_RATIO,
        "verdict": verdict,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())

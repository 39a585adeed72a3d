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
import platform
import shutil
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

TARGET_RATIO = 8.0


def _command(name: str) -> list[str]:
    if name == "autotune detect --json":
        executable = shutil.which("autotune")
        return (
            [executable, "detect", "--json"]
            if executable
            else [sys.executable, "-m", "torch_autotune", "detect", "--json"]
        )
    return [sys.executable, "-m", "torch.utils.collect_env"]


def _time(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - started


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
    samples: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(args.repeats):
        for name in names:
            samples[name].append(_time(commands[name]))

    rows = []
    for name in names:
        values = samples[name]
        rows.append(
            {
                "command": name,
                "median_s": round(statistics.median(values), 4),
                "min_s": round(min(values), 4),
                "max_s": round(max(values), 4),
            }
        )
    ratio = rows[1]["median_s"] / rows[0]["median_s"]
    print(f"{'command':38} {'median s':>9} {'min s':>7} {'max s':>7}")
    for row in rows:
        print(f"{row['command']:38} {row['median_s']:9.3f} {row['min_s']:7.3f} {row['max_s']:7.3f}")
    verdict = "PASS" if ratio >= TARGET_RATIO else "FAIL"
    target = f"target >= {TARGET_RATIO:g}x"
    print(f"detection is {ratio:.1f}x faster than collect_env ({target}): {verdict}")

    result = {
        "benchmark": "detect_speed",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "python": platform.python_version(),
            "torch_autotune": torch_autotune.__version__,
        },
        "repeats": args.repeats,
        "rows": rows,
        "ratio": round(ratio, 2),
        "target_ratio": TARGET_RATIO,
        "verdict": verdict,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())

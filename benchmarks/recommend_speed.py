"""Time `import torch_autotune; torch_autotune.recommend()` with a stored profile.

Stores this machine's rules-only profile in a temporary store, then runs the one-liner in fresh
interpreters (one untimed warm-up, then ``--repeats`` timed runs) and checks that it stays under
the target and never imports torch. Prints a table; writes benchmarks/results/recommend_speed.json.

    python benchmarks/recommend_speed.py [--repeats 15]

Exit status 0 when the target holds, 1 when it does not.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

TARGET_S = 0.3
ONE_LINER = "import torch_autotune; torch_autotune.recommend()"
CHECK = (
    "import sys, torch_autotune; p = torch_autotune.recommend(); "
    "print(p.provenance.fingerprint, 'torch' in sys.modules)"
)


def _run(code: str, env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument(
        "--output", type=Path, default=Path("benchmarks/results/recommend_speed.json")
    )
    args = parser.parse_args()

    import torch_autotune
    from torch_autotune.rules.engine import build_profile
    from torch_autotune.store import ENV_HOME, ProfileStore

    # A wheel install has compiled bytecode; an editable one under PYTHONDONTWRITEBYTECODE not.
    compileall.compile_dir(Path(torch_autotune.__file__).parent, quiet=1)
    with tempfile.TemporaryDirectory() as store:
        stored = build_profile(torch_autotune.detect())
        ProfileStore(store).save(stored)
        env = {**os.environ, ENV_HOME: store}
        check = subprocess.run(
            [sys.executable, "-c", CHECK], env=env, check=True, capture_output=True, text=True
        ).stdout.split()
        used_stored = check[0] == stored.provenance.fingerprint
        imported_torch = check[1] == "True"
        baseline = [_run("pass", env) for _ in range(args.repeats)]
        _run(ONE_LINER, env)  # warm the file cache
        samples = [_run(ONE_LINER, env) for _ in range(args.repeats)]

    median = statistics.median(samples)
    rows = [
        ("python -c pass (interpreter start)", baseline),
        (f'python -c "{ONE_LINER}"', samples),
    ]
    print(f"{'command':62} {'median s':>9} {'min s':>7} {'max s':>7}")
    for name, values in rows:
        print(f"{name:62} {statistics.median(values):9.3f} {min(values):7.3f} {max(values):7.3f}")
    ok = median < TARGET_S and used_stored and not imported_torch
    print(
        f"recommend() with a stored profile: {median:.3f} s median (target < {TARGET_S} s), "
        f"stored profile used: {used_stored}, torch imported: {imported_torch}: "
        f"{'PASS' if ok else 'FAIL'}"
    )
    result = {
        "benchmark": "recommend_speed",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count(),
            "os": platform.platform(),
            "python": platform.python_version(),
            "torch_autotune": torch_autotune.__version__,
        },
        "repeats": args.repeats,
        "interpreter_start_median_s": round(statistics.median(baseline), 4),
        "median_s": round(median, 4),
        "min_s": round(min(samples), 4),
        "max_s": round(max(samples), 4),
        "target_s": TARGET_S,
        "stored_profile_used": used_stored,
        "torch_imported": imported_torch,
        "verdict": "PASS" if ok else "FAIL",
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

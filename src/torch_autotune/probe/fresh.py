"""A few trials in a fresh process, for what a process reads only when CUDA starts (the
caching allocator's ``PYTORCH_CUDA_ALLOC_CONF``): the parent writes what to run as one JSON
document to the child's standard input, the child (``python -m torch_autotune.probe.fresh``)
runs it under the environment it was given and writes one JSON line back.

What the child runs: a trial at the profile's batch and a steady point there (samples/s), then
trials at the sizes ``above`` in order, until one does not fit; the device held to the memory
limit as the parent's was (``probe.memory.memory_capped``). The workload is built again from
``Workload.rebuild`` (a built-in's name or ``module:factory``): objects in hand cannot cross.
A child that fails, or outlives ``timeout_s``, is an outcome with its error, never the run's.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from torch_autotune.probe.trials import StepSettings

__all__ = ["FreshOutcome", "FreshRequest", "main", "run_fresh"]

RESULT = "torch-autotune-fresh "
"""What the child's one line of JSON starts with (the user's code may print too)."""


@dataclass(frozen=True)
class FreshRequest:
    """What the child runs (module docstring)."""

    rebuild: str
    min_batch_size: int
    settings: dict[str, Any]  # Settings as JSON
    steps: int
    memory_limit_bytes: int | None
    batch: int
    above: list[int] = field(default_factory=list)
    seconds: float = 5.0  # the most the point may take


@dataclass(frozen=True)
class FreshOutcome:
    """What the child found: each size tried and whether it fit, its samples/s at the
    request's batch (None: not steady, or it did not fit), what it saw of the variable asked
    for, and its error (None where it ran)."""

    fits: dict[int, bool] = field(default_factory=dict)
    samples_per_s: float | None = None
    seen: str | None = None
    error: str | None = None

    @property
    def largest(self) -> int | None:
        """The largest size that fit below the first that did not (None: the first did not)."""
        largest = None
        for size, fit in self.fits.items():
            if not fit:
                break
            largest = size
        return largest


def request_for(
    settings: StepSettings, rebuild: str, min_batch_size: int, **rest: Any
) -> FreshRequest:
    """The request for a runner of ``settings`` over the workload ``rebuild`` builds."""
    return FreshRequest(
        rebuild=rebuild,
        min_batch_size=min_batch_size,
        settings=settings.settings.model_dump(mode="json"),
        steps=settings.steps,
        memory_limit_bytes=settings.memory_limit_bytes,
        **rest,
    )


def run_fresh(
    request: FreshRequest, environment: Mapping[str, str | None], *, timeout_s: float
) -> FreshOutcome:
    """``request`` in a child process whose environment is this one's with ``environment``
    (None: the variable unset); what it found, or its error."""
    env = {k: v for k, v in os.environ.items() if k not in environment}
    env.update({k: v for k, v in environment.items() if v is not None})
    watched = next(iter(environment), None)
    command = [sys.executable, "-m", "torch_autotune.probe.fresh", watched or ""]
    try:
        done = _run(command, json.dumps(asdict(request)), env, timeout_s)
    except subprocess.TimeoutExpired:
        return FreshOutcome(error=f"it ran past {timeout_s:.0f} s and was stopped")
    except OSError as error:  # no interpreter to start, no memory to fork
        return FreshOutcome(error=f"it could not start ({error})")
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
    if done.returncode != 0 or not lines:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return FreshOutcome(error=f"it exited with {done.returncode}: {last[:300]}")
    try:
        found = json.loads(lines[-1].removeprefix(RESULT))
        fits = {int(size): bool(fit) for size, fit in found["fits"]}
        rate = None if found["samples_per_s"] is None else float(found["samples_per_s"])
        return FreshOutcome(fits, rate, found["seen"], found["error"])
    except (ValueError, KeyError, TypeError) as error:  # a line that only looks like ours
        return FreshOutcome(error=f"its answer could not be read ({error!r:.200})")


def _run(
    command: list[str], given: str, env: dict[str, str], timeout_s: float
) -> subprocess.CompletedProcess[str]:
    """``command`` with ``given`` on its standard input, in a session of its own, so that past
    ``timeout_s`` its own children (compile workers, DataLoader workers) end with it."""
    with subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    ) as child:
        try:
            out, err = child.communicate(given, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                os.killpg(child.pid, signal.SIGKILL)
            child.communicate()
            raise
    return subprocess.CompletedProcess(command, child.returncode, out, err)


def _child(request: FreshRequest, watched: str) -> dict[str, Any]:
    """Run ``request`` here (module docstring): what the parent reads back."""
    from torch_autotune.probe.memory import memory_capped
    from torch_autotune.probe.trials import TrialRunner
    from torch_autotune.probe.workloads import resolve_workload
    from torch_autotune.settings import Settings

    settings = StepSettings(
        Settings.model_validate(request.settings), request.steps, request.memory_limit_bytes
    )
    workload = resolve_workload(request.rebuild, min_batch_size=request.min_batch_size)
    runner = TrialRunner(workload, settings)
    fits: list[tuple[int, bool]] = []
    rate = None
    with memory_capped(settings.device, settings.memory_limit_bytes):
        runner.apply_flags(cudnn_benchmark=False)  # as the parent's search trained
        first = runner(request.batch)
        fits.append((request.batch, first.fits))
        if first.fits:
            runner.apply_flags()  # as the parent's points trained
            point = runner.point(request.batch, until=time.perf_counter() + request.seconds)
            rate = point.samples_per_s if point.fits and point.steady else None
            runner.apply_flags(cudnn_benchmark=False)
            for size in request.above:
                outcome = runner(size)
                fits.append((size, outcome.fits))
                if not outcome.fits:
                    break
    return {"fits": fits, "samples_per_s": rate, "seen": os.environ.get(watched), "error": None}


def main() -> None:
    """The child's entry point: the request on standard input, one line of JSON out."""
    watched = sys.argv[1] if len(sys.argv) > 1 else ""
    request = FreshRequest(**json.loads(sys.stdin.read()))
    try:
        found = _child(request, watched)
    except Exception as error:  # theirs or ours: the parent says it, the run goes on
        found = {
            "fits": [],
            "samples_per_s": None,
            "seen": None,
            "error": f"{type(error).__name__}: {error}",
        }
    print("\n" + RESULT + json.dumps(found), flush=True)  # noqa: T201  the parent reads it


if __name__ == "__main__":
    main()

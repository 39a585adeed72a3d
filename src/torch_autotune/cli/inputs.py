"""What a command reads: the files and standard input named on the command line, and the
profile of this machine that ``show``, ``export`` and ``report`` start from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from torch_autotune.errors import InputFileError, ProfileFileError, SnapshotFileError


def is_stdin(path: Path) -> bool:
    """Whether ``path`` is '-', standard input."""
    return str(path) == "-"


_STDIN_READ = "torch_autotune.stdin_read"


def stdin_text(error: type[InputFileError]) -> str:
    """Standard input as text, within the input limits; a terminal is refused, not waited on,
    and so is a second '-' in one command ('validate - -' read an empty second file)."""
    import sys

    from torch_autotune.input_files import read_stream

    context = click.get_current_context(silent=True)
    if context is not None:
        if context.meta.get(_STDIN_READ):
            raise click.UsageError("'-' is named twice; standard input can be read only once")
        context.meta[_STDIN_READ] = True
    stream = sys.stdin.buffer
    if stream.isatty():
        raise click.UsageError(
            "'-' reads standard input, which is a terminal here; pipe a file in, such as "
            "'autotune detect --json | autotune recommend --snapshot -'"
        )
    return read_stream(stream, "standard input", error)


def recorded_machine(snapshot_file: Path | None) -> Any:
    """The machine recorded in ``snapshot_file`` ('-': standard input); None for this one."""
    from torch_autotune.detect import RecordedMachine, parse_snapshot

    if snapshot_file is None:
        return None
    if is_stdin(snapshot_file):
        text = stdin_text(SnapshotFileError)
        return RecordedMachine(parse_snapshot(text, source="standard input"))
    return RecordedMachine.from_file(snapshot_file)


def snapshot(snapshot_file: Path | None) -> Any:
    """The snapshot of the machine recorded in ``snapshot_file``, else of this one."""
    from torch_autotune import api

    return api.detect(recorded_machine(snapshot_file))


def load_profile(path: Path) -> Any:
    """The profile in the file ``path`` ('-': standard input)."""
    from torch_autotune.profile_io import load_profile, parse_profile

    if is_stdin(path):
        return parse_profile(stdin_text(ProfileFileError), source="standard input")
    return load_profile(path)


def load_baseline(path: Path | None) -> Any:
    """The user's baseline in the file ``path`` ('-': standard input); None: the default."""
    from torch_autotune.profile_io import load_baseline, parse_baseline

    if path is None:
        return None
    if is_stdin(path):
        source = "standard input"
        baseline = parse_baseline(stdin_text(ProfileFileError), source=source)
    else:
        source, baseline = str(path), load_baseline(path)
    _check_workers(baseline, source)
    return baseline


def _check_workers(baseline: Any, source: str) -> None:
    """ProfileFileError where the baseline asks for more DataLoader workers or CPU threads than
    this machine can run (``invariants.too_many``): 8000 workers on 2 CPUs hung the bench while
    it started them, and 64 threads on 2 CPUs slowed the baseline the profile is held against."""
    counts = {"num_workers": baseline.num_workers, "cpu_threads": baseline.cpu_threads}
    _check_counts(counts, lambda name: f"{source}: {name}")


def check_profile_counts(profile: Any, path: Path) -> None:
    """ProfileFileError where the profile in ``path``, to be trained here (``bench
    --profile``), asks for more DataLoader workers or CPU threads than this machine can run:
    the bound of a baseline's, and of a profile file on the machine it was made for, which may
    be larger (a profile for a 64-CPU box validates with 16 workers; its bench on 2 CPUs ran
    past its estimate by minutes)."""
    from torch_autotune.invariants import COUNT_PATHS, cpu_counts

    source = "standard input" if is_stdin(path) else str(path)
    _check_counts(cpu_counts(profile.settings), lambda name: f"{source}: {COUNT_PATHS[name]}")


def _check_counts(counts: dict[str, int | None], named: Any) -> None:
    """ProfileFileError with ``invariants.too_many``'s line for the first of ``counts`` this
    machine cannot run, ``named`` as the file names it."""
    from torch_autotune.detect.host import cpus_usable_here
    from torch_autotune.invariants import check_cpu_counts

    try:
        check_cpu_counts(counts, cpus_usable_here, named)
    except ValueError as problem:
        raise ProfileFileError(str(problem)) from None


def check_workers_option(workers: int | None) -> None:
    """A usage error (exit 2) where ``--workers`` asks for more DataLoader workers than this
    machine can run, the bound a baseline's ``num_workers`` has (``invariants.too_many``)."""
    from torch_autotune.detect.host import cpus_usable_here
    from torch_autotune.invariants import check_cpu_counts

    try:
        check_cpu_counts({"num_workers": workers}, cpus_usable_here, lambda _name: "--workers")
    except ValueError as problem:
        raise click.UsageError(str(problem)) from None


def check_workload_name(workload: str | None, store: Path | None, *, bench: bool) -> None:
    """WorkloadError (exit 5), in one line and before anything runs, where ``-m`` names a
    stored profile measured on objects given to ``tune()``: no name builds them again, and
    the resolver's "neither a built-in workload nor a reference" did not say why."""
    from torch_autotune.errors import WorkloadError
    from torch_autotune.remeasure import from_objects
    from torch_autotune.store import ProfileStore

    if workload is None or not from_objects(workload):
        return
    if not ProfileStore(store).measured_from_objects(workload):
        return
    if bench:
        fix = (
            f"bench it from Python with them: torch_autotune.bench(torch_autotune.recommend("
            f"workload='{workload}'), workload={{'model': ..., 'optimizer': ..., 'dataset': ...}})"
        )
    else:
        fix = f"call torch_autotune.tune() with them again (name='{workload}') and save() it"
    raise WorkloadError(
        f"'{workload}' was measured on objects given to tune(), which -m cannot build again "
        f"from a name; {fix}, or give -m a package.module:factory that returns them"
    )


def current_profile(
    store: Path | None,
    mode: str | None,
    snapshot_file: Path | None,
    workload: str | None = None,
) -> Any:
    """recommend() for this machine (or a recorded one), for ``workload`` when one is named:
    stored if fresh, else rules only, with a note on stderr that says which.

    A recorded machine is another machine (or this one at another time): the store's profile
    for its fingerprint is shown when there is one, else the rules-only profile for it, and
    nothing is called stale, since this machine's history says nothing about it. A stored
    profile that cannot be used (corrupt, or made for another machine) is an error (exit 4)
    naming the file and the fix, where recommend() in a script warns and goes on.
    """
    import warnings

    from torch_autotune import api, fallback
    from torch_autotune.errors import (
        RulesOnlyWarning,
        StaleProfileWarning,
        StoredProfileWarning,
        UnusableGpuWarning,
    )

    machine = snapshot(snapshot_file)
    with warnings.catch_warnings(record=True) as caught:
        for category in (StaleProfileWarning, StoredProfileWarning, UnusableGpuWarning):
            warnings.simplefilter("always", category)
        warnings.simplefilter("ignore", RulesOnlyWarning)  # the note below says it, always
        writer = None if snapshot_file is not None else api.host_id()
        profile = api.profile_for(machine, mode, workload=workload, store=store, writer=writer)
    for warning in caught:
        if isinstance(warning.message, StoredProfileWarning):
            raise warning.message.error
    stale = False
    for warning in caught:
        stale = stale or isinstance(warning.message, StaleProfileWarning)
        click.echo(f"autotune: warning: {warning.message}", err=True)
    if not profile.measured and not stale:
        machine, where = machine_words(snapshot_file)
        stored = fallback.stored_for(store, profile, workload)
        text = fallback.why_rules_only(
            store, profile, workload, stored=stored, machine=machine, where=where
        )
        click.echo(f"autotune: note: {text}", err=True)
    return profile


def machine_words(snapshot_file: Path | None) -> tuple[str, str]:
    """How a note names the machine, and where the command that measures it runs."""
    from torch_autotune.fallback import THIS_MACHINE

    if snapshot_file is None:
        return THIS_MACHINE, ""
    where = "on standard input" if is_stdin(snapshot_file) else f"in {snapshot_file}"
    return f"the machine {where}", "on that machine"

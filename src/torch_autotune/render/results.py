"""What a run measured, as text: the summary ``autotune`` prints (the bench's, in
``render.bench_results``)."""

from __future__ import annotations

from pathlib import Path

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from torch_autotune.probe.fed_passes import batches_text
from torch_autotune.profile import CompileRecord, Evidence, Profile, RanksRecord, Source
from torch_autotune.records import SettingRecord
from torch_autotune.render.machine import facts_table, gib
from torch_autotune.rules.optimizer import except_compile, optimizer_memory_text
from torch_autotune.settings import RECORD_BY_NAME, RECORDS, Settings


def render_run(profile: Profile, console: Console, saved: Path | None) -> None:
    """The summary of a full run: machine, decisions, batch sizes, throughput, workers."""
    evidence = profile.evidence
    console.print(facts_table("torch-autotune: measured profile", _run_facts(profile)))
    if evidence is not None and evidence.throughput:
        console.print(_throughput_table(evidence))
    if evidence is not None and evidence.loader:
        console.print(_loader_table(evidence))
    if evidence is not None and evidence.fed:
        console.print(_fed_table(evidence, profile.settings))
    for warning in evidence.warnings if evidence is not None else ():
        console.print(Text(f"warning: {warning}", style="yellow"))
    if saved is not None:
        console.print(saved_note(profile, saved))


def _run_facts(profile: Profile) -> list[tuple[str, str]]:
    """The machine, what was measured and the settings in force, a row each."""
    evidence = profile.evidence
    snapshot = profile.provenance.snapshot
    gpus = ", ".join(sorted({a.name for a in snapshot.accelerators})) or "no GPU"
    facts = [
        (
            "machine",
            f"{gpus}; {snapshot.host.cpus_usable} usable CPUs; torch "
            f"{snapshot.software.torch_version}",
        ),
        ("device", profile.settings.device),
    ]
    if evidence is not None:
        limit = f"{evidence.max_batch_size} (limited by {evidence.limited_by}"
        limit += f": {evidence.limit_reason})" if evidence.limit_reason else ")"
        choice = evidence.batch_choice
        if choice is not None and choice.largest != evidence.max_batch_size:
            # the chosen point's variant searched on its own (compiled, say) and stopped lower
            limit += f"; {choice.largest} {choice.variant}"
        facts += [("workload", evidence.workload), *_workload_facts(evidence)]
        facts += [
            ("largest batch", limit),
            ("fastest batch", _fastest(evidence)),
            ("recommended", _recommended(profile, evidence)),
            ("run time", _run_time(evidence)),
        ]
        if evidence.compile is not None:
            facts.append(("torch.compile", _compile_text(evidence.compile)))
        if evidence.ranks is not None:
            facts.append(("ranks", _ranks_text(profile, evidence.ranks)))
        asked = profile.provenance.preferences.memory_limit_bytes
        if asked is not None:
            facts.append(("memory limit", _memory_limit(profile, evidence, asked)))
        facts += _memory_facts(evidence)
    facts += [
        (record.label, _shown(profile, record))
        for record in RECORDS
        if record.summary and not _inert(profile, record)
    ]
    return facts


def _memory_limit(profile: Profile, evidence: Evidence, asked: int) -> str:
    """``--memory-limit`` as it held: as asked, or the lower limit in effect where the device
    had less to give. On a GPU, what was free there (``evidence.memory_limit_bytes``: free
    plus what torch held, within the cap); on the CPU, the host RAM the probe may fill
    (``ram_budget``), within which a trial's growth stays whatever the cap: 100000 GiB on a
    23.5 GiB host read 'as asked' where 15.8 GiB held."""
    from torch_autotune.probe.plan import ram_budget

    shown = f"{asked / 2**30:g} GiB"
    if profile.settings.device == "cuda":
        free = evidence.memory_limit_bytes
        if free is None or free >= asked:
            return f"{shown} of the GPU, as asked"
        return (
            f"{shown} of the GPU asked; {gib(free)} in effect, what the GPU had free (other "
            "processes' memory and the CUDA context left out)"
        )
    ram = ram_budget(profile.provenance.snapshot)
    # a trial's peak was held to what the process held plus the cap, within ``ram``
    # (``evidence.memory_limit_bytes``, the lower of the two): ``ram`` where it bound
    if ram is None or (ram >= asked and evidence.memory_limit_bytes != ram):
        return f"{shown} of host RAM, as asked"
    return (
        f"{shown} of host RAM asked; {gib(ram)} in effect, the host RAM the probe may fill"
        " (70% of what was available), less what the process already held"
    )


def _memory_facts(evidence: Evidence) -> list[tuple[str, str]]:
    """The memory phases' rows: the allocator's setting (measured, or why not), the
    optimizer's step where it was measured (the decisions give the same numbers)."""
    facts = []
    if evidence.allocator is not None:
        record = evidence.allocator
        verdict = "kept" if record.kept else "not set"
        verdict = verdict if record.measured else "set as the rule recommends"
        facts.append(("allocator", f"{record.value} {verdict}: {record.reason}"))
    if evidence.optimizer_memory is not None:
        facts.append(("optimizer memory", optimizer_memory_text(evidence.optimizer_memory)))
    return facts


def _inert(profile: Profile, record: SettingRecord) -> bool:
    """Whether ``record``'s setting does nothing here: it takes effect only under another
    (``only_with``: compile's memory budget) that is off, and is at its default."""
    if record.only_with is None or (
        record.changed is not None and record.changed(profile.settings)
    ):
        return False
    under = RECORD_BY_NAME[record.only_with]
    return under.changed is not None and not under.changed(profile.settings)


def _shown(profile: Profile, record: SettingRecord) -> str:
    """A setting's value in the summary; with its measured decision's reason where its record
    asks for it (activation checkpointing: the numbers with it and without)."""
    shown = record.show(profile.settings)
    if not record.summary_reason:
        return shown
    decision = profile.decision(record.paths[0])
    if decision is None or decision.source is not Source.MEASURED:
        return shown
    return (
        decision.reason
        if decision.reason.startswith(f"{shown}:")
        else f"{shown}: {decision.reason}"
    )


def _workload_facts(evidence: Evidence) -> list[tuple[str, str]]:
    """How a batch reached the model and where the loss came from; where the search started
    and why; what was adapted (for a workload of the user's)."""
    details = evidence.details
    if details is None or details.source == "built-in":
        return []
    made = details.model or "a model built by a function"
    if details.framework is not None:
        made += f" ({details.framework})"
    facts = [("model", made), ("batch", details.batch)]
    if details.call is not None:
        facts.append(("step", f"{details.call}; loss: {details.loss or '?'}"))
    if details.min_batch_reason is not None:
        facts.append(("smallest batch", f"{details.min_batch_size}: {details.min_batch_reason}"))
    facts += [("note", note) for note in details.notes]
    return facts


def _fastest(evidence: Evidence) -> str:
    """The fastest batch, only where a steady throughput point measured one."""
    choice = evidence.batch_choice
    if choice is None:  # evidence of an earlier release
        steady = any(r.steady for r in evidence.throughput)
        return str(evidence.fastest_batch_size) if steady else "not measured"
    if choice.chosen_by == "top candidate":
        return "not measured: no throughput point ran"
    if choice.chosen_by in ("largest point", "fastest unsteady point"):
        return "not measured: no throughput point was steady"
    text = f"{evidence.fastest_batch_size} at {choice.samples_per_s or 0:,.0f} samples/s"
    if len({r.batch_size for r in evidence.throughput if r.compiled == choice.compiled}) == 1:
        text += f" ({ONE_SIZE})"  # fastest of one: nothing was compared
    elif choice.best_batch_size not in (None, evidence.fastest_batch_size):
        text += (
            f" (within 3% of the best, {choice.best_samples_per_s or 0:,.0f} samples/s at"
            f" {choice.best_batch_size})"
        )
    return text + (", compiled" if choice.compiled else "")


ONE_SIZE = "the only size a throughput point measured"

_CONFIRMED = {
    "its point": "its throughput point ran after the search, with these settings",
    "ran again": "run once more with these settings before it was recommended",
    "stepped down": "the candidate did not run again; this smaller size did",
    "not run again": "not run a second time: it would not fit in the time budget left; it ran"
    " once, with these settings",
    "its fed pass": "the smallest batch as fast fed by the DataLoader, which it trained in with"
    " these settings",
}

_FED_WHY = {  # ``BatchChoice.fed_why``: what the passes measured that made them choose
    "below the step": "training fed by the DataLoader ran below the step alone",
    "fewer threads": "training fed by the DataLoader trains at fewer CPU threads than the step's"
    " points ran at, where {sizes}",
    "step not timed": "the step alone was not timed at its batch",
}


_FED_ALONE = "the only batch fed by the DataLoader with these workers, which it trained in with"
_FED_ALONE += " these settings"

_OWN_PASS = (
    "it trained on its own batches at the CPU threads its passes chose, within 2% of the"
    " fastest, with these settings"
)


def _ranks_text(profile: Profile, ranks: RanksRecord) -> str:
    """The job's ranks: how many, where, over what, the global batch, how the group scaled
    against rank 0 alone, the DDP options."""
    nodes = f"{ranks.nodes} node{'s' if ranks.nodes > 1 else ''}"
    each = ranks.world_size // ranks.nodes
    kinds = sorted(set(ranks.devices))
    text = f"{ranks.world_size} ({nodes} x {each}, {ranks.backend}, {', '.join(kinds)}); "
    batch = profile.settings.batch.batch_size
    if batch is not None:
        text += f"batch {batch} a rank, {batch * ranks.world_size} a step together"
    if ranks.group_samples_per_s is not None:
        text += f", {ranks.group_samples_per_s:,.0f} samples/s together"
    efficiency = ranks.scaling_efficiency
    if efficiency is not None and ranks.one_rank_samples_per_s is not None:
        text += (
            f", {efficiency:.2f} of {ranks.world_size} x rank 0 alone "
            f"({ranks.one_rank_samples_per_s:,.0f} samples/s)"
        )
    if ranks.ddp_did_not_fit is not None:
        return text + (
            f"; sharded with FSDP2: DDP did not train batch {ranks.ddp_did_not_fit} on every"
            " rank (no rank trains a sharded model alone)"
        )
    return text + f"; DDP: {RECORD_BY_NAME['ddp'].show(profile.settings)}"


def _sizes_at(profile: Profile, evidence: Evidence) -> str:
    """'batches 2, 4 and 8 ran at 1 thread': the sizes the passes trained at the profile's
    settings (not those that failed)."""
    pair = (profile.settings.dataloader.num_workers, profile.settings.cpu_threads)
    ran = sorted(
        {
            f.batch_size
            for f in evidence.fed
            if f.samples_per_s and (f.num_workers, f.cpu_threads) == pair
        }
    )
    if not ran or not pair[1]:
        return "the batch was fed again"
    return f"{batches_text(ran)} ran at {pair[1]} thread{'s' * (pair[1] != 1)}"


def _recommended(profile: Profile, evidence: Evidence) -> str:
    """The recommended batch, how it was confirmed, and the global batch it makes."""
    choice = evidence.batch_choice
    text = str(evidence.batch_size)
    if choice is not None:
        confirmed = _CONFIRMED[choice.confirmed]
        if choice.fed and not any(f.dataloader for f in evidence.fed):  # ``probe.own_threads``
            confirmed = f"{_OWN_PASS}; {_sizes_at(profile, evidence)}"
        elif choice.fed and choice.fed_why is not None:
            workers = profile.settings.dataloader.num_workers
            fed = [f for f in evidence.fed if f.num_workers == workers and f.samples_per_s]
            if len({f.batch_size for f in fed}) < 2:
                confirmed = _FED_ALONE  # no other size was fed to compare it with
            why = _FED_WHY[choice.fed_why].format(sizes=_sizes_at(profile, evidence))
            confirmed = f"{why}: {confirmed}"
        if choice.compiled != profile.settings.compile.enabled:
            confirmed = confirmed.replace("with these settings", except_compile(choice.compiled))
        text += f" ({confirmed})"
    batch = profile.settings.batch
    target = profile.provenance.preferences.target_global_batch
    if batch.grad_accum_steps > 1 or target is not None:
        decision = profile.decision("batch.grad_accum_steps")
        reason = decision.reason if decision is not None else ""
        text += f"; accumulation {reason}"
    return text


def _throughput_table(evidence: Evidence) -> Table:
    table = Table(title="Throughput", title_justify="left", box=box.SIMPLE_HEAD)
    for column in ("batch", "samples/s", "spread", "note"):
        table.add_column(column, justify="right" if column != "note" else "left")
    for record in evidence.throughput:
        notes = [evidence.kind_of(record.variant)]
        if not record.steady:
            notes.append(f"{record.unsteady}: not used to choose")
        table.add_row(
            str(record.batch_size),
            f"{record.samples_per_s:.1f}",
            f"{record.relative_spread * 100:.0f}%",
            ", ".join(notes),
        )
    return table


def _loader_table(evidence: Evidence) -> Table:
    table = Table(title="DataLoader workers", title_justify="left", box=box.SIMPLE_HEAD)
    for column in ("workers", "samples/s", "note"):
        table.add_column(column, justify="right" if column != "note" else "left")
    for loader in evidence.loader:
        rate = "-" if loader.samples_per_s is None else f"{loader.samples_per_s:.1f}"
        table.add_row(str(loader.num_workers), rate, loader.error or "")
    return table


def _fed_table(evidence: Evidence, settings: Settings) -> Table:
    """The passes of training fed by the DataLoader (or, without a dataset, on the workload's
    own batches: ``probe.own_threads``), the recommended one marked (the profile's
    batch, worker count and CPU threads; its first round's pass), and a pass run again to
    confirm the choice (``probe.fed_rounds``) said to be of the second round."""
    mine = (evidence.batch_size, settings.dataloader.num_workers, settings.cpu_threads)
    title = "Training fed by the DataLoader"
    if not any(fed.dataloader for fed in evidence.fed):  # no dataset: its threads alone
        title = "Training on its own batches (no dataset): CPU threads"
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    for column in ("batch", "workers", "threads", "samples/s", "note"):
        table.add_column(column, justify="right" if column != "note" else "left")
    for fed in evidence.fed:
        chosen = (fed.batch_size, fed.num_workers, fed.cpu_threads) == mine and fed.round == 1
        notes = ["second round"] * (fed.round == 2) + [fed.error or "recommended" * chosen]
        table.add_row(
            str(fed.batch_size),
            str(fed.num_workers),
            "default" if fed.cpu_threads is None else str(fed.cpu_threads),
            "-" if fed.samples_per_s is None else f"{fed.samples_per_s:.1f}",
            ": ".join(n for n in notes if n),
        )
    return table


def saved_note(profile: Profile, saved: Path) -> str:
    """Where a profile was stored and the call that returns it."""
    world = profile.topology.world_size
    where = "on this machine" if world == 1 else f"in each rank of a job of {world} under torchrun"
    if profile.evidence is None:
        return f"saved to {saved}; torch_autotune.recommend() returns it {where}"
    return (
        f"saved to {saved}; torch_autotune.recommend(workload={profile.evidence.workload!r}) "
        f"returns it {where}, and so does recommend() until another profile is saved"
    )


def _run_time(evidence: Evidence) -> str:
    """'41.2 s of 120 s budget (search 12.0 s, throughput 20.1 s, ...)'."""
    text = f"{evidence.elapsed_s:.1f} s of {evidence.budget_s:.0f} s budget"
    if evidence.phases:
        text += " (" + ", ".join(f"{p.name} {_phase_s(p.seconds)}" for p in evidence.phases) + ")"
    return text


def _phase_s(seconds: float) -> str:
    """A phase's seconds: to the tenth, a phase that ran but took less to the millisecond (a
    workers phase of 11 ms, the loader alone at 0 workers, printed 'workers 0.0 s')."""
    return f"{seconds:.1f} s" if seconds >= 0.05 or seconds == 0 else f"{seconds:.3f} s"


def _compile_text(record: CompileRecord) -> str:
    if not record.measured:
        return f"not measured ({record.reason}); decided by the rules"
    return record.reason

"""What the bench found, as text: its arms, each setting's effect alone and in the profile,
and the one sentence that says whether the profile trains faster than the baseline."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from torch_autotune.bench import BenchEvidence, Effect
from torch_autotune.bench_record import BASELINE_ITSELF, ArmRecord
from torch_autotune.profile import Profile


def _effect_cell(effect: Effect | None) -> Text:
    if effect is None:
        return Text("not measured", style="dim")
    style = {"faster": "green", "slower": "red"}.get(effect.verdict, "")
    return Text(
        f"{effect.speedup:.2f}x ({effect.low:.2f}-{effect.high:.2f}) {effect.verdict}", style=style
    )


def bench_summary(bench: BenchEvidence) -> str:
    """One sentence: is the profile faster than the baseline, by how much, what was dropped."""
    dropped = [s.setting for s in bench.settings if s.outcome == "dropped"]
    tuned = bench.tuned
    if tuned is None:
        return "The profile and the baseline could not both be measured: no comparison."
    text = (
        f"The profile as tuned trains at {tuned.speedup:.2f}x the baseline's speed "
        f"(range {tuned.low:.2f}-{tuned.high:.2f} over {tuned.rounds} rounds: {tuned.verdict})."
    )
    if dropped:
        text += f" Dropped as measured slower: {', '.join(dropped)}."
        if bench.final is not None:
            text += (
                f" Without them: {bench.final.speedup:.2f}x the baseline "
                f"(range {bench.final.low:.2f}-{bench.final.high:.2f}: {bench.final.verdict})."
            )
        elif bench.final_is_baseline:
            text += f" Without them, {BASELINE_ITSELF}: there is nothing left to compare."
    else:
        text += " No setting measured slower than without it."
    if bench.reverted:
        text += (
            " The profile was still slower than the baseline, so every setting the bench "
            "switched went back to the baseline's value."
        )
    return text


def render_bench(profile: Profile, console: Console) -> None:
    """The bench: every arm's throughput, each setting's effect alone and in the profile."""
    evidence = profile.evidence
    bench = evidence.bench if evidence is not None else None
    if bench is None:
        console.print("This profile has no bench results: run 'autotune bench'.")
        return
    snapshot = profile.provenance.snapshot
    gpus = ", ".join(sorted({a.name for a in snapshot.accelerators})) or snapshot.host.cpu_model
    console.print(
        Text(
            f"autotune bench: {bench.workload} on {bench.device} ({gpus}, torch "
            f"{snapshot.software.torch_version}), {bench.rounds} interleaved rounds of "
            f"{bench.seconds_per_measurement:g} s per arm",
            style="bold",
        )
    )
    console.print(_arms_table(bench))
    if bench.settings:
        console.print(_settings_table(bench))
    else:
        console.print("The profile trains exactly as the baseline does: nothing to ablate.")
    for note in bench.not_ablated:
        console.print(Text(f"not ablated: {note}", style="dim"))
    console.print(Text(bench_summary(bench), style="bold"))


def _arms_table(bench: BenchEvidence) -> Table:
    arms = Table(box=box.SIMPLE_HEAD, title="Arms", title_justify="left")
    for column, justify in (("arm", "left"), ("trains with", "left"), ("samples/s", "right")):
        arms.add_column(column, justify=justify)  # type: ignore[arg-type]
    arms.add_column("spread", justify="right")
    for arm in bench.arms:  # one arm, one row: a second line of names read as a blank row
        spread = arm.spread
        arms.add_row(
            " = ".join(arm.names),
            arm.config.describe(),
            _rate_cell(arm),
            arm.error or ("-" if spread is None else f"{spread * 100:.0f}%"),
        )
    return arms


def _rate_cell(arm: ArmRecord) -> str:
    """The arm's median over the rounds that ran, and how many of them did not: a rate of two
    rounds beside a round that failed read as the arm's whole measurement."""
    median, rounds = arm.median, arm.samples_per_s
    if median is None:
        return "failed"
    failed = sum(1 for rate in rounds if rate is None)
    return f"{median:.1f}" + (f" ({failed} of {len(rounds)} rounds failed)" if failed else "")


def _settings_table(bench: BenchEvidence) -> Table:
    table = Table(
        box=box.SIMPLE_HEAD,
        title="Each setting: speedup on alone (vs baseline) and off alone (vs the profile)",
        title_justify="left",
    )
    for column in ("setting", "baseline -> profile", "on alone", "in the profile", "outcome"):
        table.add_column(column)
    for s in bench.settings:
        outcome = Text(s.outcome, style="red" if s.outcome == "dropped" else "")
        table.add_row(
            s.setting,
            f"{s.baseline_value} -> {s.tuned_value}",
            _effect_cell(s.on_alone),
            _effect_cell(s.off_alone),
            outcome,
        )
    return table

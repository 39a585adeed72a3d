"""The second round of passes fed by the DataLoader: before the choice leaves the plain
alternative, the pass it would move to and the plain alternative run once more, in the reverse
order, and the choice moves only where both rounds bear it out. Pure: no torch; ``probe.fed``
runs it after the first round's choice (``fed_threads.pick_pass``).

One pass on a busy machine moves by far more than ``FED_WITHIN``: this 2-core VM measured the
same pass (mlp at batch 512, 0 workers, 2 threads) at 937 to 2,490 samples/s in four
interleaved rounds. With one pass each, one lucky pass of another count moved the choice.

1. **When.** Only where the first round chose another pass than the plain alternative's (where
   the plain one stands, or failed, there is nothing to confirm), and only where both passes
   fit in the time left (``pass_seconds``), each predicted at the plain alternative's rate: the
   challenger's is the one in doubt. Where they do not fit, the first round's choice stays, and
   the workers' reason says that it rests on one pass each.
2. **The order.** The challenger first, then the plain alternative: the first round's order
   reversed, so that a neighbour's load rising (or falling) over the passes favours neither.
3. **The combination.** The challenger's slower pass against the plain alternative's faster:
   the choice moves only where that still says faster beyond ``FED_WITHIN``, so a challenger
   chosen fed faster than the plain alternative in every pass. Not the mean of each one's two
   passes: a lucky first pass at 1.3x the plain alternative carries a second at 0.95x through
   it (1.13x). The conservative side is the plain alternative's, as the costs are not alike:
   keeping it where another count is faster costs at most the gap measured, while trusting
   passes as close as one pass's noise cost 0.56x on this VM (``probe.fed``, "The choice").
   A load that drifts over the four passes leans the comparison the same way. A challenger
   whose second pass fails is not chosen; a plain alternative whose second pass fails keeps
   its first.
4. **The bar for the batch.** Where the plain alternative stands, the passes at its batch
   faster than its faster one (the challenger's first, and any other count's close to it,
   each resting on one pass) are set aside from the best rate the batch is chosen against
   (``Passes.set_aside``), so the plain alternative's batch is chosen as if the lucky pass
   had not run, and the choice stays within ``FED_WITHIN`` of the best rate that stands.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch_autotune.probe.fed_passes import (
    FED_WITHIN,
    FedTrial,
    Passes,
    fmt_rate,
    pass_seconds,
    rate_of,
    threads_text,
)

__all__ = ["SecondRound", "second_round"]


@dataclass(frozen=True)
class SecondRound:
    """The pass the choice rests on after the second round (the first round's pass of the
    challenger, or of the plain alternative) and what the workers' reason adds ('': no second
    round was needed). ``kept``: the plain alternative, where the second round did not bear
    out the first round's choice of another pass."""

    chosen: FedTrial
    kept: bool = False
    text: str = ""


def second_round(
    run: Passes, picked: FedTrial, plain: int, *, named: str | None = None
) -> SecondRound:
    """Steps 1 to 3 of the module docstring. ``picked``: the first round's choice; ``plain``:
    the plain alternative's worker count (its first pass at ``picked``'s batch, at the rules'
    threads, is the plain alternative's pass); ``named``: what the reason calls ``picked``
    (default: its workers, and its threads where they differ)."""
    first = next(
        (
            t
            for t in run.trials
            if t.ok and t.round == 1 and (t.batch_size, t.num_workers) == (picked.batch_size, plain)
        ),
        None,
    )
    if first is None or _pair(first) == _pair(picked):
        return SecondRound(picked)
    who = named or _who(picked, first)
    if not _fits(run, picked, first):
        why = run.short(f"a second round ({who} and the plain alternative again)")
        return SecondRound(picked, text=f"this rests on one pass each: {why}")
    again = run.feed_again(picked)
    plains = [first, run.feed_again(first)]
    fastest = max(rate_of(t) for t in plains if t.ok)
    lead = "a second round, in the reverse order,"
    if not again.ok:
        _set_aside(run, first, fastest)
        return SecondRound(
            first,
            kept=True,
            text=f"{lead} did not bear out {who}: its second pass failed ({again.error}), so "
            "the plain alternative stands",
        )
    slower = min(rate_of(picked), rate_of(again))
    faster = slower > fastest * (1 + FED_WITHIN)
    compared = (
        f"the slower of its two passes ({fmt_rate(slower)} samples/s) is{' not' * (not faster)} "
        f"faster than the faster of the plain alternative's ({fmt_rate(fastest)}) beyond "
        f"{FED_WITHIN:.0%}"
    )
    if faster:
        return SecondRound(picked, text=f"{lead} bore out {who}: {compared}")
    _set_aside(run, first, fastest)
    return SecondRound(
        first,
        kept=True,
        text=f"{lead} did not bear out {who}: {compared}, so the plain alternative stands",
    )


def _set_aside(run: Passes, plain: FedTrial, fastest: float) -> None:
    """Where the plain alternative stands after the second round: the passes at its batch
    faster than its ``fastest`` set no bar for the batch (``Passes.set_aside``; step 4 of the
    module docstring), and the batch's reason says so."""
    above = {
        _pair(t): t
        for t in sorted((t for t in run.trials if t.ok), key=rate_of)
        if t.batch_size == plain.batch_size and _pair(t) != _pair(plain) and rate_of(t) > fastest
    }
    if not above:
        return
    run.set_aside |= set(above)
    passes = ", ".join(f"{_who(t, plain)} ({fmt_rate(rate_of(t))})" for t in above.values())
    run.notes.append(
        f"the best rate leaves out the passes at batch {plain.batch_size} faster than the plain "
        f"alternative's {fmt_rate(fastest)} samples/s, as the second round did not bear out the "
        f"first round's choice: {passes} samples/s"
    )


def _fits(run: Passes, picked: FedTrial, plain: FedTrial) -> bool:
    """Whether both passes of the second round end in the time left, each at ``plain``'s rate
    (the challenger's rate is the one in doubt)."""
    if run.until is None:
        return True
    rate = rate_of(plain)
    need = sum(pass_seconds(t.batch_size, t.num_workers, rate) for t in (picked, plain))
    return need <= run.until - run.clock()


def _who(trial: FedTrial, plain: FedTrial) -> str:
    """'0 worker(s) at 1 thread': the threads named where set, or not the plain alternative's."""
    named = trial.threads is not None or trial.threads != plain.threads
    return f"{trial.num_workers} worker(s)" + (f" at {threads_text(trial.threads)}" * named)


def _pair(trial: FedTrial) -> tuple[int, int | None]:
    return trial.num_workers, trial.threads

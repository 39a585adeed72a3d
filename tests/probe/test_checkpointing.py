"""Activation checkpointing on real torch on the CPU (issue 21): the repeated blocks of the
built-ins and of models as users write them are recomputed in backward, with the same loss and
gradients as without; BatchNorm is refused; the parameters keep their names, so a checkpointed
model's weights load into a plain one; rule L2 keeps it off unless measured."""

from __future__ import annotations

import copy
import dataclasses
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from tests.probe.fake_trials import recorded, tune_on
from tests.rules.helpers import context_with, run
from torch_autotune.apply import prepare_model
from torch_autotune.errors import DoesNotFitError
from torch_autotune.probe.checkpoint_phase import ALREADY
from torch_autotune.probe.recompute import checkpointed_step_agrees
from torch_autotune.probe.search import RTOL, Agreement
from torch_autotune.probe.simulated import SimulatedMachine
from torch_autotune.probe.trials import StepSettings
from torch_autotune.probe.workloads import Workload, llama, models, resolve_workload
from torch_autotune.probe.workloads.synthetic import SyntheticTokens
from torch_autotune.profile import Preferences
from torch_autotune.rules.context import Measurements
from torch_autotune.rules.memory import checkpointing
from torch_autotune.settings import Source, torch_defaults
from torch_autotune.wrapping import (
    NotCheckpointable,
    checkpoint_blocks,
    is_checkpointed,
    unwrapped,
)

CPU = StepSettings(torch_defaults("cpu"))


def _tiny(key: str) -> Workload:
    """A built-in token workload with the same classes at a tiny size."""
    makers = {
        "gpt2": lambda: models.GPT(vocab_size=64, max_len=32, d_model=32, nhead=4, num_layers=3),
        "llama-1b": lambda: llama.Llama(
            vocab_size=64, max_len=32, d_model=32, nhead=4, kv_heads=2, num_layers=3, hidden=64
        ),
    }
    tokens = SyntheticTokens(seq_len=32, vocab_size=64)
    return dataclasses.replace(
        resolve_workload(key), make_model=makers[key], make_batch=tokens.batch, dataset=None
    )


class DropoutTower(nn.Module):
    """Blocks with dropout: the recompute must draw the same masks."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(
            *(nn.Sequential(nn.Linear(16, 16), nn.Dropout(0.3), nn.GELU()) for _ in range(4))
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)


@pytest.mark.parametrize("key", ["gpt2", "llama-1b"])
def test_a_checkpointed_step_is_the_step(key: str) -> None:
    agreement = checkpointed_step_agrees(_tiny(key), CPU, batch_size=4)
    assert agreement.agrees
    assert agreement.largest_difference <= RTOL
    assert agreement.blocks == 3


def test_dropout_draws_the_same_masks_in_the_recompute() -> None:
    mlp = resolve_workload("mlp")
    workload = dataclasses.replace(
        mlp,
        make_model=DropoutTower,
        make_batch=lambda n: (torch.randn(n, 16), torch.randn(n, 16)),
        typical_batch=None,
        dataset=None,
    )
    agreement = checkpointed_step_agrees(workload, CPU, batch_size=8)
    assert agreement.agrees
    assert agreement.blocks == 4


def test_batchnorm_in_the_blocks_is_refused_with_why() -> None:
    with pytest.raises(NotCheckpointable, match="hold BatchNorm2d, whose running statistics"):
        checkpoint_blocks(models.ResNetLike(num_classes=10))


def test_a_norm_that_tracks_running_statistics_is_refused_in_any_form() -> None:
    tracked = nn.Sequential(
        *(
            nn.Sequential(nn.Conv2d(3, 3, 1), nn.InstanceNorm2d(3, track_running_stats=True))
            for _ in range(2)
        )
    )
    with pytest.raises(NotCheckpointable, match="hold InstanceNorm2d, whose running"):
        checkpoint_blocks(tracked)
    plain = nn.Sequential(
        *(nn.Sequential(nn.Conv2d(3, 3, 1), nn.InstanceNorm2d(3)) for _ in range(2))
    )
    assert checkpoint_blocks(plain) == 2  # no statistics kept: nothing to update twice


def test_a_hugging_face_model_with_batchnorm_in_its_layers_is_refused() -> None:
    """Its own checkpointing recomputes its layers, BatchNorm and all: refused before it is
    turned on, as a model of plain torch is."""
    transformers = pytest.importorskip("transformers")
    config = transformers.MobileViTConfig(
        image_size=32,
        hidden_sizes=[16, 16, 16],
        neck_hidden_sizes=[8, 8, 16, 16, 16, 16, 32],
        num_labels=3,
        patch_size=2,
    )
    model = transformers.MobileViTForImageClassification(config)
    with pytest.raises(NotCheckpointable, match=r"MobileViTLayer.*hold BatchNorm2d"):
        checkpoint_blocks(model)
    assert not any(getattr(m, "gradient_checkpointing", False) for m in model.modules())


def test_the_blocks_of_a_shallow_decoder_with_a_large_vocabulary_are_its_blocks() -> None:
    """Its output layer, a Linear outside the blocks, outweighs them: the Linear layers are
    still not the blocks where a kind that holds them repeats."""
    model = models.GPT(vocab_size=32_000, max_len=16, d_model=64, nhead=4, num_layers=2)
    assert checkpoint_blocks(model) == 2
    assert all(is_checkpointed(b) for b in model.blocks)
    assert not any(is_checkpointed(m) for m in model.modules() if isinstance(m, nn.Linear))


def test_two_light_heads_are_not_the_blocks_of_a_stack_of_layers() -> None:
    """Kinds that hold modules come first only where they hold a share of the weight: a stack
    of Linear layers with two small Sequential heads keeps its layers as the blocks."""
    from torch_autotune.wrapping import repeated_blocks

    model = nn.Module()
    model.layers = nn.ModuleList(nn.Linear(256, 256) for _ in range(8))
    model.heads = nn.ModuleList(nn.Sequential(nn.Linear(256, 2), nn.Tanh()) for _ in range(2))
    blocks = repeated_blocks(model)
    assert set(map(id, model.layers)) <= set(map(id, blocks))
    assert not any(isinstance(b, nn.Sequential) for b in blocks)


def test_a_block_shared_by_weight_is_the_block_and_checkpointing_it_recomputes_every_call() -> None:
    """One block called in 8 places (ALBERT's sharing) with a head tied to the embedding: the
    tree lists the shared block once, so its Linear layers, the head among them, were taken
    for the blocks, and the model 'did not fit' with checkpointing."""
    from torch_autotune.wrapping import repeated_blocks

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.LayerNorm(32)
            self.up, self.down = nn.Linear(32, 128), nn.Linear(128, 32)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.down(torch.relu(self.up(self.norm(x))))

    class Shared(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(64, 32)
            shared = Block()
            self.blocks = nn.ModuleList([shared] * 8)
            self.head = nn.Linear(32, 64, bias=False)
            self.head.weight = self.embed.weight

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            x = self.embed(tokens)
            for block in self.blocks:
                x = block(x)
            return self.head(x)

    model = Shared()
    assert repeated_blocks(model) == [model.blocks[0]]
    tokens = torch.randint(0, 64, (2, 16))
    torch.manual_seed(0)
    model(tokens).sum().backward()
    plain = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad(set_to_none=True)
    assert checkpoint_blocks(model) == 1
    assert is_checkpointed(model.blocks[5])  # the one block, in every place
    model(tokens).sum().backward()
    again = [p.grad for p in model.parameters() if p.grad is not None]
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(plain, again, strict=True))


def test_a_copy_of_a_checkpointed_model_recomputes_its_own_blocks_and_it_pickles() -> None:
    """An EMA or ``AveragedModel`` deep-copies the model: the copy trains its own weights
    (a forward closed over the original's would train the original's), and the whole model
    saves and loads with ``torch.save``."""
    model = _tiny("gpt2").make_model()
    checkpoint_blocks(model)
    tokens = torch.randint(0, 64, (2, 32))
    copied = copy.deepcopy(model)
    copied(tokens).sum().backward()
    assert all(p.grad is None for p in model.parameters())
    assert all(p.grad is not None for p in copied.parameters())
    assert all(is_checkpointed(b) for b in copied.blocks)
    saved = io.BytesIO()
    torch.save(model, saved)
    saved.seek(0)
    loaded = torch.load(saved, weights_only=False)
    assert all(is_checkpointed(b) for b in loaded.blocks)
    torch.manual_seed(0)
    expected = model(tokens).sum()
    torch.manual_seed(0)
    assert torch.equal(loaded(tokens).sum(), expected)


def test_a_model_with_no_repeated_block_is_refused() -> None:
    with pytest.raises(NotCheckpointable, match="no repeated block"):
        checkpoint_blocks(nn.Linear(4, 4))


def test_the_parameters_keep_their_names_and_a_second_call_wraps_nothing() -> None:
    model = _tiny("gpt2").make_model()
    names = list(model.state_dict())
    assert checkpoint_blocks(model) == 3
    assert checkpoint_blocks(model) == 0
    assert list(model.state_dict()) == names
    saved = io.BytesIO()
    torch.save(model.state_dict(), saved)
    plain = _tiny("gpt2").make_model()
    plain.load_state_dict(torch.load(io.BytesIO(saved.getvalue())))  # exported and reloaded


def test_prepare_model_checkpoints_where_the_settings_say() -> None:
    settings = torch_defaults("cpu").model_copy(update={"activation_checkpointing": True})
    model = prepare_model(settings, _tiny("llama-1b").make_model())
    assert all(is_checkpointed(b) for b in model.blocks)
    tokens = torch.randint(0, 64, (2, 32))
    model(tokens).sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_the_rule_keeps_it_off_unless_measured() -> None:
    off = run(context_with("h100-80gb-hbm3"), checkpointing)["activation_checkpointing"]
    assert off.value is False
    assert off.rule == "L2"
    assert "kept only where the probe measured" in off.reason
    why = "not even batch 1 trained without it; with it, 12 did"
    on = run(context_with("h100-80gb-hbm3", Measurements(checkpointing_reason=why)), checkpointing)[
        "activation_checkpointing"
    ]
    assert (on.value, on.source, on.reason) == (True, Source.MEASURED, f"on: {why}")


# --- a model that fits only with checkpointing --------------------------------------------------


H100 = recorded("h100-80gb-hbm3")
LAPTOP = recorded("cpu-laptop-linux")


def _simulated_token_workload() -> Workload:
    """The tiny decoder as the simulated machine's workload (no DataLoader)."""
    return dataclasses.replace(_tiny("gpt2"), name="decoder")


def test_a_model_that_fits_only_with_checkpointing_gets_it_with_the_numbers() -> None:
    machine = SimulatedMachine(limit=0, checkpointed_limit=12, leaves=1)
    profile = tune_on(machine, _simulated_token_workload(), H100, mode="balanced", budget_s=60)
    evidence = profile.evidence
    assert evidence is not None
    assert profile.settings.activation_checkpointing
    assert evidence.max_batch_size == 12
    decision = profile.decision("activation_checkpointing")
    assert decision is not None
    assert (decision.rule, decision.source) == ("L2", Source.MEASURED)
    assert decision.reason == (
        "on: not even batch 1 trained without it (out of memory); with each repeated block's "
        "forward recomputed in backward, the largest batch that trained was 12; its recomputed"
        " blocks matched their plain forward and backward (one block trained alone on the inputs"
        " it got in a step at batch 1: outputs and gradients within 0.0e+00, relative; the whole"
        " plain step ran out of memory, or took more than --memory-limit, in the check)"
    )
    memory = {v.name: v.settings.get("activation_checkpointing") for v in evidence.variants}
    assert memory == {"eager": "off", "checkpointed": "on"}  # the plain trial kept, as it ran
    assert evidence.batch_choice is not None
    assert evidence.batch_choice.variant == "checkpointed"


def test_a_model_over_the_memory_limit_only_plain_keeps_the_plain_trial_and_its_peak() -> None:
    """On the CPU under --memory-limit 0.5, batch 1 took 0.59 GiB plain and fit checkpointed:
    the profile kept only the checkpointed search, its trials named 'eager', and the decision
    said 'it took more than --memory-limit' with no number behind it."""
    machine = SimulatedMachine(
        limit=100,
        checkpointed_limit=1000,
        memory_bytes=None,
        fixed_bytes=200 << 20,
        per_sample_bytes=400 << 20,
        leaves=1,
    )
    profile = tune_on(machine, "mlp", LAPTOP, budget_s=60, memory_limit_gib=0.5)
    evidence = profile.evidence
    assert evidence is not None
    assert profile.settings.activation_checkpointing
    plain = machine.peak(1, checkpointed=False)
    first = evidence.search[0]
    assert (first.batch_size, first.fits, first.peak_memory_bytes) == (1, False, plain)
    assert evidence.kind_of(first.variant) == "eager"
    fit = [t for t in evidence.search if t.fits]
    assert fit
    assert {evidence.kind_of(t.variant) for t in fit} == {"checkpointed"}
    assert {t.variant for t in fit} == {"checkpointed"}
    assert evidence.batch_choice is not None
    assert evidence.batch_choice.variant == "checkpointed"
    assert evidence.batch_size in evidence.ran({"activation_checkpointing": "on"})
    assert 1 not in evidence.ran({"activation_checkpointing": "off"})
    decision = profile.decision("activation_checkpointing")
    assert decision is not None
    assert decision.reason.startswith(
        f"on: not even batch 1 trained without it (batch 1 took {plain / 2**30:.2g} GiB of host"
        " RAM, more than the 0.5 GiB the memory limit allows (--memory-limit, memory_limit_gib));"
    )


@pytest.mark.slow  # the FSDP2 estimate of the tiny decoder at three world sizes
def test_a_model_that_fits_neither_way_says_both() -> None:
    machine = SimulatedMachine(limit=0, checkpointed_limit=None, leaves=1)
    with pytest.raises(DoesNotFitError) as raised:
        tune_on(machine, _simulated_token_workload(), H100, mode="balanced", budget_s=60)
    message = str(raised.value)
    assert "with activation checkpointing, not even batch 1 trained" in message
    assert "\n  - sharded with FSDP2 over 2 GPUs: about " in message


class _NeedsCheckpointing(nn.Module):
    """Blocks whose whole activations 'do not fit' (MemoryError) unless they are checkpointed;
    ``normed`` puts BatchNorm in them, which checkpointing refuses."""

    def __init__(self, normed: bool = False) -> None:
        super().__init__()
        norm: type[nn.Module] = nn.BatchNorm1d if normed else nn.LayerNorm
        self.blocks = nn.Sequential(
            *(nn.Sequential(nn.Linear(16, 16), norm(16), nn.GELU()) for _ in range(3))
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not all(is_checkpointed(b) for b in self.blocks):
            raise MemoryError("out of memory: every block's activations kept (simulated)")
        return self.blocks(x)


def _needs(normed: bool) -> dict[str, object]:
    return {
        "model": lambda: _NeedsCheckpointing(normed),
        "optimizer": lambda params: torch.optim.AdamW(params, lr=1e-3),
        "example_batch": (torch.randn(4, 16), torch.randn(4, 16)),
    }


@pytest.mark.slow  # real tune() on the CPU: seconds
def test_on_real_torch_a_model_that_needs_checkpointing_trains_with_it() -> None:
    from torch_autotune.api import tune

    profile = tune(_needs(normed=False), snapshot=LAPTOP, budget_s=15, max_batch_size=16)
    assert profile.settings.activation_checkpointing
    assert profile.settings.batch.batch_size is not None
    decision = profile.decision("activation_checkpointing")
    assert decision is not None
    # the plain step cannot run: its one kind of block was checked alone, plain and recomputed
    assert "; its recomputed blocks matched their plain forward and backward (one block" in (
        decision.reason
    )


@pytest.mark.slow  # real tune() on the CPU: seconds
def test_on_real_torch_batchnorm_blocks_say_why_checkpointing_was_not_tried() -> None:
    from torch_autotune.api import tune

    with pytest.raises(DoesNotFitError) as raised:
        tune(_needs(normed=True), snapshot=LAPTOP, budget_s=15, max_batch_size=16)
    assert "activation checkpointing was not tried: its repeated blocks" in str(raised.value)
    assert "hold BatchNorm" in str(raised.value)


def test_the_exports_of_a_checkpointed_profile() -> None:
    """Training arguments turn on the Trainer's own checkpointing (non-reentrant); Lightning and
    accelerate, which have no argument for it, say where it is applied."""
    from tests.test_bench import measured
    from torch_autotune.integrations import hf_training_arguments, tool_notes
    from torch_autotune.integrations.hf import checkpointing_argument

    profile = measured("h100-80gb-hbm3")
    settings = profile.settings.model_copy(update={"activation_checkpointing": True})
    on = profile.model_copy(update={"settings": settings})
    name = checkpointing_argument()
    assert hf_training_arguments(on)[name] is True
    assert hf_training_arguments(on)[f"{name}_kwargs"] == {"use_reentrant": False}
    assert not any("checkpointing" in key for key in hf_training_arguments(profile))
    for tool in ("lightning", "accelerate"):
        said = tool_notes(on, tool)
        assert any("activation checkpointing" in note and "prepare_model" in note for note in said)


def test_the_trainings_arguments_take_the_export_without_a_warning(tmp_path: Path) -> None:
    """The field is the one the installed transformers names (its old one warns that v6
    removes it; warnings are errors here), and the Trainer's arguments turn it on."""
    transformers = pytest.importorskip("transformers")
    from tests.test_bench import measured
    from torch_autotune.integrations import hf_training_arguments

    profile = measured("h100-80gb-hbm3")
    settings = profile.settings.model_copy(
        update={"activation_checkpointing": True, "device": "cpu"}
    )
    exported = hf_training_arguments(profile.model_copy(update={"settings": settings}))
    options = {k: v for k, v in exported.items() if "checkpointing" in k}
    arguments = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, **options)
    fields = transformers.TrainingArguments.__dataclass_fields__
    name = (
        "activation_checkpointing"
        if "activation_checkpointing" in fields
        else "gradient_checkpointing"
    )
    assert set(options) == {name, f"{name}_kwargs"}
    assert getattr(arguments, name) is True


@pytest.mark.child_process
def test_the_field_is_the_installed_transformers_one_where_nothing_imported_it() -> None:
    """``autotune export --format hf`` runs where no one imported transformers: the field is
    still the installed one's, not a guess from its version."""
    import subprocess
    import sys

    transformers = pytest.importorskip("transformers")
    fields = transformers.TrainingArguments.__dataclass_fields__
    expected = (
        "activation_checkpointing"
        if "activation_checkpointing" in fields
        else "gradient_checkpointing"
    )
    code = (
        "import sys\n"
        "from torch_autotune.integrations.hf import checkpointing_argument\n"
        "assert 'transformers' not in sys.modules\n"
        "print(checkpointing_argument())"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.strip() == expected


# --- checkpointing against the run without it, where both fit ------------------------------------


def _growing(
    recompute: float, *, limit: int = 120, checkpointed: int | None = 480
) -> SimulatedMachine:
    """A decoder on the H100 whose throughput still grows at its memory limit (a fixed cost a
    step that a larger batch spreads), checkpointed it fits ``checkpointed`` at ``recompute``
    times the step."""
    return SimulatedMachine(
        limit=limit,
        checkpointed_limit=checkpointed,
        recompute_factor=recompute,
        fixed_s=0.05,
        per_sample_s=0.0005,
        first_s=1.0,
        new_shape_s=0.05,
        autotune_s=0.0,
        per_sample_bytes=600 << 20,
        memory_bytes=(2 << 30) + (600 << 20) * (limit + 1),
        leaves=1,
    )


def _balanced(machine: SimulatedMachine):  # type: ignore[no-untyped-def]
    return tune_on(machine, _simulated_token_workload(), H100, mode="balanced", budget_s=120)


def test_checkpointing_is_kept_where_the_larger_batch_it_allows_is_faster() -> None:
    profile = _balanced(_growing(1.05))
    evidence = profile.evidence
    assert evidence is not None
    assert evidence.batch_choice is not None
    assert profile.settings.activation_checkpointing
    assert evidence.batch_choice.variant == "checkpointed"
    batch = profile.settings.batch.batch_size
    assert batch is not None
    assert batch > evidence.max_batch_size  # past what fits without it
    decision = profile.decision("activation_checkpointing")
    assert decision is not None
    assert decision.source is Source.MEASURED
    assert decision.reason.startswith(
        "on: its recomputed step matched the plain one at batch 1 (loss and gradients within"
    )
    assert "; measured faster: " in decision.reason
    assert "the largest batch was 480 with it and 120 without" in decision.reason


def test_checkpointing_that_costs_more_than_its_batch_gains_is_measured_and_dropped() -> None:
    profile = _balanced(_growing(1.6))
    evidence = profile.evidence
    assert evidence is not None
    assert not profile.settings.activation_checkpointing
    assert any(r.variant == "checkpointed" for r in evidence.throughput)  # it was measured
    decision = profile.decision("activation_checkpointing")
    assert decision is not None
    assert decision.source is Source.MEASURED
    assert decision.reason.startswith("off: measured ")
    batch = profile.settings.batch.batch_size
    assert batch is not None
    assert batch <= evidence.max_batch_size  # a size that ran without it


def test_checkpointing_is_not_measured_where_throughput_stopped_growing() -> None:
    flat = _growing(1.05)
    flat.fixed_s, flat.per_sample_s = 0.0, 0.001  # no fixed cost: the rate is flat in the batch
    profile = _balanced(flat)
    assert not profile.settings.activation_checkpointing
    assert profile.evidence is not None
    assert not any(r.variant == "checkpointed" for r in profile.evidence.throughput)
    decision = profile.decision("activation_checkpointing")
    assert decision is not None
    assert decision.reason.startswith("off: not measured: throughput stopped growing")
    assert decision.source is Source.INFERRED


def test_the_summary_gives_both_numbers_and_names_each_points_series() -> None:
    import io
    import re

    from rich.console import Console

    from torch_autotune.render import render_run

    profile = _balanced(_growing(1.05))
    out = io.StringIO()
    render_run(profile, Console(file=out, width=400, color_system=None), saved=None)
    text = out.getvalue()
    row = re.search(r"^activation checkpointing\s+(.*)$", text, re.MULTILINE)
    assert row is not None
    assert row.group(1).startswith("on: its recomputed step matched the plain one")
    assert "; measured faster: " in row.group(1)
    assert "the largest batch was 480 with it and 120 without" in row.group(1)
    evidence = profile.evidence
    assert evidence is not None
    for record in evidence.throughput:
        kind = "checkpointed" if record.variant == "checkpointed" else "eager"
        line = rf"^\s+{record.batch_size}\s+{record.samples_per_s:.1f}\s+\d+%\s+{kind}"
        assert re.search(line, text, re.MULTILINE), (record, text)


def _off_unmeasured(checked: Agreement) -> str:
    """L2's reason where the check found ``checked`` on a machine where checkpointing would be
    kept: it is off, and no checkpointed point ran."""
    machine = _growing(1.05)
    machine.recompute = checked
    profile = _balanced(machine)
    assert not profile.settings.activation_checkpointing
    assert profile.evidence is not None
    assert not any(r.variant == "checkpointed" for r in profile.evidence.throughput)
    decision = profile.decision("activation_checkpointing")
    assert decision is not None
    return decision.reason


def test_a_recompute_that_is_not_the_step_is_not_used() -> None:
    # faster with it: but its recomputed step differs
    reason = _off_unmeasured(Agreement(agrees=False, largest_difference=0.25, blocks=4))
    assert reason.startswith(
        "off: not used: a step with it differs from the plain step from the same weights by"
        " 2.5e-01 (loss or a gradient, relative), more than 0.001"
    )


def test_a_model_that_came_checkpointed_is_not_measured_against_itself() -> None:
    """The check wrapped no block (a Hugging Face model's own checkpointing on, or blocks
    wrapped before tune()): the "checkpointed" runs would be the plain ones again, so nothing
    is measured or kept on noise, and the decision says why."""
    # what a checkpointed model would gain, were it not one already
    assert _off_unmeasured(Agreement(agrees=True, largest_difference=0.0, blocks=0)) == (
        f"off: {ALREADY}"
    )


def test_a_recompute_that_could_not_be_checked_says_so() -> None:
    machine = _growing(1.05)
    machine.recompute = None  # the plain step at the smallest batch ran out of memory
    profile = _balanced(machine)
    assert profile.settings.activation_checkpointing
    decision = profile.decision("activation_checkpointing")
    assert decision is not None
    assert decision.reason.startswith(
        "on: its recomputed step was not checked (the plain step at batch 1 ran out of memory"
        " or took more than --memory-limit, and no block could be trained alone)"
    )


def test_on_real_torch_the_check_runs_one_model_at_a_time() -> None:
    """The plain step and the checkpointed one on the same model, one after the other: the
    runner lets its own model go first, and the check builds one model."""
    from torch_autotune.probe.trials import TrialRunner

    built: list[int] = []
    workload = _tiny("gpt2")
    make = workload.make_model

    def counting() -> object:
        built.append(1)
        return make()

    runner = TrialRunner(dataclasses.replace(workload, make_model=counting), StepSettings())
    runner(2)  # the runner's own model
    assert built == [1]
    checked = runner.recompute_check(2)
    assert checked is not None
    assert checked.agrees
    assert built == [1, 1]  # one more for the check, none for a twin
    assert runner._model is None  # its own was let go before


# --- a model inside DDP or torch.compile: checkpointed once, as the probe measured it ------------


@pytest.fixture
def one_rank() -> Iterator[None]:
    """A gloo process group of this process alone: enough to build DistributedDataParallel."""
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        yield
    finally:
        dist.destroy_process_group()


def _hf_gpt2() -> Any:
    """A Hugging Face GPT-2 at a tiny size, built from its config (nothing downloaded)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2)
    return transformers.GPT2LMHeadModel(config)


def _recomputes(hf: Any) -> tuple[int, bool]:
    """The blocks of ``hf`` that torch-autotune wraps, and whether its own switch is on."""
    return sum(is_checkpointed(m) for m in hf.modules()), bool(hf.is_activation_checkpointing)


def test_a_hugging_face_model_inside_ddp_checkpoints_by_its_own_switch_alone(
    one_rank: None,
) -> None:
    from torch.nn.parallel import DistributedDataParallel

    hf = _hf_gpt2()
    assert checkpoint_blocks(DistributedDataParallel(hf)) == 1  # its own switch, as alone
    assert _recomputes(hf) == (0, True)
    settings = torch_defaults("cpu").model_copy(update={"activation_checkpointing": True})
    prepare_model(settings, DistributedDataParallel(hf))  # its layers are not wrapped too
    assert _recomputes(hf) == (0, True)
    assert checkpoint_blocks(torch.compile(hf)) == 0


def test_a_two_rank_profile_checkpoints_a_hugging_face_model_once(
    one_rank: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torch.nn.parallel import DistributedDataParallel

    from torch_autotune import wrapping
    from torch_autotune.rules.engine import build_profile

    profile = build_profile(
        recorded("cpu-laptop-linux"), preferences=Preferences(processes_per_node=2)
    )
    assert profile.topology.world_size == 2
    on = profile.settings.model_copy(update={"activation_checkpointing": True})
    profile = profile.model_copy(update={"settings": on})
    # the group here has one rank: DDP as parallelize builds it where there are two
    monkeypatch.setattr(wrapping, "parallelize", lambda _s, m: DistributedDataParallel(m))
    hf = _hf_gpt2()
    trained = profile.prepare_model(hf)
    assert isinstance(trained, DistributedDataParallel)
    assert _recomputes(hf) == (0, True)
    tokens = torch.randint(0, 64, (2, 16))
    trained(input_ids=tokens, labels=tokens).loss.backward()
    assert all(p.grad is not None for p in hf.parameters())


def test_blocks_inside_a_wrapped_block_are_not_wrapped_again() -> None:
    model = DropoutTower()
    assert checkpoint_blocks(torch.compile(model)) == 4  # the four Sequential blocks, inside
    assert checkpoint_blocks(model, "torch.nn.modules.linear.Linear") == 0  # inside them
    assert not any(is_checkpointed(m) for m in model.modules() if isinstance(m, nn.Linear))
    assert checkpoint_blocks(DropoutTower(), "torch.nn.modules.linear.Linear") == 4


def test_unwrapped_looks_through_ddp_and_compile_not_a_layer_named_module(one_rank: None) -> None:
    from torch.nn.parallel import DistributedDataParallel

    model = DropoutTower()
    assert unwrapped(torch.compile(DistributedDataParallel(model))) is model
    assert unwrapped(DistributedDataParallel(torch.compile(model))) is model

    class Holder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.module = nn.Linear(2, 2)

    holder = Holder()
    assert unwrapped(holder) is holder

"""A workload's ``blocks`` (issue 21): the classes of the model's repeated blocks, named by the
user where the ones found in its module tree are not the right ones. Checkpointing recomputes
them, FSDP2 shards them, the profile keeps their names and ``prepare_model`` wraps what was
measured; a wrong value is one message that names the fix."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from tests.probe.fake_trials import recorded
from torch_autotune.api import tune
from torch_autotune.errors import DoesNotFitError, WorkloadError
from torch_autotune.profile_io import dump_profile, load_profile
from torch_autotune.settings import Source
from torch_autotune.wrapping import (
    NotCheckpointable,
    block_names,
    checkpoint_blocks,
    is_checkpointed,
    model_blocks,
)

LAPTOP = recorded("cpu-laptop-linux")


class Layer(nn.Module):
    """What the user calls a block: light beside the heads, so not the kind found."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(16, 16), nn.LayerNorm(16), nn.GELU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


class TwoHeads(nn.Module):
    """Three ``Layer``s, then two heavy heads: the repeated kind that holds most weight is the
    heads. The layers' activations 'do not fit' unless each layer is checkpointed."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Layer() for _ in range(3))
        self.heads = nn.ModuleList(
            nn.Sequential(nn.Linear(16, 512), nn.GELU(), nn.Linear(512, 16)) for _ in range(2)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not all(is_checkpointed(layer) for layer in self.layers):
            raise MemoryError("out of memory: every layer's activations kept (simulated)")
        for layer in self.layers:
            x = layer(x)
        return sum((head(x) for head in self.heads), torch.zeros_like(x))


def _objects() -> dict[str, object]:
    return {
        "model": TwoHeads,
        "optimizer": lambda params: torch.optim.AdamW(params, lr=1e-3),
        "example_batch": (torch.randn(4, 16), torch.randn(4, 16)),
    }


NAME = f"{Layer.__module__}.{Layer.__qualname__}"


def test_the_blocks_found_are_the_heads_and_the_blocks_named_are_the_layers() -> None:
    model = TwoHeads()
    assert model_blocks(model, None) == list(reversed(list(model.heads)))
    assert model_blocks(model, NAME) == list(reversed(list(model.layers)))
    assert checkpoint_blocks(model, NAME) == 3
    assert all(is_checkpointed(layer) for layer in model.layers)
    assert not any(is_checkpointed(head) for head in model.heads)


def test_a_named_class_matches_its_subclasses_and_only_the_outermost_where_they_nest() -> None:
    class Wider(Layer):
        pass

    outer = nn.Sequential(Layer(), Wider())
    outer[0].inner.append(Layer())  # a Layer inside a Layer: only the outer one is a block
    assert model_blocks(outer, NAME) == [outer[1], outer[0]]


def test_block_names_take_a_class_or_several_once_each() -> None:
    assert block_names(Layer) == (NAME,)
    assert block_names([Layer, nn.Linear, Layer]) == (NAME, "torch.nn.modules.linear.Linear")
    for wrong in (42, [Layer, 3], [], Layer()):
        with pytest.raises(TypeError):
            block_names(wrong)


def test_a_model_without_the_named_class_cannot_be_checkpointed() -> None:
    with pytest.raises(NotCheckpointable, match=r"no module of the classes given as its blocks"):
        checkpoint_blocks(nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2)), NAME)


@pytest.mark.slow  # real tune() on the CPU: seconds
def test_a_model_that_fits_only_with_its_named_blocks_checkpointed_is_tuned_with_them() -> None:
    """Without ``blocks`` the heads are checkpointed and the layers still 'do not fit'; with
    ``blocks=Layer`` it trains, and the profile holds the name that wraps them again."""
    with pytest.raises(DoesNotFitError):
        tune(_objects(), snapshot=LAPTOP, budget_s=8, max_batch_size=16)
    profile = tune(**_objects(), blocks=Layer, snapshot=LAPTOP, budget_s=8, max_batch_size=16)
    assert profile.settings.activation_checkpointing
    assert profile.settings.blocks == NAME
    decision = profile.decision("blocks")
    assert decision is not None
    assert decision.source is Source.USER
    assert profile.provenance.preferences.blocks == NAME
    fresh = profile.prepare_model(TwoHeads())
    assert all(is_checkpointed(layer) for layer in fresh.layers)
    assert not any(is_checkpointed(head) for head in fresh.heads)


def test_the_profile_keeps_the_names_through_its_file(tmp_path: Path) -> None:
    from tests.test_bench import measured

    profile = measured("h100-80gb-hbm3")
    settings = profile.settings.model_copy(update={"blocks": f"{NAME},torch.nn.Linear"})
    named = profile.model_copy(update={"settings": settings})
    path = tmp_path / "p.yaml"
    path.write_text(dump_profile(named))
    assert load_profile(path).settings.blocks == f"{NAME},torch.nn.Linear"


@pytest.mark.parametrize(
    ("blocks", "said"),
    [
        (42, "'blocks' is an int; give the classes of the model's repeated blocks"),
        (nn.Conv2d, "the model has no module of the classes given as its blocks"),
    ],
)
def test_blocks_that_are_no_classes_of_the_model_are_one_message(blocks: object, said: str) -> None:
    objects = {**_objects(), "model": TwoHeads()}
    with pytest.raises(WorkloadError, match=said):
        tune(**objects, blocks=blocks, snapshot=LAPTOP, budget_s=15)  # type: ignore[arg-type]
    with pytest.raises(WorkloadError, match=said):
        tune({**objects, "blocks": blocks}, snapshot=LAPTOP, budget_s=15)


def test_blocks_that_a_factorys_model_does_not_hold_are_the_workloads_error() -> None:
    """A model given as its class is built by the probe: a class it does not hold was saved
    in the profile, or, where the model did not fit, ended the run as one that does not fit,
    'checkpointing not tried' (exit 7), not as the workload's error (exit 5)."""
    from torch_autotune.errors import DoesNotFitError

    said = "the model has no module of the classes given as its blocks"
    objects = {**_objects(), "model": TwoHeads}
    with pytest.raises(WorkloadError, match=said) as raised:
        tune(**objects, blocks=nn.Conv2d, snapshot=LAPTOP, budget_s=15)  # type: ignore[arg-type]
    assert not isinstance(raised.value, DoesNotFitError)
    assert raised.value.exit_code == 5
    with pytest.raises(WorkloadError, match=said) as raised:
        tune({**objects, "blocks": nn.Conv2d}, snapshot=LAPTOP, budget_s=15)
    assert not isinstance(raised.value, DoesNotFitError)


def test_the_trainers_arguments_leave_named_blocks_to_prepare_model() -> None:
    """The Trainer's own checkpointing recomputes its model's layers, not the blocks the probe
    measured: with named blocks the export turns it off and says where they are wrapped."""
    from tests.test_bench import measured
    from torch_autotune.integrations import hf_training_arguments, tool_notes

    profile = measured("h100-80gb-hbm3")
    on = {"activation_checkpointing": True}
    plain = profile.model_copy(update={"settings": profile.settings.model_copy(update=on)})
    named = plain.model_copy(
        update={"settings": plain.settings.model_copy(update={"blocks": NAME})}
    )
    assert any("checkpointing" in key for key in hf_training_arguments(plain))
    assert not any("checkpointing" in key for key in hf_training_arguments(named))
    said = tool_notes(named, "hf")
    assert any("prepare_model" in note and "blocks the workload named" in note for note in said)
    assert any(note.startswith(f"blocks: {NAME}") for note in said)


def test_a_name_from_another_script_matches_by_the_class_name_alone() -> None:
    """A class the tuning script defined is ``__main__.Layer`` in its profile; the training
    script imports it from its module."""
    model = TwoHeads()
    assert model_blocks(model, "__main__.Layer") == list(reversed(list(model.layers)))
    assert model_blocks(model, "__main__.Missing") == []


def test_fsdp2_refuses_a_model_without_the_named_blocks_rather_than_shard_it_whole() -> None:
    from torch_autotune.settings import torch_defaults
    from torch_autotune.wrapping import shard

    settings = torch_defaults("cpu").model_copy(update={"blocks": "pkg.model.Missing"})
    with pytest.raises(ValueError, match=r"no module of the classes the profile names"):
        shard(settings, TwoHeads(), mesh=object())


def test_named_blocks_of_a_model_that_checkpoints_itself_are_refused() -> None:
    """Its own checkpointing on, blocks named inside it would be recomputed twice over."""
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16)
    model = transformers.GPT2LMHeadModel(config)
    layer = type(model.transformer.h[0])
    names = ",".join(block_names(layer))
    assert checkpoint_blocks(model, names) == 2  # its own checkpointing off: they are wrapped
    model = transformers.GPT2LMHeadModel(config)
    checkpoint_blocks(model)  # its own, as gradient_checkpointing_enable() turns it on
    with pytest.raises(NotCheckpointable, match=r"checkpoints its own layers already"):
        checkpoint_blocks(model, names)

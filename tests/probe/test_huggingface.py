"""Hugging Face with no glue: a ``PreTrainedModel`` with dict samples and its own loss, a
``datasets.Dataset``, a ``transformers.Trainer``, each tuned as the user has it, and each
profile then used by a real Trainer at the tuned batch.

Real transformers and datasets on this CPU: models built from config objects at a tiny size,
a tokenizer built here from a word list, synthetic data; nothing is downloaded (the hub is
told to stay offline, and nothing here asks it). A real ``tune()`` is slow (10-20 s).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no test here may reach the network
transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")

from tests.conftest import env_importing_from  # noqa: E402
from tests.probe.fake_trials import recorded  # noqa: E402
from torch_autotune.api import recommend, save, tune  # noqa: E402
from torch_autotune.errors import WorkloadError, raised_by_user_code  # noqa: E402
from torch_autotune.hardware import HardwareSnapshot  # noqa: E402
from torch_autotune.integrations import hf_training_arguments  # noqa: E402
from torch_autotune.probe.workloads import Workload, resolve_workload  # noqa: E402
from torch_autotune.profile import Profile  # noqa: E402

LAPTOP = recorded("cpu-laptop-linux")  # a CPU-only machine: the real probe runs on this CPU
VOCAB = 64
SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture(autouse=True)
def no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine without CUDA for transformers and accelerate, which ask torch while a
    Trainer and its arguments are built (the hardware guard refuses any caller but torch)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


# --- the user's objects, as they have them ------------------------------------------------------


def bert() -> Any:
    """A BERT sequence classifier (3 classes) at a tiny size, without dropout (so that a loss
    can be compared with the model's own)."""
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        num_labels=3,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return transformers.BertForSequenceClassification(config)


def gpt2() -> Any:
    """A GPT-2 causal LM at a tiny size, without dropout."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=VOCAB,
        n_positions=64,
        n_embd=32,
        n_layer=1,
        n_head=2,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=1,
        eos_token_id=1,
    )
    return transformers.GPT2LMHeadModel(config)


def tokenizer() -> Any:
    """A fast word-level tokenizer over ``w0`` .. ``w61``, with ``[PAD]`` (id 0) and ``[UNK]``."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = {"[PAD]": 0, "[UNK]": 1, **{f"w{i}": i + 2 for i in range(VOCAB - 2)}}
    inner = Tokenizer(models.WordLevel(words, unk_token="[UNK]"))
    inner.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=inner, pad_token="[PAD]", unk_token="[UNK]"
    )


class Reviews(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Tokenized reviews as a user's dataset gives them: a dict per sample with
    ``input_ids``, ``attention_mask`` and an int ``label`` (the Trainer renames it ``labels``)."""

    def __init__(self, size: int = 64, length: int = 16) -> None:
        self.size = size
        self.length = length

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict[str, Any]:
        if not 0 <= index < self.size:
            raise IndexError(index)
        generator = torch.Generator().manual_seed(index)
        return {
            "input_ids": torch.randint(2, VOCAB, (self.length,), generator=generator),
            "attention_mask": torch.ones(self.length, dtype=torch.int64),
            "label": index % 3,
        }


def token_rows(size: int = 64, length: int = 16) -> Any:
    """A ``datasets.Dataset`` of Python lists, as a tokenizer's ``map`` leaves it, for a
    causal LM: ``input_ids``, ``labels`` (the same ids) and the ``text`` they came from."""
    ids = [[2 + (7 * row + col) % (VOCAB - 2) for col in range(length)] for row in range(size)]
    texts = [" ".join(f"w{i - 2}" for i in row) for row in ids]
    return datasets.Dataset.from_dict({"input_ids": ids, "labels": ids, "text": texts})


def texts_of_many_lengths(size: int = 64) -> Any:
    """A ``datasets.Dataset`` of texts from 3 to 24 words, tokenized (rows of different
    lengths, Python lists), with a ``label`` column."""
    texts = [
        " ".join(f"w{(row * 5 + col) % 62}" for col in range(3 + row % 22)) for row in range(size)
    ]
    encoded = tokenizer()(texts)
    return datasets.Dataset.from_dict(
        {"text": texts, **encoded, "label": [row % 3 for row in range(size)]}
    )


def make_classifier_workload() -> dict[str, Any]:
    """A user's factory: the model and the data they already have, nothing else."""
    return {"model": bert(), "dataset": Reviews()}


def trainer_for(
    tmp_path: Path, model: Any, dataset: Any, collator: Any = None, **arguments: Any
) -> Any:
    """A Trainer as a user builds one, on the CPU."""
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "trainer"), report_to="none", use_cpu=True, **arguments
    )
    return transformers.Trainer(
        model=model, args=args, train_dataset=dataset, data_collator=collator
    )


def one_step(workload: Workload) -> float:
    """One real step of the workload at batch 4, which changes the weights; its loss."""
    model = workload.make_model()
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = workload.make_optimizer(model)
    loss = workload.train_step(model, workload.make_batch(4))
    loss.backward()
    optimizer.step()
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))
    return float(loss.detach())


# --- a PreTrainedModel with dict samples --------------------------------------------------------


def test_a_sequence_classifier_with_dict_samples_trains_on_its_own_loss() -> None:
    workload = resolve_workload(None, objects={"model": bert(), "dataset": Reviews()})
    batch = workload.make_batch(4)
    assert set(batch) == {"input_ids", "attention_mask", "label"}
    model = workload.make_model()
    loss = workload.train_step(model, batch)
    own = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        labels=batch["label"],
    ).loss
    assert torch.allclose(loss, own)  # the model's own loss, attention_mask passed
    details = workload.details()  # type: ignore[misc]
    assert details.framework == "transformers"
    assert details.loss == "the model's own"
    assert details.call == "model(**batch) with input_ids, attention_mask, labels"
    assert workload.name == "BertForSequenceClassification"
    assert workload.kind == "transformer"


def test_a_transformers_model_without_an_optimizer_gets_the_trainer_s_default() -> None:
    workload = resolve_workload(None, objects={"model": bert(), "dataset": Reviews()})
    model = workload.make_model()
    optimizer = workload.make_optimizer(model)
    arguments = transformers.TrainingArguments(output_dir="unused", report_to="none")
    klass, kwargs = transformers.Trainer.get_optimizer_cls_and_kwargs(arguments)
    assert type(optimizer) is klass is torch.optim.AdamW
    (group,) = optimizer.param_groups
    assert group["lr"] == kwargs["lr"] == 5e-5
    assert group["betas"] == (0.9, 0.999)
    assert group["weight_decay"] == 0.0  # the Trainer's, not AdamW's own 0.01
    assert group["fused"] == kwargs.get("fused")  # adamw_torch_fused from torch 2.8
    assert [id(p) for p in group["params"]] == [id(p) for p in model.parameters()]
    assert workload.optimizer == "adamw"
    (note,) = [n for n in workload.details().notes if n.startswith("no optimizer")]  # type: ignore[misc]
    assert "the Hugging Face Trainer's default" in note
    assert "lr=5e-05" in note


def test_the_probe_s_options_reach_the_trainer_s_default_optimizer() -> None:
    workload = resolve_workload(None, objects={"model": bert(), "dataset": Reviews()})
    assert workload.optimizer_accepts(fused=False)
    optimizer = workload.make_optimizer(workload.make_model(), fused=False)
    assert optimizer.param_groups[0]["fused"] is False


def test_the_user_s_optimizer_is_kept_for_a_transformers_model() -> None:
    model = bert()
    given = torch.optim.SGD(model.parameters(), lr=0.1)
    workload = resolve_workload(
        None, objects={"model": model, "dataset": Reviews(), "optimizer": given}
    )
    assert workload.optimizer == "sgd"
    assert isinstance(workload.make_optimizer(workload.make_model()), torch.optim.SGD)
    assert not any(n.startswith("no optimizer") for n in workload.details().notes)  # type: ignore[misc]


def test_an_hf_model_whose_batch_has_no_labels_is_told_to_give_them_in_one_line() -> None:
    rows = token_rows().remove_columns(["labels"])
    workload = resolve_workload(None, objects={"model": gpt2(), "dataset": rows})
    with pytest.raises(WorkloadError) as raised:
        workload.train_step(workload.make_model(), workload.make_batch(2))
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("'GPT2LMHeadModel': no loss for the step")
    assert "the batch has no 'labels'" in message
    assert "give the samples 'labels'" in message
    assert "DataCollatorForLanguageModeling(tokenizer, mlm=False)" in message
    assert "loss_fn(outputs, batch)" in message
    assert not raised_by_user_code(raised.value)


# --- a datasets.Dataset -------------------------------------------------------------------------


def test_a_datasets_dataset_of_lists_batches_as_tensors_without_its_text() -> None:
    workload = resolve_workload(None, objects={"model": gpt2(), "dataset": token_rows()})
    batch = workload.make_batch(4)
    assert set(batch) == {"input_ids", "labels"}  # text removed, as the Trainer does
    assert batch["input_ids"].shape == (4, 16)  # stacked, not transposed into 16 lists of 4
    assert torch.equal(batch["input_ids"], batch["labels"])
    assert one_step(workload) > 0
    details = workload.details()  # type: ignore[misc]
    assert details.framework == "transformers"
    assert any(
        "removed as the Trainer's remove_unused_columns does: text" in n for n in details.notes
    )
    assert any("with_format('torch')" in n for n in details.notes)
    assert not workload.variable_shapes


def test_rows_of_many_lengths_go_through_a_padding_collator_the_search_on_the_longest() -> None:
    rows = texts_of_many_lengths()
    longest = max(len(ids) for ids in rows["input_ids"])
    collator = transformers.DataCollatorWithPadding(tokenizer())
    workload = resolve_workload(
        None, objects={"model": bert(), "dataset": rows, "collate_fn": collator}
    )
    worst = workload.make_batch(8)
    assert set(worst) == {"input_ids", "attention_mask", "labels"}  # label renamed by it
    assert worst["input_ids"].shape == (8, longest)
    assert workload.typical_batch is not None
    typical = workload.typical_batch(8)
    assert typical["input_ids"].shape[1] <= longest
    tokens = [int(b["attention_mask"].sum()) for b in (worst, typical)]
    assert tokens[0] > tokens[1]  # the search's rows are the longest, the points' at random
    assert workload.variable_shapes
    assert one_step(workload) > 0
    details = workload.details()  # type: ignore[misc]
    assert details.variable_shapes
    assert not any("with_format" in n for n in details.notes)  # the collator reads the lists


def test_a_collate_of_the_users_own_gets_the_columns_it_reads() -> None:
    """A collate that tokenizes the raw text on the fly, as many scripts do: the dataset
    reaches it as the user has it (the Trainer's column removal, which Hugging Face's own
    collators expect, cut 'text' and the collate raised KeyError)."""
    rows = texts_of_many_lengths()
    tok = tokenizer()

    def collate(batch: list[dict[str, Any]]) -> Any:
        encoded = tok([row["text"] for row in batch], padding=True, return_tensors="pt")
        encoded["labels"] = torch.tensor([row["label"] for row in batch])
        return encoded

    workload = resolve_workload(
        None, objects={"model": bert(), "dataset": rows, "collate_fn": collate}
    )
    assert workload.make_batch(4)["input_ids"].shape[0] == 4
    details = workload.details()  # type: ignore[misc]
    assert "the dataset's columns are kept as they are: the collate_fn reads them" in details.notes
    assert not any("remove_unused_columns" in n for n in details.notes)


def test_a_subclass_of_a_hugging_face_collator_is_one_of_theirs() -> None:
    """A collator that derives from transformers' (TRL's do) pads tokens, not text: the
    columns the model takes no argument for are removed for it, as for the Trainer's own."""

    class Padding(transformers.DataCollatorWithPadding):
        pass

    workload = resolve_workload(
        None,
        objects={
            "model": bert(),
            "dataset": texts_of_many_lengths(),
            "collate_fn": Padding(tokenizer()),
        },
    )
    assert "text" not in workload.make_batch(4)
    details = workload.details()  # type: ignore[misc]
    assert any("remove_unused_columns does: text" in n for n in details.notes)


def test_rows_of_many_lengths_without_a_collate_say_to_give_a_padding_one() -> None:
    rows = texts_of_many_lengths()
    with pytest.raises(WorkloadError, match="give a collate_fn that batches them"):
        resolve_workload(None, objects={"model": bert(), "dataset": rows})


def test_a_dataset_dict_is_told_to_give_a_split(tmp_path: Path) -> None:
    splits = datasets.DatasetDict({"train": token_rows(), "test": token_rows(8)})
    message = (
        "'GPT2LMHeadModel': the dataset is a DatasetDict of splits (train, test); give the split"
        " to train on, such as dataset['train']"
    )
    with pytest.raises(WorkloadError) as raised:
        resolve_workload(None, objects={"model": gpt2(), "dataset": splits})
    assert str(raised.value) == message
    with pytest.raises(WorkloadError) as raised:
        resolve_workload(trainer_for(tmp_path, gpt2(), splits))
    assert str(raised.value) == message


# --- a Trainer ----------------------------------------------------------------------------------


def test_a_trainer_is_taken_as_it_trains(tmp_path: Path) -> None:
    rows = texts_of_many_lengths().remove_columns(["label"])
    collator = transformers.DataCollatorForLanguageModeling(tokenizer(), mlm=False)
    trainer = trainer_for(tmp_path, gpt2(), rows, collator, weight_decay=0.1)
    workload = resolve_workload(trainer)
    assert workload.name == "GPT2LMHeadModel"
    batch = workload.make_batch(4)
    assert set(batch) == {"input_ids", "attention_mask", "labels"}  # text removed, labels made
    model = workload.make_model()
    assert model is not trainer.model
    loss = workload.train_step(model, batch)
    assert torch.allclose(loss, model(**batch).loss)
    details = workload.details()  # type: ignore[misc]
    assert details.framework == "transformers Trainer"
    assert details.call == "trainer.compute_loss(model, batch) (Trainer.compute_loss)"
    assert details.variable_shapes
    assert any("DataCollatorForLanguageModeling" in n for n in details.notes)
    assert trainer.optimizer is None  # the Trainer builds its own when it trains


def test_a_trainer_s_precision_arguments_are_said_to_be_the_profiles_to_set(
    tmp_path: Path,
) -> None:
    """TrainingArguments(bf16=True) takes effect in train(), which the probe does not call:
    the note says the profile's precision was measured, not the Trainer's (it said nothing,
    and the export's bf16 read as if it had been measured against it)."""
    trainer = trainer_for(tmp_path, gpt2(), token_rows(), bf16=True)
    details = resolve_workload(trainer).details()  # type: ignore[misc]
    (note,) = [n for n in details.notes if "ask for" in n]
    assert "ask for bf16, which it applies when train() starts" in note
    assert "the profile's precision instead" in note


def test_a_trainer_whose_loss_is_nan_is_said_in_the_notes(tmp_path: Path) -> None:
    """A Trainer's step that trains to NaN is as fast and learns nothing: the notes say so, as
    for a step of the user's own (the Trainer's step kept no loss to read)."""

    class NanTrainer(transformers.Trainer):  # type: ignore[misc]
        def compute_loss(self, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
            return model(**inputs).loss * float("nan")

    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "trainer"), report_to="none", use_cpu=True
    )
    workload = resolve_workload(NanTrainer(model=gpt2(), args=args, train_dataset=token_rows()))
    assert workload.details is not None
    workload.train_step(workload.make_model(), workload.make_batch(2))
    (note,) = [n for n in workload.details().notes if "loss was" in n]
    assert note.startswith("the last training step's loss was nan: ")


def test_a_trainer_s_optimizer_is_built_over_each_copy_with_its_weight_decay_groups(
    tmp_path: Path,
) -> None:
    trainer = trainer_for(tmp_path, bert(), Reviews(), weight_decay=0.1, learning_rate=3e-4)
    workload = resolve_workload(trainer)
    model = workload.make_model()
    optimizer = workload.make_optimizer(model)
    assert isinstance(optimizer, torch.optim.AdamW)
    names = {id(p): n for n, p in model.named_parameters()}
    decayed, plain = optimizer.param_groups
    assert (decayed["weight_decay"], plain["weight_decay"]) == (0.1, 0.0)
    assert {g["lr"] for g in optimizer.param_groups} == {3e-4}
    assert all(id(p) in names for g in optimizer.param_groups for p in g["params"])  # the copy's
    assert not any("bias" in names[id(p)] or "LayerNorm" in names[id(p)] for p in decayed["params"])
    assert any("bias" in names[id(p)] for p in plain["params"])
    assert trainer.optimizer is None
    assert workload.optimizer == "adamw"
    (note,) = [n for n in workload.details().notes if n.startswith("optimizer:")]  # type: ignore[misc]
    assert f"optim '{trainer.args.optim.value}'" in note  # what trained is the Trainer's optim


def test_a_trainer_s_fused_optim_is_the_profile_s_kernel_and_its_export_s(tmp_path: Path) -> None:
    """optim='adamw_torch_fused' on a CPU: the Trainer's fused AdamW trained, and the profile
    said fused_optimizer off (rule I3). It now says on, with what fixed it, and the Hugging
    Face export writes the optim that trained."""
    from torch_autotune import compose
    from torch_autotune.profile import Mode
    from torch_autotune.rules.engine import build_profile

    def profile_of(optim: str) -> Profile:
        trainer = trainer_for(tmp_path, bert(), Reviews(), optim=optim)
        workload = resolve_workload(trainer)
        preferences = compose.preferences(workload, Mode.SPEED, True, None, None)
        return build_profile(LAPTOP, preferences=preferences)

    fused = profile_of("adamw_torch_fused")
    assert fused.settings.optimizer.fused
    decision = fused.decision("optimizer.fused")
    assert decision is not None
    assert decision.reason.startswith("fixed by your Trainer's optim='adamw_torch_fused': ")
    assert hf_training_arguments(fused)["optim"] == "adamw_torch_fused"
    plain = profile_of("adamw_torch")  # foreach trained: the rules' kernel, the Trainer's too
    assert not plain.settings.optimizer.fused
    assert "optim" not in hf_training_arguments(plain)


def test_a_trainer_s_optimizer_note_says_what_its_optim_builds(tmp_path: Path) -> None:
    """optim='adamw_torch' was noted as 'a fused optim trains fused whatever the rules say, so
    the profile's optimizer.fused is on', beside a profile with it off (rule I3). The note now
    says what the Trainer's own optim builds, and agrees with the profile's kernel."""
    from torch_autotune import compose
    from torch_autotune.profile import Mode
    from torch_autotune.rules.engine import build_profile

    for optim in ("adamw_torch", "adamw_torch_fused"):
        workload = resolve_workload(trainer_for(tmp_path, bert(), Reviews(), optim=optim))
        (note,) = [n for n in workload.details().notes if n.startswith("optimizer:")]  # type: ignore[misc]
        preferences = compose.preferences(workload, Mode.SPEED, True, None, None)
        fused = build_profile(LAPTOP, preferences=preferences).settings.optimizer.fused
        assert fused is (optim == "adamw_torch_fused")
        assert f"optim '{optim}'" in note
        assert ("trains fused whatever the rules say" in note) is fused
        assert ("so the profile's optimizer.fused is on" in note) is fused
        assert ("it is not built fused, so the profile's optimizer.fused decides" in note) is (
            not fused
        )


def test_a_trainer_s_accumulated_global_batch_is_kept_as_the_target(tmp_path: Path) -> None:
    """per_device_train_batch_size=16 and gradient_accumulation_steps=4: the profile and the
    Hugging Face export gave the measured batch and accumulation 1, and the global batch went
    from 64 to whatever fitted, without a word. The Trainer's 64 samples per optimizer step are
    now the target of accumulation (rule L1): kept with the measured batch, and said where they
    came from; a target the user gives still wins, and a Trainer that does not accumulate has
    its batch tuned as before."""
    from tests.probe.fake_trials import cpu_machine, tune_on
    from tests.test_claims import disagreements
    from torch_autotune import compose
    from torch_autotune.profile import Mode

    args = {"per_device_train_batch_size": 16, "gradient_accumulation_steps": 4}
    trainer = trainer_for(tmp_path, bert(), Reviews(size=512), **args)
    workload = resolve_workload(trainer)
    (note,) = [n for n in workload.details().notes if "samples per process" in n]  # type: ignore[misc]
    assert note.startswith(
        "your Trainer's per_device_train_batch_size 16 x gradient_accumulation_steps 4 = 64"
        " samples per process per optimizer step: the profile keeps that global batch"
    )
    simulated = dataclasses.replace(workload, dataset=None)  # no real DataLoader measured
    machine = cpu_machine(fixed_s=0.05, per_sample_s=0.002, first_s=0.3, autotune_s=0.0)
    for options, target in (
        ({}, 64),
        ({"max_batch_size": 16}, 64),  # as where memory fits 16: 16 x 4 steps
        ({"processes_per_node": 2}, 128),  # the Trainer's arguments are per device
        ({"target_global_batch": 32}, 32),  # the user's own target
    ):
        profile = tune_on(machine, simulated, LAPTOP, budget_s=60, **options)
        exported = hf_training_arguments(profile)
        steps = exported["gradient_accumulation_steps"]
        made = exported["per_device_train_batch_size"] * steps * profile.topology.world_size
        assert (made, profile.provenance.preferences.target_global_batch) == (target, target)
        assert steps == (4 if options.get("max_batch_size") else 1)
        decision = profile.decision("batch.grad_accum_steps")
        assert decision is not None
        trainer_s = "; the target is your Trainer's per_device_train_batch_size 16 x"
        assert (trainer_s in decision.reason) is ("target_global_batch" not in options)
        assert disagreements(profile) == []
    plain = resolve_workload(
        trainer_for(tmp_path, bert(), Reviews(), per_device_train_batch_size=16)
    )
    assert plain.update_samples is None
    assert not any("samples per process" in n for n in plain.details().notes)  # type: ignore[misc]
    preferences = compose.preferences(plain, Mode.SPEED, True, None, None)
    assert compose.workload_target(preferences, plain, 1).target_global_batch is None


def test_a_trainer_s_global_batch_above_the_most_a_target_may_be_is_said_not_kept(
    tmp_path: Path,
) -> None:
    """A Trainer's per_device_train_batch_size x gradient_accumulation_steps (times the
    processes) above MAX_GLOBAL_BATCH is no target a profile holds, and was dropped, while its
    note said the profile keeps it and rule L1 said no target was given. Both now say it is
    not kept, and why; the note of one within the bound still says it is kept."""
    from torch_autotune import compose
    from torch_autotune.bounds import MAX_GLOBAL_BATCH
    from torch_autotune.profile import Mode
    from torch_autotune.rules.engine import build_profile

    def trainer(batch: int, steps: int) -> Workload:
        args = {"per_device_train_batch_size": batch, "gradient_accumulation_steps": steps}
        return resolve_workload(trainer_for(tmp_path, bert(), Reviews(), **args))

    above, within = trainer(4096, 4097), trainer(4096, 2048)  # 16,781,312 and 8,388,608
    for workload, processes, kept in ((above, 1, False), (within, 4, False), (within, 1, True)):
        assert workload.update_samples is not None
        made = workload.update_samples[0] * processes
        assert (made <= MAX_GLOBAL_BATCH) is kept
        (note,) = [n for n in workload.details().notes if "samples per process" in n]  # type: ignore[misc]
        preferences = compose.preferences(workload, Mode.SPEED, True, None, None)
        target = compose.workload_target(preferences, workload, processes)
        assert target.target_global_batch == (made if kept else None)
        reason = build_profile(LAPTOP, preferences=target).decision("batch.grad_accum_steps")
        assert reason is not None
        not_kept = f"{made:,} is more than {MAX_GLOBAL_BATCH:,}, the most a target global batch"
        assert (not_kept in reason.reason) is not kept
        assert ("no target global batch is given" in reason.reason) is False
        if workload is above:
            assert "so the profile does not keep it" in note
            assert "the profile keeps that global batch" not in note
        else:  # within the bound for one process: kept, unless its processes make it more
            assert "the profile keeps that global batch (times its processes)" in note
            assert f"where its processes make it more than {MAX_GLOBAL_BATCH:,}" in note


def test_a_trainer_s_own_optimizer_is_rebuilt_over_each_copy(tmp_path: Path) -> None:
    model = bert()
    given = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    args = transformers.TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=Reviews(), optimizers=(given, None)
    )
    workload = resolve_workload(trainer)
    assert workload.optimizer == "sgd"
    copy = workload.make_model()
    rebuilt = workload.make_optimizer(copy)
    assert isinstance(rebuilt, torch.optim.SGD)
    assert rebuilt.param_groups[0]["momentum"] == 0.9
    held = [id(p) for g in rebuilt.param_groups for p in g["params"]]
    assert held == [id(p) for p in copy.parameters()]


class DoubledLoss(transformers.Trainer):  # type: ignore[misc]
    """A Trainer subclass with a compute_loss of its own, which records the models it gets."""

    models: list[Any]

    def compute_loss(
        self, model: Any, inputs: Any, return_outputs: bool = False, num_items_in_batch: Any = None
    ) -> Any:
        self.models = [*getattr(self, "models", []), model]
        labels = inputs.pop("labels")  # as label smoothing does: the probe copies the batch
        outputs = model(**inputs)
        return torch.nn.functional.cross_entropy(outputs.logits, labels) * 2


def test_a_trainer_subclass_s_compute_loss_is_called_with_the_copy(tmp_path: Path) -> None:
    args = transformers.TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    trainer = DoubledLoss(model=bert(), args=args, train_dataset=Reviews())
    workload = resolve_workload(trainer)
    model = workload.make_model()
    batch = workload.make_batch(4)
    first = workload.train_step(model, batch)
    again = workload.train_step(model, batch)  # the batch still holds its labels
    own = model(**batch).loss
    assert torch.allclose(first, own * 2)
    assert torch.allclose(again, first)
    assert trainer.models == [model, model]
    details = workload.details()  # type: ignore[misc]
    assert details.call == "trainer.compute_loss(model, batch) (DoubledLoss.compute_loss)"
    assert details.loss == "DoubledLoss.compute_loss"


def test_a_trainer_without_a_train_dataset_is_refused_in_one_line(tmp_path: Path) -> None:
    trainer = trainer_for(tmp_path, bert(), None)
    with pytest.raises(WorkloadError) as raised:
        resolve_workload(trainer)
    assert str(raised.value) == (
        "'BertForSequenceClassification': the Trainer has no train_dataset; give"
        " Trainer(..., train_dataset=...): the probe trains on its samples"
    )


def test_a_trainer_whose_batches_have_no_labels_is_told_what_makes_them(tmp_path: Path) -> None:
    rows = token_rows().remove_columns(["labels"])
    workload = resolve_workload(trainer_for(tmp_path, gpt2(), rows))
    with pytest.raises(WorkloadError) as raised:
        workload.train_step(workload.make_model(), workload.make_batch(2))
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("'GPT2LMHeadModel': the Trainer's compute_loss got no loss")
    assert "(keys: input_ids)" in message
    assert "DataCollatorForLanguageModeling(tokenizer, mlm=False)" in message


def test_a_factory_returning_a_trainer_is_named_as_the_factory(tmp_path: Path) -> None:
    def make_trainer() -> Any:
        return trainer_for(tmp_path, bert(), Reviews())

    workload = resolve_workload(make_trainer)
    assert workload.name.endswith(
        ":test_a_factory_returning_a_trainer_is_named_as_the_factory.<locals>.make_trainer"
    )
    details = workload.details()  # type: ignore[misc]
    assert details.source == "factory"
    assert not any("the workload is named" in n for n in details.notes)


# --- nothing imported for objects of other packages ----------------------------------------------


@pytest.mark.child_process
@pytest.mark.slow  # a child interpreter imports torch: 2-3 s
def test_plain_objects_import_neither_transformers_nor_datasets() -> None:
    code = textwrap.dedent(
        """
        import sys, torch
        from torch_autotune.probe.workloads import resolve_workload
        data = torch.utils.data.TensorDataset(torch.randn(8, 4), torch.randint(0, 2, (8,)))
        workload = resolve_workload(None, objects={
            "model": torch.nn.Linear(4, 2),
            "dataset": data,
            "optimizer": lambda params, **kw: torch.optim.SGD(params, lr=0.1, **kw),
        })
        workload.train_step(workload.make_model(), workload.make_batch(4)).backward()
        workload.details()
        print([m for m in ("transformers", "datasets", "lightning") if m in sys.modules])
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=env_importing_from(SRC),
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


# --- tuned, then trained by a real Trainer at the tuned batch ------------------------------------


@pytest.fixture
def seen_batches() -> Iterator[Callable[[Any], list[int]]]:
    """``watch(model)``: the batch sizes the model's forward gets from then on."""
    handles: list[Any] = []

    def watch(model: Any) -> list[int]:
        sizes: list[int] = []

        def record(_module: Any, _args: Any, kwargs: dict[str, Any]) -> None:
            sizes.append(int(kwargs["input_ids"].shape[0]))

        handles.append(model.register_forward_pre_hook(record, with_kwargs=True))
        return sizes

    yield watch
    for handle in handles:
        handle.remove()


def trains_at_the_tuned_batch(
    profile: Profile,
    tmp_path: Path,
    watch: Callable[[Any], list[int]],
    model: Any,
    dataset: Any,
    *,
    collator: Any = None,
) -> None:
    """A real Trainer with the profile's exported TrainingArguments trains two steps, each
    on the batch the profile gives."""
    exported = json.loads(json.dumps(hf_training_arguments(profile)))  # as the file holds it
    batch_size = profile.settings.batch.batch_size
    assert exported["per_device_train_batch_size"] == batch_size
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "trained"),
        max_steps=2,
        report_to=[],
        save_strategy="no",
        **exported,
    )
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=dataset, data_collator=collator
    )
    sizes = watch(model)
    result = trainer.train()
    assert result.global_step == 2
    assert sizes == [batch_size, batch_size]


def measured_on(profile: Profile, workload: str, framework: str) -> None:
    evidence = profile.evidence
    assert evidence is not None
    assert profile.measured
    assert evidence.workload == workload
    assert evidence.details is not None
    assert evidence.details.framework == framework
    ran = {t.batch_size for t in evidence.search if t.fits}
    assert evidence.batch_size in ran  # never a size that did not run


@pytest.mark.slow  # a real tune(): 15 s of budget, then two Trainer steps
def test_tune_a_sequence_classifier_factory_then_train_it_with_the_export(
    tmp_path: Path, seen_batches: Callable[[Any], list[int]]
) -> None:
    profile = tune(make_classifier_workload, snapshot=LAPTOP, budget_s=15, max_batch_size=32)
    measured_on(profile, f"{__name__}:make_classifier_workload", "transformers")
    details = profile.evidence.details  # type: ignore[union-attr]
    assert details.loss == "the model's own"
    assert details.optimizer == "AdamW"
    trains_at_the_tuned_batch(profile, tmp_path, seen_batches, bert(), Reviews())


@pytest.mark.slow  # a real tune(): 15 s of budget, then two Trainer steps
def test_tune_a_causal_lm_on_a_datasets_dataset_then_train_it_with_the_export(
    tmp_path: Path, seen_batches: Callable[[Any], list[int]]
) -> None:
    rows = token_rows()
    profile = tune(model=gpt2(), dataset=rows, snapshot=LAPTOP, budget_s=15, max_batch_size=32)
    measured_on(profile, "GPT2LMHeadModel", "transformers")
    assert rows.format["type"] is None  # the user's dataset is left as it was
    assert "text" in rows.column_names
    trains_at_the_tuned_batch(profile, tmp_path, seen_batches, gpt2(), rows)


@pytest.mark.slow  # a real tune(): 15 s of budget, then two Trainer steps
def test_tune_a_trainer_as_it_is_then_train_it_with_the_export(
    tmp_path: Path,
    seen_batches: Callable[[Any], list[int]],
    detected_as: Callable[[str], HardwareSnapshot],
) -> None:
    detected_as("cpu-laptop-linux")
    rows = texts_of_many_lengths().remove_columns(["label"])
    collator = transformers.DataCollatorForLanguageModeling(tokenizer(), mlm=False)
    model = gpt2()
    before = {name: p.detach().clone() for name, p in model.state_dict().items()}
    trainer = trainer_for(tmp_path, model, rows, collator)
    profile = tune(trainer, budget_s=15, max_batch_size=32)
    measured_on(profile, "GPT2LMHeadModel", "transformers Trainer")
    assert profile.evidence.details.variable_shapes  # type: ignore[union-attr]
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # untouched
    assert trainer.optimizer is None
    save(profile)
    assert recommend(workload="GPT2LMHeadModel").measured  # as the evidence's note says
    trains_at_the_tuned_batch(profile, tmp_path, seen_batches, model, rows, collator=collator)


@pytest.mark.slow  # a real tune(): 10 s of budget, then one Trainer step
def test_tune_an_accumulating_trainer_then_train_its_global_batch_with_the_export(
    tmp_path: Path,
    seen_batches: Callable[[Any], list[int]],
    detected_as: Callable[[str], HardwareSnapshot],
) -> None:
    """A Trainer of 8 x 4 samples per optimizer step: the export's Trainer steps on 32 samples
    too, in micro-batches of the tuned size (it stepped on the tuned batch alone)."""
    detected_as("cpu-laptop-linux")
    rows = token_rows(size=256)
    args = {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 4}
    profile = tune(trainer_for(tmp_path, gpt2(), rows, **args), budget_s=10)
    measured_on(profile, "GPT2LMHeadModel", "transformers Trainer")
    exported = json.loads(json.dumps(hf_training_arguments(profile)))  # as the file holds it
    batch, steps = exported["per_device_train_batch_size"], exported["gradient_accumulation_steps"]
    assert batch * steps == 32
    trained = transformers.TrainingArguments(
        output_dir=str(tmp_path / "trained"),
        max_steps=1,
        report_to=[],
        save_strategy="no",
        **exported,
    )
    model = gpt2()
    sizes = seen_batches(model)
    transformers.Trainer(model=model, args=trained, train_dataset=rows).train()
    assert sizes == [batch] * steps  # one optimizer step on the Trainer's global batch


# --- the GPU benchmark's script -------------------------------------------------------------------


@pytest.mark.slow  # a child interpreter tunes and runs the grid on a tiny GPT-2: 30-60 s
def test_the_hf_gpt2_benchmark_runs_in_smoke_mode(tmp_path: Path) -> None:
    script = SRC.parent / "benchmarks" / "hf_gpt2.py"
    result = subprocess.run(
        [sys.executable, str(script), "--smoke", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env_importing_from(SRC, HF_HUB_OFFLINE="1"),
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((tmp_path / "hf_gpt2_objects_cpu-smoke.json").read_text())
    assert report["versions"]["device"] == "cpu (smoke)"
    assert report["versions"]["transformers"] == transformers.__version__
    (measured,) = report["results"]
    assert measured["smoke"] is True
    assert measured["details"]["framework"] == "transformers"
    arms = {arm["arm"]: arm["samples_per_s"] for arm in measured["arms"]}
    assert isinstance(arms["baseline"], float)
    assert isinstance(arms["tuned"], float)
    assert measured["tuned_over_oracle"] == arms["tuned"] / measured["oracle_samples_per_s"]
    text = (tmp_path / "hf_gpt2_objects_cpu-smoke.md").read_text()
    assert "**Smoke run**" in text
    assert not list((SRC.parent / "benchmarks" / "results").glob("hf_gpt2_*smoke*"))


def test_a_hugging_face_model_checkpoints_its_own_layers_with_the_same_step() -> None:
    """Issue 21: activation checkpointing on a PreTrainedModel goes through its own
    gradient_checkpointing_enable (non-reentrant), and the step it recomputes is the step."""
    from torch_autotune.probe.recompute import checkpointed_step_agrees
    from torch_autotune.probe.trials import StepSettings
    from torch_autotune.settings import torch_defaults
    from torch_autotune.wrapping import checkpoint_blocks

    workload = resolve_workload(None, objects={"model": gpt2(), "dataset": token_rows()})
    agreement = checkpointed_step_agrees(workload, StepSettings(torch_defaults("cpu")), 4)
    assert agreement.agrees
    assert agreement.blocks == 1  # the model's own switch
    model = workload.make_model()
    assert checkpoint_blocks(model) == 1
    assert any(getattr(m, "gradient_checkpointing", False) for m in model.modules())
    assert checkpoint_blocks(model) == 0


def test_what_the_model_does_of_its_own_is_said_beside_the_profiles_settings() -> None:
    """A model already in bf16, with Hugging Face's checkpointing turned on by the user: every
    trial trained so, and the notes say it (the profile read 'float32' and 'off' alone)."""
    model = gpt2().to(torch.bfloat16)
    model.activation_checkpointing_enable()
    details = resolve_workload(None, objects={"model": model, "dataset": token_rows()}).details()  # type: ignore[misc]
    said = " ".join(details.notes)
    assert "the model's parameters are bfloat16: every trial trained in it" in said
    assert "the model checkpoints its activations itself" in said
    plain = resolve_workload(None, objects={"model": gpt2(), "dataset": token_rows()}).details()  # type: ignore[misc]
    assert not any("parameters are" in n or "checkpoints its" in n for n in plain.notes)

"""Workloads: the built-in models train on the CPU, the synthetic data is deterministic, and
every way a user's factory can be unusable is one clear WorkloadError (exit code 5)."""

from __future__ import annotations

import dataclasses
import math
import pickle
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torch_autotune.errors import EXIT_WORKLOAD, WorkloadError, raised_by_user_code
from torch_autotune.probe import workloads
from torch_autotune.probe.workloads import (
    BUILTIN_WORKLOADS,
    DEFAULT_WORKLOAD,
    CpuHeavyDataset,
    SyntheticImages,
    SyntheticTokens,
    Workload,
    as_workload,
    default_workload,
    llama,
    load_workload,
    models,
    resolve_workload,
)

SAMPLE_MODELS = Path(__file__).parent / "sample_user_models"
README = (
    "give model, optimizer and a dataset, a loader or an example_batch (see the README's"
    " 'Your own model')"
)

# The documented shapes of one batch of 8: (inputs, input dtype), (targets, target dtype),
# and the model's output.
BATCH_OF_8 = {
    "conv": ((8, 3, 64, 64), torch.float32, (8,), torch.int64, (8, 10)),
    "transformer": ((8, 128), torch.int64, (8, 128), torch.int64, (8, 128, 1000)),
    "mlp": ((8, 512), torch.float32, (8,), torch.int64, (8, 10)),
    "resnet50": ((8, 3, 224, 224), torch.float32, (8,), torch.int64, (8, 1000)),
    "gpt2": ((8, 512), torch.int64, (8, 512), torch.int64, (8, 512, 50257)),
    "gpt2-large": ((8, 1024), torch.int64, (8, 1024), torch.int64, (8, 1024, 50257)),
    "llama-1b": ((8, 2048), torch.int64, (8, 2048), torch.int64, (8, 2048, 32000)),
}
KIND = {"conv": "conv", "transformer": "transformer", "mlp": "mlp"}
KIND |= {"resnet50": "conv", "gpt2": "transformer"}
KIND |= {"gpt2-large": "transformer", "llama-1b": "transformer"}
BUILT = {key: make() for key, make in BUILTIN_WORKLOADS.items()}
# Workloads a CPU test trains at batch 8; a step of the realistic ones takes seconds here, and
# the memory-bound ones (issue 21) are built on the meta device only.
SMALL = ["conv", "transformer", "mlp"]
REALISTIC = ["resnet50", "gpt2"]
MEMORY_BOUND = ["gpt2-large", "llama-1b"]


def quick_model(key: str) -> torch.nn.Module:
    """The workload's model; a realistic one as the same classes at a tiny size."""
    if key == "resnet50":
        return workloads.BottleneckResNet(blocks=(1, 1, 1, 1), widths=(8, 8, 16, 16))
    if key in ("gpt2", "gpt2-large"):
        return workloads.GPT(vocab_size=64, max_len=32, d_model=32, nhead=4, num_layers=2)
    if key == "llama-1b":
        return _tiny_llama()
    return BUILT[key].make_model()


def train_step(workload: Workload, model: torch.nn.Module, batch_size: int = 8) -> float:
    """One real training step (forward, loss, backward, optimizer step); returns the loss."""
    optimizer = workload.make_optimizer(model)
    loss = workload.train_step(model, workload.make_batch(batch_size))
    loss.backward()
    optimizer.step()
    return float(loss.detach())


# --- built-in workloads ---------------------------------------------------------------------------


def test_the_builtins_are_the_small_three_the_realistic_and_memory_bound_two() -> None:
    assert list(BUILTIN_WORKLOADS) == [*SMALL, *REALISTIC, *MEMORY_BOUND]
    assert DEFAULT_WORKLOAD == "conv"
    assert resolve_workload(None).name == "conv"


@pytest.mark.parametrize(
    ("device", "expected"),
    [("cuda", "resnet50"), ("cuda:1", "resnet50"), ("mps", "resnet50"), ("cpu", "conv")],
)
def test_the_default_workload_is_resnet50_on_an_accelerator_and_conv_on_the_cpu(
    device: str, expected: str
) -> None:
    assert default_workload(device) == expected
    assert resolve_workload(None, device=device).name == expected
    assert resolve_workload("mlp", device=device).name == "mlp"  # a name asked for wins


def model_output_shape(key: str, inputs: torch.Tensor) -> tuple[int, ...]:
    """The model's output shape: computed for real on the small workloads, on the meta device
    (shapes only, no arithmetic) for the realistic ones."""
    if key in SMALL:
        return tuple(BUILT[key].make_model()(inputs).shape)
    with torch.device("meta"):
        model = BUILT[key].make_model()
    return tuple(model(inputs.to("meta")).shape)


@pytest.mark.parametrize("key", list(BUILTIN_WORKLOADS))
def test_builtin_batch_and_output_have_the_documented_shapes(key: str) -> None:
    workload = BUILT[key]
    inputs_shape, inputs_dtype, targets_shape, targets_dtype, output_shape = BATCH_OF_8[key]
    inputs, targets = workload.make_batch(8)
    assert (tuple(inputs.shape), inputs.dtype) == (inputs_shape, inputs_dtype)
    assert (tuple(targets.shape), targets.dtype) == (targets_shape, targets_dtype)
    assert model_output_shape(key, inputs) == output_shape
    assert workload.kind == KIND[key]
    assert workload.sample_shape
    assert workload.max_batch_size is None


@pytest.mark.parametrize("key", SMALL)
def test_builtin_training_step_runs_on_the_cpu_and_changes_the_weights(key: str) -> None:
    workload = BUILT[key]
    model = workload.make_model()
    before = [p.detach().clone() for p in model.parameters()]
    loss = train_step(workload, model)
    assert math.isfinite(loss)
    assert loss > 0
    assert not any(torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))


@pytest.mark.parametrize("key", SMALL)
def test_builtin_make_model_returns_independent_fresh_models(key: str) -> None:
    workload = BUILT[key]
    first, second = workload.make_model(), workload.make_model()
    assert first is not second
    pointers = {p.data_ptr() for p in first.parameters()}
    assert pointers.isdisjoint(p.data_ptr() for p in second.parameters())
    snapshot = [p.detach().clone() for p in second.parameters()]
    train_step(workload, first)
    assert all(torch.equal(s, p) for s, p in zip(snapshot, second.parameters(), strict=True))
    assert second.training


@pytest.mark.parametrize("key", list(BUILTIN_WORKLOADS))
def test_builtin_models_are_built_on_the_device_itself_every_tensor_there(key: str) -> None:
    # the meta device stands for an accelerator: a tensor made on the CPU first would show
    workload = BUILT[key]
    assert workload.builds_on_device
    model = workload.model_on("meta")
    tensors = [*model.parameters(), *model.buffers()]
    assert tensors
    assert {t.device.type for t in tensors} == {"meta"}


def _built_where(on_device: bool) -> tuple[str, str]:
    """(where the factory's own tensors were made, where the model's parameters are)."""
    made: list[str] = []

    def make_model() -> torch.nn.Module:
        made.append(torch.empty(0).device.type)
        return torch.nn.Linear(2, 2)

    workload = dataclasses.replace(BUILT["mlp"], make_model=make_model, builds_on_device=on_device)
    model = workload.model_on("meta")
    return made[0], next(model.parameters()).device.type


def test_a_workload_that_cannot_build_on_the_device_is_built_on_the_cpu_and_moved() -> None:
    assert _built_where(on_device=True) == ("meta", "meta")
    assert _built_where(on_device=False) == ("cpu", "meta")


def test_before_torch_2_whose_device_is_no_context_a_builtin_is_built_on_the_cpu_and_moved(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class OldDevice:  # torch 1.x: ``torch.device`` has no __enter__
        pass

    made: list[str] = []

    def make_model() -> torch.nn.Module:
        made.append(torch.empty(0).device.type)
        return torch.nn.Linear(2, 2)

    workload = dataclasses.replace(BUILT["mlp"], make_model=make_model)
    assert workload.builds_on_device
    monkeypatch.setattr(torch, "device", OldDevice)
    model = workload.model_on("meta")
    monkeypatch.undo()
    assert made == ["cpu"]
    assert next(model.parameters()).device.type == "meta"


@pytest.mark.usefixtures("user_models")
def test_the_users_models_are_built_on_the_cpu_as_they_wrote_them() -> None:
    for spec in ("tiny:good_mapping", "tiny:good_object"):
        assert not load_workload(spec).builds_on_device


@pytest.mark.parametrize("key", list(BUILTIN_WORKLOADS))
def test_builtin_dataset_items_are_samples_of_the_batch_shape(key: str) -> None:
    workload = BUILT[key]
    assert workload.dataset is not None
    inputs, targets = workload.make_batch(2)
    item_inputs, item_targets = workload.dataset[7]
    assert (item_inputs.shape, item_inputs.dtype) == (inputs.shape[1:], inputs.dtype)
    assert (item_targets.shape, item_targets.dtype) == (targets.shape[1:], targets.dtype)
    again = workload.dataset[7]
    assert torch.equal(item_inputs, again[0])
    assert torch.equal(item_targets, again[1])
    assert not torch.equal(item_inputs, workload.dataset[8][0])


def test_builtin_batches_are_the_same_every_call() -> None:
    first, second = BUILT["conv"].make_batch(4), BUILT["conv"].make_batch(4)
    assert torch.equal(first[0], second[0])
    assert torch.equal(first[1], second[1])


@pytest.mark.parametrize(("key", "vocab_size"), [("transformer", 1000), ("gpt2", 50257)])
def test_builtin_token_targets_are_the_next_tokens(key: str, vocab_size: int) -> None:
    inputs, targets = BUILT[key].make_batch(3)
    assert torch.equal(inputs[:, 1:], targets[:, :-1])
    assert 0 <= int(inputs.min()) <= int(inputs.max()) < vocab_size


@pytest.mark.parametrize("key", list(BUILTIN_WORKLOADS))
def test_builtin_optimizer_is_adamw_at_1e_3_and_takes_fused(key: str) -> None:
    workload = BUILT[key]
    assert workload.optimizer_accepts(fused=True)
    optimizer = workload.make_optimizer(quick_model(key), fused=True)
    assert isinstance(optimizer, torch.optim.AdamW)
    assert optimizer.defaults["lr"] == 1e-3
    assert optimizer.defaults["fused"] is True


@pytest.mark.parametrize("key", list(BUILTIN_WORKLOADS))
def test_builtin_models_pickle(key: str) -> None:
    model = quick_model(key)
    copy = pickle.loads(pickle.dumps(model))
    assert type(copy) is type(model)
    pairs = zip(model.state_dict().values(), copy.state_dict().values(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)


def test_model_classes_are_module_attributes() -> None:
    assert workloads.ResNetLike.__module__ == "torch_autotune.probe.workloads.models"
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        workloads.Nope  # noqa: B018


@pytest.mark.parametrize("name", models.__all__)
def test_the_package_serves_every_model_class(name: str) -> None:
    assert getattr(workloads, name) is getattr(models, name)


def test_a_model_pickled_before_the_classes_moved_still_loads() -> None:
    # Such a pickle names the class by the package, not by the models module.
    assert pickle.loads(b"ctorch_autotune.probe.workloads\nResNetLike\n.") is models.ResNetLike


@settings(max_examples=12, deadline=None)
@given(batch_size=st.integers(min_value=1, max_value=64))
def test_make_batch_returns_exactly_the_samples_asked_for(batch_size: int) -> None:
    for workload in BUILT.values():
        inputs, targets = workload.make_batch(batch_size)
        assert inputs.shape[0] == targets.shape[0] == batch_size


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_make_batch_refuses_a_size_that_is_not_a_positive_int(bad: Any) -> None:
    with pytest.raises(ValueError, match="batch size must be a positive int"):
        BUILT["mlp"].make_batch(bad)


@pytest.mark.child_process
def test_importing_workloads_and_building_the_builtins_does_not_import_torch() -> None:
    code = (
        "import sys; from torch_autotune.probe.workloads import BUILTIN_WORKLOADS as B; "
        "[make() for make in B.values()]; print('torch' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"


# --- the realistic built-ins: ResNet-50 and GPT-2 small -------------------------------------------


def meta_model(key: str) -> torch.nn.Module:
    """The workload's model on the meta device: shapes and parameter counts, no memory."""
    with torch.device("meta"):
        return BUILT[key].make_model()


# torchvision's resnet50 has exactly 25,557,032; GPT-2 small 124,439,808 with 1024 positions,
# 393,216 fewer with 512.
@pytest.mark.parametrize(
    ("key", "exact", "published"),
    [
        ("resnet50", 25_557_032, 25.6e6),
        ("gpt2", 124_046_592, 124e6),
        ("gpt2-large", 774_030_080, 774e6),  # GPT-2 large: 774M (Radford et al. 2019)
        ("llama-1b", 1_104_218_112, 1.1e9),  # Llama 3.2 1B's blocks, Llama 2's vocabulary
    ],
)
def test_realistic_models_have_the_published_parameter_counts(
    key: str, exact: int, published: float
) -> None:
    count = sum(p.numel() for p in meta_model(key).parameters())
    assert count == exact
    assert abs(count - published) / published < 0.01


def test_resnet50_is_a_7x7_stem_and_3_4_6_3_bottlenecks_down_to_2048_channels_at_7x7() -> None:
    model = meta_model("resnet50")
    assert model.stem[0].kernel_size == (7, 7)
    assert isinstance(model.stem[3], torch.nn.MaxPool2d)
    assert all(isinstance(block, workloads.Bottleneck) for block in model.blocks)
    strides = [block.conv2.stride[0] for block in model.blocks]
    assert strides == [1, 1, 1, 2, 1, 1, 1, 2, 1, 1, 1, 1, 1, 2, 1, 1]
    features = model.blocks(model.stem(torch.empty(2, 3, 224, 224, device="meta")))
    assert tuple(features.shape) == (2, 2048, 7, 7)


@pytest.mark.slow  # 124M parameters initialised: 2 s
def test_gpt2_has_twelve_blocks_a_tied_head_and_gpt2_initialisation() -> None:
    model = BUILT["gpt2"].make_model()
    assert model.head.weight is model.tokens.weight
    assert model.head.bias is None
    assert (len(model.blocks), model.blocks[0].attention.nhead) == (12, 12)
    assert tuple(model.positions.weight.shape) == (512, 768)
    fc, proj = (layer.weight.detach() for layer in (model.blocks[5].fc, model.blocks[5].proj))
    assert float(fc.std()) == pytest.approx(0.02, rel=0.05)
    assert float(proj.std()) == pytest.approx(0.02 / math.sqrt(24), rel=0.05)
    assert float(model.blocks[5].fc.bias.detach().abs().max()) == 0.0


def test_the_memory_bound_builtins_are_gpt2_large_and_a_llama_of_a_billion() -> None:
    large = meta_model("gpt2-large")
    assert (len(large.blocks), large.blocks[0].attention.nhead) == (36, 20)
    assert tuple(large.positions.weight.shape) == (1024, 1280)
    decoder = meta_model("llama-1b")
    block = decoder.blocks[0]
    assert (len(decoder.blocks), block.attention.nhead, block.attention.kv_heads) == (16, 32, 8)
    assert isinstance(block.attention_norm, llama.RMSNorm)
    assert tuple(block.gate.weight.shape) == (8192, 2048)  # SwiGLU: gate, up and down
    assert all(m.bias is None for m in decoder.modules() if isinstance(m, torch.nn.Linear))
    assert decoder.head.weight is not decoder.tokens.weight  # untied, as Llama's
    assert "cos" not in decoder.state_dict()  # the rotary tables are rebuilt, never saved


def _tiny_llama() -> torch.nn.Module:
    return llama.Llama(
        vocab_size=64, max_len=32, d_model=32, nhead=4, kv_heads=2, num_layers=2, hidden=64
    )


def test_llama_attention_is_causal_and_rotary_sees_positions() -> None:
    torch.manual_seed(0)
    model = _tiny_llama().eval()
    tokens = torch.randint(0, 64, (1, 16))
    changed = tokens.clone()
    changed[0, 10] = (tokens[0, 10] + 1) % 64
    before, after = model(tokens), model(changed)
    assert torch.allclose(before[:, :10], after[:, :10])  # earlier positions cannot see it
    assert not torch.allclose(before[:, 10:], after[:, 10:])
    # no position embedding but the rotation: without it, one layer of causal attention
    # cannot tell the order of the tokens before the last (a token repeated would not show it
    # either: every position averages the same values, rotated or not)
    one = llama.Llama(
        vocab_size=64, max_len=32, d_model=32, nhead=4, kv_heads=2, num_layers=1, hidden=64
    ).eval()
    order, swapped = torch.tensor([[3, 5, 9]]), torch.tensor([[5, 3, 9]])
    assert not torch.allclose(one(order)[0, -1], one(swapped)[0, -1])
    one.cos.fill_(1.0)  # the rotation undone: the order is lost
    one.sin.zero_()
    assert torch.allclose(one(order)[0, -1], one(swapped)[0, -1], atol=1e-6)


def test_a_tiny_llama_learns() -> None:
    torch.manual_seed(0)
    model = _tiny_llama()
    inputs, targets = SyntheticTokens(seq_len=32, vocab_size=64).batch(8)
    workload = BUILT["llama-1b"]
    optimizer = workload.make_optimizer(model, lr=1e-2)
    losses = []
    for _ in range(15):
        loss = workload.train_step(model, (inputs, targets))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.7 * losses[0]


def test_gpt_attention_is_causal() -> None:
    torch.manual_seed(0)
    model = workloads.GPT(vocab_size=50, max_len=16, d_model=32, nhead=4, num_layers=2).eval()
    tokens = torch.randint(0, 50, (1, 16))
    changed = tokens.clone()
    changed[0, 10] = (tokens[0, 10] + 1) % 50
    before, after = model(tokens), model(changed)
    assert torch.allclose(before[:, :10], after[:, :10])  # earlier positions cannot see it
    assert not torch.allclose(before[:, 10:], after[:, 10:])


@pytest.mark.parametrize("key", REALISTIC)
def test_the_realistic_architectures_learn_at_a_tiny_size(key: str) -> None:
    torch.manual_seed(0)
    model = quick_model(key)
    if key == "resnet50":
        inputs, targets = SyntheticImages(size=32, num_classes=1000).batch(8)
    else:
        inputs, targets = SyntheticTokens(seq_len=32, vocab_size=64).batch(8)
    optimizer = BUILT[key].make_optimizer(model, lr=1e-2)
    losses = []
    for _ in range(15):
        loss = BUILT[key].train_step(model, (inputs, targets))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.7 * losses[0]


@pytest.mark.parametrize("key", ["resnet50", pytest.param("gpt2", marks=pytest.mark.slow)])
def test_the_realistic_workloads_train_a_real_step_on_the_cpu(key: str) -> None:
    """The full-size model with its optimizer and loss at batch 1; a crop of the batch (64x64
    pixels, 64 tokens) keeps the step to seconds on two cores (GPT-2's 124M parameters: 6 s,
    so it is slow)."""
    workload = BUILT[key]
    torch.manual_seed(0)
    model = workload.make_model()
    inputs, targets = workload.make_batch(1)
    if key == "resnet50":
        inputs = inputs[..., :64, :64]
    else:
        inputs, targets = inputs[:, :64], targets[:, :64]
    last = next(reversed(list(model.parameters())))
    before = last.detach().clone()
    loss = workload.train_step(model, (inputs, targets))
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())
    workload.make_optimizer(model).step()
    assert math.isfinite(float(loss.detach()))
    assert not torch.equal(before, last)
    if key == "gpt2":  # GPT-2's initialisation starts near a uniform guess over the vocabulary
        assert float(loss.detach()) == pytest.approx(math.log(50257), abs=0.5)


def test_realistic_batches_repeat_a_pool_of_distinct_samples() -> None:
    inputs, targets = BUILT["resnet50"].make_batch(100)
    assert torch.equal(inputs[64:], inputs[:36])
    assert torch.equal(targets[64:], targets[:36])
    assert not torch.equal(inputs[0], inputs[1])
    assert torch.equal(BUILT["resnet50"].make_batch(3)[0], inputs[:3])


@pytest.mark.parametrize("key", REALISTIC)
def test_realistic_datasets_pickle_as_a_few_numbers(key: str) -> None:
    """DataLoader workers under spawn receive the dataset: a few ints, never the data."""
    dataset = BUILT[key].dataset
    payload = pickle.dumps(dataset)
    assert len(payload) < 1000
    copy = pickle.loads(payload)
    assert torch.equal(copy[3][0], dataset[3][0])
    assert torch.equal(copy[3][1], dataset[3][1])


# --- CpuHeavyDataset ------------------------------------------------------------------------------


def test_cpu_heavy_items_are_deterministic_per_index() -> None:
    dataset = CpuHeavyDataset(length=20, passes=1)
    image, label = dataset[3]
    assert (tuple(image.shape), image.dtype, label.dtype) == (
        (3, 64, 64),
        torch.float32,
        torch.int64,
    )
    assert 0 <= int(label) < 10
    other = CpuHeavyDataset(length=20, passes=1)
    assert torch.equal(image, other[3][0])
    assert torch.equal(label, other[3][1])
    assert not torch.equal(image, dataset[4][0])
    assert torch.equal(dataset[-1][0], dataset[19][0])


def test_cpu_heavy_seed_changes_the_items() -> None:
    assert not torch.equal(CpuHeavyDataset(passes=0)[0][0], CpuHeavyDataset(passes=0, seed=1)[0][0])


def test_cpu_heavy_index_out_of_range_is_an_index_error() -> None:
    with pytest.raises(IndexError, match="index 5 out of range for 5 items"):
        CpuHeavyDataset(length=5)[5]


def test_cpu_heavy_dataset_pickles_with_its_settings() -> None:
    dataset = CpuHeavyDataset(length=7, image_size=32, source_size=40, passes=2, seed=3)
    copy = pickle.loads(pickle.dumps(dataset))
    assert len(copy) == 7
    assert torch.equal(copy[2][0], dataset[2][0])
    assert tuple(copy[2][0].shape) == (3, 32, 32)


@pytest.mark.slow  # the spawned worker is a new interpreter that imports torch: 2-3 s
def test_cpu_heavy_dataset_loads_in_spawned_workers() -> None:
    loader = torch.utils.data.DataLoader(
        CpuHeavyDataset(length=4, passes=1),
        batch_size=2,
        num_workers=1,
        multiprocessing_context="spawn",
    )
    images, labels = next(iter(loader))
    assert tuple(images.shape) == (2, 3, 64, 64)
    assert tuple(labels.shape) == (2,)
    assert torch.equal(images[1], CpuHeavyDataset(length=4, passes=1)[1][0])


def test_cpu_heavy_dataset_refuses_a_source_smaller_than_the_image() -> None:
    with pytest.raises(ValueError, match="source_size 32 is smaller than image_size 64"):
        CpuHeavyDataset(source_size=32)


# --- the user's factory: good ---------------------------------------------------------------------


@pytest.fixture
def user_models(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The sample user package importable as 'tiny'; sys.path and sys.modules restored after."""
    monkeypatch.syspath_prepend(str(SAMPLE_MODELS))
    yield
    for name in [n for n in sys.modules if n == "tiny" or n.startswith("tiny_")]:
        del sys.modules[name]


def load_error(spec: str) -> WorkloadError:
    """The WorkloadError that loading ``spec`` raises (exit code 5 checked)."""
    with pytest.raises(WorkloadError) as raised:
        load_workload(spec)
    assert raised.value.exit_code == EXIT_WORKLOAD == 5
    return raised.value


@pytest.mark.usefixtures("user_models")
def test_a_mapping_with_an_example_batch_loads_and_trains() -> None:
    workload = load_workload("tiny:good_mapping")
    assert (workload.name, workload.kind) == ("tiny:good_mapping", "mlp")
    assert workload.sample_shape == "(1x4x4 float32; int64)"
    assert workload.dataset is None
    assert workload.max_batch_size is None
    inputs, targets = workload.make_batch(10)
    assert tuple(inputs.shape) == (10, 1, 4, 4)
    assert targets.tolist() == [0, 1, 2, 0] * 2 + [0, 1]
    assert torch.equal(inputs[4], inputs[0])  # the 4 example samples, repeated
    model = workload.make_model()
    assert model is not workload.make_model()
    before = [p.detach().clone() for p in model.parameters()]
    assert train_step(workload, model, batch_size=6) > 0
    assert not any(torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))
    assert workload.optimizer_accepts(fused=True)


@pytest.mark.usefixtures("user_models")
def test_a_factory_returning_a_workload_gets_it_back_as_it_is() -> None:
    import tiny

    workload = load_workload("tiny:good_workload")
    assert workload.name == "tiny-regression"
    assert isinstance(workload, tiny.Workload)
    model = workload.make_model()
    before = model.weight.detach().clone()
    assert train_step(workload, model, batch_size=3) >= 0
    assert not torch.equal(before, model.weight)


@pytest.mark.usefixtures("user_models")
def test_an_object_with_a_model_instance_and_a_dataset_loads() -> None:
    workload = load_workload("tiny:good_object")
    assert workload.kind == "mlp"  # inferred from the module's layers: linear and GELU only
    assert workload.max_batch_size == 10  # the dataset's length
    assert workload.dataset is not None
    assert len(workload.dataset) == 10
    inputs, targets = workload.make_batch(12)  # the first 10 samples, then again
    assert tuple(inputs.shape) == (12, 1, 4, 4)
    assert targets.tolist() == [0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 0, 1]
    assert workload.sample_shape == "(1x4x4 float32; int64)"
    first, second = workload.make_model(), workload.make_model()  # deep copies of the instance
    assert first is not second
    assert train_step(workload, first) > 0
    assert not all(
        torch.equal(a, b) for a, b in zip(first.parameters(), second.parameters(), strict=True)
    )


@pytest.mark.usefixtures("user_models")
def test_the_default_loss_is_cross_entropy_for_classes_and_mse_for_floats() -> None:
    classes = load_workload("tiny:good_mapping")
    model = classes.make_model()
    inputs, labels = classes.make_batch(4)
    expected = torch.nn.functional.cross_entropy(model(inputs), labels)
    assert torch.allclose(classes.train_step(model, (inputs, labels)), expected)
    regression = load_workload("tiny:float_targets")
    model = regression.make_model()
    inputs, targets = torch.randn(2, 1, 4, 4), torch.randn(2, 3)
    expected = torch.nn.functional.mse_loss(model(inputs), targets)
    assert torch.allclose(regression.train_step(model, (inputs, targets)), expected)


def test_the_cross_entropy_takes_classes_on_dim_1_or_on_the_last_dim() -> None:
    from torch_autotune.probe.workloads.losses import _cross_entropy as loss_fn

    logits, tokens = torch.randn(2, 5, 7), torch.randint(0, 7, (2, 5))  # (N, S, vocab)
    expected = torch.nn.functional.cross_entropy(logits.reshape(10, 7), tokens.reshape(10))
    assert torch.allclose(loss_fn(logits, tokens), expected)
    maps, pixels = torch.randn(2, 4, 3, 3), torch.randint(0, 4, (2, 3, 3))  # (N, C, H, W)
    assert torch.equal(loss_fn(maps, pixels), torch.nn.functional.cross_entropy(maps, pixels))


@pytest.mark.usefixtures("user_models")
def test_an_optimizer_factory_without_keyword_arguments_is_not_given_fused() -> None:
    workload = load_workload("tiny:lambda_optimizer")
    assert not workload.optimizer_accepts(fused=True)
    assert workload.optimizer_accepts()
    with pytest.raises(WorkloadError, match="does not take fused as keyword arguments"):
        workload.make_optimizer(workload.make_model(), fused=True)


@pytest.mark.usefixtures("user_models")
def test_resolve_workload_takes_names_specs_and_workloads() -> None:
    assert resolve_workload("mlp").name == "mlp"
    assert resolve_workload("tiny:good_mapping").name == "tiny:good_mapping"
    workload = BUILT["conv"]
    assert resolve_workload(workload) is workload


def test_resolve_workload_suggests_the_builtin_on_a_typo() -> None:
    with pytest.raises(WorkloadError) as raised:
        resolve_workload("tranformer")
    assert str(raised.value) == (
        "'tranformer' is neither a built-in workload (conv, transformer, mlp, resnet50, gpt2,"
        " gpt2-large, llama-1b) nor a package.module:factory reference; perhaps you meant"
        " 'transformer'?"
    )


def test_the_docstring_example_is_a_working_factory() -> None:
    doc = workloads.__doc__ or ""
    example = textwrap.dedent(doc.split("Example ``mypkg/models.py``::", 1)[1])
    namespace: dict[str, Any] = {}
    exec(compile(example, "mypkg/models.py", "exec"), namespace)
    workload = as_workload(namespace["make_workload"](), name="mypkg.models:make_workload")
    assert workload.kind == "mlp"
    assert workload.optimizer_accepts(fused=True)
    assert train_step(workload, workload.make_model(), batch_size=40) > 0


# --- the user's factory: every way it can be unusable ---------------------------------------------


@pytest.mark.parametrize(
    ("spec", "hint"),
    [
        ("tiny", ""),
        ("tiny:", ""),
        ("tiny:good mapping", ""),
        ("models/tiny.py:make", " (a module name, not a file path)"),
        (":make", ""),
    ],
)
def test_a_spec_that_is_not_package_module_factory_is_refused(spec: str, hint: str) -> None:
    assert str(load_error(spec)) == (
        f"'{spec}' is not a factory reference: write package.module:factory{hint},"
        " e.g. mypkg.models:make_workload"
    )


@pytest.mark.usefixtures("user_models")
def test_a_module_that_does_not_exist_is_named_with_the_fix() -> None:
    error = load_error("pkg.mod:factory")
    assert str(error) == (
        "'pkg.mod:factory': module 'pkg.mod' cannot be imported (No module named 'pkg');"
        " check the name and that it is importable from the current directory"
    )
    assert isinstance(error.__cause__, ModuleNotFoundError)


@pytest.mark.usefixtures("user_models")
def test_a_module_given_as_a_file_name_is_told_to_drop_the_py() -> None:
    assert str(load_error("tiny.py:good_mapping")).endswith("drop the '.py': tiny:...")


@pytest.mark.usefixtures("user_models")
def test_a_module_missing_a_dependency_says_what_to_install() -> None:
    error = load_error("tiny_missing_dependency:make_workload")
    assert str(error) == (
        "'tiny_missing_dependency:make_workload': module 'tiny_missing_dependency' cannot be"
        " imported: it needs a module that is missing (No module named"
        " 'a_package_that_is_not_installed'); install it in this environment"
    )


@pytest.mark.usefixtures("user_models")
def test_a_module_that_raises_at_import_is_named_with_the_cause_chained() -> None:
    error = load_error("tiny_import_error:make_workload")
    assert str(error) == (
        "'tiny_import_error:make_workload': importing 'tiny_import_error' raised"
        " ZeroDivisionError: division by zero; fix the module"
    )
    assert isinstance(error.__cause__, ZeroDivisionError)


@pytest.mark.usefixtures("user_models")
def test_a_module_that_parses_arguments_at_import_is_told_to_guard_it() -> None:
    error = load_error("tiny_argparse:make_workload")
    assert str(error).startswith(
        "'tiny_argparse:make_workload': importing 'tiny_argparse' exited (SystemExit 2)"
    )
    assert "if __name__ == '__main__':" in str(error)


@pytest.mark.usefixtures("user_models")
def test_a_missing_factory_suggests_the_closest_name() -> None:
    error = load_error("tiny:good_maping")
    assert str(error) == (
        "'tiny:good_maping': module 'tiny' has no attribute 'good_maping';"
        " perhaps you meant 'good_mapping'?"
    )
    assert isinstance(error.__cause__, AttributeError)
    assert str(load_error("tiny:zzz")).endswith("has no attribute 'zzz'; check the factory name")


@pytest.mark.usefixtures("user_models")
def test_a_factory_that_is_not_callable_is_refused() -> None:
    assert str(load_error("tiny:NOT_A_FUNCTION")) == (
        "'tiny:NOT_A_FUNCTION': 'NOT_A_FUNCTION' is an int, not a function; point to a"
        " function that takes no arguments and returns the workload"
    )


@pytest.mark.usefixtures("user_models")
def test_a_factory_that_needs_arguments_is_refused_before_it_is_called() -> None:
    assert str(load_error("tiny:needs_args")).startswith(
        "'tiny:needs_args' needs arguments (missing a required argument: 'data_dir');"
    )


@pytest.mark.usefixtures("user_models")
def test_a_factory_that_raises_is_named_with_its_exception_chained() -> None:
    error = load_error("tiny:raises")
    assert str(error) == (
        "'tiny:raises' raised RuntimeError: the data directory /data/imagenet is missing;"
        " fix the factory"
    )
    assert isinstance(error.__cause__, RuntimeError)


@pytest.mark.usefixtures("user_models")
def test_a_factory_that_exits_is_refused() -> None:
    assert str(load_error("tiny:exits")).startswith("'tiny:exits' exited (SystemExit 2);")


@pytest.mark.usefixtures("user_models")
def test_a_factory_returning_the_wrong_type_is_refused() -> None:
    assert str(load_error("tiny:wrong_type")) == (
        "'tiny:wrong_type' returned an int; a factory returns a Workload or a dict that holds"
        f" the model and its data: {README}"
    )


@pytest.mark.usefixtures("user_models")
def test_a_factory_returning_a_model_alone_is_told_it_needs_its_data() -> None:
    assert str(load_error("tiny:returns_module")) == (
        f"'tiny:returns_module' is a Sequential alone: the probe also needs its data; {README}"
    )


@pytest.mark.usefixtures("user_models")
@pytest.mark.parametrize(
    ("factory", "message"),
    [
        ("broken", "'tiny:broken' has no 'model'; " + README),
        ("no_optimizer", "'tiny:no_optimizer' has no 'optimizer'; " + README),
        (
            "no_data",
            "'tiny:no_data' has neither 'dataset', 'loader' nor 'example_batch'; " + README,
        ),
        (
            "unknown_key",
            "'tiny:unknown_key' has the unknown key 'modle'; perhaps you meant 'model'?",
        ),
        (
            "bad_kind",
            "'tiny:bad_kind': kind 'transformers' is not one of conv, transformer, mlp, other;"
            " perhaps you meant 'transformer'?",
        ),
        (
            "model_is_string",
            "'tiny:model_is_string': 'model' is a str; give an nn.Module or a function that"
            " builds one",
        ),
        (
            "mismatched_batch",
            "'tiny:mismatched_batch': 'example_batch' holds tensors with 4 and 3 samples on"
            " dim 0; every tensor of a batch holds its samples on dim 0",
        ),
        (
            "batch_without_tensors",
            "'tiny:batch_without_tensors': 'example_batch' is a list that holds no tensor with"
            " samples on dim 0; give a batch as your DataLoader yields it",
        ),
        (
            "list_dataset",
            "'tiny:list_dataset': 'dataset' is an int, not a map-style dataset (one with __len__"
            " and __getitem__); give one, or an example_batch instead",
        ),
        (
            "optimizer_of_another_model",
            "'tiny:optimizer_of_another_model': the optimizer holds 4 of its 4 parameters that"
            " are not the model's being trained: it was built over another model (the probe"
            " trains a fresh copy of yours for every trial, and would train nothing); give the"
            " optimizer object itself (it is rebuilt over each copy) or a factory such as"
            " functools.partial(torch.optim.AdamW, lr=3e-4)",
        ),
        (
            "step_and_loss",
            "'tiny:step_and_loss': give 'train_step' or 'loss_fn', not both: train_step returns"
            " the loss",
        ),
    ],
)
def test_a_factory_result_missing_or_misusing_a_field_is_refused(
    factory: str, message: str
) -> None:
    assert str(load_error(f"tiny:{factory}")) == message


@pytest.mark.usefixtures("user_models")
def test_an_optimizer_object_is_rebuilt_over_each_copy_of_the_model() -> None:
    """An optimizer built over the user's model holds the original's parameters; the probe
    trains copies, so it is rebuilt over each, with its class and hyperparameters."""
    workload = load_workload("tiny:optimizer_instance")
    model = workload.make_model()
    optimizer = workload.make_optimizer(model)
    assert isinstance(optimizer, torch.optim.AdamW)
    held = [p for group in optimizer.param_groups for p in group["params"]]
    assert [id(p) for p in held] == [id(p) for p in model.parameters()]
    assert optimizer.param_groups[0]["lr"] == 0.02
    assert optimizer.param_groups[0]["weight_decay"] == 0.5
    assert workload.optimizer == "adamw"
    assert train_step(workload, model, batch_size=4) > 0


@pytest.mark.usefixtures("user_models")
@pytest.mark.parametrize(
    ("factory", "message"),
    [
        (
            "batch_is_one_tensor",
            "'tiny:batch_is_one_tensor': no loss for the step (model(batch) (a Tensor, no"
            " targets)): the model returned a Tensor and the batch has no targets; give"
            " loss_fn(outputs, targets), or train_step(model, batch) -> loss",
        ),
        (
            "dict_dataset",
            "'tiny:dict_dataset': none of the batch's keys (pixels, label) is an argument of"
            " Sequential.forward (input); name them as forward does, or give"
            " train_step(model, batch)",
        ),
    ],
)
def test_a_batch_the_model_cannot_take_fails_at_the_first_step_in_one_line(
    factory: str, message: str
) -> None:
    """These load (a batch may be a lone tensor or a dict); the first step says what is
    missing, as a WorkloadError of ours (exit 5, one line), not the user's traceback."""
    workload = load_workload(f"tiny:{factory}")
    with pytest.raises(WorkloadError) as raised:
        workload.train_step(workload.make_model(), workload.make_batch(2))
    assert str(raised.value) == message
    assert not raised_by_user_code(raised.value)


@pytest.mark.usefixtures("user_models")
def test_a_dataset_whose_samples_cannot_be_batched_is_refused() -> None:
    error = load_error("tiny:ragged_dataset")
    assert str(error).startswith(
        "'tiny:ragged_dataset': the dataset's samples cannot be batched by torch's default collate"
    )
    assert str(error).endswith(
        "give a collate_fn that batches them (a padding one for samples of different lengths)"
    )
    assert isinstance(error.__cause__, RuntimeError)


class _TwoLengths(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Even samples hold 8 values, odd ones 4: the largest batch together, a mixed batch not."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return torch.zeros(8 if index % 2 == 0 else 4), 0


def test_samples_of_two_sizes_without_a_padding_collate_are_refused_when_loaded() -> None:
    """The search's batches (the largest samples) would batch; the throughput points' random
    ones would not: refused before anything is measured, not after the search."""
    fields = {
        "model": torch.nn.Linear(8, 2),
        "optimizer": torch.optim.SGD,
        "dataset": _TwoLengths(),
    }
    with pytest.raises(WorkloadError) as raised:
        as_workload(fields, name="two")
    assert str(raised.value).startswith(
        "'two': the dataset's samples cannot be batched by torch's default collate"
    )
    assert str(raised.value).endswith("(a padding one for samples of different lengths)")


@pytest.mark.usefixtures("user_models")
def test_a_dataset_that_raises_is_named_with_the_index() -> None:
    error = load_error("tiny:failing_dataset")
    assert str(error) == (
        "'tiny:failing_dataset': dataset[0] raised OSError: cannot open /data/train/0.png;"
        " fix the dataset"
    )
    assert isinstance(error.__cause__, OSError)


@pytest.mark.usefixtures("user_models")
def test_a_model_function_returning_something_else_fails_when_called() -> None:
    workload = load_workload("tiny:model_function_returns_string")
    with pytest.raises(WorkloadError) as raised:
        workload.make_model()
    assert str(raised.value) == (
        "'tiny:model_function_returns_string': the model function returned a str, not an nn.Module"
    )


def test_a_workload_with_an_unknown_kind_is_refused() -> None:
    with pytest.raises(WorkloadError, match="kind 'cnn' is not one of conv, transformer"):
        Workload(
            name="x",
            kind="cnn",  # type: ignore[arg-type]
            make_model=BUILT["mlp"].make_model,
            make_optimizer=BUILT["mlp"].make_optimizer,
            make_batch=BUILT["mlp"].make_batch,
            train_step=BUILT["mlp"].train_step,
        )


def mlp_fields(**overrides: Any) -> dict[str, Any]:
    """A factory's result for a small MLP, with ``overrides``."""
    fields = {
        "model": lambda: torch.nn.Linear(3, 2),
        "optimizer": torch.optim.SGD,
        "example_batch": (torch.zeros(2, 3), torch.zeros(2, dtype=torch.int64)),
    }
    return fields | overrides


@pytest.mark.parametrize("size", [1, 8, 10**9])
def test_a_positive_int_caps_the_batch_in_a_workload_and_in_a_factory_result(size: int) -> None:
    mlp = BUILT["mlp"]
    workload = Workload(
        name="x",
        kind="mlp",
        make_model=mlp.make_model,
        make_optimizer=mlp.make_optimizer,
        make_batch=mlp.make_batch,
        train_step=mlp.train_step,
        max_batch_size=size,
    )
    assert workload.max_batch_size == size
    assert as_workload(mlp_fields(max_batch_size=size), name="m").max_batch_size == size


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, False, "8"])
def test_a_max_batch_size_that_is_not_a_positive_int_is_refused(bad: Any) -> None:
    mlp = BUILT["mlp"]
    with pytest.raises(WorkloadError, match="max_batch_size must be a positive int or None"):
        Workload(
            name="x",
            kind="mlp",
            make_model=mlp.make_model,
            make_optimizer=mlp.make_optimizer,
            make_batch=mlp.make_batch,
            train_step=mlp.train_step,
            max_batch_size=bad,
        )
    with pytest.raises(WorkloadError) as raised:
        as_workload(mlp_fields(max_batch_size=bad), name="m")
    assert str(raised.value) == f"'m': 'max_batch_size' must be a positive int, not {bad!r}"


@pytest.mark.parametrize("name", sorted(BUILTIN_WORKLOADS))
def test_a_built_in_workload_is_named_as_it_is_asked_for(name: str) -> None:
    """The evidence records the workload's name, and the bench resolves it again from there."""
    assert resolve_workload(name).name == name


def test_objects_are_named_after_their_model_and_torch_containers_by_their_architecture() -> None:
    """Two different nn.Sequential models keep profiles of their own; the same architecture
    gets the same name in every run, and a model class of the user's is its own name."""
    from torch_autotune.probe.workloads.protocol import default_name

    small = default_name({"model": torch.nn.Sequential(torch.nn.Linear(2, 3))})
    again = default_name({"model": torch.nn.Sequential(torch.nn.Linear(2, 3))})
    wider = default_name({"model": torch.nn.Sequential(torch.nn.Linear(2, 4))})
    assert small == again
    assert small != wider
    assert small.startswith("Sequential-")
    assert len(small) == len("Sequential-") + 6

    class MyNet(torch.nn.Module):
        pass

    assert default_name({"model": MyNet()}) == "MyNet"

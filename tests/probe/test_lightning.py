"""A LightningModule tuned through its own training_step and configure_optimizers, with the real
Lightning on the CPU: its LightningDataModule or its own train_dataloader, the refusals, the
compile the probe measures, and the profile used by LightningCLI at the tuned batch.

Tiny models on synthetic data. Each module counts its calls in ``Calls`` (class attributes,
so that the copies the probe trains count too) and says which object ran.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from torch_autotune import tune
from torch_autotune.detect import load_snapshot
from torch_autotune.errors import WorkloadError, raised_by_user_code
from torch_autotune.hardware import HardwareSnapshot
from torch_autotune.integrations import lightning_data_kwargs, render_lightning
from torch_autotune.probe.workloads import resolve_workload
from torch_autotune.probe.workloads.lightning import is_datamodule, is_lightning_module
from torch_autotune.probe.workloads.lightning_step import BATCH_IDX, TrainingStep
from torch_autotune.profile import Profile
from torch_autotune.settings import torch_defaults

from .fake_trials import mlp_machine, tune_on, tune_ticking

pl = pytest.importorskip("lightning.pytorch")

LAPTOP = Path(__file__).parent.parent / "fixtures" / "snapshots" / "cpu-laptop-linux.json"


def laptop() -> HardwareSnapshot:
    return load_snapshot(LAPTOP)


class Calls:
    """What the modules saw: the objects that ran training_step, the batch sizes, and how
    often configure_optimizers ran (class attributes: the copies count too)."""

    steps: ClassVar[list[int]] = []
    sizes: ClassVar[list[int]] = []
    indices: ClassVar[list[int]] = []
    configured: ClassVar[list[int]] = []
    compiling: ClassVar[list[bool]] = []

    @classmethod
    def clear(cls) -> None:
        for seen in (cls.steps, cls.sizes, cls.indices, cls.configured, cls.compiling):
            seen.clear()


@pytest.fixture(autouse=True)
def _fresh_calls() -> None:
    Calls.clear()


class Classifier(pl.LightningModule):
    """A two-layer classifier on 16 features that logs its loss, as a LightningModule does."""

    def __init__(self, returns: str = "tensor", optimizers: str = "one") -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
        self.returns = returns
        self.optimizers_returned = optimizers

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        Calls.steps.append(id(self))
        Calls.indices.append(batch_idx)
        Calls.compiling.append(torch.compiler.is_compiling())
        x, y = batch
        Calls.sizes.append(int(x.shape[0]))
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        if self.returns == "dict":
            return {"loss": loss, "logits": None}
        if self.returns == "none":
            return None
        if self.returns == "dict without loss":
            return {"total": loss}
        if self.returns == "trainer":
            return loss * self.trainer.accumulate_grad_batches
        return loss

    def configure_optimizers(self) -> Any:
        Calls.configured.append(id(self))
        sgd = functools.partial(torch.optim.SGD, lr=0.1)
        forms: dict[str, Any] = {
            "one": lambda: torch.optim.AdamW(self.parameters(), lr=1e-3),
            "fused": lambda: torch.optim.AdamW(self.parameters(), lr=1e-3, fused=True),
            "list": lambda: [sgd(self.parameters())],
            "with schedulers": self._with_scheduler,
            "dict": lambda: {"optimizer": sgd(self.parameters()), "lr_scheduler": None},
            "two": lambda: [sgd(self.net[0].parameters()), sgd(self.net[2].parameters())],
            "none": lambda: None,
            "trainer": lambda: sgd(self.parameters(), lr=self.trainer.max_epochs),
        }
        return forms[self.optimizers_returned]()

    def _with_scheduler(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=10)]


def _samples(count: int = 256) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    return TensorDataset(
        torch.randn(count, 16, generator=generator),
        torch.randint(0, 4, (count,), generator=generator),
    )


class Data(pl.LightningDataModule):
    """A DataModule that builds its dataset in setup(), as most do, and takes the batch size
    and the worker count."""

    def __init__(self, batch_size: int = 32, num_workers: int = 0) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.prepared = False
        self.dataset: Dataset[Any] | None = None

    def prepare_data(self) -> None:
        self.prepared = True

    def setup(self, stage: str) -> None:
        self.dataset = _samples()

    def train_dataloader(self) -> DataLoader[Any]:
        assert self.dataset is not None, "setup() was not called"
        return DataLoader(self.dataset, batch_size=self.batch_size, num_workers=self.num_workers)


class OwnData(Classifier):
    """A LightningModule with its own train_dataloader, its dataset made in setup()."""

    def setup(self, stage: str) -> None:
        self.train_set = _samples()

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(self.train_set, batch_size=16)


class Manual(Classifier):
    """Manual optimization: training_step steps its own optimizer."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False


def _ran(profile: Profile) -> set[int]:
    """The batch sizes that trained during the probe: search trials and throughput points."""
    assert profile.evidence is not None
    ran = {t.batch_size for t in profile.evidence.search if t.fits}
    return ran | {p.batch_size for p in profile.evidence.throughput}


# --- tuned through training_step ---------------------------------------------------------------


@pytest.mark.slow  # a real tune() of a few seconds
def test_a_module_and_its_datamodule_tune_through_training_step_on_copies() -> None:
    module, data = Classifier(), Data()
    before = {key: value.clone() for key, value in module.state_dict().items()}
    profile = tune(module, datamodule=data, snapshot=laptop(), budget_s=5, max_batch_size=64)
    assert Calls.steps, "training_step never ran"
    assert id(module) not in Calls.steps  # the probe trained copies
    assert id(module) not in Calls.configured
    assert set(Calls.steps) <= set(Calls.configured)  # each copy's own optimizer
    assert set(Calls.indices) == {BATCH_IDX}
    assert all(torch.equal(before[key], value) for key, value in module.state_dict().items())
    assert not hasattr(module, "train_set")
    assert data.prepared  # the DataModule's hooks ran, as the Trainer runs them
    batch = profile.settings.batch.batch_size
    assert batch is not None
    assert batch in _ran(profile)
    assert batch in Calls.sizes
    assert profile.evidence is not None
    details = profile.evidence.details
    assert details is not None
    assert details.framework == "lightning"
    assert details.model == "Classifier"
    assert details.optimizer == "AdamW"
    assert details.call == "training_step(batch, batch_idx)"
    assert details.loader_arguments == ("batch_size", "num_workers")
    assert profile.evidence.workload == "Classifier"


@pytest.mark.slow
def test_a_module_with_its_own_train_dataloader_tunes_alone() -> None:
    module = OwnData(returns="dict", optimizers="with schedulers")
    profile = tune(module, snapshot=laptop(), budget_s=6, max_batch_size=32)
    assert profile.settings.batch.batch_size in _ran(profile)
    assert Calls.steps
    assert not hasattr(module, "train_set")  # setup() ran on the probe's copy only
    assert profile.evidence is not None
    assert profile.evidence.details is not None
    assert profile.evidence.details.loader_arguments == ()
    assert profile.evidence.details.optimizer == "SGD"


def test_a_factory_dict_with_a_datamodule_is_the_same_workload() -> None:
    workload = resolve_workload(lambda: {"model": Classifier(), "datamodule": Data(batch_size=7)})
    model = workload.make_model()
    assert isinstance(model, TrainingStep)
    batch = workload.make_batch(5)
    loss = workload.train_step(model, batch)
    assert loss.dim() == 0
    assert loss.requires_grad
    assert Calls.sizes == [5]  # the trial's batch size, not the DataModule's 7


def test_the_keyword_form_is_the_same_workload() -> None:
    """``tune(model=module, datamodule=dm)``: the objects as keyword arguments."""
    workload = resolve_workload(objects={"model": Classifier(), "datamodule": Data()})
    assert isinstance(workload.make_model(), TrainingStep)
    assert workload.name == "Classifier"


def test_lightning_is_recognised_by_its_classes_without_being_imported() -> None:
    assert is_lightning_module(Classifier())
    assert is_datamodule(Data())
    assert not is_lightning_module(nn.Linear(1, 1))
    assert not is_datamodule(_samples())


def test_the_older_pytorch_lightning_package_is_recognised_too() -> None:
    old = pytest.importorskip("pytorch_lightning")

    class Old(old.LightningModule):  # type: ignore[misc]
        """A module of the package Lightning was called before 2.0."""

    assert is_lightning_module(Old())
    assert is_datamodule(old.LightningDataModule())


def test_the_evidence_names_the_hooks_the_probe_does_not_call() -> None:
    class Hooks(Classifier):
        def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
            return batch

        def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
            return None

    details = resolve_workload(Hooks(), objects={"datamodule": Data()}).details
    assert details is not None
    notes = details().notes
    assert notes == (
        "hooks of the module the probe does not call (it moves the batch and steps the"
        " optimizer itself): on_after_batch_transfer, on_train_batch_start",
    )
    plain = resolve_workload(Classifier(), objects={"datamodule": Data()}).details
    assert plain is not None
    assert plain().notes == ()


def test_a_loss_fn_trains_the_module_through_its_forward() -> None:
    given = {"datamodule": Data(), "loss_fn": nn.functional.cross_entropy}
    workload = resolve_workload(Classifier(), objects=given)
    model = workload.make_model()
    assert isinstance(model, Classifier)
    assert workload.train_step(model, workload.make_batch(4)).requires_grad
    assert Calls.steps == []


# --- what each form returns ---------------------------------------------------------------------


@pytest.mark.parametrize("form", ["one", "list", "with schedulers", "dict"])
def test_configure_optimizers_in_each_form_gives_the_copys_optimizer(form: str) -> None:
    workload = resolve_workload(Classifier(optimizers=form), objects={"datamodule": Data()})
    model = workload.make_model()
    optimizer = workload.make_optimizer(model)
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert held == {id(p) for p in model.parameters()}
    assert Calls.configured[-1] == id(model.module)


def test_a_ranks_model_in_ddp_gets_configure_optimizers_of_the_module_inside() -> None:
    """A job's ranks train the model in DDP, which has no configure_optimizers: every
    LightningModule failed `autotune --nproc-per-node 2` (exit 5, 'fix it')."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from torch_autotune.probe.step import make_optimizer

    workload = resolve_workload(Classifier(), objects={"datamodule": Data()})
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        wrapped = DistributedDataParallel(workload.make_model())
        optimizer = make_optimizer(workload, wrapped, {"foreach": False})
    finally:
        dist.destroy_process_group()
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert held == {id(p) for p in wrapped.parameters()}
    assert Calls.configured[-1] == id(wrapped.module.module)


def test_the_probes_fused_option_rebuilds_the_configured_optimizer() -> None:
    workload = resolve_workload(Classifier(), objects={"datamodule": Data()})
    assert workload.optimizer == "adamw"
    assert workload.optimizer_accepts(fused=True)
    model = workload.make_model()
    optimizer = workload.make_optimizer(model, foreach=False)
    assert isinstance(optimizer, torch.optim.AdamW)
    assert optimizer.defaults["foreach"] is False


def test_a_configured_optimizer_built_fused_is_told_to_the_rules() -> None:
    """configure_optimizers building AdamW(fused=True) trains fused where the rules keep torch's
    default (the probe passes no fused then): the workload says what fixes the kernel."""
    fused = resolve_workload(Classifier(optimizers="fused"), objects={"datamodule": Data()})
    assert fused.fused_by == "the model's configure_optimizers, which builds AdamW(..., fused=True)"
    plain = resolve_workload(Classifier(), objects={"datamodule": Data()})
    assert plain.fused_by is None


@pytest.mark.parametrize("returns", ["tensor", "dict"])
def test_the_step_takes_a_loss_tensor_or_a_dict_with_loss(returns: str) -> None:
    workload = resolve_workload(Classifier(returns=returns), objects={"datamodule": Data()})
    model = workload.make_model()
    loss = workload.train_step(model, workload.make_batch(4))
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())


def test_a_training_step_whose_loss_is_nan_is_said_in_the_notes() -> None:
    """training_step's loss is read as the probe trains: a NaN is said, as for a step of the
    user's own (the notes read a step that never ran, and said nothing)."""
    workload = resolve_workload(Classifier(), objects={"datamodule": Data()})
    assert workload.details is not None
    model = workload.make_model()
    with torch.no_grad():
        next(model.parameters()).fill_(float("nan"))
    workload.train_step(model, workload.make_batch(4))
    (note,) = [n for n in workload.details().notes if "loss was" in n]
    assert note.startswith("the last training step's loss was nan: ")
    plain = resolve_workload(Classifier(), objects={"datamodule": Data()})
    assert plain.details is not None
    plain.train_step(plain.make_model(), plain.make_batch(4))
    assert not any("loss was" in n for n in plain.details().notes)


# --- refusals, each in one line -----------------------------------------------------------------


def test_manual_optimization_is_refused_with_the_fix() -> None:
    with pytest.raises(WorkloadError, match=r"manual optimization .* give train_step"):
        resolve_workload(Manual(), objects={"datamodule": Data()})


def test_manual_optimization_tunes_through_the_users_train_step() -> None:
    def step(model: nn.Module, batch: Any) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(model(x), y)

    workload = resolve_workload(Manual(), objects={"datamodule": Data(), "train_step": step})
    model = workload.make_model()
    assert isinstance(model, Manual)  # the module itself, called through its forward
    loss = workload.train_step(model, workload.make_batch(4))
    assert loss.requires_grad
    assert Calls.steps == []


def test_several_optimizers_are_refused_with_the_fix() -> None:
    with pytest.raises(WorkloadError, match=r"returned 2 optimizers \(SGD, SGD\).*optimizer="):
        resolve_workload(Classifier(optimizers="two"), objects={"datamodule": Data()})


def test_several_optimizers_tune_with_the_users_optimizer() -> None:
    given = {"datamodule": Data(), "optimizer": functools.partial(torch.optim.SGD, lr=0.1)}
    workload = resolve_workload(Classifier(optimizers="two"), objects=given)
    model = workload.make_model()
    assert isinstance(workload.make_optimizer(model), torch.optim.SGD)


def test_an_optimizer_built_over_the_users_module_is_rebuilt_over_each_copy() -> None:
    module = Classifier(optimizers="two")
    given = {"datamodule": Data(), "optimizer": torch.optim.SGD(module.parameters(), lr=0.1)}
    workload = resolve_workload(module, objects=given)
    model = workload.make_model()
    optimizer = workload.make_optimizer(model)
    held = [p for group in optimizer.param_groups for p in group["params"]]
    assert [id(p) for p in held] == [id(p) for p in model.parameters()]
    assert optimizer.param_groups[0]["lr"] == 0.1


def test_no_optimizer_is_refused() -> None:
    with pytest.raises(WorkloadError, match=r"returned 0 optimizers \(none\)"):
        resolve_workload(Classifier(optimizers="none"), objects={"datamodule": Data()})


@pytest.mark.parametrize(
    ("returns", "message"),
    [
        ("none", r"training_step returned None, which Lightning takes as 'skip this batch'"),
        ("dict without loss", r"training_step returned a dict without 'loss' \(its keys: total\)"),
    ],
)
def test_a_step_without_a_loss_is_refused_in_one_line(returns: str, message: str) -> None:
    workload = resolve_workload(Classifier(returns=returns), objects={"datamodule": Data()})
    with pytest.raises(WorkloadError, match=message):
        workload.train_step(workload.make_model(), workload.make_batch(4))


@pytest.mark.slow  # tune() starts: a second or two
def test_tune_stops_at_a_step_returning_none_with_one_line() -> None:
    with pytest.raises(WorkloadError, match="training_step returned None"):
        tune(Classifier(returns="none"), datamodule=Data(), snapshot=laptop(), budget_s=5)


def test_a_step_that_needs_the_trainer_says_so_and_keeps_the_users_traceback() -> None:
    workload = resolve_workload(Classifier(returns="trainer"), objects={"datamodule": Data()})
    with pytest.raises(WorkloadError, match=r"training_step uses self\.trainer") as caught:
        workload.train_step(workload.make_model(), workload.make_batch(4))
    assert isinstance(caught.value.__cause__, RuntimeError)
    assert raised_by_user_code(caught.value.__cause__)


def test_configure_optimizers_that_needs_the_trainer_says_to_give_an_optimizer() -> None:
    with pytest.raises(WorkloadError, match=r"configure_optimizers uses self.trainer.*optimizer="):
        resolve_workload(Classifier(optimizers="trainer"), objects={"datamodule": Data()})


class NeedsTheTrainer(Classifier):
    """Common Lightning code that reads the Trainer: a OneCycleLR over the Trainer's steps in
    configure_optimizers, the scheduler's rate logged from training_step."""

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        loss = super().training_step(batch, batch_idx)
        self.log("lr", self.lr_schedulers().get_last_lr()[0])  # type: ignore[union-attr]
        return loss

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.AdamW(self.parameters(), lr=1e-3)
        total = self.trainer.estimated_stepping_batches
        scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, 1e-2, total_steps=int(total))
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }


def _loss_of(module: nn.Module, batch: Any) -> torch.Tensor:
    """The README's train_step: training_step's loss, without self.lr_schedulers()."""
    x, y = batch
    Calls.sizes.append(int(x.shape[0]))
    return nn.functional.cross_entropy(module(x), y)


def test_a_module_that_needs_the_trainer_tunes_as_the_readme_says() -> None:
    """Neither hook runs without a Trainer, each says so in one line; the README's factory
    gives the optimizer and the train_step in their place, and the module tunes as it is."""
    with pytest.raises(WorkloadError, match=r"configure_optimizers uses self\.trainer"):
        resolve_workload(NeedsTheTrainer(), objects={"datamodule": Data()})
    optimizer = functools.partial(torch.optim.AdamW, lr=1e-3)
    alone = resolve_workload(
        NeedsTheTrainer(), objects={"datamodule": Data(), "optimizer": optimizer}
    )
    with pytest.raises(WorkloadError, match=r"training_step uses self\.trainer.*train_step\("):
        alone.train_step(alone.make_model(), alone.make_batch(4))

    def make_workload() -> dict[str, Any]:
        return {
            "model": NeedsTheTrainer(),
            "datamodule": Data(),
            "optimizer": optimizer,
            "train_step": _loss_of,
        }

    Calls.clear()
    profile = tune_ticking(
        make_workload, snapshot=laptop(), budget_s=20, max_batch_size=32, num_workers=0
    )
    assert profile.settings.batch.batch_size in _ran(profile)
    assert profile.settings.batch.batch_size in Calls.sizes  # real steps, through the module
    assert not Calls.steps  # training_step, which needs the Trainer, never ran
    assert profile.evidence is not None
    details = profile.evidence.details
    assert details is not None
    assert (details.call, details.optimizer) == ("train_step(model, batch)", "AdamW")


def test_self_log_works_without_a_trainer_and_the_step_counters_stay_at_zero() -> None:
    """What the README says works in training_step with no Trainer attached."""
    seen: list[tuple[int, int, str]] = []

    class Counts(Classifier):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            loss = super().training_step(batch, batch_idx)
            self.log_dict({"loss": loss}, prog_bar=True)
            seen.append((self.global_step, self.current_epoch, self.device.type))
            return loss

    workload = resolve_workload(Counts(), objects={"datamodule": Data()})
    model = workload.make_model()
    for _ in range(2):
        workload.train_step(model, workload.make_batch(4)).backward()
    assert seen == [(0, 0, "cpu")] * 2


def test_a_module_without_data_is_told_to_give_its_datamodule() -> None:
    with pytest.raises(WorkloadError, match=r"no train_dataloader\(\) of its own.*datamodule=dm"):
        resolve_workload(Classifier())


def test_a_datamodule_beside_a_dataset_is_refused() -> None:
    with pytest.raises(WorkloadError, match="give 'datamodule' or dataset, not both"):
        resolve_workload(Classifier(), objects={"datamodule": Data(), "dataset": _samples()})


def test_a_module_class_is_told_to_give_the_module() -> None:
    with pytest.raises(
        WorkloadError, match=r"the class Classifier; give the LightningModule itself"
    ):
        resolve_workload({"model": Classifier, "datamodule": Data()})


def test_an_error_in_training_step_is_the_users_own_with_its_traceback() -> None:
    workload = resolve_workload(Classifier(), objects={"datamodule": Data()})
    with pytest.raises(ValueError, match="not enough values to unpack") as caught:
        workload.train_step(workload.make_model(), (torch.zeros(2, 16),))
    assert raised_by_user_code(caught.value)


# --- the warnings -------------------------------------------------------------------------------


def test_only_the_log_warning_is_silenced(recwarn: pytest.WarningsRecorder) -> None:
    class Warns(Classifier):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            import warnings

            warnings.warn("a warning of the user's own", UserWarning, stacklevel=1)
            return super().training_step(batch, batch_idx)

    workload = resolve_workload(Warns(), objects={"datamodule": Data()})
    with pytest.warns(UserWarning, match="a warning of the user's own"):
        workload.train_step(workload.make_model(), workload.make_batch(4))
    assert not [w for w in recwarn if "self.log" in str(w.message)]


# --- the model the probe trains -----------------------------------------------------------------


def test_copies_share_the_modules_dataset_and_nothing_they_train() -> None:
    workload = resolve_workload(OwnData())
    first, second = workload.make_model(), workload.make_model()
    assert isinstance(first, TrainingStep)
    assert isinstance(second, TrainingStep)
    assert first.module.train_set is second.module.train_set
    assert first.module is not second.module
    assert not {id(p) for p in first.parameters()} & {id(p) for p in second.parameters()}


def test_moving_the_model_moves_the_lightning_modules_own_device_and_dtype() -> None:
    model = resolve_workload(Classifier(), objects={"datamodule": Data()}).make_model()
    assert isinstance(model, TrainingStep)
    assert model.to(torch.float64) is model
    assert model.module.dtype == torch.float64
    assert model.module.device == torch.device("cpu")


@pytest.mark.slow  # compiles a small step: seconds
# torch's own warning while dynamo wraps a non-leaf tensor after the graph break at self.log;
# dynamo hides it with showwarning, which an "error" filter never reaches
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")
@pytest.mark.usefixtures("inductor_on_the_cpu")
def test_compiling_the_probes_model_compiles_training_step() -> None:
    from torch_autotune.apply import batch_to_device, compile_model

    workload = resolve_workload(Classifier(), objects={"datamodule": Data()})
    settings = torch_defaults("cpu")
    settings = settings.model_copy(
        update={"compile": settings.compile.model_copy(update={"enabled": True})}
    )
    torch._dynamo.reset()
    model = compile_model(settings, workload.make_model())
    for size in (8, 16):
        loss = workload.train_step(model, batch_to_device(settings, workload.make_batch(size)))
        loss.backward()
    assert Calls.compiling[0] is True  # training_step was traced by dynamo
    assert Calls.sizes[:2] == [8, 16]


# --- the profile, used --------------------------------------------------------------------------


def test_the_export_writes_the_datamodules_arguments_from_a_lightning_profile() -> None:
    profile = tune_on(
        mlp_machine(),
        resolve_workload(Classifier(), objects={"datamodule": Data()}),
        laptop(),
        budget_s=10,
        max_batch_size=64,
    )
    data = lightning_data_kwargs(profile)
    assert data["batch_size"] == profile.settings.batch.batch_size
    assert data["num_workers"] == profile.settings.dataloader.num_workers
    assert set(data) == {"batch_size", "num_workers"}


class CliModel(Classifier):
    """The model LightningCLI builds (no arguments of its own)."""

    def __init__(self) -> None:
        super().__init__()


@pytest.mark.slow  # tune, then LightningCLI trains two steps: seconds
# Lightning's advice on this 2-core machine (more workers, log every n steps), and torch 2.13's
# deprecation of a pytree class Lightning 2.6 still uses: the user's tool, not our code
@pytest.mark.filterwarnings("ignore::lightning.fabric.utilities.warnings.PossibleUserWarning")
@pytest.mark.filterwarnings(
    "ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated:FutureWarning"
)
def test_lightning_cli_trains_at_the_tuned_batch_with_the_export(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The exported config's ``data:`` section reaches the DataModule: LightningCLI trains at the
    tuned batch with the tuned workers, not at the DataModule's default 32."""
    cli = pytest.importorskip("lightning.pytorch.cli")
    pytest.importorskip("jsonargparse")
    profile = tune(CliModel(), datamodule=Data(), snapshot=laptop(), budget_s=5, max_batch_size=96)
    batch = profile.settings.batch.batch_size
    assert batch is not None
    assert batch != 32  # the DataModule's own default, which the run would train at otherwise
    config = tmp_path / "lightning.yaml"
    config.write_text(render_lightning(profile))
    Calls.clear()
    monkeypatch.setattr(sys, "argv", ["train.py"])  # the command line is args= alone
    # Lightning's Trainer asks CUDA from its own code: a machine without it, as a CPU build
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    run = cli.LightningCLI(
        CliModel,
        Data,
        args=[
            "fit",
            "--config",
            str(config),
            "--seed_everything=0",
            "--trainer.max_steps=2",
            "--trainer.logger=false",
            "--trainer.enable_checkpointing=false",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
            f"--trainer.default_root_dir={tmp_path}",
        ],
        save_config_callback=None,
    )
    assert Calls.sizes == [batch, batch]
    assert run.datamodule.num_workers == profile.settings.dataloader.num_workers

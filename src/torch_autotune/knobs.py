"""The settings the bench switches, each a typed transform between a profile and an arm.

A ``Knob`` is one setting the bench ablates: the ``TrainConfig`` fields that move together,
and how to put a config's value for them into ``Settings`` (``put``, with ``model_copy`` on
each nested model) and which settings that touches (``paths``, the dotted names a profile's
decisions are written under). ``settings_config`` reads a profile's settings into the config
the bench trains it with; ``train_settings`` goes the other way, so a bench arm trains with the
very settings a profile would hold. Pure: no torch, no hardware.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch_autotune.bench_record import TrainConfig
from torch_autotune.records import SettingRecord, on_off
from torch_autotune.settings import (
    RECORD_BY_NAME,
    RECORDS,
    THREAD_VARIABLES,
    Settings,
    setting_value,
    torch_defaults,
)


@dataclass(frozen=True)
class Knob:
    """One setting the bench switches: the TrainConfig fields that move together, how to put
    their value into ``Settings``, and the settings' dotted names that holds it."""

    name: str
    fields: tuple[str, ...]
    put: Callable[[Settings, TrainConfig], Settings]
    paths: Callable[[TrainConfig], tuple[str, ...]]
    path: str | None = None  # a knob TrainConfig holds in ``settings``: its dotted path


def _precision(s: Settings, c: TrainConfig) -> Settings:
    precision = s.precision.model_copy(
        update={
            "autocast": c.precision != "float32",
            "dtype": c.precision,
            "grad_scaler": c.precision == "float16",
        }
    )
    return s.model_copy(update={"precision": precision})


def _batch_size(s: Settings, c: TrainConfig) -> Settings:
    return s.model_copy(update={"batch": s.batch.model_copy(update={"batch_size": c.batch_size})})


def _compile(s: Settings, c: TrainConfig) -> Settings:
    compiled = s.compile.model_copy(
        update={"enabled": c.compile_mode is not None, "mode": c.compile_mode}
    )
    return s.model_copy(update={"compile": compiled})


def _channels_last(s: Settings, c: TrainConfig) -> Settings:
    fmt = "channels_last" if c.channels_last else "contiguous_format"
    return s.model_copy(update={"memory_format": fmt})


def _tf32(s: Settings, c: TrainConfig) -> Settings:
    """TF32 on or off through the profile's API; torch's default (None) sets no API at all."""
    update: dict[str, Any] = {"tf32": bool(c.tf32)}
    if c.tf32 is None:
        update["api"] = None
    return s.model_copy(update={"matmul": s.matmul.model_copy(update=update)})


def _tf32_paths(c: TrainConfig) -> tuple[str, ...]:
    return ("matmul.tf32",) if c.tf32 is not None else ("matmul.tf32", "matmul.api")


def _cudnn_benchmark(s: Settings, c: TrainConfig) -> Settings:
    backends = s.backends.model_copy(update={"cudnn_benchmark": bool(c.cudnn_benchmark)})
    return s.model_copy(update={"backends": backends})


def _fused(s: Settings, c: TrainConfig) -> Settings:
    optimizer = s.optimizer.model_copy(update={"fused": c.fused_optimizer})
    return s.model_copy(update={"optimizer": optimizer})


def _workers(s: Settings, c: TrainConfig) -> Settings:
    update: dict[str, Any] = {"num_workers": c.num_workers, "prefetch_factor": c.prefetch_factor}
    if c.num_workers == 0:
        update["persistent_workers"] = False  # torch refuses it without workers
    return s.model_copy(update={"dataloader": s.dataloader.model_copy(update=update)})


def _workers_paths(c: TrainConfig) -> tuple[str, ...]:
    paths = ("dataloader.num_workers", "dataloader.prefetch_factor")
    return (*paths, "dataloader.persistent_workers") if c.num_workers == 0 else paths


def _pin(s: Settings, c: TrainConfig) -> Settings:
    dataloader = s.dataloader.model_copy(update={"pin_memory": c.pin_memory})
    return s.model_copy(update={"dataloader": dataloader})


def _threads(s: Settings, c: TrainConfig) -> Settings:
    """The threads, and the OpenMP/MKL variables with them, as the rules write them (G1-G3:
    equal to ``cpu_threads``, unset where torch's default is kept): a drop that left them
    at the old count made a profile its own validation refuses."""
    environment = {k: v for k, v in s.environment.items() if k not in THREAD_VARIABLES}
    if c.cpu_threads is not None:
        environment |= dict.fromkeys(THREAD_VARIABLES, str(c.cpu_threads))
    return s.model_copy(update={"cpu_threads": c.cpu_threads, "environment": environment})


def _fixed(*paths: str) -> Callable[[TrainConfig], tuple[str, ...]]:
    return lambda _config: paths


_CUSTOM: dict[str, Knob] = {
    knob.name: knob
    for knob in (
        Knob(
            "precision",
            ("precision",),
            _precision,
            _fixed("precision.autocast", "precision.dtype", "precision.grad_scaler"),
        ),
        Knob("batch_size", ("batch_size",), _batch_size, _fixed("batch.batch_size")),
        Knob("compile", ("compile_mode",), _compile, _fixed("compile.enabled", "compile.mode")),
        Knob("channels_last", ("channels_last",), _channels_last, _fixed("memory_format")),
        Knob("tf32", ("tf32",), _tf32, _tf32_paths),
        Knob(
            "cudnn_benchmark",
            ("cudnn_benchmark",),
            _cudnn_benchmark,
            _fixed("backends.cudnn_benchmark"),
        ),
        Knob("fused_optimizer", ("fused_optimizer",), _fused, _fixed("optimizer.fused")),
        Knob("num_workers", ("num_workers", "prefetch_factor"), _workers, _workers_paths),
        Knob("pin_memory", ("pin_memory",), _pin, _fixed("dataloader.pin_memory")),
        Knob(
            "cpu_threads",
            ("cpu_threads",),
            _threads,
            _fixed("cpu_threads", *(f"environment.{v}" for v in THREAD_VARIABLES)),
        ),
    )
}
"""The knobs whose ``TrainConfig`` fields were named before the records: each reads and writes
its fields as they always did (a ``--baseline`` file names them)."""


def _generic(record: SettingRecord) -> Knob:
    """The knob of a setting that ``TrainConfig`` names by its path only: its value lives in
    ``TrainConfig.settings`` (absent: torch's default, as in ``Settings``)."""
    (path,) = record.paths

    def put(settings: Settings, config: TrainConfig) -> Settings:
        value = config.settings.get(path, setting_value(torch_defaults(settings.device), path))
        return settings_with(settings, path, value)

    return Knob(record.bench or record.name, (), put, _fixed(path), path)


def _knobs() -> tuple[Knob, ...]:
    return tuple(
        _CUSTOM[record.bench] if record.bench in _CUSTOM else _generic(record)
        for record in RECORDS
        if record.bench is not None
    )


KNOBS: tuple[Knob, ...] = _knobs()
"""Every setting the bench can ablate (the records with ``bench``), in the records' order."""

KNOB_BY_NAME = {knob.name: knob for knob in KNOBS}


def not_ablated(settings: Settings) -> tuple[str, ...]:
    """Why the bench leaves alone each setting ``settings`` change that it does not switch
    (the records' ``not_ablated``, where their setting is not torch's default)."""
    return tuple(
        record.not_ablated
        for record in RECORDS
        if record.not_ablated is not None
        and record.changed is not None
        and record.changed(settings)
    )


def couples(knob: Knob) -> tuple[tuple[Knob, str], ...]:
    """The knobs that go back with ``knob`` when the bench drops it, each with why (its
    record's ``couples``: channels_last goes with AMP, rule H1)."""
    record = next((r for r in RECORDS if r.bench == knob.name), None)
    if record is None:
        return ()
    return tuple(
        (KNOB_BY_NAME[bench], why)
        for name, why in record.couples.items()
        if (bench := RECORD_BY_NAME[name].bench) is not None
    )


def parent(knob: Knob) -> Knob | None:
    """The knob ``knob``'s setting takes effect only under (its record's ``only_with``:
    compile, for compile's memory budget); None for most."""
    record = next((r for r in RECORDS if r.bench == knob.name), None)
    if record is None or record.only_with is None:
        return None
    bench = RECORD_BY_NAME[record.only_with].bench
    return KNOB_BY_NAME[bench] if bench is not None else None


def goes_with_parent(knob: Knob, dropped: set[str]) -> bool:
    """Whether ``knob`` is dropped with its ``parent``, among the knobs named ``dropped``: the
    parent's drop takes it back too (``couples``) and brings back the batch that ran without
    both, so it is not dropped again on its own."""
    under = parent(knob)
    return under is not None and under.name in dropped


def switched_off(config: TrainConfig, knob: Knob, baseline: TrainConfig) -> TrainConfig:
    """``config`` with ``knob`` as ``baseline`` has it, and the settings that take effect only
    under it (``dependents``) too."""
    off = with_knob(config, knob, baseline)
    for dependent in dependents(knob):
        off = with_knob(off, dependent, baseline)
    return off


def switched_on(config: TrainConfig, knob: Knob, source: TrainConfig) -> TrainConfig:
    """``config`` with ``knob`` as ``source`` has it, and its ``parent`` too: a setting that
    takes effect only under another is switched on with it (compile's memory budget, compile)."""
    under = parent(knob)
    on = with_knob(config, under, source) if under is not None else config
    return with_knob(on, knob, source)


def dependents(knob: Knob) -> tuple[Knob, ...]:
    """The knobs whose setting takes effect only under ``knob``'s (their record's
    ``only_with``: compile's memory budget, under compile): off wherever ``knob`` is."""
    record = next((r for r in RECORDS if r.bench == knob.name), None)
    if record is None:
        return ()
    return tuple(KNOB_BY_NAME[r.bench] for r in RECORDS if r.only_with == record.name and r.bench)


def knob_value(config: TrainConfig, knob: Knob) -> Any:
    """The knob's value in a config: a scalar for one field, a tuple for several."""
    if knob.path is not None:
        return config.settings.get(knob.path)
    values = tuple(getattr(config, name) for name in knob.fields)
    return values[0] if len(values) == 1 else values


def with_knob(config: TrainConfig, knob: Knob, source: TrainConfig) -> TrainConfig:
    """``config`` with the knob's fields taken from ``source``."""
    if knob.path is not None:
        delta = {k: v for k, v in config.settings.items() if k != knob.path}
        if knob.path in source.settings:
            delta[knob.path] = source.settings[knob.path]
        return config.model_copy(update={"settings": delta})
    return config.model_copy(update={name: getattr(source, name) for name in knob.fields})


def show_value(config: TrainConfig, knob: Knob) -> str:
    """The knob's value as the report prints it."""
    if knob.name == "num_workers":
        return str(config.num_workers)
    if knob.path is not None:
        value = config.settings.get(knob.path)
        return (
            "default" if value is None else on_off(value) if isinstance(value, bool) else str(value)
        )
    value = getattr(config, knob.fields[0])
    if value is None:
        return "eager" if knob.name == "compile" else "default"
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def settings_config(settings: Settings, baseline: TrainConfig | None = None) -> TrainConfig:
    """The TrainConfig that trains as ``settings`` do: a profile's, read back for the bench.

    A profile without a measured batch size keeps the baseline's: the bench never makes up a
    size. Settings that mean nothing on the profile's device (cuDNN off CUDA) stay at torch's
    default, as in the baseline.
    """
    s = settings
    base = baseline or TrainConfig()
    cuda = s.device == "cuda"
    dl = s.dataloader
    defaults = torch_defaults(s.device)
    paths = [k.path for k in KNOBS if k.path is not None]
    return TrainConfig(
        settings={p: setting_value(s, p) for p in paths if _differs(s, defaults, p)},
        batch_size=s.batch.batch_size or base.batch_size,
        precision=s.precision.dtype if s.precision.autocast else "float32",
        channels_last=s.memory_format == "channels_last",
        compile_mode=(s.compile.mode or "default") if s.compile.enabled else None,
        cudnn_benchmark=True if cuda and s.backends.cudnn_benchmark else None,  # off: default
        tf32=s.matmul.tf32 if s.matmul.api is not None else None,
        fused_optimizer=s.optimizer.fused,
        num_workers=dl.num_workers,
        prefetch_factor=dl.prefetch_factor if dl.num_workers > 0 else None,
        pin_memory=dl.pin_memory,
        cpu_threads=s.cpu_threads,
    )


def _differs(settings: Settings, defaults: Settings, path: str) -> bool:
    return setting_value(settings, path) != setting_value(defaults, path)


def settings_with(settings: Settings, path: str, value: Any) -> Settings:
    """``settings`` with the leaf at the dotted ``path`` set to ``value`` (validated)."""
    data = settings.model_dump()
    *parents, leaf = path.split(".")
    node = data
    for part in parents:
        node = node[part]
    node[leaf] = value
    return Settings.model_validate(data)


def train_settings(config: TrainConfig, base: Settings) -> Settings:
    """``base`` with every knob at ``config``'s value: the settings one bench arm trains with.

    What the knobs do not cover (the device, the TF32 API, determinism, the environment) stays
    as ``base`` has it.
    """
    settings = base
    for knob in KNOBS:
        settings = knob.put(settings, config)
    return settings

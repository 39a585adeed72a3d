"""The bench's knobs as typed transforms between a profile's settings and a bench arm.

Every property holds for every ``TrainConfig`` hypothesis draws: a knob changes only the
settings it names, the settings it writes read back as the config it came from, and the
settings an arm trains with are ones a profile could hold.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tests.test_bench import measured
from torch_autotune.bench_record import TrainConfig
from torch_autotune.knobs import KNOBS, settings_config, train_settings, with_knob
from torch_autotune.settings import Settings, setting_value, settings_paths, torch_defaults

BASE = measured("a100-sxm4-80gb-8x").settings  # CUDA, with a TF32 API


@st.composite
def configs(draw: st.DrawFn) -> TrainConfig:
    workers = draw(st.integers(min_value=0, max_value=16))
    compile_mode = draw(st.sampled_from([None, "default", "reduce-overhead", "max-autotune"]))
    # the settings TrainConfig names by path only (absent: torch's default): checkpointing on,
    # and compile's memory budget, which takes effect only under compile
    settings: dict[str, bool | float] = {}
    if draw(st.booleans()):
        settings["activation_checkpointing"] = True
    if compile_mode is not None and draw(st.booleans()):
        settings["compile.memory_budget"] = draw(st.floats(min_value=0.0, max_value=1.0))
    return TrainConfig(
        batch_size=draw(st.integers(min_value=1, max_value=4096)),
        precision=draw(st.sampled_from(["float32", "float16", "bfloat16"])),
        channels_last=draw(st.booleans()),
        compile_mode=compile_mode,
        # off is torch's default: a profile holds "off" and "default" alike, as None
        cudnn_benchmark=draw(st.sampled_from([None, True])),
        tf32=draw(st.sampled_from([None, True, False])),
        fused_optimizer=draw(st.booleans()),
        num_workers=workers,
        prefetch_factor=draw(st.none() | st.integers(1, 8)) if workers else None,
        pin_memory=draw(st.booleans()),
        cpu_threads=draw(st.none() | st.integers(1, 64)),
        settings=settings,
    )


LEAVES = sorted(settings_paths() - {"environment"})  # the variables are leaves of their own


def _leaves(settings: Settings) -> dict[str, object]:
    return {path: setting_value(settings, path) for path in LEAVES}


@given(configs(), configs())
def test_a_knob_changes_only_the_settings_it_names(start: TrainConfig, config: TrainConfig) -> None:
    before = train_settings(start, BASE)
    old = _leaves(before)
    for knob in KNOBS:
        changed = {p for p, v in _leaves(knob.put(before, config)).items() if old[p] != v}
        assert changed <= set(knob.paths(config)), knob.name


@given(configs())
def test_the_settings_of_an_arm_read_back_as_its_config(config: TrainConfig) -> None:
    assert settings_config(train_settings(config, BASE)) == config


@given(configs(), configs())
def test_one_knob_put_in_is_that_knob_taken_from_the_other_config(
    start: TrainConfig, source: TrainConfig
) -> None:
    for knob in KNOBS:
        settings = knob.put(train_settings(start, BASE), source)
        expected = with_knob(start, knob, source)
        if knob.name == "tf32" and start.tf32 is None:
            # torch's default names no TF32 API, and a pure transform cannot pick one: TF32
            # stays unset (the bench's loop gives its base the API of the running torch)
            expected = start
        assert settings_config(settings) == expected, knob.name


@given(configs())
def test_an_arm_trains_with_valid_settings_and_keeps_what_no_knob_covers(
    config: TrainConfig,
) -> None:
    settings = train_settings(config, BASE)
    assert Settings.model_validate(settings.model_dump()) == settings  # nested models intact
    assert settings.device == BASE.device
    assert settings.backends.deterministic_algorithms == BASE.backends.deterministic_algorithms
    threads = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")  # the threads' knob holds them too
    kept = {k: v for k, v in settings.environment.items() if k not in threads}
    assert kept == {k: v for k, v in BASE.environment.items() if k not in threads}
    said = {settings.environment.get(name) for name in threads}
    assert said == {None if settings.cpu_threads is None else str(settings.cpu_threads)}
    assert settings.dataloader.seed_workers == BASE.dataloader.seed_workers


def test_the_default_config_on_torch_defaults_changes_nothing() -> None:
    cpu = torch_defaults("cpu")
    assert train_settings(TrainConfig(), cpu) == cpu.model_copy(
        update={"batch": cpu.batch.model_copy(update={"batch_size": 32})}
    )

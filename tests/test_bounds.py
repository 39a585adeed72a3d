"""Numbers that validate can run: every count bounded by what a machine can have, no infinity
or NaN anywhere in a profile, a snapshot or a bench record."""

from __future__ import annotations

import ast
import inspect
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from tests.test_bench import measured
from torch_autotune import bench_record, bounds, evidence, hardware, profile, sections, topology
from torch_autotune import settings as settings_model
from torch_autotune.bench import TrainConfig
from torch_autotune.detect.cgroup import read_cpu_quota, read_memory_limit
from torch_autotune.detect.recorded import load_snapshot
from torch_autotune.errors import ProfileFileError
from torch_autotune.hand_edits import with_hand_edits
from torch_autotune.hardware import HardwareSnapshot
from torch_autotune.profile import Profile
from torch_autotune.profile_io import dump_profile, parse_profile
from torch_autotune.rules import context

MODEL_MODULES = (
    settings_model,
    sections,
    evidence,
    bench_record,
    profile,
    hardware,
    context,
    topology,
)
MODELS = [
    model
    for module in MODEL_MODULES
    for _, model in inspect.getmembers(module, inspect.isclass)
    if issubclass(model, BaseModel) and model.__module__ == module.__name__
]
SRC = Path(__file__).resolve().parents[1] / "src"

# The largest a count of each kind may be; an integer under any other key is a seed at most.
LIMITS = {
    "num_workers": bounds.MAX_WORKERS,
    "cpu_threads": bounds.MAX_CPUS,
    "processes_per_node": bounds.MAX_CPUS,
    "cpus_per_process": bounds.MAX_CPUS,
    "devices_per_process": bounds.MAX_ACCELERATORS,
    "batch_multiple": bounds.MAX_BATCH_SIZE,
    "cpus_usable": bounds.MAX_CPUS,
    "cpu_cores_physical": bounds.MAX_CPUS,
    "cpu_cores_logical": bounds.MAX_CPUS,
    "cpu_affinity_count": bounds.MAX_CPUS,
    "torch_num_threads": bounds.MAX_CPUS,
    "prefetch_factor": bounds.MAX_PREFETCH_FACTOR,
    "batch_size": bounds.MAX_BATCH_SIZE,
    "max_batch_size": bounds.MAX_BATCH_SIZE,
    "fastest_batch_size": bounds.MAX_BATCH_SIZE,
    "grad_accum_steps": bounds.MAX_GRAD_ACCUM_STEPS,
    "sm_count": bounds.MAX_COMPUTE_UNITS,
    "rounds": bounds.MAX_ROUNDS,
}


def leaves(
    data: Any, path: tuple[str | int, ...] = ()
) -> Iterator[tuple[tuple[str | int, ...], Any]]:
    """Every scalar of a dumped model with its path."""
    if isinstance(data, dict):
        for key, value in data.items():
            yield from leaves(value, (*path, key))
    elif isinstance(data, (list, tuple)):
        for index, value in enumerate(data):
            yield from leaves(value, (*path, index))
    else:
        yield path, data


def assert_runnable(model: BaseModel) -> None:
    """No float that is not finite, no count beyond its limit."""
    for path, value in leaves(model.model_dump()):
        if isinstance(value, float):
            assert math.isfinite(value), path
        elif isinstance(value, int) and not isinstance(value, bool):
            key = next((p for p in reversed(path) if isinstance(p, str)), "")
            if key.endswith("_bytes"):
                assert 0 <= value <= bounds.MAX_BYTES, path
            else:
                assert bounds.SEED_MIN <= value <= LIMITS.get(key, bounds.SEED_MAX), path


def integer_schemas(schema: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(schema, dict):
        if schema.get("type") == "integer":
            yield path, schema
        for key, value in schema.items():
            yield from integer_schemas(value, f"{path}.{key}")
    elif isinstance(schema, list):
        for index, value in enumerate(schema):
            yield from integer_schemas(value, f"{path}[{index}]")


def test_every_module_that_defines_a_model_is_checked() -> None:
    """The models moved once (to settings.py and evidence.py) and this file went on checking
    the modules they had left: find every class built on a pydantic model in the source, by
    its bases, without importing (and so without torch)."""
    model_bases = {"BaseModel", "StrictModel", "_Frozen"}
    defining = set()
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and any(
                getattr(base, "id", getattr(base, "attr", None)) in model_bases
                for base in node.bases
            ):
                defining.add(".".join(path.relative_to(SRC).with_suffix("").parts))
    assert defining <= {module.__name__ for module in MODEL_MODULES}
    assert {model.__name__ for model in MODELS} >= {"ThroughputRecord", "LoaderRecord", "Settings"}


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_every_model_refuses_infinity_and_nan(model: type[BaseModel]) -> None:
    assert model.model_config.get("allow_inf_nan") is False
    assert model.model_config.get("extra") == "forbid"


@pytest.mark.parametrize("root", [Profile, HardwareSnapshot, TrainConfig], ids=lambda m: m.__name__)
def test_every_integer_has_an_upper_bound(root: type[BaseModel]) -> None:
    unbounded = [
        path
        for path, schema in integer_schemas(root.model_json_schema())
        if not {"maximum", "exclusiveMaximum", "const", "enum"} & set(schema)
    ]
    assert unbounded == []


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("cpu_threads", 1_000_000_000),  # aborted inside libgomp, allocating 216 GB
        ("num_workers", 1_000_000_000_000),
        ("batch_size", 1 << 40),
        ("prefetch_factor", 1 << 20),
    ],
)
def test_a_count_no_machine_has_is_refused(field: str, value: int) -> None:
    with pytest.raises(ValidationError, match="less than or equal to"):
        TrainConfig(**{field: value, **({"num_workers": 1} if field == "prefetch_factor" else {})})


@pytest.mark.parametrize(
    ("fmt", "value"),
    [("yaml", ".inf"), ("yaml", "-.inf"), ("yaml", ".nan"), ("json", "Infinity"), ("json", "NaN")],
)
def test_a_profile_file_with_a_float_that_is_not_finite_is_refused(fmt: str, value: str) -> None:
    text = dump_profile(measured("cpu-laptop-linux"), fmt)  # type: ignore[arg-type]
    written = "budget_s: 120.0" if fmt == "yaml" else '"budget_s": 120.0'
    assert written in text
    with pytest.raises(ProfileFileError, match=r"finite number|greater than 0"):
        parse_profile(text.replace(written, written.replace("120.0", value)))


@pytest.mark.parametrize("value", [0.0, -5.0])
@pytest.mark.parametrize("record", ["throughput", "loader"])
def test_a_measured_rate_is_positive(record: str, value: float) -> None:
    """A rate of samples/s is what ran, so more than zero: the loader's was not checked."""
    data = measured("cpu-laptop-linux", workers=2).model_dump(mode="json")
    sound = {
        "throughput": {"batch_size": 64, "samples_per_s": 900.0, "relative_spread": 0.01},
        "loader": {"num_workers": 2, "samples_per_s": 5000.0},
    }[record]
    data["evidence"][record] = [sound]
    assert parse_profile(json.dumps(data), fmt="json")  # the record as measured loads
    data["evidence"][record] = [{**sound, "samples_per_s": value}]
    with pytest.raises(ProfileFileError, match="greater than 0"):
        parse_profile(json.dumps(data), fmt="json")


def test_a_cgroup_limit_above_every_machine_binds_nothing(tmp_path: Path) -> None:
    group = tmp_path / "sys" / "fs" / "cgroup"
    group.mkdir(parents=True)
    (group / "cgroup.controllers").write_text("cpu memory\n")
    (tmp_path / "proc" / "self").mkdir(parents=True)
    (tmp_path / "proc" / "self" / "cgroup").write_text("0::/\n")
    (group / "cpu.max").write_text(f"{(bounds.MAX_CPUS + 1) * 100000} 100000\n")
    (group / "memory.max").write_text(f"{bounds.MAX_BYTES + 1}\n")
    assert read_cpu_quota(tmp_path) is None
    assert read_memory_limit(tmp_path) is None


# --- the property: what validates can run, and round-trips ---------------------------------------

HOSTILE = st.one_of(
    st.integers(min_value=-(1 << 70), max_value=1 << 70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([10**12, 10**9, 1 << 63, 1 << 64, -1, 0, math.inf, -math.inf, math.nan]),
)


def _numeric_paths(data: Any) -> list[tuple[str | int, ...]]:
    return [
        path
        for path, value in leaves(data)
        if isinstance(value, (int, float)) and not isinstance(value, bool)
    ]


def _set(data: Any, path: tuple[str | int, ...], value: Any) -> None:
    for part in path[:-1]:
        data = data[part]
    data[path[-1]] = value


PROFILE = measured("a100-sxm4-80gb-8x", workers=4).model_dump(mode="json")
SNAPSHOT = load_snapshot(
    Path(__file__).parent / "fixtures" / "snapshots" / "rtx-4090-plus-rtx-3060.json"
).model_dump(mode="json")


@pytest.mark.slow  # 300 hostile profiles: seconds
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_profile_that_validates_holds_only_numbers_that_can_run(data: st.DataObject) -> None:
    import copy

    raw = copy.deepcopy(PROFILE)
    paths = _numeric_paths(raw)
    for _ in range(data.draw(st.integers(1, 3))):
        _set(raw, data.draw(st.sampled_from(paths)), data.draw(HOSTILE))
    try:
        loaded = Profile.model_validate(raw)
    except ValidationError:
        return
    assert_runnable(loaded)
    edited = with_hand_edits(loaded)  # a value set apart from its decision: the file's own
    for fmt in ("yaml", "json"):
        assert parse_profile(dump_profile(loaded, fmt), fmt=fmt) == edited  # type: ignore[arg-type]
        assert parse_profile(dump_profile(edited, fmt), fmt=fmt) == edited  # type: ignore[arg-type]


@pytest.mark.slow  # 300 hostile snapshots
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_a_snapshot_that_validates_holds_only_numbers_that_can_run(data: st.DataObject) -> None:
    import copy

    raw = copy.deepcopy(SNAPSHOT)
    paths = _numeric_paths(raw)
    for _ in range(data.draw(st.integers(1, 3))):
        _set(raw, data.draw(st.sampled_from(paths)), data.draw(HOSTILE))
    try:
        loaded = HardwareSnapshot.model_validate(raw)
    except ValidationError:
        return
    assert_runnable(loaded)
    assert HardwareSnapshot.model_validate_json(loaded.model_dump_json()) == loaded

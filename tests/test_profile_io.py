"""Bad profile files: one clear line, a documented exit code, and nothing on disk changed."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from torch_autotune.cli import cli
from torch_autotune.errors import EXIT_BAD_INPUT, ProfileFileError
from torch_autotune.hardware import HardwareSnapshot
from torch_autotune.profile import Profile
from torch_autotune.profile_io import dump_profile, load_profile
from torch_autotune.rules.engine import build_profile

SNAPSHOT_DIR = Path(__file__).parent / "fixtures" / "snapshots"


@pytest.fixture(scope="module")
def profile() -> Profile:
    snapshot = HardwareSnapshot.model_validate_json((SNAPSHOT_DIR / "tesla-t4.json").read_text())
    return build_profile(snapshot, now=datetime(2026, 11, 1, tzinfo=timezone.utc), host_id="t")


@pytest.fixture
def good_yaml(profile: Profile) -> str:
    return dump_profile(profile, "yaml")


def validate(path: Path) -> Result:
    return CliRunner().invoke(cli, ["validate", str(path)], prog_name="autotune")


def _cases(good: str) -> dict[str, tuple[str, str]]:
    return {
        "corrupt": ("settings: [unclosed\n  - x: {\n", "is not valid YAML (line"),
        "truncated": (good[: len(good) // 2].rsplit("\n", 3)[0] + "\n  extra: [", "not valid YAML"),
        "empty": ("", "is empty, not a profile"),
        "list": ("- 1\n- 2\n", "is a list, not a profile"),
        "number": ("42\n", "is a number, not a profile"),
        "string": ("just words\n", "is a string, not a profile"),
        "unknown-key-typo": (
            good.replace("  num_workers:", "  num_worker:", 1),
            "unknown key 'settings.dataloader.num_worker'; did you mean 'num_workers'?",
        ),
        "future-schema": (
            good.replace("schema_version: 2", "schema_version: 7", 1),
            "pip install -U torch-autotune",
        ),
        "python-object-tag": (
            "!!python/object/apply:os.system ['echo pwned']\n",
            "refused a YAML tag that would construct an object",
        ),
        "broken-invariant": (
            good.replace("dtype: float16", "dtype: bfloat16", 1),
            "bfloat16 needs compute capability 8.0",
        ),
        "bad-json": ('{"schema_version": 1,', "is not valid JSON"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "corrupt",
        "truncated",
        "empty",
        "list",
        "unknown-key-typo",
        "future-schema",
        "python-object-tag",
        "broken-invariant",
        "bad-json",
    ],
)
def test_bad_profile_file_gives_one_line_exit_3_and_changes_nothing(
    tmp_path: Path, good_yaml: str, case: str
) -> None:
    content, expected = _cases(good_yaml)[case]
    path = tmp_path / "profile.yaml"
    path.write_text(content)
    result = validate(path)
    assert result.exit_code == EXIT_BAD_INPUT
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("autotune: error: ")
    assert expected in lines[0]
    assert "Traceback" not in result.output
    assert path.read_text() == content
    with pytest.raises(ProfileFileError):
        load_profile(path)


def _with_environment(profile: Profile, environment: dict[str, str], threads: int | None) -> str:
    """``profile`` as JSON with ``settings.environment`` and ``settings.cpu_threads`` edited."""
    data: dict[str, Any] = profile.model_dump(mode="json")
    data["settings"]["environment"] = environment
    data["settings"]["cpu_threads"] = threads
    return json.dumps(data)


@pytest.mark.parametrize(
    ("environment", "threads", "expected"),
    [
        (
            {"OMP_NUM_THREADS": "abc"},
            None,
            "settings.environment.OMP_NUM_THREADS: 'abc' is not a positive whole number",
        ),
        (
            {"MKL_NUM_THREADS": "0"},
            2,
            "settings.environment.MKL_NUM_THREADS: '0' is not a positive whole number (set it "
            "to cpu_threads, '2')",
        ),
        (
            {"OMP_NUM_THREADS": "64", "MKL_NUM_THREADS": "3"},
            3,
            "settings.environment.OMP_NUM_THREADS: '64' differs from cpu_threads 3 (set it to "
            "cpu_threads, '3')",
        ),
        (
            {"CUBLAS_WORKSPACE_CONFIG": "garbage"},
            None,
            "settings.environment.CUBLAS_WORKSPACE_CONFIG: 'garbage' is not a workspace torch's "
            "deterministic mode accepts (set it to ':4096:8', or ':16:8' for less memory)",
        ),
        (
            {"HIPBLAS_WORKSPACE_CONFIG": "4096:8"},
            None,
            "settings.environment.HIPBLAS_WORKSPACE_CONFIG: '4096:8' is not a workspace",
        ),
        (
            {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments"},
            None,
            "settings.environment.PYTORCH_CUDA_ALLOC_CONF: 'expandable_segments' is not a "
            "comma-separated list of key:value pairs",
        ),
        (
            {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128,"},
            None,
            "is not a comma-separated list of key:value pairs",
        ),
    ],
    ids=["omp-abc", "mkl-zero", "omp-not-cpu-threads", "cublas", "hipblas", "alloc", "alloc-comma"],
)
def test_an_environment_value_nothing_can_read_is_refused(
    tmp_path: Path,
    profile: Profile,
    environment: dict[str, str],
    threads: int | None,
    expected: str,
) -> None:
    """Environment values were never checked: 'OMP_NUM_THREADS: abc' validated, and
    'autotune export --format env' wrote 'export OMP_NUM_THREADS=abc'."""
    path = tmp_path / "profile.json"
    path.write_text(_with_environment(profile, environment, threads))
    result = validate(path)
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"autotune: error: {path}: ")
    assert expected in lines[0]
    out = tmp_path / "env.sh"
    exported = CliRunner().invoke(
        cli, ["export", "--profile", str(path), "--format", "env", "-o", str(out)]
    )
    assert exported.exit_code == EXIT_BAD_INPUT, exported.output
    assert not out.exists()


def test_environment_values_torch_reads_validate(tmp_path: Path, profile: Profile) -> None:
    environment = {
        "OMP_NUM_THREADS": "3",
        "MKL_NUM_THREADS": "3",
        "CUBLAS_WORKSPACE_CONFIG": ":16:8",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,"
        "roundup_power2_divisions:[256:1,512:2,>:1], garbage_collection_threshold:0.8",
    }
    path = tmp_path / "profile.json"
    path.write_text(_with_environment(profile, environment, 3))
    result = validate(path)
    assert result.exit_code == 0, result.output
    assert load_profile(path).settings.environment == environment


def test_the_object_tag_is_never_executed(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    path = tmp_path / "profile.yaml"
    path.write_text(f"!!python/object/apply:os.system ['touch {marker}']\n")
    validate(path)
    assert not marker.exists()


def test_valid_profile_validates(tmp_path: Path, good_yaml: str) -> None:
    path = tmp_path / "profile.yaml"
    path.write_text(good_yaml)
    result = validate(path)
    assert result.exit_code == 0
    assert "valid profile" in result.output


def test_json_and_yaml_hold_the_same_profile(profile: Profile, tmp_path: Path) -> None:
    (tmp_path / "p.json").write_text(dump_profile(profile, "json"))
    (tmp_path / "p.yaml").write_text(dump_profile(profile, "yaml"))
    assert load_profile(tmp_path / "p.json") == load_profile(tmp_path / "p.yaml") == profile

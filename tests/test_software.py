"""Python and torch facts read without importing torch (``torch_autotune.detect.software``).

torch installs are faked as package directories under ``tmp_path`` holding a ``version.py`` written
the way real wheels write it; installed-distribution metadata is faked by patching
``importlib.metadata.version``. The architecture table is pinned to the rules catalog (E1-E4, §Q).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import platform
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from torch_autotune.detect import software
from torch_autotune.detect.software import (
    TorchBuild,
    default_start_method,
    read_software,
    read_torch_build,
    wheel_arch_list,
)

# Architecture lists of official wheels, as the catalog quotes them.
MAXWELL_TO_HOPPER = ("sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90")  # E1, E4 cu126
MAXWELL_TO_BLACKWELL = (*MAXWELL_TO_HOPPER, "sm_100", "sm_120")  # 2.7 cu128 (E2)
VOLTA_TO_BLACKWELL = ("sm_70", "sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120")  # E3
TURING_TO_BLACKWELL = VOLTA_TO_BLACKWELL[1:]  # E4: 2.11+ cu128, every CUDA 13 wheel


def version_py(version: str, *, cuda: str | None = None, hip: str | None = None) -> str:
    """torch/version.py as the build writes it (tools/generate_torch_version.py)."""
    return textwrap.dedent(
        f"""\
        from typing import Optional

        __all__ = ['__version__', 'debug', 'cuda', 'git_version', 'hip', 'rocm', 'xpu']
        __version__ = {version!r}
        debug = False
        cuda: Optional[str] = {cuda!r}
        git_version = 'a1cb3cc05d46d198467bebbb6e8fba50a325d4e7'
        hip: Optional[str] = {hip!r}
        rocm: Optional[str] = None
        xpu: Optional[str] = None
        """
    )


CUDA_128 = version_py("2.8.0+cu128", cuda="12.8")
ROCM_64 = version_py("2.8.0+rocm6.4", hip="6.4.43482")
CPU = version_py("2.8.0+cpu")


class Site:
    """A fake site-packages: top-level package directories under a temporary root."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def add(self, name: str, files: dict[str, str] | None = None) -> Path:
        directory = self.root / name
        directory.mkdir()
        for filename, text in (files or {}).items():
            (directory / filename).write_text(text, encoding="utf-8")
        return directory

    def add_torch(self, version_file: str) -> Path:
        return self.add("torch", {"__init__.py": "", "version.py": version_file})

    def find(self, name: str) -> Path | None:
        directory = self.root / name
        return directory if directory.is_dir() else None


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Site:
    """Packages found on the fake site only (Triton included), never on the real one."""
    fake = Site(tmp_path)
    monkeypatch.setattr(software, "_package_dir", fake.find)
    return fake


@pytest.fixture
def distributions(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Installed distributions by name -> version; empty unless a test adds some."""
    installed: dict[str, str] = {}

    def version(name: str) -> str:
        if name not in installed:
            raise importlib.metadata.PackageNotFoundError(name)
        return installed[name]

    monkeypatch.setattr(importlib.metadata, "version", version)
    return installed


# --- torch/version.py ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("version_file", "expected"),
    [
        pytest.param(CUDA_128, TorchBuild("2.8.0+cu128", "12.8", None), id="cuda-wheel"),
        pytest.param(ROCM_64, TorchBuild("2.8.0+rocm6.4", None, "6.4.43482"), id="rocm-wheel"),
        pytest.param(CPU, TorchBuild("2.8.0+cpu", None, None), id="cpu-wheel"),
        pytest.param(
            version_py("2.8.0", cuda=""), TorchBuild("2.8.0", None, None), id="empty-cuda-is-none"
        ),
        pytest.param(
            "raise RuntimeError('version.py was executed')\n"
            "import torch._C  # would import the binary\n" + CUDA_128,
            TorchBuild("2.8.0+cu128", "12.8", None),
            id="parsed-not-executed",
        ),
    ],
)
def test_read_torch_build_parses_version_py(
    site: Site, distributions: dict[str, str], version_file: str, expected: TorchBuild
) -> None:
    distributions["torch"] = "9.9.9"  # the file wins over metadata when it declares a version
    site.add_torch(version_file)

    assert read_torch_build(find_package_dir=site.find) == expected


@pytest.mark.parametrize(
    ("installed", "expected"),
    [
        pytest.param({"torch": "2.8.0"}, TorchBuild("2.8.0", None, None), id="from-metadata"),
        pytest.param({}, None, id="no-metadata-either"),
    ],
)
@pytest.mark.parametrize(
    "files",
    [
        pytest.param({"version.py": "__version__ = '2.8.0+cu128\ncuda = '12.8'\n"}, id="syntax"),
        pytest.param({"version.py": "__version__ = '2.8.0'\x00\n"}, id="null-byte"),
        pytest.param({"__init__.py": ""}, id="missing-version-py"),
    ],
)
def test_read_torch_build_falls_back_to_metadata_on_unreadable_version_py(
    site: Site,
    distributions: dict[str, str],
    files: dict[str, str],
    installed: dict[str, str],
    expected: TorchBuild | None,
) -> None:
    distributions.update(installed)
    site.add("torch", files)

    assert read_torch_build(find_package_dir=site.find) == expected


@pytest.mark.parametrize(
    ("installed", "version"),
    [
        pytest.param({"torch": "2.8.0"}, "2.8.0", id="metadata"),
        pytest.param({}, "unknown", id="none"),
    ],
)
def test_read_torch_build_without_declared_version(
    site: Site, distributions: dict[str, str], installed: dict[str, str], version: str
) -> None:
    distributions.update(installed)
    site.add_torch("cuda: Optional[str] = '12.6'\nhip = None\n")

    assert read_torch_build(find_package_dir=site.find) == TorchBuild(version, "12.6", None)


def test_read_torch_build_without_torch_is_none(site: Site, distributions: dict[str, str]) -> None:
    distributions["torch"] = "2.8.0"  # stale metadata without the package is not an install

    assert read_torch_build(find_package_dir=site.find) is None


# --- architectures of official wheels -----------------------------------------------------------


@pytest.mark.parametrize(
    ("torch_version", "cuda_version", "expected"),
    [
        pytest.param("2.1.0", "11.8", MAXWELL_TO_HOPPER, id="cu118-2.1"),
        pytest.param("2.6.0", "12.6", MAXWELL_TO_HOPPER, id="cu126-2.6"),
        pytest.param("2.8.0", "12.6", MAXWELL_TO_HOPPER, id="cu126-2.8-keeps-pascal"),
        pytest.param("2.13.0", "12.6", MAXWELL_TO_HOPPER, id="cu126-2.13-legacy"),
        pytest.param("2.7.0", "12.8", MAXWELL_TO_BLACKWELL, id="cu128-2.7"),
        pytest.param("2.8.0", "12.8", VOLTA_TO_BLACKWELL, id="cu128-2.8-drops-maxwell-pascal"),
        pytest.param("2.8.0+cu128", "12.8.1", VOLTA_TO_BLACKWELL, id="cu128-2.8-local-label"),
        pytest.param("2.10.0", "12.9", VOLTA_TO_BLACKWELL, id="cu129-2.10"),
        pytest.param("2.11.0", "12.8", TURING_TO_BLACKWELL, id="cu128-2.11-drops-volta"),
        pytest.param("2.10.0", "13.0", TURING_TO_BLACKWELL, id="cu130-2.10"),
        pytest.param("2.13.0", "13.2", TURING_TO_BLACKWELL, id="cu132-2.13"),
        pytest.param("2.10.0.dev20251001+cu130", "13.0", TURING_TO_BLACKWELL, id="nightly"),
        pytest.param("1.12.1+cu102", "10.2", ("sm_37", "sm_50", "sm_60", "sm_70"), id="cu102"),
        pytest.param("1.8.1+cu101", "10.1", ("sm_37", "sm_50", "sm_60", "sm_70"), id="cu101"),
        pytest.param(
            "1.7.1+cu110",
            "11.0",
            ("sm_37", "sm_50", "sm_60", "sm_70", "sm_75", "sm_80"),
            id="cu110",
        ),
    ],
)
def test_wheel_arch_list_matches_the_published_matrix(
    torch_version: str, cuda_version: str, expected: tuple[str, ...]
) -> None:
    assert wheel_arch_list(torch_version, cuda_version, "x86_64") == expected


def test_wheel_arch_list_cu117_covers_kepler_but_not_hopper() -> None:
    arch_list = wheel_arch_list("2.0.1", "11.7")

    assert arch_list is not None
    assert "sm_37" in arch_list
    assert "sm_86" in arch_list
    assert "sm_90" not in arch_list


@pytest.mark.parametrize(
    ("torch_version", "cuda_version"),
    [
        pytest.param("2.5.1", "12.8", id="cu128-before-2.7-is-custom"),
        pytest.param("2.6.0", "12.9", id="cu129-before-2.7-is-custom"),
        pytest.param("nightly", "12.8", id="garbage-torch"),
        pytest.param("2.8.0", "cuda", id="garbage-cuda"),
        pytest.param("", "12.8", id="empty-torch"),
        pytest.param("2.8.0", "", id="empty-cuda"),
        pytest.param("1.4.0", "9.2", id="before-cuda-10"),
        pytest.param("2.9.0a0+145a3a7bda.nv25.10", "13.0", id="jetpack"),
        pytest.param("2.5.0a0+e000cf0ad9.nv24.10", "12.6", id="ngc-container"),
        pytest.param("2.9.0a0+git1c2d3e4", "12.8", id="source-build"),
    ],
)
def test_wheel_arch_list_unknown_build_is_none(torch_version: str, cuda_version: str) -> None:
    assert wheel_arch_list(torch_version, cuda_version) is None


def test_the_aarch64_cuda_13_wheels_carry_jetson_thors_sm_110() -> None:
    arm = wheel_arch_list("2.10.0", "13.0", "aarch64")
    assert arm is not None
    assert "sm_110" in arm
    assert "sm_110" not in (wheel_arch_list("2.10.0", "13.0", "x86_64") or ())


@given(
    torch_minor=st.integers(0, 20),
    torch_patch=st.integers(0, 3),
    cuda=st.tuples(st.integers(11, 13), st.integers(0, 9)),
)
def test_wheel_arch_list_is_none_or_ordered_sm_targets(
    torch_minor: int, torch_patch: int, cuda: tuple[int, int]
) -> None:
    arch_list = wheel_arch_list(f"2.{torch_minor}.{torch_patch}", f"{cuda[0]}.{cuda[1]}")

    if arch_list is None:
        return
    assert arch_list
    assert all(re.fullmatch(r"sm_\d+", arch) for arch in arch_list)
    numbers = [int(arch[3:]) for arch in arch_list]
    assert numbers == sorted(set(numbers))
    if cuda >= (13, 0):
        assert numbers[0] >= 75  # CUDA 13 cannot target anything older than Turing


# --- read_software ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("version_file", "installed", "arch_list", "source", "cudnn", "warned"),
    [
        pytest.param(None, {}, None, None, None, ["software.torch_version"], id="torch-absent"),
        pytest.param(CPU, {}, (), "release-table", None, [], id="cpu-build"),
        pytest.param(
            CUDA_128,
            {"nvidia-cudnn-cu12": "9.10.2.21"},
            VOLTA_TO_BLACKWELL,
            "release-table",
            "9.10.2",
            [],
            id="cuda-build",
        ),
        pytest.param(
            CUDA_128,
            {},
            VOLTA_TO_BLACKWELL,
            "release-table",
            None,
            ["software.cudnn_version"],
            id="cuda-build-no-cudnn-wheel",
        ),
        pytest.param(
            version_py("2.5.1+cu128", cuda="12.8"),
            {"nvidia-cudnn-cu12": "9.5.1.17"},
            None,
            None,
            "9.5.1",
            ["software.torch_cuda_arch_list"],
            id="custom-cuda-build",
        ),
        pytest.param(
            ROCM_64,
            {"nvidia-cudnn-cu12": "9.10.2.21"},  # a stray wheel is not what a ROCm torch uses
            None,
            None,
            None,
            ["software.torch_cuda_arch_list"],
            id="rocm-build",
        ),
    ],
)
def test_read_software_torch_facts(
    *,
    site: Site,
    distributions: dict[str, str],
    version_file: str | None,
    installed: dict[str, str],
    arch_list: tuple[str, ...] | None,
    source: str | None,
    cudnn: str | None,
    warned: list[str],
) -> None:
    distributions.update(installed)
    if version_file is not None:
        site.add_torch(version_file)

    reading, warnings = read_software(find_package_dir=site.find)

    assert reading.torch == read_torch_build(find_package_dir=site.find)
    assert reading.torch_cuda_arch_list == arch_list
    assert reading.torch_cuda_arch_list_source == source
    assert reading.cudnn_version == cudnn
    assert [w.field for w in warnings] == warned


def test_read_software_reports_this_python(site: Site, distributions: dict[str, str]) -> None:
    reading, _ = read_software(find_package_dir=site.find)

    assert reading.python_version == platform.python_version()
    assert reading.python_implementation == platform.python_implementation()
    assert reading.python_gil_enabled is getattr(sys, "_is_gil_enabled", lambda: True)()
    assert reading.multiprocessing_start_method == default_start_method()


@pytest.mark.parametrize(
    ("packages", "installed", "available", "version"),
    [
        pytest.param(["triton"], {"triton": "3.4.0"}, True, "3.4.0", id="triton"),
        pytest.param(["triton"], {"pytorch-triton": "3.5.0+git"}, True, "3.5.0+git", id="nightly"),
        pytest.param([], {"triton": "3.4.0"}, False, None, id="metadata-only-not-importable"),
        pytest.param([], {}, False, None, id="absent"),
    ],
)
def test_read_software_triton(
    *,
    site: Site,
    distributions: dict[str, str],
    packages: list[str],
    installed: dict[str, str],
    available: bool,
    version: str | None,
) -> None:
    for name in packages:
        site.add(name, {"__init__.py": ""})
    distributions.update(installed)

    reading, _ = read_software(find_package_dir=site.find)

    assert (reading.triton_available, reading.triton_version) == (available, version)


def test_read_software_cudnn_follows_the_torch_cuda_major(
    site: Site, distributions: dict[str, str]
) -> None:
    # pip leaves the old dependency behind when a cu130 torch is replaced by a cu128 one.
    distributions.update({"nvidia-cudnn-cu13": "9.13.0.50", "nvidia-cudnn-cu12": "9.10.2.21"})
    site.add_torch(CUDA_128)

    reading, _ = read_software(find_package_dir=site.find)

    assert reading.cudnn_version == "9.10.2"


# --- start method and import cost, in a fresh interpreter ----------------------------------------


def run_python(code: str) -> dict[str, object]:
    """Run code in a fresh interpreter; it prints one JSON object."""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    result: dict[str, object] = json.loads(done.stdout)
    return result


@pytest.mark.parametrize(
    ("setup", "chosen"),
    [
        pytest.param("", None, id="platform-default"),
        pytest.param("mp.set_start_method('spawn')", "spawn", id="set-by-user"),
    ],
)
def test_default_start_method_does_not_fix_the_context(setup: str, chosen: str | None) -> None:
    code = textwrap.dedent(
        f"""\
        import json, multiprocessing as mp
        from torch_autotune.detect.software import default_start_method
        {setup}
        method = default_start_method()
        after = mp.get_start_method(allow_none=True)
        try:
            mp.set_start_method(mp.get_all_start_methods()[-1])
            settable = True
        except RuntimeError:  # "context has already been set"
            settable = False
        print(json.dumps({{
            "method": method,
            "after": after,
            "first": mp.get_all_start_methods()[0],
            "settable": settable,
        }}))
        """
    )

    result = run_python(code)

    assert result["after"] == chosen
    assert result["method"] == (chosen or result["first"])
    assert result["settable"] is (chosen is None)  # the user can still choose afterwards


def test_read_software_does_not_import_torch() -> None:
    result = run_python(
        "import json, sys\n"
        "from torch_autotune.detect.software import read_software\n"
        "reading, _ = read_software()\n"
        "print(json.dumps({'torch_imported': 'torch' in sys.modules,"
        " 'found': reading.torch is not None}))"
    )

    assert result["found"] is (importlib.util.find_spec("torch") is not None)
    assert result["torch_imported"] is False  # read from metadata and version.py alone

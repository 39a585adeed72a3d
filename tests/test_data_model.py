"""The data model stands alone: the profile, its settings and evidence import no feature.

The modules of the ground floor (settings, evidence, invariants, profile, the thresholds they
share with the rules, the hardware snapshot and the errors) may import pydantic, the standard
library and each other, nothing else: not the bench, the rules, the probe, the store, ``apply``
or the CLI. Their imports are read with ``ast``, following the ground floor's own imports, so a
feature import hidden one module away is found too. Imports inside functions (``Profile.apply``
importing ``apply`` when it runs) and under ``TYPE_CHECKING`` do not run at import time and are
not counted.
"""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import pytest

import torch_autotune
from torch_autotune import thresholds
from torch_autotune.rules import compile as compile_rules
from torch_autotune.rules import precision as precision_rules

PACKAGE = Path(torch_autotune.__file__).parent
GROUND_FLOOR = {
    "torch_autotune.bench_record",
    "torch_autotune.bounds",
    "torch_autotune.errors",
    "torch_autotune.evidence",
    "torch_autotune.hardware",
    "torch_autotune.invariants",
    "torch_autotune.launch",
    "torch_autotune.profile",
    "torch_autotune.records",
    "torch_autotune.sections",
    "torch_autotune.settings",
    "torch_autotune.thresholds",
    "torch_autotune.topology",
}
THIRD_PARTY = {"pydantic", "typing_extensions"}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _module_level_imports(tree: ast.Module) -> set[str]:
    """Modules imported when the module is imported: top level and plain ``if``/``try``
    blocks, not function bodies or ``if TYPE_CHECKING``."""
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module)
            elif isinstance(node, ast.If) and not _is_type_checking(node):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)

    visit(tree.body)
    return found


def _source(module: str) -> Path:
    return PACKAGE.joinpath(*module.split(".")[1:]).with_suffix(".py")


def _allowed(module: str) -> bool:
    top = module.split(".", maxsplit=1)[0]
    if top == "torch_autotune":
        return module in GROUND_FLOOR or module == "__future__"
    return top in sys.stdlib_module_names or top in THIRD_PARTY or top == "__future__"


@pytest.mark.parametrize("module", sorted(GROUND_FLOOR))
def test_a_data_model_module_imports_no_feature(module: str) -> None:
    tree = ast.parse(_source(module).read_text(), filename=str(_source(module)))
    imported = _module_level_imports(tree)
    assert {m for m in imported if not _allowed(m)} == set()


def test_the_checker_finds_a_feature_import_and_skips_what_does_not_run() -> None:
    code = (
        "from typing import TYPE_CHECKING\n"
        "import torch\n"
        "from torch_autotune.bench import TrainConfig\n"
        "if TYPE_CHECKING:\n"
        "    from torch_autotune.store import Store\n"
        "def apply():\n"
        "    from torch_autotune.apply import prepare_model\n"
    )
    imported = _module_level_imports(ast.parse(code))
    assert {m for m in imported if not _allowed(m)} == {"torch", "torch_autotune.bench"}


def test_the_rules_and_the_invariants_share_one_copy_of_each_threshold() -> None:
    from torch_autotune import invariants

    assert precision_rules.BF16_MIN_CC is thresholds.BF16_MIN_CC
    assert compile_rules.MAX_AUTOTUNE_MIN_SMS is thresholds.MAX_AUTOTUNE_MIN_SMS
    assert compile_rules.FULL_TRITON_CC is thresholds.FULL_TRITON_CC
    assert invariants.BF16_MIN_CC is thresholds.BF16_MIN_CC
    assert invariants.TF32_MIN_CC is thresholds.TF32_MIN_CC


def test_the_old_import_paths_still_work() -> None:
    from torch_autotune import evidence, profile, settings

    bench = importlib.import_module("torch_autotune.bench")  # the name is bench(), the function

    for name in ("TrainConfig", "Effect", "ArmRecord", "SettingEffect", "BenchEvidence"):
        assert getattr(bench, name) is getattr(evidence, name), name
    for name in ("Evidence", "SearchTrialRecord", "ThroughputRecord", "CompileRecord"):
        assert getattr(profile, name) is getattr(evidence, name), name
    for name in ("Settings", "Mode", "Source", "ALLOWED_ENVIRONMENT", "settings_paths"):
        assert getattr(profile, name) is getattr(settings, name), name

"""The package's structure, read from its own imports: no cycle, floors that hold, rooms that
can be read in one sitting.

The imports are parsed, not run: every ``import`` and ``from ... import`` of a module of
``torch_autotune``, at module level or inside a function (a lazy import is still a
dependency), except those under ``if TYPE_CHECKING:``, which exist for the type checker only.
ruff enforces who may import torch, rich and click, and who may print (``pyproject.toml``,
banned-api and T20); these tests hold what ruff cannot say: the graph as a whole, and the
outside packages in the files ruff lets off its bans as a whole (``HOMES``).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = "torch_autotune"
SRC = Path(__file__).resolve().parent.parent / "src" / PACKAGE

MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 60
LONG_BY_DESIGN = "Long by design:"
"""A function over ``MAX_FUNCTION_LINES`` lines says why in its docstring, after these words."""

# The ground floor: the data model and the errors. They import nothing that does work.
DATA_MODEL = {
    f"{PACKAGE}.{name}"
    for name in (
        "version",
        "errors",
        "bounds",
        "thresholds",
        "hardware",
        "records",
        "sections",
        "settings",
        "evidence",
        "bench_record",
        "invariants",
        "topology",
        "launch",
        "profile",
    )
}
# Lazy imports the floors allow, each with its reason. Nothing else below may reach up.
LAZY_BY_DESIGN = {
    (f"{PACKAGE}.profile", f"{PACKAGE}.apply"): "Profile.apply(), .autocast() and the other "
    "one-line helpers of the README call the torch translation when a training script calls them",
    (f"{PACKAGE}.profile", f"{PACKAGE}.wrapping"): "Profile.prepare_model() and .parallelize() "
    "wrap a job's model, as the probe did, when a training script calls them",
    (f"{PACKAGE}.apply", f"{PACKAGE}.detect.host"): "Profile.apply() holds a profile's threads "
    "and workers to the CPUs this process may use as detection counts them, a container's CPU "
    "quota included, which the affinity mask does not show",
}
# The pure layers: they decide from data and never touch torch or the terminal.
PURE = (f"{PACKAGE}.rules", f"{PACKAGE}.probe.search", f"{PACKAGE}.probe.timemodel")


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(SRC.rglob("*.py"))}


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement of ``tree`` outside ``if TYPE_CHECKING:`` blocks."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _type_checking_only(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of the package that module ``name`` imports (absolute or relative).

    ``from a import b`` imports ``a.b`` where that is a module, else ``a``. The parent packages
    Python imports on the way are not counted: ``a/__init__.py`` re-exporting ``a.b`` would
    otherwise close a loop with every ``a.b`` that imports a sibling.
    """
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in _imports(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        for target in targets:
            if target in known:
                found.add(target)
                if isinstance(node, ast.ImportFrom):
                    break  # ``from a import b`` where a.b is a module: that module, not ``a``
    found.discard(name)
    return found


@functools.cache
def _parsed() -> dict[str, frozenset[str]]:
    known = modules()
    names = set(known)
    return {name: frozenset(imported(name, path, names)) for name, path in known.items()}


def graph(*, lazy_by_design: bool = True) -> dict[str, set[str]]:
    """Who imports whom; without ``lazy_by_design``, less the lazy imports allowed upwards."""
    edges = {name: set(targets) for name, targets in _parsed().items()}
    if not lazy_by_design:
        for source, target in LAZY_BY_DESIGN:
            edges.get(source, set()).discard(target)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(edges.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def reachable(edges: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for succ in edges.get(todo.pop(), ()):
            if succ not in seen:
                seen.add(succ)
                todo.append(succ)
    return seen


# --- the walker itself ---------------------------------------------------------------------------


def test_the_walker_sees_lazy_imports_and_skips_type_checking_ones(tmp_path: Path) -> None:
    code = (
        "from typing import TYPE_CHECKING\n"
        "from . import b\n"
        "if TYPE_CHECKING:\n"
        "    from pkg.c import C\n"
        "def f():\n"
        "    from pkg.d import thing\n"
        "    import pkg.e\n"
    )
    path = tmp_path / "pkg" / "a.py"
    path.parent.mkdir()
    path.write_text(code)
    known = {"pkg.a", "pkg.b", "pkg.c", "pkg.d", "pkg.e", "pkg"}
    assert imported("pkg.a", path, known) == {"pkg.b", "pkg.d", "pkg.e"}


def test_the_cycle_finder_finds_a_loop_and_only_loops() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(edges) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


# --- the package -------------------------------------------------------------------------------


def test_the_walk_covers_the_package() -> None:
    edges = graph()
    assert f"{PACKAGE}.cli" in edges
    # The front door reaches the whole house: nothing is orphaned by the walk.
    assert reachable(edges, f"{PACKAGE}.cli") >= {f"{PACKAGE}.rules.engine", f"{PACKAGE}.store"}


def test_no_import_cycle() -> None:
    found = cycles(graph())
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_data_model_imports_nothing_that_does_work() -> None:
    edges = graph(lazy_by_design=False)
    for name in sorted(DATA_MODEL & set(edges)):
        outside = edges[name] - DATA_MODEL
        assert not outside, f"{name} imports {sorted(outside)}: the data model stands alone"


@pytest.mark.parametrize("layer", PURE)
def test_the_pure_layers_stay_below_the_probe_and_the_cli(layer: str) -> None:
    edges = graph(lazy_by_design=False)
    members = [name for name in edges if name == layer or name.startswith(layer + ".")]
    assert members, layer
    forbidden = (f"{PACKAGE}.cli", f"{PACKAGE}.api", f"{PACKAGE}.store", f"{PACKAGE}.apply")
    for name in members:
        bad = sorted(m for m in reachable(edges, name) if m.startswith(forbidden))
        assert not bad, f"{name} reaches {bad}"


def test_every_module_reads_in_one_sitting() -> None:
    long = {
        name: lines
        for name, path in modules().items()
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"


def _code_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """The function's lines from its signature to its end, less its docstring: what it says
    about itself is never too long."""
    lines = (node.end_lineno or node.lineno) - node.lineno + 1
    first = node.body[0]
    docstring = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
    if docstring and isinstance(first.value.value, str):  # type: ignore[attr-defined]
        lines -= (first.end_lineno or first.lineno) - first.lineno + 1
    return lines


def test_a_long_function_says_why() -> None:
    unexplained = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            length = _code_lines(node)
            if length > MAX_FUNCTION_LINES and LONG_BY_DESIGN not in (
                ast.get_docstring(node) or ""
            ):
                unexplained.append(f"{name}.{node.name} ({length} lines)")
    assert not unexplained, (
        f"functions over {MAX_FUNCTION_LINES} lines without '{LONG_BY_DESIGN}' in the "
        f"docstring: {unexplained}"
    )


# --- where the outside packages may be imported ---------------------------------------------

_CUDA_HOMES = (
    "apply",
    "wrapping",
    "detect.torch_env",
    "probe.loader",
    "probe.loop",
    "probe.oom",
    "probe.timing",
    "probe.trials",
    "probe.state",
    "probe.ddp",
    "probe.ranks",
    "probe.group",
    "probe.estimate",
    "probe.memory",
    "probe.recompute",
)
HOMES: dict[str, tuple[str, ...]] = {
    "torch": (*_CUDA_HOMES, "probe.step", "probe.workloads"),  # they train, never ask CUDA
    "torch.cuda": _CUDA_HOMES,
    "pynvml": ("detect.nvml",),
    "rich": ("cli", "render", "plot.text"),
    "click": ("cli",),
    "matplotlib": ("plot.panels", "plot.png"),
    "matplotlib.pyplot": (),
}
"""The modules (or packages, with everything in them) that may import each outside package
that marks a floor; the most specific name rules (``matplotlib.pyplot`` over ``matplotlib``).

ruff's banned-api says the same, but ruff lets a file off the rule as a whole, not name by name:
``apply.py``, let off for torch, would pass ruff with ``import rich`` in it, and so would the
probe's trials, loop, loader, oom and timing and ``detect/nvml.py``. This walk holds every
module to every line, and runs where ruff is not installed."""


def outside_imports(path: Path) -> set[str]:
    """The dotted names of every absolute import in ``path`` (lazy ones included, those under
    ``if TYPE_CHECKING:`` left out): ``from a.b import c`` is ``a.b.c``."""
    found: set[str] = set()
    for node in _imports(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif node.level == 0 and node.module:
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def misplaced(module: str, imports: set[str]) -> list[str]:
    """The imports of ``module`` that ``HOMES`` keeps elsewhere, each with where it belongs."""
    bad = []
    for name in sorted(imports):
        rules = [key for key in HOMES if _within(name, key)]
        if not rules:
            continue
        homes = HOMES[max(rules, key=len)]
        if not any(_within(module, f"{PACKAGE}.{home}") for home in homes):
            bad.append(f"{module} imports {name} (only in: {', '.join(homes) or 'no module'})")
    return bad


def test_the_homes_checker_sees_through_a_file_ruff_lets_off() -> None:
    assert misplaced(f"{PACKAGE}.apply", {"torch.nn", "torch.cuda"}) == []
    assert misplaced(f"{PACKAGE}.apply", {"rich.console"}) == [
        f"{PACKAGE}.apply imports rich.console (only in: cli, render, plot.text)"
    ]
    assert misplaced(f"{PACKAGE}.detect.nvml", {"torch", "pynvml"}) != []
    assert misplaced(f"{PACKAGE}.probe.workloads.models", {"torch.nn"}) == []
    assert misplaced(f"{PACKAGE}.probe.workloads.models", {"torch.cuda"}) != []
    assert misplaced(f"{PACKAGE}.plot.png", {"matplotlib.figure.Figure"}) == []
    assert misplaced(f"{PACKAGE}.plot.png", {"matplotlib.pyplot"}) != []
    assert misplaced(f"{PACKAGE}.plot.data", {"matplotlib.figure", "rich.text"}) != []
    assert misplaced(f"{PACKAGE}.cli.group", {"click", "rich.console", "yaml"}) == []
    assert misplaced(f"{PACKAGE}.cli", {"click.testing"}) == []
    assert misplaced(f"{PACKAGE}.client", {"click"}) != []  # a name that only starts alike


def test_outside_packages_are_imported_only_at_home() -> None:
    bad = [
        line for name, path in modules().items() for line in misplaced(name, outside_imports(path))
    ]
    assert not bad, "\n".join(bad)


# --- the floors ruff holds -------------------------------------------------------------------

ROOT = SRC.parent.parent


def ruff() -> list[str]:
    """The command that runs the ruff installed with this Python (the test extra brings it).

    Missing, the tests that ask it fail rather than skip: CI runs the suite before it installs
    the dev tools, and a skip there would leave the floors' configuration untested."""
    if importlib.util.find_spec("ruff") is None:
        pytest.fail("ruff is not installed: pip install -e '.[test]' (the test extra brings it)")
    return [sys.executable, "-m", "ruff"]


LAYERS = [
    # (a file of the package, an import, whether ruff lets it through)
    ("rules/engine.py", "torch", False),
    ("rules/engine.py", "rich.console", False),
    ("settings.py", "torch", False),
    ("evidence.py", "click", False),
    ("bench.py", "torch.nn", False),
    ("probe/search.py", "torch", False),
    ("probe/search.py", "rich", False),
    ("store.py", "click", False),
    ("api.py", "rich", False),
    ("compose.py", "torch", False),
    ("cli/measure.py", "click", True),
    ("cli/measure.py", "rich.console", True),
    ("cli/measure.py", "torch", False),
    ("cli/measure.py", "pynvml", False),
    ("detect/host.py", "pynvml", False),
    ("detect/nvml.py", "pynvml", True),
    ("apply.py", "torch", True),
    ("probe/trials.py", "torch", True),
    ("probe/workloads/models.py", "torch.nn", True),
    ("probe/workloads/models.py", "rich", False),
    ("probe/workloads/models.py", "torch.cuda", False),
    ("render/machine.py", "rich.table", True),
    ("render/machine.py", "torch", False),
    ("render/machine.py", "click", False),
    ("plot/text.py", "rich", True),
    ("plot/png.py", "matplotlib.figure", True),
    ("plot/png.py", "matplotlib.pyplot", False),
    ("plot/data.py", "torch", False),
    ("profile.py", "matplotlib", False),
]


@pytest.mark.parametrize(("where", "module", "allowed"), LAYERS)
def test_ruff_holds_the_floors(where: str, module: str, allowed: bool) -> None:
    """ruff, with this project's configuration, bans ``module`` in ``where`` (or lets it be)."""
    path = SRC / where
    assert path.parent.is_dir(), where
    code = f"def f() -> None:\n    import {module}  # lazily, as the package imports torch\n"
    found = subprocess.run(
        [
            *ruff(),
            "check",
            "--no-cache",
            "--select",
            "TID251",
            "--output-format",
            "json",
            "--stdin-filename",
            str(path),
            "-",
        ],
        input=code,
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert found.returncode in (0, 1), found.stderr  # 2: ruff itself failed (its configuration)
    codes = [item["code"] for item in json.loads(found.stdout)]
    assert codes == ([] if allowed else ["TID251"]), found.stderr


def test_the_library_never_prints() -> None:
    """print is banned in src/ (T20): the CLI writes through its console, the library raises."""
    found = subprocess.run(
        [
            *ruff(),
            "check",
            "--no-cache",
            "--select",
            "T20",
            "--output-format",
            "json",
            "--stdin-filename",
            str(SRC / "rules" / "engine.py"),
            "-",
        ],
        input="print(1)\n",
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert [item["code"] for item in json.loads(found.stdout)] == ["T201"]


# --- the architecture notes -------------------------------------------------------------------

NOTES = ROOT / "docs" / "architecture.md"
_CODE_SPAN = re.compile(r"`([^`\s]+)`")
_NAME_IN_MODULE = re.compile(r"(?P<module>[a-z_/]+)\.(?P<name>[A-Za-z_][\w.]*?)(?:\(\))?")


def cited_names(text: str) -> tuple[set[str], set[tuple[str, str]]]:
    """What the notes name in code spans: files and folders of the package (``store.py``,
    ``probe/workloads/``) and names in its modules (``probe/run.measure``: module, name)."""
    files: set[str] = set()
    names: set[tuple[str, str]] = set()
    for span in _CODE_SPAN.findall(text):
        if span.endswith((".py", "/")) and "<" not in span:
            files.add(span)
            continue
        match = _NAME_IN_MODULE.fullmatch(span)
        if match is not None:
            module = match["module"].replace("/", ".")
            names.add((f"{PACKAGE}.{module}", match["name"]))
    return files, names


def test_the_citation_finder_reads_files_and_names() -> None:
    text = "`store.py`, `probe/workloads/`, `probe/run._Run.search`, `api.tune()`, `Profile`"
    files, names = cited_names(text)
    assert files == {"store.py", "probe/workloads/"}
    assert names == {(f"{PACKAGE}.probe.run", "_Run.search"), (f"{PACKAGE}.api", "tune")}


def test_the_architecture_notes_name_what_exists() -> None:
    """Every file, folder and function docs/architecture.md names in the package exists: the
    path of a batch size it draws goes through real functions."""
    import importlib

    files, names = cited_names(NOTES.read_text(encoding="utf-8"))
    known = modules()
    missing = sorted(f for f in files if not ((SRC / f).exists() or (ROOT / f).exists()))
    checked = 0
    for module, name in sorted(names):
        if module not in known:
            continue  # a span such as `ruff.toml` or `Profile.apply()`: not a module's name
        found: object = importlib.import_module(module)
        for part in name.split("."):
            found = getattr(found, part, None)
        if found is None:
            missing.append(f"{module}.{name}")
        checked += 1
    assert checked >= 15, f"only {checked} names checked: the finder no longer reads the notes"
    assert not missing, f"docs/architecture.md names what does not exist: {missing}"

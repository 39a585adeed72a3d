"""Each option of ``autotune`` is declared once (``torch_autotune.cli.options``), so that a
flag shared by several commands cannot drift: the same type, bounds, destination and
environment variable wherever it appears."""

from __future__ import annotations

import ast
import inspect
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

import torch_autotune.cli
from torch_autotune import api
from torch_autotune.cli import cli
from torch_autotune.errors import EXIT_USAGE
from torch_autotune.hardware import HardwareSnapshot

CLI_PACKAGE = Path(torch_autotune.cli.__file__).parent


def _declared_flags() -> Counter[str]:
    """Every flag written in a ``click.option(...)`` call anywhere in the CLI's source."""
    flags: Counter[str] = Counter()
    for source in CLI_PACKAGE.glob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if node.func.attr != "option":
                continue
            for arg in node.args:
                if isinstance(arg, ast.Constant) and str(arg.value).startswith("-"):
                    flags[str(arg.value)] += 1
    return flags


def test_every_flag_is_written_once_in_the_source() -> None:
    flags = _declared_flags()
    assert "--store" in flags  # the walk finds the declarations
    assert {flag: n for flag, n in flags.items() if n > 1} == {}


def _shape(option: click.Option) -> tuple[object, ...]:
    """What must agree wherever a flag appears: all but its help and its default."""
    kind = option.type
    bounds = (getattr(kind, "min", None), getattr(kind, "max", None))
    choices = tuple(getattr(kind, "choices", ()))
    return (option.name, type(kind), bounds, choices, option.envvar, option.is_flag)


def test_a_flag_shared_by_commands_means_the_same_everywhere() -> None:
    commands: list[click.Command] = [cli, *cli.commands.values()]
    seen: dict[str, set[tuple[object, ...]]] = defaultdict(set)
    for command in commands:
        for param in command.params:
            if isinstance(param, click.Option):
                for flag in param.opts:
                    seen[flag].add(_shape(param))
    shared = {flag for flag in seen if sum(flag in _opts(c) for c in commands) > 1}
    assert {"--store", "--model", "--mode", "--budget", "--snapshot", "--json"} <= shared
    assert {flag: shapes for flag, shapes in seen.items() if len(shapes) > 1} == {}


def _opts(command: click.Command) -> set[str]:
    return {flag for p in command.params if isinstance(p, click.Option) for flag in p.opts}


def test_the_bench_commands_defaults_are_the_apis() -> None:
    """``autotune bench`` always passes --rounds and --seconds, so the command's defaults
    must be ``bench()``'s, or the two would train differently by default."""
    defaults = inspect.signature(api.bench).parameters
    options = {p.name: p for p in cli.commands["bench"].params}
    for name in ("rounds", "seconds"):
        assert options[name].default == defaults[name].default, name


def test_every_option_says_what_it_does() -> None:
    """'autotune --help' listed --mode without a word, and 'recommend --help' --optimizer."""
    silent = [
        f"{command.name} {param.opts[-1]}"
        for command in [cli, *cli.commands.values()]
        for param in command.params
        if isinstance(param, click.Option) and not param.hidden and not (param.help or "").strip()
    ]
    assert silent == []


def _run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), prog_name="autotune")


def test_an_option_of_the_run_before_a_command_is_refused_not_ignored(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """'autotune --workers 9 bench' benched as if --workers had not been given: click parsed
    the run's options, then the command ran without them."""
    called: list[str] = []
    monkeypatch.setattr(api, "bench", lambda *_a, **_k: called.append("bench"))
    result = _run("--workers", "9", "bench")
    assert result.exit_code == EXIT_USAGE
    assert result.stderr.splitlines() == [
        "autotune: error: --workers before 'bench' is an option of autotune without a command,"
        " which 'bench' would ignore; 'bench' takes no --workers, so leave it out; see"
        " 'autotune --help'"
    ]
    assert called == []
    shared = _run("-m", "mlp", "show")  # the command has it too: named as typed, and where
    assert shared.exit_code == EXIT_USAGE
    assert "give it after the command: 'autotune show -m ...'" in shared.stderr


def test_the_store_from_the_environment_is_no_option_given_before_a_command(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    detected_as: Callable[[str], HardwareSnapshot],
) -> None:
    detected_as("cpu-laptop-linux")
    monkeypatch.setenv("TORCH_AUTOTUNE_HOME", str(tmp_path))
    assert _run("show").exit_code == 0

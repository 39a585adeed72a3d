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
from torch_autotune import api, together
from torch_autotune.cli import cli
from torch_autotune.errors import EXIT_PROBE, EXIT_USAGE, ProbeError
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


def _past_the_check(*_args: object, **_kwargs: object) -> None:
    raise ProbeError("stopped by the test past the memory limit's check")


_NO_LIMIT_ABOVE = "and no limit above what it has can hold"


@pytest.mark.parametrize(
    "case",
    [
        (
            "cpu-laptop-linux",
            "100000",
            "this machine's host RAM, 15.39 GiB: the probe trains on the CPU",
            "15.39",
        ),
        (
            "cpu-container-quota-4",
            "17",
            "the host RAM this container may use (its memory limit), 16 GiB: the probe trains "
            "on the CPU",
            "16",
        ),
        (
            "h100-80gb-hbm3",
            "80",
            "the NVIDIA H100 80GB HBM3's memory, 79.18 GiB: the probe trains on the GPU",
            "79.18",
        ),
        (  # every rank is held to it: the smaller GPU bounds it
            "rtx-4090-plus-rtx-3060",
            "20",
            "the NVIDIA GeForce RTX 3060's memory, 11.76 GiB: the probe trains on the GPU",
            "11.76",
        ),
    ],
    ids=["host-ram", "container", "gpu", "two-gpus"],
)
def test_a_memory_limit_above_what_the_device_has_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    detected_as: Callable[[str], HardwareSnapshot],
    case: tuple[str, str, str, str],
) -> None:
    """--memory-limit 100000 on a 23.5 GiB host tuned, exit 0, and the summary said '100000 GiB
    of host RAM, as asked' where 15.8 GiB held; the preferences recorded 1.07e14 bytes. No cap
    above the device's memory binds (on a GPU, the allocator's fraction stops at all of it):
    refused before anything trains, with the most that can hold, which is accepted."""
    machine, asked, what, most = case
    detected_as(machine)
    monkeypatch.setattr(together, "probe", _past_the_check)
    store = ("--budget", "30", "--no-save", "--store", str(tmp_path))
    refused = _run("--memory-limit", asked, *store)
    assert refused.exit_code == EXIT_USAGE, refused.output
    errors = [line for line in refused.stderr.splitlines() if "error" in line]
    assert errors == [
        f"autotune: error: --memory-limit {asked} is more than {what}, {_NO_LIMIT_ABOVE}; ask "
        f"for {most} or less"
    ]
    accepted = _run("--memory-limit", most, *store)
    assert accepted.exit_code == EXIT_PROBE, accepted.output
    assert "past the memory limit's check" in accepted.stderr


def test_a_memory_limit_on_mps_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    detected_as: Callable[[str], HardwareSnapshot],
) -> None:
    """On MPS neither the allocator's fraction nor the CPU's cap is set: the summary said
    '8 GiB of host RAM, as asked' where nothing held it."""
    detected_as("apple-m2-pro-mps")
    monkeypatch.setattr(together, "probe", _past_the_check)
    refused = _run("--memory-limit", "8", "--budget", "30", "--no-save", "--store", str(tmp_path))
    assert refused.exit_code == EXIT_USAGE, refused.output
    assert [line for line in refused.stderr.splitlines() if "error" in line] == [
        "autotune: error: --memory-limit 8: the probe trains on MPS, where it holds no limit "
        "(only a CUDA GPU's allocator, or host RAM on the CPU); leave it out"
    ]

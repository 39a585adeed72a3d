"""The input limits give the project's own one line whichever PyYAML reads the text.

PyYAML 6.0.4's wheels carry libyaml 0.2.6, which refuses nesting past 1,000 levels itself
(``exceeded maximum nesting depth``), and its scanner reads up to 1,024 characters ahead of the
event it hands over, so a run of ``[`` stopped it before our count reached 65: a new virtual
environment got PyYAML's message where the floor's 6.0 to 6.0.3 gave ours. Every test here runs
twice, on the PyYAML installed and on that newer check simulated over it (the same refusal, from
the scanner, with the same look-ahead), so both behaviours are held in one run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from tests.test_input_files import DEEP, JSON_ONLY, LOADERS
from torch_autotune.cli import cli
from torch_autotune.errors import EXIT_BAD_INPUT, ProfileFileError
from torch_autotune.input_files import MAX_NESTING, parse_yaml
from torch_autotune.profile_io import load_profile, parse_profile

LIBYAML_MAX_NEST_LEVEL = 1000  # libyaml 0.2.6's default, as PyYAML 6.0.4 reports it
REFERENCE_PROFILES = sorted((Path(__file__).parents[1] / "profiles").glob("*.yaml"))


class NestingLimitedLoader(yaml.SafeLoader):
    """PyYAML's safe loader with libyaml 0.2.6's own nesting check: the scanner refuses a flow
    level or a block indent past ``LIBYAML_MAX_NEST_LEVEL``, as ``yaml_parser_increase_flow_level``
    and ``yaml_parser_roll_indent`` do, with the same error class and problem."""

    def fetch_flow_collection_start(self, TokenClass: Any) -> None:
        self._refuse_past(self.flow_level)
        super().fetch_flow_collection_start(TokenClass)

    def add_indent(self, column: int) -> bool:
        added = bool(super().add_indent(column))
        self._refuse_past(len(self.indents))
        return added

    def _refuse_past(self, level: int) -> None:
        if level >= LIBYAML_MAX_NEST_LEVEL:
            mark = self.get_mark()
            raise yaml.scanner.ScannerError(
                "while increasing flow level", mark, "exceeded maximum nesting depth", mark
            )


def _real_nesting_control() -> int:
    """libyaml's own limit in the PyYAML installed (6.0.4 and later), -1 where it has none."""
    binding = getattr(yaml, "_yaml", None)
    return int(getattr(binding, "_get_max_nest_level", lambda: -1)())


@pytest.fixture(params=["installed", "libyaml-nesting-limit"])
def pyyaml(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The PyYAML installed as it is, then with libyaml 0.2.6's nesting check simulated in the
    parser the package reads with (the C one when it is there)."""
    if request.param == "libyaml-nesting-limit":
        monkeypatch.setattr(yaml, "CSafeLoader", NestingLimitedLoader, raising=False)
    return str(request.param)


def _pyyaml_refuses_it_itself(text: str, loader: Any) -> bool:
    """Whether walking the events of ``text`` ends in PyYAML's own nesting error before 65
    levels reach the walker: the failure the project's check must be ahead of."""
    depth = 0
    try:
        for event in yaml.parse(text, Loader=loader):
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_NESTING:
                    return False
    except yaml.scanner.ScannerError as exc:
        return exc.problem == "exceeded maximum nesting depth"
    return False


@pytest.mark.parametrize("case", ["yaml-flow-sequences", "json-arrays"])
def test_the_simulation_fails_where_pyyaml_6_0_4_failed_the_project(case: str) -> None:
    # The two texts that failed the project's tests with PyYAML 6.0.4: the simulated parser
    # refuses them with PyYAML's message before the 65th level, as the real one does.
    assert _pyyaml_refuses_it_itself(DEEP[case], NestingLimitedLoader)
    if _real_nesting_control() > 0:
        assert _pyyaml_refuses_it_itself(DEEP[case], yaml.CSafeLoader)


def test_the_simulation_reads_every_reference_profile_as_pyyaml_does() -> None:
    for path in REFERENCE_PROFILES:
        text = path.read_text()
        assert yaml.load(text, Loader=NestingLimitedLoader) == yaml.safe_load(text), path.name


@pytest.mark.usefixtures("pyyaml")
@pytest.mark.parametrize("loader", LOADERS)
@pytest.mark.parametrize("case", DEEP)
def test_deep_nesting_gets_the_projects_message(loader: str, case: str) -> None:
    load, error = LOADERS[loader]
    with pytest.raises(error) as caught:
        load(DEEP[case])
    if loader not in JSON_ONLY or case.startswith("json") or case == "yaml-flow-sequences":
        assert f"nested more than {MAX_NESTING} levels deep" in str(caught.value)
    assert "exceeded maximum nesting depth" not in str(caught.value)


NESTED = {
    "flow": lambda depth: "[" * depth + "]" * depth,
    "flow-unclosed-in-a-mapping": lambda depth: "a: " + "[" * (depth - 1),  # the mapping is one
    "block": lambda depth: "- " * depth + "x\n",
}


@pytest.mark.usefixtures("pyyaml")
@pytest.mark.parametrize("depth", [MAX_NESTING, MAX_NESTING + 1, 999, 1_000, 1_001, 100_000])
@pytest.mark.parametrize("shape", NESTED)
def test_the_nesting_limit_is_the_projects_on_both_sides_of_pyyamls(shape: str, depth: int) -> None:
    text = NESTED[shape](depth)
    if depth > MAX_NESTING:
        with pytest.raises(ProfileFileError, match=rf"^f is nested more than {MAX_NESTING} levels"):
            parse_yaml(text, "f", ProfileFileError, "fix it")
    elif shape == "flow-unclosed-in-a-mapping":
        with pytest.raises(ProfileFileError, match=r"^f is not valid YAML"):
            parse_yaml(text, "f", ProfileFileError, "fix it")
    else:
        assert parse_yaml(text, "f", ProfileFileError, "fix it")


@pytest.mark.usefixtures("pyyaml")
@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("a: [1, 2\nb: }\n", "(line 2, column 2)"),
        ("a: " + "[" * 30 + "}" + "]" * 30 + "\n", "(line 1, column 34)"),
    ],
    ids=["unclosed", "wrong-bracket-within-the-limit"],
)
def test_bad_syntax_within_the_limits_is_still_reported_where_it_is(
    text: str, problem: str
) -> None:
    with pytest.raises(ProfileFileError, match="is not valid YAML") as caught:
        parse_profile(text)
    assert problem in str(caught.value)


@pytest.mark.usefixtures("pyyaml")
def test_a_deep_yaml_file_is_one_line_and_exit_3_from_the_command(tmp_path: Path) -> None:
    path = tmp_path / "profile.yaml"
    path.write_text("settings: " + "[" * 100_000 + "\n")  # YAML: the JSON scan never sees it
    result = CliRunner().invoke(cli, ["validate", str(path)], prog_name="autotune")
    assert result.exit_code == EXIT_BAD_INPUT
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"autotune: error: {path} is nested more than {MAX_NESTING} levels deep (a profile or "
        "snapshot nests 6); regenerate it with 'autotune export'"
    ]


@pytest.mark.usefixtures("pyyaml")
@pytest.mark.parametrize("path", REFERENCE_PROFILES[:3], ids=lambda p: p.stem)
def test_a_good_profile_loads_the_same(path: Path) -> None:
    assert load_profile(path) == parse_profile(path.read_text(), fmt="yaml")

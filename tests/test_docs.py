"""The documents a newcomer reads hold to the code: the module index of ``docs/architecture.md``
has one line for every module of the package and no other, each on the floor the floor table
gives it, and the imports keep to those floors; every link between the README and ``docs/``
reaches a file and a heading that exist.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.test_architecture import LAZY_BY_DESIGN, PACKAGE, ROOT, SRC, graph, module_name

NOTES = ROOT / "docs" / "architecture.md"
GUIDES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
_CODE_SPAN = re.compile(r"`([^`\s]+)`")
_ROW = re.compile(r"^\|(?P<cells>.*)\|\s*$")
_LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")


def section(text: str, title: str) -> str:
    """The text under the heading ``## title``, up to the next heading of that level."""
    _, found, rest = text.partition(f"\n## {title}\n")
    assert found, f"docs/architecture.md has no '## {title}' section"
    return rest.split("\n## ", 1)[0]


def table(text: str) -> list[list[str]]:
    """The cells of the first Markdown table in ``text``, less its header and rule."""
    rows: list[list[str]] = []
    for line in text.splitlines():
        match = _ROW.match(line.strip())
        if match is None:
            if rows:
                break
            continue
        rows.append([cell.strip() for cell in match["cells"].split("|")])
    return rows[2:]


def package_files() -> set[str]:
    """Every module of the package, as its path under ``src/torch_autotune``."""
    return {path.relative_to(SRC).as_posix() for path in SRC.rglob("*.py")}


def index() -> dict[str, int]:
    """The module index: each module's path and the floor its line gives it."""
    found: dict[str, int] = {}
    for cells in table(section(NOTES.read_text(encoding="utf-8"), "Module index")):
        module, floor = cells[0].strip("`"), cells[1]
        assert module not in found, f"the module index has two lines for {module}"
        assert floor.isdigit(), f"the module index gives {module} the floor {floor!r}"
        found[module] = int(floor)
    return found


def floor_table() -> dict[str, int]:
    """The floor table: each file or folder it names (`bench.py`, `probe/`, or the data model's
    bare `version`) and the number of its floor."""
    text = NOTES.read_text(encoding="utf-8")
    homes: dict[str, int] = {}
    start = text.index("| floor | modules |")
    for cells in table(text[start:]):
        floor = int(cells[0].split()[0])
        for name in _CODE_SPAN.findall(cells[1]):
            homes[name if name.endswith(("/", ".py")) else f"{name}.py"] = floor
    return homes


def floor_of(module: str, homes: dict[str, int]) -> int | None:
    """The floor the floor table gives a module's path: the file itself, else its folder."""
    if module in homes:
        return homes[module]
    folders = [name for name in homes if name.endswith("/") and module.startswith(name)]
    return homes[max(folders, key=len)] if folders else None


def test_the_module_index_has_a_line_for_every_module_and_no_other() -> None:
    """A module added, moved or removed without its line in the index fails here."""
    lines, modules = set(index()), package_files()
    assert not modules - lines, f"modules without a line in the index: {sorted(modules - lines)}"
    assert not lines - modules, f"index lines without a module: {sorted(lines - modules)}"


def test_every_line_of_the_index_says_what_its_module_owns() -> None:
    for cells in table(section(NOTES.read_text(encoding="utf-8"), "Module index")):
        assert len(cells) == 3, f"a line of the index is not module, floor, owns: {cells}"
        assert len(cells[2].split()) >= 3, f"a line says too little of its module: {cells}"


def test_the_index_gives_each_module_the_floor_the_floor_table_gives_it() -> None:
    homes = floor_table()
    assert {homes.get("version.py"), homes.get("apply.py"), homes.get("probe/")} == {1, 2, 3}
    wrong = {
        module: (floor, floor_of(module, homes))
        for module, floor in index().items()
        if floor_of(module, homes) != floor
    }
    assert not wrong, f"index floor against the floor table's, per module: {wrong}"


def test_no_module_imports_from_a_floor_above_its_own() -> None:
    """The floors as the index gives them, held by the imports (lazy ones included), less the
    imports that point up by design (``Profile.apply()`` calling ``apply.py``, which counts
    this machine's CPUs with ``detect/host.py``)."""
    floors = {module_name(SRC / path): floor for path, floor in index().items()}
    allowed = set(LAZY_BY_DESIGN)
    upward = sorted(
        f"{source} (floor {floors[source]}) imports {target} (floor {floors[target]})"
        for source, targets in graph().items()
        for target in targets
        if floors[target] > floors[source] and (source, target) not in allowed
    )
    assert not upward, upward
    assert (f"{PACKAGE}.profile", f"{PACKAGE}.apply") in allowed


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.DOTALL)
    return {slug(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}


def test_slug_makes_githubs_anchors() -> None:
    assert slug("`autotune`: the whole job") == "autotune-the-whole-job"
    assert slug("`autotune bench`: is the profile really faster here?") == (
        "autotune-bench-is-the-profile-really-faster-here"
    )


def test_every_link_between_the_guides_reaches_a_file_and_a_heading() -> None:
    """The README and the documents under ``docs/`` link to each other by file and heading:
    a heading renamed or a file moved without its links fails here."""
    broken: list[str] = []
    checked = 0
    for guide in GUIDES:
        for target in _LINK.findall(guide.read_text(encoding="utf-8")):
            if "://" in target:
                continue
            file, _, anchor = target.partition("#")
            path = (guide.parent / file).resolve() if file else guide
            checked += 1
            if not path.exists():
                broken.append(f"{guide.name}: {target} (no such file)")
            elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                broken.append(f"{guide.name}: {target} (no such heading)")
    assert checked >= 10, f"only {checked} links checked: the finder no longer reads the guides"
    assert not broken, broken

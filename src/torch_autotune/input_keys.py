"""Keys a JSON or YAML mapping holds twice: both parsers keep the last value and never say so.

A hand-edited profile with ``num_workers: 4`` and, further down the same mapping,
``num_workers: 16`` loaded as 16 with no word; which one the person meant is theirs to say. So
``input_files`` parses with the readers here, and a key held twice is one line that names the
key and where it is (the lines in YAML, the path of the object in JSON).
"""

from __future__ import annotations

import functools
import json
from typing import Any

from torch_autotune.errors import InputFileError

KEEP_ONE = "keep the one you mean and delete the other"


class KeyTwice(Exception):
    """A mapping of a YAML file that holds a key twice: the key, and where both are."""

    def __init__(self, key: str, where: str) -> None:
        super().__init__(key, where)
        self.key, self.where = key, where


@functools.cache
def unique_keys(loader: type) -> type:
    """``loader`` (PyYAML's safe loader, C or Python) refusing a mapping that holds a key twice,
    which PyYAML reads as its last value and never says so.

    The whole node graph is checked before anything is built: a merge (``<<: *base``) rewrites
    the mappings it builds, and a key it brings in may be set again, as YAML allows.
    """
    import yaml

    merge = "tag:yaml.org,2002:merge"

    class UniqueKeys(loader):  # type: ignore[misc]
        def construct_document(self, node: yaml.Node) -> Any:
            done: set[int] = set()
            stack = [node]
            while stack:
                here = stack.pop()
                if id(here) in done:
                    continue
                done.add(id(here))
                if isinstance(here, yaml.MappingNode):
                    first: dict[Any, yaml.Node] = {}
                    for key_node, value_node in here.value:
                        stack += (value_node, key_node)
                        if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == merge:
                            continue
                        key = self.construct_object(key_node)
                        if key in first:
                            raise KeyTwice(key_node.value, _both(first[key], key_node))
                        first[key] = key_node
                elif isinstance(here, yaml.SequenceNode):
                    stack += reversed(here.value)
            return super().construct_document(node)

    return UniqueKeys


def _both(first: Any, second: Any) -> str:
    one, two = first.start_mark, second.start_mark
    if one.line == two.line:
        return f" (line {one.line + 1}, columns {one.column + 1} and {two.column + 1})"
    return f" (lines {one.line + 1} and {two.line + 1})"


def load_json(text: str) -> tuple[Any, list[tuple[str, int]]]:
    """The data in JSON ``text``, and each key an object holds twice with the id of that
    object (``json`` keeps the last value and never says so)."""
    twice: list[tuple[str, int]] = []

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        data = dict(pairs)
        if len(data) < len(pairs):
            seen: set[str] = set()
            for key, _ in pairs:
                if key in seen:
                    twice.append((key, id(data)))
                    break
                seen.add(key)
        return data

    return json.loads(text, object_pairs_hook=unique), twice


def check_json_keys(
    data: Any, twice: list[tuple[str, int]], source: str, error: type[InputFileError]
) -> None:
    """Refuse JSON with an object that holds a key twice, named by the object's path."""
    if not twice:
        return
    key, holder = twice[0]
    stack: list[tuple[Any, str]] = [(data, "")]
    while stack:
        node, path = stack.pop()
        if id(node) == holder:
            where = f"in {path}" if path else "at its top level"
            raise error(f"{source} holds the key {key!r} twice, {where}; {KEEP_ONE}")
        if isinstance(node, dict | list):
            items = node.items() if isinstance(node, dict) else enumerate(node)
            stack += ((child, f"{path}.{name}" if path else str(name)) for name, child in items)
    raise error(f"{source} holds the key {key!r} twice; {KEEP_ONE}")

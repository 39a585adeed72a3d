"""How workload errors and reports name values: articles, exceptions, lists, close matches.

Pure text; nothing here imports torch.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor


def _describe_sample(batch: Tensor) -> str:
    """One sample of a batch for reports: ``3x64x64 float32``, or ``int64`` for a scalar."""
    dtype = str(batch.dtype).removeprefix("torch.")
    shape = "x".join(str(size) for size in batch.shape[1:])
    return f"{shape} {dtype}" if shape else dtype


def _article(value: object) -> str:
    """``None``, ``an int``, ``a Sequential``: what a value is, for messages."""
    if value is None:
        return "None"
    kind = type(value).__name__
    return f"{'an' if kind[0].lower() in 'aeiou' else 'a'} {kind}"


def _exception(exc: BaseException) -> str:
    """``RuntimeError: boom`` (the type alone when the message is empty)."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _listed(names: Iterable[object]) -> str:
    return ", ".join(str(name) for name in names)


def _perhaps(word: str, choices: Iterable[str]) -> str:
    """``"; perhaps you meant 'x'?"`` for the closest choice, or ``""`` when none is close."""
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f"; perhaps you meant '{close[0]}'?" if close else ""

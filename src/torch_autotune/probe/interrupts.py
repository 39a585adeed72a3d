"""Importing a module with Ctrl-C held until the import is done.

torch's start-up loses a Ctrl-C: while ``torch._C`` initialises, its C++ code clears the Python
error pending at that moment, a ``KeyboardInterrupt`` included (torch 2.13 on Linux: one of
15 Ctrl-Cs sent at even intervals during ``import torch``). The interrupt was lost, and
``autotune`` ran on to the end and exited 0. ``tune()`` and ``bench()`` import torch through
here first, before the user's factory module (which imports it too), so a Ctrl-C at any moment
of the import ends the run as soon as torch is in: one line, exit 130.

Only in the main thread (the only one Python delivers signals to), and only where Ctrl-C
raises ``KeyboardInterrupt`` (Python's own handler): a handler of the caller's, or an ignored
SIGINT (a command started in the background), is left as it is.
"""

from __future__ import annotations

import importlib
import importlib.util
import signal
import sys
import threading
from types import FrameType, ModuleType

from torch_autotune.errors import ProbeError, said_in_one_line

__all__ = ["import_holding_ctrl_c", "import_torch"]


def import_holding_ctrl_c(name: str) -> ModuleType:
    """``importlib.import_module(name)``, a Ctrl-C during it raised once it is done."""
    if (
        name in sys.modules
        or threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        return importlib.import_module(name)
    pressed: list[int] = []

    def hold(number: int, _frame: FrameType | None) -> None:
        pressed.append(number)

    previous = signal.signal(signal.SIGINT, hold)
    try:
        module = importlib.import_module(name)
    finally:
        signal.signal(signal.SIGINT, previous)
    if pressed:
        raise KeyboardInterrupt
    return module


def import_torch() -> None:
    """Import torch before anything is measured, with Ctrl-C held (its start-up would lose
    one); ProbeError, naming the fix, where torch is not installed or is installed but fails
    to import (a missing shared library, a half-removed install, a build for another Python)."""
    install = "the build for this machine (https://pytorch.org/get-started/locally/)"
    if importlib.util.find_spec("torch") is None:
        raise ProbeError(
            f"torch is not installed, so nothing can be probed; install {install} and run "
            "autotune again"
        )
    try:
        import_holding_ctrl_c("torch")
    except Exception as exc:  # a broken install raises anything: ImportError, OSError, ...
        raise ProbeError(
            f"torch is installed but fails to import ({said_in_one_line(exc)}), so nothing "
            f"can be probed; check 'python -c \"import torch\"', reinstall {install} and run "
            "autotune again"
        ) from None

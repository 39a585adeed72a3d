"""Ctrl-C while torch starts (issue 11): torch's start-up clears a pending KeyboardInterrupt, so
the run went on; imported through ``import_holding_ctrl_c``, the interrupt is raised once the
import is done."""

from __future__ import annotations

import signal
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from torch_autotune.probe.interrupts import import_holding_ctrl_c

# A module that does what torch._C's start-up does: a Ctrl-C arrives while it runs, and its
# (C++) code clears the pending error and goes on.
SWALLOWS = """
import os, signal, time
try:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.5)  # the signal is delivered; Python's handler raises here
except KeyboardInterrupt:
    pass  # cleared, as torch's PyErr_Clear does
LOADED = True
"""


@pytest.fixture
def swallowing_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    if not hasattr(signal, "SIGINT") or sys.platform == "win32":
        pytest.skip("os.kill with SIGINT is POSIX")
    name = f"swallows_ctrl_c_{id(tmp_path)}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(SWALLOWS))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def test_a_ctrl_c_the_import_would_lose_is_raised_once_it_is_done(swallowing_module: str) -> None:
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            import_holding_ctrl_c(swallowing_module)
        assert sys.modules[swallowing_module].LOADED  # imported whole, then interrupted
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back
    finally:
        signal.signal(signal.SIGINT, previous)


def test_without_a_ctrl_c_the_module_comes_back() -> None:
    assert import_holding_ctrl_c("json") is sys.modules["json"]


def test_outside_the_main_thread_nothing_is_held() -> None:
    """Python delivers signals to the main thread only, and signal.signal refuses others."""
    found: list[object] = []
    thread = threading.Thread(target=lambda: found.append(import_holding_ctrl_c("textwrap")))
    thread.start()
    thread.join()
    assert found == [textwrap]

"""What a command writes besides its rendered text: the console, profile files, charts, and
the warnings a profile calls for."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click


def console() -> Any:
    """The console the renderers draw on (stdout; plain when it is not a terminal)."""
    from torch_autotune.render import make_console

    return make_console()


def check_can_save(store: Path | None) -> None:
    """StoreError (exit 4) now when the profile store cannot be written, or a directory stands
    where one of this machine's profiles goes: before a probe or a bench that would measure
    for minutes and then fail to save."""
    from torch_autotune import api
    from torch_autotune.profile import fingerprint
    from torch_autotune.store import ProfileStore

    saved = ProfileStore(store)  # the machine is detected only where a .json is no file
    odd = any(not path.is_file() for path in saved.profiles_dir.rglob("*.json"))
    saved.check_writable(fingerprint(api.detect()) if odd else None)


def write_profile(profile: Any, output: Path) -> None:
    """Write ``profile`` to ``output`` atomically: JSON for a .json name, else YAML."""
    from torch_autotune.files import write_atomically
    from torch_autotune.profile_io import dump_profile

    write_atomically(output, dump_profile(profile, "json" if output.suffix == ".json" else "yaml"))
    click.echo(f"wrote {output}", err=True)


def plot_after_run(profile: Any, path: Path) -> None:
    """The charts as a PNG after a run that measured; in the terminal, with a warning, when
    matplotlib is not installed (the measurements are saved either way)."""
    from torch_autotune import plot

    if not plot.matplotlib_available():
        click.echo(
            "autotune: warning: matplotlib is not installed, so no PNG was written; the charts "
            "follow as text (pip install 'torch-autotune[plot]' for the PNG)",
            err=True,
        )
        plot.render_charts(profile, console())
        return
    plot.save_png(profile, path)
    click.echo(f"wrote {path}", err=True)


def warn_unused_gpu(profile: Any) -> None:
    """One line on stderr when the profile trains on the CPU of a machine with a GPU."""
    from torch_autotune.api import unused_gpu_reason

    reason = unused_gpu_reason(profile)
    if reason is not None:
        click.echo(f"autotune: warning: {reason}", err=True)

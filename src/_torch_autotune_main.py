"""The ``autotune`` command's entry point, outside the ``torch_autotune`` package.

A console script imports the module it names before it calls anything, and importing
``torch_autotune.__main__`` first imports the package itself: ``torch_autotune/__init__.py``
loads the public API and its data model, 115 ms on a 2-core CPU, against 11 ms for the
command's own modules. A Ctrl-C in that window got Python's traceback instead of one line.
This module imports nothing until ``main()`` runs, so that window is down to the
interpreter's own start-up, which no program can guard.
"""

import sys

EXIT_INTERRUPTED = 130  # errors.EXIT_INTERRUPTED, not imported: nothing is imported before main


def main() -> None:
    """Import the command (the package with it) and run it."""
    try:
        from torch_autotune.cli import main as run
    except KeyboardInterrupt:
        sys.stderr.write("autotune: interrupted\n")
        sys.exit(EXIT_INTERRUPTED)
    run()


if __name__ == "__main__":
    main()

"""The ``autotune`` command's entry point, also ``python -m torch_autotune``.

The command's modules are imported inside ``main()``, so that a Ctrl-C while they load is one
line and exit 130, like a Ctrl-C later, which the command itself handles (``cli._Group``).
"""

import sys

EXIT_INTERRUPTED = 130  # errors.EXIT_INTERRUPTED, not imported: nothing is imported before main


def main() -> None:
    """Import the command and run it."""
    try:
        from torch_autotune.cli import main as run
    except KeyboardInterrupt:
        sys.stderr.write("autotune: interrupted\n")
        sys.exit(EXIT_INTERRUPTED)
    run()


if __name__ == "__main__":
    main()

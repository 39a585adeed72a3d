"""``python -m torch_autotune``: the ``autotune`` command.

Its entry point is ``_torch_autotune_main.main``, outside this package: Python imports the
package before this module, so only there is a Ctrl-C while the package loads one line too.
"""

from _torch_autotune_main import main

__all__ = ["main"]

if __name__ == "__main__":
    main()

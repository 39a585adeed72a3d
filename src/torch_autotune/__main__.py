"""`python -m torch_autotune` runs the `autotune` command."""

from torch_autotune.cli import main

if __name__ == "__main__":
    main()

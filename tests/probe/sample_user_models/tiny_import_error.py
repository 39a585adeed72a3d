"""A user module whose import fails with its own bug."""

SCALE = 1 / 0


def make_workload() -> None:
    return None

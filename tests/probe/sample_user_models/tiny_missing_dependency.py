"""A user module that needs a package this environment does not have."""

import a_package_that_is_not_installed  # noqa: F401


def make_workload() -> None:
    return None

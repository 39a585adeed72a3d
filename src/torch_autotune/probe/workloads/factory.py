"""The user's factory: import ``"package.module:factory"``, call it, check what it returns.

Every way the reference, the import or the call can fail is a ``WorkloadError`` naming the
problem and the fix, the user's own exception chained as ``__cause__``; ``protocol`` checks the
result.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torch_autotune.errors import WorkloadError, user_code_failed
from torch_autotune.probe.workloads.messages import _article, _exception, _perhaps
from torch_autotune.probe.workloads.protocol import as_workload

if TYPE_CHECKING:
    from torch_autotune.probe.workloads.workload import Workload

__all__ = ["call_factory", "load_workload"]


def load_workload(spec: str) -> Workload:
    """Import ``"package.module:factory"``, call the factory, and check what it returns.

    The current directory is put first on ``sys.path`` (as ``python -m`` does) so that a
    module next to the training script imports. Raises ``WorkloadError`` for every way the
    factory is unusable, the user's own exception chained as ``__cause__``.
    """
    module_name, attribute = _parse_spec(spec)
    module = _import(spec, module_name)
    factory = _attribute(spec, module, module_name, attribute)
    made = as_workload(call_factory(spec, factory), name=spec)
    return made if module_name == "__main__" else dataclasses.replace(made, rebuild=spec)


def _parse_spec(spec: str) -> tuple[str, str]:
    """``"package.module:factory"`` -> ``("package.module", "factory")``; dotted both sides."""
    module_name, colon, attribute = spec.partition(":")
    parts = [*module_name.split("."), *attribute.split(".")]
    if colon and all(part.isidentifier() for part in parts):
        return module_name, attribute
    hint = ""
    if "/" in spec or "\\" in spec or spec.partition(":")[0].endswith(".py"):
        hint = " (a module name, not a file path)"
    raise WorkloadError(
        f"'{spec}' is not a factory reference: write package.module:factory{hint},"
        " e.g. mypkg.models:make_workload"
    )


def _ensure_current_directory_on_path() -> None:
    """Put the current directory first on ``sys.path`` unless it is there (as ``python -m``)."""
    here = os.getcwd()
    if "" not in sys.path and here not in sys.path:
        sys.path.insert(0, here)


def _import(spec: str, module_name: str) -> Any:
    """Import the factory's module; any failure is a ``WorkloadError`` naming its cause."""
    _ensure_current_directory_on_path()
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and _is_self_or_parent(exc.name, module_name):
            fix = "check the name and that it is importable from the current directory"
            if module_name.endswith(".py"):
                fix = f"drop the '.py': {module_name.removesuffix('.py')}:..."
            raise WorkloadError(
                f"'{spec}': module '{module_name}' cannot be imported ({exc}); {fix}"
            ) from exc
        raise WorkloadError(
            f"'{spec}': module '{module_name}' cannot be imported: it needs a module that is"
            f" missing ({exc}); install it in this environment"
        ) from exc
    except SystemExit as exc:
        raise WorkloadError(
            f"'{spec}': importing '{module_name}' exited (SystemExit {exc.code}); a module"
            " with a factory must not parse arguments or train at import: put that under"
            " if __name__ == '__main__':"
        ) from exc
    except Exception as exc:
        raise user_code_failed(
            f"'{spec}': importing '{module_name}' raised {_exception(exc)}; fix the module", exc
        ) from exc


def _is_self_or_parent(missing: str, module_name: str) -> bool:
    """Whether the module that was not found is ``module_name`` or one of its packages."""
    return module_name == missing or module_name.startswith(missing + ".")


def _attribute(spec: str, module: Any, module_name: str, attribute: str) -> Callable[[], Any]:
    """The factory named by the dotted ``attribute`` of ``module``; it must be callable."""
    found = module
    owner = f"module '{module_name}'"
    for part in attribute.split("."):
        try:
            found = getattr(found, part)
        except AttributeError as exc:
            public = [name for name in dir(found) if not name.startswith("_")]
            raise WorkloadError(
                f"'{spec}': {owner} has no attribute '{part}'"
                f"{_perhaps(part, public) or '; check the factory name'}"
            ) from exc
        owner = f"'{part}'"
    if not callable(found):
        raise WorkloadError(
            f"'{spec}': '{attribute}' is {_article(found)}, not a function; point to a function"
            " that takes no arguments and returns the workload"
        )
    return found  # type: ignore[no-any-return]


def call_factory(spec: str, factory: Callable[[], Any]) -> Any:
    """Call the factory with no arguments; its failures become ``WorkloadError``."""
    try:
        inspect.signature(factory).bind()
    except TypeError as exc:
        raise WorkloadError(
            f"'{spec}' needs arguments ({exc}); a factory is called with none: give them"
            " defaults or wrap it in a function without parameters"
        ) from exc
    except ValueError:
        pass  # no readable signature (a builtin): let the call decide
    try:
        return factory()
    except SystemExit as exc:
        raise WorkloadError(
            f"'{spec}' exited (SystemExit {exc.code}); a factory must return the workload,"
            " not parse arguments or exit"
        ) from exc
    except Exception as exc:
        raise user_code_failed(f"'{spec}' raised {_exception(exc)}; fix the factory", exc) from exc

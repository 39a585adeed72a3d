"""The test suite itself: warnings are errors for our code only.

The first GPU run of the suite (H100, torch 2.11.0+cu130; issue 10) failed tests on torch's own
deprecation warnings; these tests check the filters in pyproject.toml.
"""

from __future__ import annotations

import warnings

import pytest

TORCH_DEPRECATION = (
    "`torch.jit.script_method` is deprecated. Please switch to `torch.compile` or `torch.export`."
)


def warn_from(module: str, message: str, category: type[Warning] = DeprecationWarning) -> None:
    """``warnings.warn`` as code in ``module`` calls it (the filters match on that name)."""
    code = compile("warnings.warn(message, category)", f"<{module}>", "exec")
    exec(code, {"__name__": module, "warnings": warnings, "message": message, "category": category})


def warn_as_torch_2_11_does() -> None:
    """torch 2.11 when torch.compile imports inductor: ``torch.jit.script_method`` decorates a
    class in torch.utils.mkldnn, and torch.jit._script warns about itself."""
    warn_from("torch.jit._script", TORCH_DEPRECATION)


# --- warnings as errors for our code only --------------------------------------------------------


def test_a_deprecation_inside_another_package_is_shown_not_raised() -> None:
    with warnings.catch_warnings(record=True) as caught:  # the filters stay as pytest set them
        warn_as_torch_2_11_does()
    assert [str(w.message) for w in caught] == [TORCH_DEPRECATION]


@pytest.mark.parametrize("module", ["torch_autotune.probe.loop", "tests.test_the_suite"])
@pytest.mark.parametrize("category", [DeprecationWarning, PendingDeprecationWarning, UserWarning])
def test_our_own_warnings_stay_errors(module: str, category: type[Warning]) -> None:
    with pytest.raises(category, match="ours"):
        warn_from(module, "ours", category)


def test_pytest_benchmark_turning_itself_off_under_xdist_is_no_error() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warn_from(
            "pytest_benchmark.logger",
            "Benchmarks are automatically disabled because xdist plugin is active.",
            UserWarning,
        )
    assert caught == []

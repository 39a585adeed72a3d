"""A profile as shell ``export`` lines for its environment variables, and what it cannot hold."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from torch_autotune.integrations.common import header, line, notes
from torch_autotune.records import Export

if TYPE_CHECKING:
    from torch_autotune.profile import Profile


_READERS: Mapping[str, str] = {
    "OMP_NUM_THREADS": "OpenMP",
    "MKL_NUM_THREADS": "MKL",
    "PYTORCH_CUDA_ALLOC_CONF": "CUDA's caching allocator",
    "CUBLAS_WORKSPACE_CONFIG": "cuBLAS",
    "HIPBLAS_WORKSPACE_CONFIG": "hipBLAS",
}
"""What reads each variable the profile may export: once, when it starts in the process (torch's
import, or the first CUDA work), and never again."""


def _read_by(names: Sequence[str]) -> str:
    """'MKL and OpenMP read them once, each when it starts' for ``names``, each reader once."""
    readers = list(dict.fromkeys(_READERS[name] for name in names))
    joined = readers[0] if len(readers) == 1 else ", ".join(readers[:-1]) + f" and {readers[-1]}"
    them = "reads it" if len(names) == 1 else "read them"
    return f"{joined} {them} once, {'when' if len(readers) == 1 else 'each when'} it starts"


def render_env(profile: Profile) -> str:
    """POSIX shell ``export`` lines for the profile's environment variables, safely quoted,
    under comments that say who reads them and what the file cannot set."""
    lines = header(profile, "Environment variables")
    environment = profile.settings.environment
    variables = sorted(environment.items())
    names = [name for name, _value in variables]
    if names:
        lines += [
            f"# Source this file before starting Python: {_read_by(names)} in the process.",
            "#   . ./THIS.sh && python train.py",
        ]
    else:
        lines.append("# This profile sets no environment variables: nothing to export.")
    said = notes(profile, ENV)
    if said:
        lines.append("# The profile's other settings are not variables; set them in your script:")
        lines += [f"#   {note}" for note in said]
    lines += [f"export {name}={shlex.quote(value)}" for name, value in variables]
    return "\n".join(lines) + "\n"


ENV: Mapping[str, Export] = {
    "device": Export(itself="the header names the device; profile.device in the script"),
    "batch_size": line(
        lambda s: (
            None
            if s.batch.batch_size is None
            else f"DataLoader(dataset, batch_size={s.batch.batch_size}) (profile.batch_size)"
        )
    ),
    "grad_accum_steps": line(
        lambda s: (
            None
            if s.batch.grad_accum_steps == 1
            else f"gradient accumulation: {s.batch.grad_accum_steps} batches a step"
            " (profile.grad_accum_steps)"
        )
    ),
    "environment": Export(itself="the export lines"),
}
"""What the environment file writes for each setting, by record name (``Export``): the
variables themselves, and every other setting as a comment."""

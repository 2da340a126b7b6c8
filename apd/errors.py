"""Errors a user can cause. The CLI prints them as one line and exits with code 2. (torch is imported only
where CUDA's errors are caught, so that the CLI and a sampling worker can import this module before
torch: :mod:`apd.pipeline.spawned`.)"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


class ApdError(Exception):
    """Base class for user-facing errors (bad config, missing data, bad artifact, divergence)."""


class ConfigError(ApdError):
    """A pipeline file that cannot be read or does not validate."""


class DataError(ApdError):
    """A dataset that is missing or malformed."""


class ArtifactError(ApdError):
    """An artifact that is missing, corrupt, or does not match the pipeline."""


class DivergenceError(ApdError):
    """A sampler or trainer whose loss or parameters became NaN or infinite."""


class DeviceMemoryError(ApdError):
    """A CUDA device that ran out of memory; the message names it and the settings to lower."""


# Per command, the settings its GPU memory grows with, which an out-of-memory error names.
MEMORY_SETTINGS = {
    "sample": "sgld.batch_size or baselines.batch_size",
    "distill": "distill.in_memory_gb, distill.batch_size or distill.eval_networks",
    "evaluate": "evaluate.networks, evaluate.sgld_samples, evaluate.mc_passes or evaluate.ood_size",
}


@contextlib.contextmanager
def out_of_memory_is_an_error(command: str, device: torch.device) -> Iterator[None]:
    """``with out_of_memory_is_an_error(command, device):`` turns CUDA running out of memory in the block into
    a :class:`DeviceMemoryError` naming ``device`` and what to lower for ``command`` (its
    :data:`MEMORY_SETTINGS`)."""
    import torch

    try:
        yield
    except torch.cuda.OutOfMemoryError:
        if device.type == "cuda" and device.index is None:  # "cuda": the current CUDA device
            device = torch.device("cuda", torch.cuda.current_device())
        settings = MEMORY_SETTINGS.get(command, "the batch and sample sizes of the config")
        raise DeviceMemoryError(f"CUDA out of memory on {device}: lower {settings} (--set SECTION.KEY=VALUE), "
                                "or run on another device (--device)") from None

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
    """A device (a CUDA card or the CPU's memory) that ran out of memory; the message names it and the settings
    to lower."""


class DeviceUnusableError(ApdError):
    """A CUDA device this machine cannot run on (busy, broken, or not served by its driver or PyTorch build)."""


# Per command, the settings its memory (a card's or the CPU's) grows with, which an out-of-memory error names.
MEMORY_SETTINGS = {
    "sample": "sgld.batch_size, baselines.batch_size or the network's widths (net.hidden, net.conv)",
    "distill": "distill.in_memory_gb, distill.batch_size, distill.eval_networks or the GAN's widths "
               "(distill.gen_hidden, distill.critic_hidden)",
    "evaluate": "evaluate.networks, evaluate.sgld_samples, evaluate.mc_passes or evaluate.ood_size",
}


# CUDA runtime errors (cudaError_t) that say the machine cannot run on a card, not that the code is wrong: the
# driver is older than the runtime (35, 36), the card is busy or in a prohibited compute mode (46, 216), no
# card or a bad one (100, 101), no kernel or PTX this build of PyTorch can run there (209, 222), an
# uncorrectable memory error (214), the driver not ready or mismatched (802 to 804).
MACHINE_ERRORS = frozenset({35, 36, 46, 100, 101, 209, 214, 216, 222, 802, 803, 804})


# How PyTorch's CPU allocator says that the machine's memory cannot hold a tensor (a RuntimeError).
CPU_ALLOCATOR_REFUSED = "DefaultCPUAllocator: can't allocate memory"


def _out_of_memory(command: str, what: str) -> DeviceMemoryError:
    """The one-line error ``what`` for ``command``: what to lower, and what else to try."""
    settings = MEMORY_SETTINGS.get(command, "the batch and sample sizes of the config")
    return DeviceMemoryError(f"{what}: lower {settings} (--set SECTION.KEY=VALUE), or run on another device "
                             "(--device)")


@contextlib.contextmanager
def device_failures_are_errors(command: str, device: torch.device) -> Iterator[None]:
    """``with device_failures_are_errors(command, device):`` turns what the machine causes in the block into
    one-line errors: running out of memory, on a CUDA card or in the CPU's memory (PyTorch's allocator refusing a
    tensor, or Python's :class:`MemoryError`), into a :class:`DeviceMemoryError` naming where and what to lower
    for ``command`` (its :data:`MEMORY_SETTINGS`), a card the machine cannot run on (a :data:`MACHINE_ERRORS`
    code) into a :class:`DeviceUnusableError`. Other errors (a device-side assert, an illegal address) are the
    code's and propagate."""
    import torch

    try:
        yield
    except torch.cuda.OutOfMemoryError:
        if device.type == "cuda" and device.index is None:  # "cuda": the current CUDA device
            device = torch.device("cuda", torch.cuda.current_device())
        raise _out_of_memory(command, f"CUDA out of memory on {device}") from None
    except getattr(torch, "AcceleratorError", ()) as exc:  # torch ≥ 2.8 gives CUDA's errors their code
        if getattr(exc, "error_code", None) not in MACHINE_ERRORS:
            raise
        reason = str(exc).splitlines()[0].removeprefix("CUDA error: ")
        raise DeviceUnusableError(f"{device} cannot be used: {reason}; run on another device (--device)") from None
    except MemoryError:
        raise _out_of_memory(command, "out of CPU memory") from None
    except RuntimeError as exc:  # after the CUDA errors, which are RuntimeErrors as well
        if CPU_ALLOCATOR_REFUSED not in str(exc):
            raise
        raise _out_of_memory(command, "out of CPU memory") from None

"""Named random streams: every random choice of a pipeline draws from its own seed, derived from the
config's one ``seed`` and the choice's name, so no two choices share a stream by accident (a chain's
initialisation can never equal a baseline's) and adding a choice moves no other.

    seed(s, "chain", 3, "noise") = int(SHA-256(JSON([s, "chain", 3, "noise"]))[:8 hex digits])

(32 bits, what numpy and scikit-learn accept as a seed as well as torch).

Streams in use: ``("chain", c, "init" | "batches" | "noise")``, ``("baseline", name, "init" |
"batches" | "dropout")``, ``("distill", "codec" | "fisher" | "gan" | "batches" | "monitor")``,
``("evaluate", …)``, ``("attack", …)``, ``("experiment", name, …)``.
"""

from __future__ import annotations

import hashlib
import json

import torch


def seed(base: int, *names: str | int) -> int:
    """The seed of stream ``names`` under the config seed ``base`` (module docstring); < 2³²."""
    text = json.dumps([base, *names])
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)


def generator(base: int, *names: str | int, device: torch.device | str = "cpu") -> torch.Generator:
    """A torch generator on ``device`` seeded with :func:`seed` (draws into a device tensor need a
    generator on that device)."""
    return torch.Generator(device=device).manual_seed(seed(base, *names))

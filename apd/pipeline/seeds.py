"""Named random streams: every random choice of a pipeline draws from its own seed, derived from the
config's one ``seed`` and the choice's name, so no two choices share a stream by accident (a chain's
initialisation can never equal a baseline's) and adding a choice moves no other.

    seed(s, "chain", 3, "noise") = int(SHA-256(JSON([s, "chain", 3, "noise"]))[:8 hex digits])

(32 bits, what numpy and scikit-learn accept as a seed as well as torch).

Streams in use: ``("chain", c, "init" | "batches" | "noise")``, ``("baseline", name, "init" |
"batches" | "dropout")``, ``("distill", "codec" | "fisher" | "gan" | "batches" | "monitor")``,
``("evaluate", …)``, ``("attack", …)``, ``("experiment", name, …)``. Generator seed k ≥ 1 of
``[distill] seeds`` draws from its own copies of the streams that make and judge a generator,
:func:`replicated`: ``("distill", "seed", k, "gan")``, ``("evaluate", "seed", k, "draws", "apd")``; seed 0 from
the streams as named above, so that a pipeline's one generator is its seed 0.
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


def replicated(k: int, *names: str | int) -> tuple[str | int, ...]:
    """The names of stream ``names`` for generator seed ``k``: as they are for seed 0, with ``"seed", k`` after
    the first (the stage's) otherwise, so that seed k's streams depend on k alone and not on how many
    seeds are trained."""
    return names if k == 0 else (names[0], "seed", k, *names[1:])

"""Deep ensembles (Lakshminarayanan, Pritzel & Blundell, "Simple and Scalable Predictive Uncertainty
Estimation using Deep Ensembles", NeurIPS 2017), as a baseline of the same kind as the project's SGD
network: M networks of one architecture, each trained with :func:`apd.samplers.baselines.train_baseline` (SGD,
weight decay on the mean loss, best-validation-accuracy epoch) from its own seeded initialisation and
its own minibatch order. No adversarial training (the paper's optional extra) and no variance head:
classification members give softmax outputs, averaged by the evaluation like any ensemble.

:class:`DeepEnsemble` holds the members' flat weight vectors; storage M·D. ``sample_weights(k)`` gives
all M members when k ≥ M (``max_members()`` = M; never more), else k of them drawn without replacement.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from apd.config import BaselineConfig
from apd.nets import ParamSpec, network
from apd.posteriors.kept import FixedEnsemble
from apd.samplers.baselines import train_baseline


class DeepEnsemble(FixedEnsemble):
    """M independently trained networks (rows of ``members`` [M, D], or a list of [D] vectors)."""

    def __init__(self, members: Tensor | Sequence[Tensor], spec: ParamSpec, device: torch.device | str = "cpu",
                 name: str = "ensemble") -> None:
        if not isinstance(members, Tensor):
            if not members:
                raise ValueError("a deep ensemble needs at least one member")
            members = torch.stack([m.detach().reshape(-1).float().cpu() for m in members])
        super().__init__(members, spec, device, name)


def train_deep_ensemble(sizes: list[int], cfg: BaselineConfig, x_train: Tensor, y_train: Tensor, x_val: Tensor,
                        y_val: Tensor, seeds: Sequence[tuple[int, int]], conv: Sequence[int] = ()) -> list[Tensor]:
    """Train one network ``apd.nets.network(sizes, conv)`` (no dropout) per entry of ``seeds`` and return their flat
    weights.

    Member m is initialised under ``torch.manual_seed(seeds[m][0])`` (the global RNG is restored
    afterwards) and trained by :func:`apd.samplers.baselines.train_baseline` with ``seeds[m][1]`` for its
    minibatch order, on ``x_train``'s device; the validation split picks each member's epoch, as for
    the SGD baseline. The pipeline gives each member its own named streams (``("ensemble", m, "init" |
    "batches")``), so the members differ from each other and from the SGD baseline.
    """
    if not seeds:
        raise ValueError("a deep ensemble needs at least one member")
    vectors = []
    for init_seed, batch_seed in seeds:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(init_seed)
            net = network(sizes, conv)
        net = net.to(x_train.device)
        trained = train_baseline(net, cfg, x_train, y_train, x_val, y_val, seed=batch_seed)
        net.load_state_dict(trained.state_dict)
        vectors.append(ParamSpec.from_module(net).flatten(net))
    return vectors

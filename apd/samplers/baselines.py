"""Point-estimate baselines: the SGD network and the MC-dropout network (Gal & Ghahramani, 2016).

Both minimise the mean minibatch cross-entropy with SGD and weight decay on the mean loss; each epoch
the validation accuracy is measured (for MC dropout, of the MC predictive p̄ = (1/T) Σ_t p(y | x, mask_t)
over T passes with dropout active), and the best epoch's state_dict is kept.
"""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from apd.config import BaselineConfig
from apd.cuda_graphs import RecordedStep
from apd.data import MinibatchOrder

log = logging.getLogger(__name__)


@dataclass
class TrainedBaseline:
    state_dict: dict[str, Tensor]
    best_epoch: int
    val_accuracy: float
    seconds: float


def trains_alike_in_either_mode(net: nn.Module) -> bool:
    """Whether ``net`` computes the same in training and evaluation mode: it holds no dropout and no batch
    normalisation."""
    return not any(isinstance(m, (nn.Dropout, nn.modules.batchnorm._BatchNorm)) for m in net.modules())


class MinibatchSGD:
    """One step of ``optimizer`` on ``net``'s mean cross-entropy over the rows ``idx`` of ``x``, ``y``
    (:meth:`__call__`; the rows are copied into a tensor the step reads). On CUDA, for a network that trains
    alike in either mode (:func:`trains_alike_in_either_mode`), the step is recorded as a CUDA graph and
    replayed (:class:`~apd.cuda_graphs.RecordedStep`; ``cuda_graph`` False: never): a step of these small
    networks is a few dozen short kernels, which the replay launches in one call, making the same updates."""

    def __init__(self, net: nn.Module, optimizer: torch.optim.Optimizer, x: Tensor, y: Tensor, batch_size: int,
                 cuda_graph: bool | None = None) -> None:
        self.net, self.optimizer, self.x, self.y = net, optimizer, x, y
        self.rows = torch.empty(batch_size, dtype=torch.long, device=x.device)
        record = x.is_cuda and trains_alike_in_either_mode(net) if cuda_graph is None else cuda_graph
        self._recording = RecordedStep("SGD training", x.device) if record else None

    def _update(self) -> Tensor:
        loss = F.cross_entropy(self.net(self.x[self.rows]), self.y[self.rows])
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return loss.detach()

    def __call__(self, idx: Tensor) -> Tensor:
        """The step on rows ``idx``; returns the minibatch loss before it (recorded: the same tensor at every
        call, holding the new value)."""
        self.rows.copy_(idx)
        return self._update() if self._recording is None else self._recording(self._update)


@torch.no_grad()
def mc_dropout_probs(net: nn.Module, x: Tensor, passes: int, batch: int = 4096) -> Tensor:
    """Class probabilities of ``passes`` dropout masks on x: [T, N, C] (the net is left in eval mode). Each
    forward call takes up to ``batch`` rows: several passes over a small x at once (every row draws its own
    mask, so stacked copies of x are independent passes), or one pass over a large x in pieces. For a large x
    the layers before the first dropout (:func:`split_at_dropout`: a CNN's convolutions, an MLP's first
    layer), which no mask reaches, run once on each piece and every pass reuses their output; the masks are
    drawn in the same order on the same shapes, so the probabilities are those of whole passes, bit for bit."""
    net.train()
    n = len(x)
    if n >= batch:
        unmasked, masked = split_at_dropout(net)
        pieces = [unmasked(x[i:i + batch]) for i in range(0, n, batch)]
        out = torch.stack([torch.cat([torch.softmax(masked(piece), -1) for piece in pieces]) for _ in range(passes)])
    else:
        per_call = batch // n
        out = torch.cat([torch.softmax(net(x.repeat(k, *[1] * (x.ndim - 1))), -1).view(k, n, -1)
                         for k in (min(per_call, passes - start) for start in range(0, passes, per_call))])
    net.eval()
    return out


def split_at_dropout(net: nn.Module) -> tuple[nn.Module, nn.Module]:
    """``net`` as (the layers before its first ``nn.Dropout``, the rest), so that net(x) = rest(before(x));
    (an identity, ``net``) unless ``net`` is an ``nn.Sequential`` holding a dropout layer."""
    if isinstance(net, nn.Sequential):
        for i, layer in enumerate(net):
            if isinstance(layer, nn.Dropout):
                return net[:i], net[i:]
    return nn.Identity(), net


@torch.no_grad()
def validation_accuracy(net: nn.Module, x: Tensor, y: Tensor, mc_passes: int = 0) -> float:
    """Accuracy of the deterministic net (``mc_passes`` 0) or of its MC-dropout predictive."""
    if mc_passes:
        predictive = mc_dropout_probs(net, x, mc_passes).mean(0)
    else:
        net.eval()
        predictive = net(x)
    return (predictive.argmax(-1) == y).float().mean().item()


def train_baseline(net: nn.Module, cfg: BaselineConfig, x_train: Tensor, y_train: Tensor, x_val: Tensor,
                   y_val: Tensor, seed: int, mc_passes: int = 0, progress=None) -> TrainedBaseline:
    """Train ``net`` in place with SGD (lr, momentum, weight decay) for ``cfg.epochs`` epochs
    (:class:`MinibatchSGD`: recorded as a CUDA graph on a GPU) and return the state_dict of the epoch with the
    best validation accuracy (MC predictive if ``mc_passes``)."""
    start = time.perf_counter()
    optimizer = torch.optim.SGD(net.parameters(), lr=cfg.lr, momentum=cfg.momentum,
                                weight_decay=cfg.weight_decay)
    order = MinibatchOrder(len(y_train), cfg.batch_size, seed, x_train.device)
    sgd = MinibatchSGD(net, optimizer, x_train, y_train, cfg.batch_size)
    best = TrainedBaseline(copy.deepcopy(net.state_dict()), -1, -1.0, 0.0)
    epochs = range(cfg.epochs) if progress is None else progress(range(cfg.epochs))
    for epoch in epochs:
        net.train()
        for t in range(epoch * order.batches_per_epoch, (epoch + 1) * order.batches_per_epoch):
            sgd(order.indices(t))
        accuracy = validation_accuracy(net, x_val, y_val, mc_passes)
        if accuracy > best.val_accuracy:
            best = TrainedBaseline(copy.deepcopy(net.state_dict()), epoch, accuracy, 0.0)
        if hasattr(epochs, "set_postfix"):
            epochs.set_postfix(val_acc=f"{accuracy:.4f}", best=f"{best.val_accuracy:.4f}")
    best.seconds = time.perf_counter() - start
    return best

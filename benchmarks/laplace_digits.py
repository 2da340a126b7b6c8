"""Laplace approximations of the digits SGD network: test accuracy and NLL of sampled networks and of
the GLM predictive, the prior precision chosen by marginal likelihood and the posterior scale τ on the
validation split (apd.posteriors.laplace).

Data: scikit-learn digits, 1,000 train / 300 validation / 497 test (seed 0). Network 64-100-10 trained
by ``train_baseline`` (SGD lr 0.05, weight decay 0.01, batch 100, 100 epochs, best validation epoch).
For each structure (KFAC over all layers, full last layer) and prior (one precision per parameter
tensor, or one), three choices of τ: the lowest validation NLL ("val-NLL"), the widest τ within 0.01
nats of it ("+0.01"), and τ = 1 (the Laplace posterior itself). "sampled" = the ensemble of 100 weight
draws (mean of their softmax), "per-net" = the mean accuracy of single draws, "GLM" = the probit GLM
predictive with its own τ chosen the same way. Run from the repository root:
``python benchmarks/laplace_digits.py`` (about a minute on one core).
"""

from __future__ import annotations

import time

import torch

from apd.config import BaselineConfig, DataConfig
from apd.data import load_dataset
from apd.nets import mlp
from apd.posteriors.laplace import fit_laplace
from apd.samplers.baselines import train_baseline


def nll(probs: torch.Tensor, y: torch.Tensor) -> float:
    return -probs[torch.arange(len(y)), y].clamp_min(1e-12).log().mean().item()


def accuracy(probs: torch.Tensor, y: torch.Tensor) -> float:
    return (probs.argmax(-1) == y).float().mean().item()


def widest_within(scales: list[float], values: list[float], tolerance: float) -> float:
    return max(t for t, v in zip(scales, values, strict=True) if v <= min(values) + tolerance)


def main() -> None:
    torch.set_num_threads(1)
    data = load_dataset(DataConfig(dataset="digits", train_size=1000, val_size=300), seed=0, data_dir=None)
    torch.manual_seed(0)
    net = mlp([64, 100, 10])
    trained = train_baseline(net, BaselineConfig(lr=0.05, weight_decay=0.01, epochs=100), data.x_train,
                             data.y_train, data.x_val, data.y_val, seed=0)
    net.load_state_dict(trained.state_dict)
    x, y = data.x_test, data.y_test
    with torch.no_grad():
        sgd = torch.softmax(net(x), -1)
    print(f"train {len(data.y_train)} / val {len(data.y_val)} / test {len(y)}; SGD best epoch "
          f"{trained.best_epoch}, {trained.seconds:.1f} s; test acc {accuracy(sgd, y):.4f} NLL {nll(sgd, y):.3f}\n")
    print("| structure | prior | prior precisions | τ rule | τ | sampled acc | sampled NLL | per-net acc "
          "| GLM τ | GLM acc | GLM NLL | fit s | tune s | stored / D |")
    print("|" + "---|" * 14)
    for subset, hessian in (("all", "kron"), ("last_layer", "full")):
        for prior in ("layerwise", "scalar"):
            post = fit_laplace(net, data.x_train, data.y_train, data.x_val, data.y_val, subset=subset,
                               hessian=hessian, prior=prior, generator=torch.Generator().manual_seed(1))
            info = post.info
            rules = {"val-NLL": (post.scale, post.glm_scale),
                     "+0.01": (widest_within(info.scales, info.val_nll, 0.01),
                               widest_within(info.scales, info.glm_val_nll, 0.01)),
                     "τ = 1": (1.0, 1.0)}
            for rule, (tau, glm_tau) in rules.items():
                post.scale = tau
                probs = post.predict_probs(x, 100, torch.Generator().manual_seed(2))
                ensemble = probs.mean(0)
                start = time.perf_counter()
                glm = post.glm_probs(x, scale=glm_tau)
                glm_seconds = time.perf_counter() - start
                row = [f"{subset}/{hessian}", prior, " ".join(f"{p:.3g}" for p in info.prior_precision), rule,
                       f"{tau:g}", f"{accuracy(ensemble, y):.4f}", f"{nll(ensemble, y):.3f}",
                       f"{(probs.argmax(-1) == y).float().mean().item():.3f}",
                       f"{glm_tau:g}", f"{accuracy(glm, y):.4f}", f"{nll(glm, y):.3f}",
                       f"{info.fit_seconds:.1f}", f"{info.tune_seconds:.1f}",
                       f"{post.stored_parameters() / post.spec.numel:.1f}"]
                print("| " + " | ".join(row) + " |", flush=True)
            by_tau = {t: (round(v, 4), round(g, 4))
                      for t, v, g in zip(info.scales, info.val_nll, info.glm_val_nll, strict=True)}
            print(f"   validation NLL (sampled, GLM) by τ: {by_tau}; log marglik {info.log_marglik:.1f}; "
                  f"GLM on the test split {glm_seconds:.2f} s", flush=True)


if __name__ == "__main__":
    main()

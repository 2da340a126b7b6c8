"""apd: Adversarial Posterior Distillation of Bayesian neural networks (Wang et al., ICML 2018).

The public API, for using a pipeline's artifacts and its parts from Python::

    import apd
    post = apd.load("artifacts/digits", "apd")      # or "sgld", "sgd", "mcdropout", "mog"
    probs = post.predict_probs(x, k=100)            # [100, N, C]

``SGLD`` (a ``torch.optim.Optimizer``), ``SampleStore`` (the HDF5 sample store), ``scores`` (uncertainty
scores, higher = more uncertain), ``detection`` (AUROC, AUPR-In, AUPR-Out, FPR95 with OOD positive),
``predict_probs`` (K networks at once), ``mlp``, ``ParamSpec`` and ``Posterior`` are importable from
here; each is imported on first use, so that ``import apd`` (which the command line and a sampling worker
start with) does not import torch before they have set up their signals (:mod:`apd.interrupts`,
:mod:`apd.pipeline.spawned`).
"""

import importlib

__version__ = "0.2.0"

# The public API: name → the module that defines it.
_API = {"load": "apd.api", "detection": "apd.metrics", "ParamSpec": "apd.nets", "mlp": "apd.nets",
        "predict_probs": "apd.nets", "Posterior": "apd.posteriors", "SGLD": "apd.samplers.sgld",
        "SampleStore": "apd.samplers.store", "scores": "apd.uncertainty"}

__all__ = ["SGLD", "ParamSpec", "Posterior", "SampleStore", "detection", "load", "mlp", "predict_probs", "scores"]


def __getattr__(name: str):
    """``apd.NAME`` for a name of the public API: imported from its module the first time."""
    if name not in _API:
        raise AttributeError(f"module 'apd' has no attribute {name!r}")
    value = getattr(importlib.import_module(_API[name]), name)
    globals()[name] = value
    return value

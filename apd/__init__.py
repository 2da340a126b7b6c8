"""apd: Adversarial Posterior Distillation of Bayesian neural networks (Wang et al., ICML 2018).

The public API, for using a pipeline's artifacts and its parts from Python::

    import apd
    post = apd.load("artifacts/digits", "apd")      # or "sgld", "sgd", "mcdropout", "mog"
    data = apd.load_data("artifacts/digits")        # its splits and OOD sets, as `apd evaluate` builds them
    probs = post.predict_probs(data.splits.x_test, k=100)  # [100, N, C]

``SGLD`` (a ``torch.optim.Optimizer``), ``SampleStore`` (the HDF5 sample store), ``scores`` (uncertainty
scores, higher = more uncertain), ``detection`` (AUROC, AUPR-In, AUPR-Out, FPR95 with OOD positive),
``predict_probs`` (K networks at once), ``mlp``, ``ParamSpec`` and ``Posterior`` are importable from
here. Each is imported when first used (:func:`__getattr__`), so ``import apd`` or reading
``apd.__version__`` loads none of the pipeline (nor torch, which the command line and a sampling worker
import only once they have set up their signals: :mod:`apd.interrupts`, :mod:`apd.pipeline.spawned`), and
no module of the package imports this one.
"""

from importlib import import_module

from apd._version import __version__

EXPORTS = {  # public name → the module that defines it
    "load": "apd.api",
    "load_data": "apd.api",
    "detection": "apd.metrics",
    "ParamSpec": "apd.nets",
    "mlp": "apd.nets",
    "predict_probs": "apd.nets",
    "Posterior": "apd.posteriors",
    "SGLD": "apd.samplers.sgld",
    "SampleStore": "apd.samplers.store",
    "scores": "apd.uncertainty",
}

__all__ = ["__version__", *sorted(EXPORTS)]


def __getattr__(name: str) -> object:
    """A public name of :data:`EXPORTS`, imported from its module on first use and kept."""
    if name not in EXPORTS:
        raise AttributeError(f"module 'apd' has no attribute {name!r}")
    value = getattr(import_module(EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *EXPORTS})

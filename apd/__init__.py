"""apd: Adversarial Posterior Distillation of Bayesian neural networks (Wang et al., ICML 2018).

The public API, for using a pipeline's artifacts and its parts from Python::

    import apd
    post = apd.load("artifacts/digits", "apd")      # or "sgld", "sgd", "mcdropout", "mog"
    probs = post.predict_probs(x, k=100)            # [100, N, C]

``SGLD`` (a ``torch.optim.Optimizer``), ``SampleStore`` (the HDF5 sample store), ``scores`` (uncertainty
scores, higher = more uncertain), ``detection`` (AUROC, AUPR-In, AUPR-Out, FPR95 with OOD positive),
``predict_probs`` (K networks at once), ``mlp``, ``ParamSpec`` and ``Posterior`` are importable from
here.
"""

__version__ = "0.2.0"

from apd.api import load  # noqa: E402
from apd.metrics import detection  # noqa: E402
from apd.nets import ParamSpec, mlp, predict_probs  # noqa: E402
from apd.posteriors import Posterior  # noqa: E402
from apd.samplers.sgld import SGLD  # noqa: E402
from apd.samplers.store import SampleStore  # noqa: E402
from apd.uncertainty import scores  # noqa: E402

__all__ = ["SGLD", "ParamSpec", "Posterior", "SampleStore", "detection", "load", "mlp", "predict_probs", "scores"]

"""apd: Adversarial Posterior Distillation of Bayesian neural networks (Wang et al., ICML 2018)."""

__version__ = "0.1.0"

"""A hand-set results.json with every optional section, shared by the report, results and docs tests."""

from __future__ import annotations

METHODS = ["sgd", "mcdropout", "sgld", "apd"]
OOD_SETS = ["gaussian", "uniform"]
SCORES_GIVEN = ["entropy", "bald", "variation_ratio"]  # deliberately not in report order


def _stat(mean: float, std: float) -> dict[str, float]:
    return {"mean": mean, "std": std}


def _detection(auroc: float) -> dict[str, dict[str, float]]:
    return {"auroc": _stat(auroc, 0.5), "aupr_in": _stat(auroc - 1.0, 0.6),
            "aupr_out": _stat(auroc + 1.0, 0.7), "fpr95": _stat(0.2, 0.01)}


def _adversarial_cell(entropy: float, target_index: int) -> dict:
    return {"entropy": {"auroc": entropy}, "bald": {"auroc": entropy - 5.0},
            "model_variance": {"auroc": entropy - 10.0}, "accuracy": 0.1 * (target_index + 1)}


def full_results() -> dict:
    """Four methods, two OOD sets, three scores; every optional key present. Hand-set numbers are checked."""
    ood = {name: {score: {m: _detection(60.0 + 8 * mi + 2 * si + oi) for mi, m in enumerate(METHODS)}
                  for si, score in enumerate(SCORES_GIVEN)} for oi, name in enumerate(OOD_SETS)}
    ood["gaussian"]["bald"]["apd"] = {"auroc": _stat(97.83, 0.31), "aupr_in": _stat(97.44, 0.2),
                                      "aupr_out": _stat(98.06, 0.2), "fpr95": _stat(0.05, 0.01)}
    ood["uniform"]["bald"]["apd"]["auroc"] = _stat(90.01, 0.4)
    for name in OOD_SETS:  # one network has no BALD or variation ratio: null in JSON, n/a in tables
        ood[name]["bald"]["sgd"] = ood[name]["variation_ratio"]["sgd"] = None
    paper = {"mcdropout": {"fgsm": [89.53, 94.01, 91.70], "pgd": [88.37, 93.95, 91.63]},
             "sgld": {"fgsm": [54.99, 83.76, 75.93], "pgd": [56.91, 84.98, 82.80]},
             "apd": {"fgsm": [54.51, 83.05, 86.02], "pgd": [54.98, 88.01, 93.15]}}
    targets = ["mcdropout", "sgld", "apd"]
    return {
        "pipeline": "demo", "config_hash": "abc123", "dataset": "digits",
        "sizes": {"train": 1000, "val": 300, "test": 497}, "device": "cpu", "runs": 3,
        "ensemble": {"sgd": 1, "mcdropout": 200, "sgld": 100, "apd": 100},
        "methods": METHODS,
        "accuracy": {m: {"acc": _stat(0.97 + 0.003 * i, 0.0012), "nll": _stat(0.1, 0.01),
                         "brier": _stat(0.05, 0.002), "ece": _stat(0.02, 0.003)}
                     for i, m in enumerate(METHODS)},
        "ood": ood,
        "ood_meta": {"n_in": 497, "n_out": 497, "ratio_in_out": "1:1", "scale": 1.0},
        "storage": {"sgld": {"parameters": 7_951_000, "bytes": 31_804_000, "in_sgld_samples": 100.0},
                    "apd": {"parameters": 1_670_000, "bytes": 6_680_000, "in_sgld_samples": 21.0}},
        "mog": [{"components": k, "parameters": 159_020 * k, "in_sgld_samples": 2.0 * k, "draws": 3,
                 "accuracy": _stat(acc, 0.002), "accuracy_share": share, "bald_auroc": _stat(95.0, 0.4),
                 "bald_auroc_share": share - 0.01}
                for k, acc, share in [(1, 0.49, 0.5), (10, 0.88, 0.9), (60, 0.972, 0.993)]],
        "apd_share": {"parameters": 1_670_000, "in_sgld_samples": 21.0, "accuracy_share": 0.998,
                      "bald_auroc_share": 0.995},
        "fidelity": {"apd": {"weight_std_ratio": 0.69, "bald_ratio": 3.3, "nn_distance": 12.5,
                             "heldout_nn_distance": 14.0, "nn_ratio": 0.893},
                     "mog": {"weight_std_ratio": 1.01, "bald_ratio": 1.1, "nn_distance": 13.0,
                             "heldout_nn_distance": 14.0, "nn_ratio": 0.929}},
        "timing": {"sgld": 12.0, "apd": 3.5, "loading": {"sgld": 0.5, "apd": 2.0}, "mog_growth": 40.0,
                   "total": 125.0},
        "adversarial": {source: {attack: {t: _adversarial_cell(values[ti], ti)
                                          for ti, t in enumerate(targets)}
                                 for attack, values in attacks.items()} for source, attacks in paper.items()},
        "adversarial_whitebox": {t: {"pgd": _adversarial_cell(70.0 + ti, ti)}
                                 for ti, t in enumerate(targets)},
    }

"""Experiments of the evaluation beyond accuracy and OOD detection (adversarial examples, …)."""

"""The scoring protocol (apd.evaluation.protocol.judge_probs): each part of the stacked inputs gets the
scores apd.uncertainty gives it on its own, and one network has no ensemble score."""

from __future__ import annotations

import numpy as np
import torch

from apd.evaluation.protocol import EvaluationInputs, judge_probs
from apd.metrics import detection
from apd.uncertainty import SCORE_FUNCTIONS, bald, scores

N_TEST, N_IN, N_OUT = 30, 10, 10


def inputs() -> EvaluationInputs:
    g = torch.Generator().manual_seed(0)
    return EvaluationInputs(torch.zeros(N_TEST, 2), torch.randint(4, (N_TEST,), generator=g), torch.zeros(N_IN, 2),
                            {"near": torch.zeros(N_OUT, 2), "far": torch.zeros(N_OUT, 2)})


def member_probs(k: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(k)
    return (3 * torch.randn(k, N_TEST + N_IN + 2 * N_OUT, 4, generator=g)).softmax(-1)


def test_each_part_of_the_stacked_inputs_gets_its_own_scores():
    probs, names = member_probs(7), list(SCORE_FUNCTIONS)
    judged = judge_probs(probs, inputs(), names)
    inside = scores(probs[:, N_TEST:N_TEST + N_IN])
    far = scores(probs[:, -N_OUT:])
    for name in names:  # float rounding: a part computed within the stack or on its own
        np.testing.assert_allclose(judged.inside[name], inside[name].numpy(), rtol=1e-14, atol=1e-16)
        np.testing.assert_allclose(judged.outside["far"][name], far[name].numpy(), rtol=1e-14, atol=1e-16)
    assert judged.detection["far"]["bald"] == detection(judged.inside["bald"], judged.outside["far"]["bald"])
    torch.testing.assert_close(judged.information["test"], bald(probs[:, :N_TEST]), rtol=1e-14, atol=1e-16)
    assert torch.equal(judged.predictive["near"], probs[:, N_TEST + N_IN:-N_OUT].double().mean(0))


def test_one_network_has_no_ensemble_score_and_no_information():
    judged = judge_probs(member_probs(1), inputs(), ["bald", "max_prob", "model_variance"])
    assert judged.detection["near"]["bald"] is None and judged.detection["near"]["model_variance"] is None
    assert judged.detection["near"]["max_prob"] is not None and set(judged.inside) == {"max_prob"}
    assert torch.equal(judged.information["far"], torch.zeros(N_OUT, dtype=torch.float64))

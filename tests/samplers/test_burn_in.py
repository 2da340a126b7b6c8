"""The burn-in read from a store's log-likelihood trace (apd.samplers.burn_in) on hand-made traces."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from apd.nets import ParamSpec, mlp
from apd.samplers.burn_in import BURN_IN_RHAT, retained_rows, trace_burn_in
from apd.samplers.store import SampleStore, StoreRows

M = 300  # samples per chain


def _chains(drifting: list[int], seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Four chains of M standard normal log-likelihoods; in each of ``drifting`` the first third climbs
    from −40 to −1 instead."""
    rng = np.random.default_rng(seed)
    traces = [rng.normal(size=M) for _ in range(4)]
    for chain in drifting:
        traces[chain][:M // 3] = np.linspace(-40.0, -1.0, M // 3) + 0.1 * rng.normal(size=M // 3)
    return np.concatenate(traces), np.repeat(np.arange(4), M)


def test_stationary_chains_drop_nothing():
    found = trace_burn_in(*_chains([]))
    assert found["burn_in"] == 0 and found["reached"] and found["rhat"] <= BURN_IN_RHAT
    assert found["grid"] == [[0.0, 0, found["rhat"]]] and (found["chains"], found["samples_per_chain"]) == (4, M)


@pytest.mark.parametrize("drifting", [[1], [0, 1, 2, 3]])
def test_a_chain_whose_first_third_drifts_drops_the_smallest_prefix_that_settles_the_trace(drifting):
    found = trace_burn_in(*_chains(drifting))
    # the smallest grid prefix with split R-hat ≤ 1.05: every shorter one is above it
    assert found["reached"] and found["rhat"] <= BURN_IN_RHAT
    assert all(rhat > BURN_IN_RHAT for _, _, rhat in found["grid"][:-1])
    assert [drop for _, drop, _ in found["grid"]] == [int(f * M) for f, _, _ in found["grid"]]
    # the rank-normalised R-hat tolerates the drift's last samples: 60 of its 100 are dropped with one chain
    # drifting, 75 with all four; nothing is dropped that is not needed
    assert found["burn_in"] == (60 if drifting == [1] else 75)
    assert trace_burn_in(*_chains(drifting), threshold=1.01)["burn_in"] >= found["burn_in"]


def test_chains_that_never_agree_drop_half_and_say_so():
    log_liks, chains = _chains([])
    log_liks = log_liks + 3.0 * chains  # four chains at four levels: no prefix helps
    found = trace_burn_in(log_liks, chains)
    assert not found["reached"] and found["burn_in"] == M // 2 and found["fraction"] == 0.5
    assert len(found["grid"]) == 11


def test_the_grid_drops_exactly_the_floor_of_each_fraction():
    m = 180  # 0.35 · 180 is 62.999… in floating point; ⌊7/20 · 180⌋ = 63
    log_liks, chains = _chains([])
    log_liks = np.concatenate([log_liks[c * M:c * M + m] + 3.0 * c for c in range(4)])
    found = trace_burn_in(log_liks, np.repeat(np.arange(4), m))
    assert [drop for _, drop, _ in found["grid"]] == [i * m // 20 for i in range(11)]


def test_one_chain_is_read_as_its_two_halves():
    rng = np.random.default_rng(1)
    trace = rng.normal(size=M)
    assert trace_burn_in(trace, np.zeros(M, dtype=np.int64))["burn_in"] == 0
    trace[:M // 3] = np.linspace(-40.0, -1.0, M // 3)
    found = trace_burn_in(trace, np.zeros(M, dtype=np.int64))
    assert found["reached"] and 0 < found["burn_in"] <= M // 3 and found["chains"] == 1


def test_a_store_without_log_likelihoods_or_with_short_chains_has_no_burn_in():
    with pytest.raises(ValueError, match="log-likelihood"):
        trace_burn_in(np.full(40, np.nan), np.repeat([0, 1], 20))
    with pytest.raises(ValueError, match="too short"):
        trace_burn_in(np.zeros(10), np.repeat([0, 1], 5))
    short = trace_burn_in(np.random.default_rng(0).normal(size=24), np.repeat([0, 1], 12))
    assert short["grid"][-1][1] <= 12 - 8  # the grid ends where a half-chain would hold fewer than 4 draws


def test_retained_rows_drop_each_chains_first_samples_and_a_view_reads_them(tmp_path):
    chains = np.array([0, 0, 0, 1, 1, 1, 1])
    assert retained_rows(chains, 1).tolist() == [1, 2, 4, 5, 6]
    assert retained_rows(np.array([1, 0, 1, 0]), 1).tolist() == [2, 3]  # chains interleaved
    spec = ParamSpec.from_module(mlp([2, 2]))
    rows = torch.arange(7 * spec.numel, dtype=torch.float32).view(7, spec.numel)
    with SampleStore.create(tmp_path / "s.h5", spec, {}) as store:
        store.append_many(rows, steps=np.arange(7), chains=chains, log_liks=-np.arange(7.0))
    with SampleStore.open(tmp_path / "s.h5") as store:
        view = StoreRows(store, retained_rows(store.chains, 1))
        assert len(view) == 5 and view.chains.tolist() == [0, 0, 1, 1, 1]
        assert view.log_liks.tolist() == [-1.0, -2.0, -4.0, -5.0, -6.0] and view.steps.tolist() == [1, 2, 4, 5, 6]
        torch.testing.assert_close(view.read([0, 4]), rows[[1, 6]])
        torch.testing.assert_close(view.read_all(1, 3), rows[[2, 4]])

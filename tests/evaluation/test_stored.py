"""Stored samples predicted once and shared (apd.evaluation.stored): every ensemble read from the shared
predictions is, to the bit, the one its own prediction gives, and each row is predicted once."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from apd.distillation.precision import round_trip
from apd.evaluation import stored as stored_module
from apd.evaluation.protocol import EvaluationInputs, judge, judge_probs
from apd.evaluation.stored import StoredPredictions
from apd.metrics import auroc
from apd.nets import ParamSpec, mlp, network, predict_probs
from apd.posteriors import GaussianMixture, KeptSamples, SGLDSamples
from apd.samplers.store import SampleStore, StoreRows
from apd.uncertainty import member_entropies
from tests.helpers import RecordedBar
from tests.tiny_pipeline import counted_predictions

SPEC = ParamSpec.from_module(mlp([16, 12, 3]))
CNN = ParamSpec.from_module(network([784, 12, 3], [3, 4]))


def make_store(path, spec: ParamSpec) -> SampleStore:
    """24 rows from two chains of 12."""
    g = torch.Generator().manual_seed(0)
    with SampleStore.create(path, spec, {}) as s:
        for chain in range(2):
            s.append_many(0.3 * torch.randn(12, spec.numel, generator=g), steps=np.arange(12), chains=chain)
    return SampleStore.open(path)


@pytest.fixture
def store(tmp_path):
    with make_store(tmp_path / "s.h5", SPEC) as s:
        yield s


@pytest.fixture
def inputs():
    g = torch.Generator().manual_seed(1)
    return EvaluationInputs(torch.randn(30, 16, generator=g), torch.randint(3, (30,), generator=g),
                            torch.randn(10, 16, generator=g), {"far": 3 * torch.randn(10, 16, generator=g)})


@pytest.mark.parametrize(("spec", "features"), [(SPEC, 16), (CNN, 784)], ids=["mlp", "cnn"])
def test_rows_are_their_own_predictions_and_predicted_once(tmp_path, monkeypatch, spec, features):
    """To the bit for an MLP; a CNN's first convolution is one product of all the networks' filters, whose
    rounding the BLAS may choose by its width, so one network alone can differ in the last bit."""
    same = torch.equal if spec.is_mlp else lambda a, b: torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7) is None
    x = torch.randn(40, features, generator=torch.Generator().manual_seed(2))
    with make_store(tmp_path / "s.h5", spec) as store:
        shared, calls = StoredPredictions(store, x, "cpu"), counted_predictions(monkeypatch)
        rows = np.array([5, 3, 17, 3])  # any order, repeats allowed
        assert same(shared.probs(rows), predict_probs(spec, store.read(rows), x))
        assert same(shared.probs([17, 0, 5]), predict_probs(spec, store.read([17, 0, 5]), x))
        assert calls == [3, 1]  # rows 3, 5, 17, then only row 0
        int8 = torch.stack([round_trip(row, "int8") for row in store.read(rows)])
        assert same(shared.probs(rows, "int8"), predict_probs(spec, int8, x))  # each precision its own rows
        assert calls == [3, 1, 3]


@pytest.mark.parametrize("kept_bytes", [None, 0], ids=["kept", "past-the-budget"])
def test_member_entropies_are_those_of_the_members_judged_together(store, inputs, monkeypatch, kept_bytes):
    """Each row's entropies, kept with it (or computed for it past the budget), are to the bit those of the
    rows' predictions judged together, and so are the judgement's BALD and every other score."""
    monkeypatch.setattr(stored_module, "ENTROPY_ROWS", 3)  # several parts per block
    shared = StoredPredictions(store, inputs.stacked("cpu"), "cpu", kept_bytes=kept_bytes)
    shared.prefetch(np.arange(24))
    rows = np.array([7, 2, 19, 2, 11])
    probs, entropies = shared.members(rows)
    direct = predict_probs(SPEC, store.read(rows), inputs.stacked("cpu"))
    assert torch.equal(probs, direct) and torch.equal(entropies, member_entropies(direct))
    given, computed = (judge_probs(probs, inputs, ["bald", "max_prob"], auroc, member_entropy)
                       for member_entropy in (entropies, None))
    assert all(torch.equal(given.information[name], computed.information[name]) for name in computed.information)
    assert given.detection == computed.detection and given.accuracy == computed.accuracy


def test_entropies_are_kept_in_the_room_predictions_leave_and_give_way_to_them(store, monkeypatch):
    """With room for three rows' predictions: two rows' predictions and one row's entropies are kept (the
    other's computed again when asked for); a third row's prediction drops the kept entropies to fit, and is
    not predicted again; entropies asked for again are computed again, and are the same."""
    x = torch.randn(40, 16)
    row = 40 * 3 * 4  # one row's predictions, [N, C] float32; its entropies take 40 * 8
    shared, calls = StoredPredictions(store, x, "cpu", kept_bytes=3 * row), counted_predictions(monkeypatch)
    entropies_of: list[int] = []

    def entropies(probs):
        entropies_of.append(len(probs))
        return member_entropies(probs)

    monkeypatch.setattr(stored_module, "member_entropies", entropies)
    first = shared.members([1, 2])[1]
    assert torch.equal(first, member_entropies(predict_probs(SPEC, store.read([1, 2]), x)))
    assert torch.equal(shared.members([1, 2])[1], first) and entropies_of == [2, 1]  # row 1's kept, row 2's not
    shared.probs([3])
    shared.probs([3])
    assert calls == [2, 1]  # row 3 kept, in room row 1's entropies gave up
    assert torch.equal(shared.members([1, 2])[1], first) and entropies_of == [2, 1, 2]


def test_past_the_budget_rows_are_predicted_again(store, monkeypatch):
    x = torch.randn(40, 16)
    shared, calls = StoredPredictions(store, x, "cpu", kept_bytes=0), counted_predictions(monkeypatch)
    for _ in range(2):
        assert torch.equal(shared.probs([1, 2]), predict_probs(SPEC, store.read([1, 2]), x))
    assert calls == [2, 2]


def test_a_storage_forgotten_gives_its_room_to_the_next(store, monkeypatch):
    """With room for two rows: two float32 rows kept leave none for int8's, predicted again at every ask; once
    float32's are forgotten, int8's are kept (predicted once), and float32's asked again are predicted again."""
    x = torch.randn(40, 16)
    shared, calls = StoredPredictions(store, x, "cpu", kept_bytes=2 * 40 * 3 * 4), counted_predictions(monkeypatch)
    shared.members([1, 2])
    shared.probs([1, 2], "int8")
    shared.forget("float32")
    for _ in range(2):
        assert torch.equal(shared.probs([1, 2], "int8"), predict_probs(SPEC, torch.stack(
            [round_trip(row, "int8") for row in store.read([1, 2])]), x))
    assert calls == [2, 2, 2]  # float32, int8 past the room, then int8 kept
    shared.probs([1, 2])
    assert calls == [2, 2, 2, 2]  # float32 again


def test_one_storage_at_a_time_groups_the_keys_and_forgets_each_storage_after_its_last(store, monkeypatch):
    """Keys come grouped by storage, storages in the order they first appear and each group in its own order; a
    storage is forgotten only once the caller is done with its last key."""
    shared = StoredPredictions(store, torch.randn(40, 16), "cpu")
    forgotten: list[str] = []
    monkeypatch.setattr(shared, "forget", forgotten.append)
    storages = {"a": "float32", "b": "int8", "c": "float32", "d": "int4", "e": "int8"}
    seen = []
    for key in shared.one_storage_at_a_time(storages):
        seen.append((key, list(forgotten)))
    assert seen == [("a", []), ("c", []), ("b", ["float32"]), ("e", ["float32"]), ("d", ["float32", "int8"])]
    assert forgotten == ["float32", "int8", "int4"]


def test_rows_are_kept_while_they_take_at_most_half_the_available_memory(store, monkeypatch):
    x = torch.randn(40, 16)
    row = 40 * 3 * 4  # bytes of one row's predictions, [N, C] float32
    monkeypatch.setattr(stored_module, "available_bytes", lambda device: 5 * row)  # room for two rows and a half
    shared, calls = StoredPredictions(store, x, "cpu"), counted_predictions(monkeypatch)
    for _ in range(2):
        shared.probs([1, 2])
        shared.probs([3, 4])
    assert shared.kept_bytes == int(2.5 * row) and calls == [2, 2, 2]  # rows 1, 2 kept, 3 and 4 predicted again


def test_prefetched_rows_are_predicted_in_blocks_and_only_while_they_fit(store, monkeypatch):
    """A prefetch predicts the rows not yet kept in blocks of READ_ROWS and keeps them; later reads of them
    predict nothing. Past the budget it stops: a block that would not fit is left to be predicted when read."""
    x = torch.randn(40, 16)
    row = 40 * 3 * 4  # bytes of one row's predictions, [N, C] float32
    monkeypatch.setattr(stored_module, "READ_ROWS", 4)
    shared, calls = StoredPredictions(store, x, "cpu"), counted_predictions(monkeypatch)
    shared.probs([0])
    shared.prefetch(np.array([9, 0, 1, 2, 3, 9, 4, 5]))
    assert calls == [1, 4, 2]  # row 0 kept already; rows 1-5 and 9 in blocks of 4
    assert torch.equal(shared.probs([5, 9, 1]), predict_probs(SPEC, store.read([5, 9, 1]), x)) and calls == [1, 4, 2]
    small, calls = StoredPredictions(store, x, "cpu", kept_bytes=6 * row), counted_predictions(monkeypatch)
    small.prefetch(np.arange(12))
    assert calls == [4]  # the second block of 4 would pass 6 rows' bytes: not predicted
    small.probs(np.arange(6))
    assert calls == [4, 2]


def test_a_prediction_of_several_blocks_counts_its_networks_on_a_bar(store, monkeypatch):
    """Rows predicted in more than one block (fcNN1's store takes minutes) move one bar by each block's networks,
    named by their storage; a single block (a subset's few rows) and rows kept already make none."""
    monkeypatch.setattr(stored_module, "READ_ROWS", 4)
    monkeypatch.setattr(RecordedBar, "made", [])
    shared = StoredPredictions(store, torch.randn(40, 16), "cpu", progress=RecordedBar)
    shared.prefetch(np.arange(10))
    shared.probs([0, 1, 10, 11, 12])  # three rows to predict: one block
    shared.prefetch(np.arange(10))
    shared.prefetch(np.arange(6), "int8")
    assert [(bar.total, bar.n, bar.unit) for bar in RecordedBar.made] == [(10, 10, "network"), (6, 6, "network")]
    assert "float32" in RecordedBar.made[0].desc and "int8" in RecordedBar.made[1].desc
    small = StoredPredictions(store, torch.randn(40, 16), "cpu", kept_bytes=6 * 40 * 3 * 4, progress=RecordedBar)
    small.prefetch(np.arange(12))  # the second block would pass the budget: stopped after the first
    assert (RecordedBar.made[-1].total, RecordedBar.made[-1].n) == (12, 4)


def test_available_memory_on_the_cpu_is_the_kernels_estimate(tmp_path, monkeypatch):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemFree:         1000000 kB\nMemAvailable:    2048 kB\n")
    monkeypatch.setattr(stored_module, "MEMINFO", meminfo)
    assert stored_module.available_bytes(torch.device("cpu")) == 2048 * 1024
    monkeypatch.setattr(stored_module, "MEMINFO", tmp_path / "absent")
    assert 0 < stored_module.available_bytes(torch.device("cpu")) < 2**50


def test_judged_draws_of_stored_samples_are_the_ones_their_own_predictions_give(store, inputs, monkeypatch):
    """SGLD's draws and kept samples (all of them, or some) read from the shared predictions: the same
    members, the generator advanced alike, the same judgement; a method of other members predicts itself."""
    shared = StoredPredictions(store, inputs.stacked("cpu"), "cpu")
    kept = KeptSamples.from_store(store, [2, 7, 13, 20, 22])
    mixture = GaussianMixture(store.read_all(), 2, SPEC, seed=0)
    for method, k in ((SGLDSamples(store), 8), (kept, 5), (kept, 3), (mixture, 4)):
        own, from_shared = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
        expected = judge(method, inputs, k, own, ["bald", "max_prob"])
        found = judge(method, inputs, k, from_shared, ["bald", "max_prob"], shared)
        assert torch.equal(found.test_probs, expected.test_probs) and found.detection == expected.detection
        assert torch.equal(found.predictive["far"], expected.predictive["far"])
        assert torch.equal(torch.randint(10**6, (1,), generator=own), torch.randint(10**6, (1,), generator=from_shared))
    shared, calls = StoredPredictions(store, inputs.stacked("cpu"), "cpu"), counted_predictions(monkeypatch)
    judge(kept, inputs, 5, None, ["bald"], shared)
    judge(SGLDSamples(store), inputs, len(store), torch.Generator().manual_seed(4), ["bald"], shared)
    assert calls == [5, len(store) - 5]  # every stored sample, each once


def test_members_of_another_store_or_permuted_are_not_read_from_it(store, inputs):
    shared = StoredPredictions(store, inputs.stacked("cpu"), "cpu")
    later = StoreRows(store, np.arange(4, 24))  # another view of the rows: its own row numbers
    g = torch.Generator().manual_seed(0)
    state = g.get_state()
    for method in (SGLDSamples(later), KeptSamples.from_store(later, [0, 1]),
                   SGLDSamples(store, perms=torch.arange(12).repeat(len(store), 1))):
        assert shared.draw(method, 2, g) is None and torch.equal(g.get_state(), state)

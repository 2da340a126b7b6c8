"""``apd experiment precision``: the budget's arithmetic, and the study's outputs on the tiny pipeline."""

from __future__ import annotations

import copy
import dataclasses
import json
import math

import pytest
import torch

from apd.config_load import from_dict
from apd.distillation.chain_generators import ChainGenerators
from apd.distillation.codec import WeightCodec
from apd.distillation.gan import Generator
from apd.distillation.generator import DistilledGenerator, architecture, build_generator
from apd.distillation.precision import (
    PartPrecisions,
    module_bytes,
    module_tensors,
    round_trip,
    round_trip_module_,
    stored_bytes,
)
from apd.evaluation.kept_storage import kept_for
from apd.experiments.precision import (
    StoredCoordinates,
    apd_bytes,
    chain_generators_storage,
    coordinates_storage,
    fewer_bytes_than_kept,
    generator_storage,
    largest_rank,
    render_table,
    stored_apd,
    wins_over_float32_kept,
)
from apd.nets import ParamSpec, mlp
from apd.posteriors import APDGenerator
from tests.tiny_pipeline import TINY, run_experiment_on_copy

SPEC = ParamSpec.from_module(mlp([64, 32, 10]))  # the tiny pipeline's network: D = 2,410


def test_a_generators_float32_bytes_are_four_per_stored_number():
    d = from_dict(TINY).distill
    model = build_generator(architecture(d, SPEC.numel, SPEC.layer_sizes))
    assert module_bytes(model, "float32") == 4 * model.stored_parameters()
    assert generator_storage(d, d.subspace_rank, SPEC, PartPrecisions()) == pytest.approx(model.storage_in_samples())


def test_the_budget_buys_the_largest_rank_and_the_fewest_samples_that_take_it():
    d = from_dict(TINY).distill
    # one sample of D = 2,410 numbers: 1, 0.5, 0.2658 (int8) and 0.1408 (int4) samples' worth
    for precision, samples in (("float32", 4), ("float16", 8), ("int8", 16), ("int4", 29)):
        storage = lambda r, p=precision: generator_storage(d, r, SPEC, PartPrecisions(p))  # noqa: E731
        rank = largest_rank(storage, 4.0, limit=100)
        assert storage(rank) <= 4.0 < storage(rank + 1)
        assert kept_for(4.0, SPEC.numel, precision, available=1000) == samples
    assert largest_rank(lambda r: generator_storage(d, r, SPEC, PartPrecisions()), 0.5, limit=100) == 0  # the mean: 1
    assert largest_rank(lambda r: 0.0, 4.0, limit=7) == 7  # never more than the limit
    # the coordinates' codec: mean, basis and scales; then 200 samples × r coordinates, all at 4 bytes
    assert coordinates_storage(3, SPEC, 200, "float32") == pytest.approx((SPEC.numel * 4 + 3 + 600) / SPEC.numel)
    assert kept_for(4.0, SPEC.numel, "int8", available=10) == 10


def test_the_samples_coordinates_are_counted_at_the_precision_they_are_stored_at():
    codec = WeightCodec.empty("subspace", SPEC.numel, 3, residual=False)
    exact = StoredCoordinates(codec, torch.randn(200, 3), SPEC, "SGLD coordinates r=3")
    assert exact.storage_in_samples() == pytest.approx(exact.stored_parameters() / SPEC.numel)
    for precision in ("float32", "float16", "int8", "int4"):
        stored = exact.stored_at(PartPrecisions(precision))
        assert stored.precision == precision and stored.name == f"SGLD coordinates r=3, {precision}"
        assert stored.storage_in_samples() == pytest.approx(coordinates_storage(3, SPEC, 200, precision))
    assert exact.stored_at(PartPrecisions("int8")).storage_in_samples() < 0.3 * exact.storage_in_samples()
    # the codec's mean at int8, the rest and the coordinates at int4: each counted at its own
    mean_int8 = exact.stored_at(PartPrecisions("int4", "float32", "int8"))  # the generators' precision plays no part
    assert (mean_int8.name, mean_int8.precision) == ("SGLD coordinates r=3, int4, mean int8", "int4")
    int4 = exact.stored_at(PartPrecisions("int4"))
    assert mean_int8.stored_bytes() == int4.stored_bytes() + stored_bytes(SPEC.numel, "int8") - stored_bytes(
        SPEC.numel, "int4")
    assert torch.equal(mean_int8.coordinates, int4.coordinates) and torch.equal(mean_int8.codec.basis, int4.codec.basis)


def test_the_samples_coordinates_decoded_by_a_codec_read_back_from_a_precision_keep_their_coordinates():
    codec = WeightCodec("subspace", SPEC.numel, torch.randn(SPEC.numel), torch.rand(3) + 0.5,
                        torch.linalg.qr(torch.randn(SPEC.numel, 3))[0])
    exact = StoredCoordinates(codec, torch.randn(200, 3), SPEC, "SGLD coordinates r=3")
    before = copy.deepcopy(codec.state_dict())
    decoded = exact.codec_at(PartPrecisions("int4", "int8"))  # the generators' precision is not the codec's
    assert decoded.name == "SGLD coordinates r=3, codec int4" and decoded.coordinates is exact.coordinates
    assert (decoded.precision, decoded.codec_stored_as) == ("float32", PartPrecisions("int4"))
    # storage: the codec at 4 bits, the 600 coordinates at 4 bytes
    assert decoded.stored_bytes() == module_bytes(codec, "int4") + 600 * 4 < exact.stored_bytes()
    # θ = μ + U·diag(σ)·c with μ, σ and U read back from int4: near the exact decoding, not equal to it
    rows = exact.coordinates[:5]
    rounded = round_trip_module_(copy.deepcopy(codec), "int4")
    assert torch.equal(decoded.codec.decode_principal(rows), rounded.decode_principal(rows))
    gap = (decoded.codec.decode_principal(rows) - codec.decode_principal(rows)).abs().max()
    assert 0 < gap < 0.5 * codec.decode_principal(rows).abs().max()
    assert all(torch.equal(codec.state_dict()[name], value) for name, value in before.items())  # left as it was
    # the mean at int8, the rest at int4: the mean read back from int8, counted at it
    mean_int8 = exact.codec_at(PartPrecisions("int4", mean="int8"))
    assert mean_int8.name == "SGLD coordinates r=3, codec int4, mean int8"
    assert torch.equal(mean_int8.codec.mean, round_trip(codec.mean, "int8"))
    assert torch.equal(mean_int8.codec.basis, rounded.basis) and torch.equal(mean_int8.codec.scale, rounded.scale)
    assert mean_int8.stored_bytes() == decoded.stored_bytes() + stored_bytes(SPEC.numel, "int8") - stored_bytes(
        SPEC.numel, "int4")


def test_one_generator_per_chain_is_counted_with_its_codec_and_shares_and_stored_at_int8():
    codec = WeightCodec("subspace", SPEC.numel, torch.zeros(SPEC.numel), torch.ones(2), torch.eye(SPEC.numel)[:, :2])
    generators = []
    for code in (-1.0, 1.0):  # generator c always gives the code (c, c)
        generator = Generator(3, [4], 2)
        torch.nn.init.zeros_(generator.net[-1].weight)
        torch.nn.init.constant_(generator.net[-1].bias, code)
        generators.append(generator)
    model = DistilledGenerator(ChainGenerators(generators, torch.tensor([0.25, 0.75])), codec)
    method = APDGenerator(model, SPEC)
    weights = method.sample_weights(8, torch.Generator().manual_seed(0))
    assert weights[:, 0].tolist() == [-1.0] * 2 + [1.0] * 6  # θ = μ + U·diag(σ)·c: the first weight is c's first
    per_generator = sum(p.numel() for p in generators[0].parameters())
    assert method.stored_parameters() == codec.stored_parameters() + 2 * per_generator + 2  # and the 2 shares
    stored = stored_apd(method, PartPrecisions("int8"))
    assert torch.equal(stored.sample_weights(8, torch.Generator().manual_seed(0)), weights)  # ±1 survive int8
    d, rank = from_dict(TINY).distill, 5  # z 32, hidden [32]: 32·32 + 32 + 32·5 + 5 numbers a generator
    numbers = SPEC.numel * (1 + rank) + rank + 2 * (32 * 32 + 32 + 32 * rank + rank) + 2
    assert chain_generators_storage(d, rank, SPEC, 2, PartPrecisions()) == pytest.approx(numbers / SPEC.numel)


def test_the_study_compares_apd_with_its_kept_samples_at_each_precision(tiny_pipeline, tmp_path):
    out = run_experiment_on_copy(tiny_pipeline, tmp_path, "precision", "budget=4", "steps=20")
    results = json.loads((out / "precision.json").read_text())
    rows = {row["precision"]: row for row in results["rows"]}
    assert list(rows) == ["float32", "float16", "int8", "int4"]
    assert rows["float32"]["rank"] < rows["float16"]["rank"] < rows["int8"]["rank"] < rows["int4"]["rank"]
    assert [rows[p]["k"] for p in rows] == [4, 8, 16, 29]
    for row in rows.values():  # every method within the budget, the kept samples at least at it
        assert max(row["apd"]["in_sgld_samples"], row["coordinates"]["in_sgld_samples"]) <= 4
        assert 4 <= row["kept"]["in_sgld_samples"] < 4.27
        assert fewer_bytes_than_kept(row) == []
        assert row["apd"]["steps"] == 20
        assert row["margins"]["compared"] == row["coordinates"]["margins"]["compared"] == 5  # 2 sets × 2, NLL
        assert row["per_chain"]["chains"] == 1 and row["per_chain"]["in_sgld_samples"] <= 4
    assert rows["float32"]["coordinates"]["rank"] < rows["int8"]["coordinates"]["rank"]
    assert rows["float32"]["coordinates"]["storage_shift"] == 0
    assert rows["float32"]["apd"]["storage_shift"] == 0 == rows["float32"]["kept"]["storage_shift"]
    assert 0 < rows["int8"]["kept"]["storage_shift"] < 0.05  # rounding moves the predictive, a little
    assert rows["int8"]["kept"]["storage_shift"] < rows["int4"]["kept"]["storage_shift"]  # and 4 bits more
    float32_kept = rows["float32"]["kept"]  # the kept-samples yardstick: ⌈S⌉ = 4 samples kept at float32
    for row in rows.values():
        for method in (row["apd"], row["per_chain"]):
            assert math.ceil(method["in_sgld_samples"]) == 4
            over = wins_over_float32_kept(method, float32_kept, results["sgld"])
            assert over["compared"] == 5 and "percentile" in over["nll"]
            if row["precision"] == "float32":  # the same kept samples as the row's own margins
                assert over == (row["margins"] if method is row["apd"] else method["margins"])
    assert wins_over_float32_kept(rows["int8"]["apd"] | {"in_sgld_samples": 2.5}, float32_kept,
                                  results["sgld"]) is None  # 3 ≠ 4
    table = (out / "precision.md").read_text()
    assert "| int8 | SGLD coordinates |" in table and "none fits" not in table
    assert "wins over ⌈S⌉ float32 kept" in table
    assert "the fewest SGLD samples that take the budget (⌈S / s⌉" in table and "not at equal storage" not in table
    # a study written before ⌈S / s⌉ kept the most samples that fit, which may take less than APD: said so
    older = json.loads(json.dumps(results))
    int8 = next(row for row in older["rows"] if row["precision"] == "int8")
    int8["kept"]["in_sgld_samples"] = int8["apd"]["in_sgld_samples"] - 0.01
    assert fewer_bytes_than_kept(int8)[0] == "APD"
    older_table = render_table(older)
    assert "and the most SGLD samples that fit, evenly spaced" in older_table
    assert "The kept samples take less storage at int8 than “APD”" in older_table
    assert "those wins over kept are not at equal storage." in older_table
    assert (out / "precision.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_with_room_for_one_storage_each_sample_is_predicted_once_per_precision(tiny_pipeline, tmp_path, monkeypatch):
    """Where the predictions' memory holds the store's predictions at one storage only, each row's kept samples
    give way to the next row's: each sample is predicted at most once at each precision, and the study is the
    one judged with room for all."""
    from tests.tiny_pipeline import counted_predictions, one_storage, without_timings

    options = ("budget=4", "steps=20", "precisions=['float32', 'int8', 'int4']")
    roomy = run_experiment_on_copy(tiny_pipeline, tmp_path / "roomy", "precision", *options)
    predicted = counted_predictions(monkeypatch, room=one_storage(tiny_pipeline[0], "tuning"))
    tight = run_experiment_on_copy(tiny_pipeline, tmp_path / "tight", "precision", *options)
    assert 2 * 200 < sum(predicted) <= 3 * 200
    assert without_timings(json.loads((roomy / "precision.json").read_text())) == without_timings(
        json.loads((tight / "precision.json").read_text()))


def test_a_budget_too_small_for_the_generator_still_scores_the_kept_samples(tiny_pipeline, tmp_path):
    out = run_experiment_on_copy(tiny_pipeline, tmp_path, "precision", "budget=1", 'precisions=["float32"]')
    row = json.loads((out / "precision.json").read_text())["rows"][0]
    assert row["rank"] == 0 and row["apd"] is None and row["margins"] is None and row["kept"]["k"] == 1
    assert row["coordinates"] is None
    assert "none fits" in (out / "precision.md").read_text()


def test_a_generators_codec_and_networks_may_be_stored_at_precisions_of_their_own():
    d = dataclasses.replace(from_dict(TINY).distill, per_chain=True)
    model = build_generator(architecture(d, SPEC.numel, SPEC.layer_sizes, 2))
    torch.manual_seed(0)
    for tensor in module_tensors(model):
        tensor.data.normal_()
    for precision in ("float32", "float16", "int8", "int4"):  # one precision: every stored tensor at it
        assert apd_bytes(model, PartPrecisions(precision)) == module_bytes(model, precision)
    assert apd_bytes(model, PartPrecisions("int4", "float32")) == module_bytes(model.codec, "int4") + 4 * sum(
        t.numel() for t in (*model.generator.parameters(), *model.generator.buffers()))
    method = APDGenerator(model, SPEC)
    whole = round_trip_module_(copy.deepcopy(model), "int8").state_dict()
    int8 = stored_apd(method, PartPrecisions("int8")).model
    assert all(torch.equal(whole[k], v) for k, v in int8.state_dict().items())
    mixed = stored_apd(method, PartPrecisions("int4", "float32")).model
    assert all(torch.equal(a, b) for a, b in zip(mixed.generator.state_dict().values(),
                                                 model.generator.state_dict().values(), strict=True))
    codec = round_trip_module_(copy.deepcopy(model.codec), "int4").state_dict()
    assert all(torch.equal(codec[k], v) for k, v in mixed.codec.state_dict().items())

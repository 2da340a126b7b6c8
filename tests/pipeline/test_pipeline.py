"""End to end on a small digits pipeline: sample → distill → evaluate, and the artifacts between."""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from apd.cli import main
from apd.config_load import load_config
from apd.distillation.generator import load_generator
from apd.distillation.training import evenly_spaced
from apd.errors import ArtifactError
from apd.evaluation.stored import StoredPredictions
from apd.methods import ALL_METHODS
from apd.nets import ParamSpec, mlp, predict_probs
from apd.pipeline.methods import fit_mixture
from apd.pipeline.runtime import RunContext, torch_threads
from apd.posteriors import APDGenerator, GaussianMixture, SGLDSamples
from apd.samplers.store import SampleStore
from tests.tiny_pipeline import TINY, copy_samples, copy_samples_as_two_chains, tiny_context, toml


@pytest.fixture(scope="module")
def pipeline(tiny_pipeline):
    return tiny_pipeline


def _load_apd(path):
    manifest = json.loads(path.with_suffix(".json").read_text())
    model, spec = load_generator(path, manifest)
    return APDGenerator(model, spec)


def test_results_have_every_method_set_and_score(pipeline):
    root, _ = pipeline
    results = json.loads((root / "tiny" / "eval" / "results.json").read_text())
    methods = list(ALL_METHODS)
    assert set(results["accuracy"]) == set(methods)
    for by_score in results["ood"].values():
        assert set(by_score) == {"variation_ratio", "bald", "entropy", "max_prob"}
        for score, by_method in by_score.items():
            assert set(by_method) == set(methods)
            for method, metrics in by_method.items():
                if method == "sgd" and score in ("variation_ratio", "bald"):
                    assert metrics is None  # one network has no disagreement: n/a, not 50
                else:
                    assert 0 <= metrics["auroc"]["mean"] <= 100
    assert set(results["ood"]) == {"gaussian", "uniform"}
    assert results["accuracy"]["sgld"]["acc"]["mean"] > 0.85
    assert [row["components"] for row in results["mog"]] == [1, 3]
    assert results["storage"]["sgld"]["in_sgld_samples"] == 200
    assert set(results["fidelity"]) == set(methods) - {"sgld", "sgd", "laplace-glm"}  # weight-space methods
    for name, row in results["fidelity"].items():  # unaligned (distill.align none): SGLD's samples as stored
        assert row["sgld_frame"] == "as stored" and row["bald_members"] == min(results["ensemble"][name], 200)
    assert all("set_gaps" in row for row in results["quality"].values())  # each method's gaps per draw
    assert all(row["draws"] == 3 and row["accuracy"]["std"] >= 0 for row in results["mog"])
    assert (root / "tiny" / "eval" / "tables.md").is_file()


def test_torch_threads_are_set_for_a_block_and_restored_after_it():
    before = torch.get_num_threads()
    other = 1 if before != 1 else 2
    with torch_threads(other):
        assert torch.get_num_threads() == other
    assert torch.get_num_threads() == before
    with torch_threads(0):
        assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError), torch_threads(other):
        raise RuntimeError("a stage failed")
    assert torch.get_num_threads() == before


def test_generator_round_trip_and_spec_mismatch(pipeline):
    root, _ = pipeline
    path = tiny_context(root).layout.generator
    manifest = json.loads(path.with_suffix(".json").read_text())
    spec = ParamSpec.from_module(mlp([64, 32, 10]))
    apd = _load_apd(path)
    weights = apd.sample_weights(5, torch.Generator().manual_seed(0))
    assert weights.shape == (5, spec.numel)
    again = _load_apd(path).sample_weights(5, torch.Generator().manual_seed(0))
    torch.testing.assert_close(weights, again)
    assert apd.predict_probs(torch.zeros(3, 64), 4).shape == (4, 3, 10)
    with pytest.raises(ArtifactError, match=r"64-32-10 network, the pipeline.s network is 64-16-10"):
        load_generator(path, manifest, expect_spec=ParamSpec.from_module(mlp([64, 16, 10])))


def test_stages_are_reused(pipeline, capsys):
    root, config = pipeline
    capsys.readouterr()
    for stage in ("sample", "distill"):
        assert main([stage, "--config", str(config), "--artifacts", str(root)]) == 0
    assert capsys.readouterr().err.count("reusing") == 6  # samples, four baselines (with SWAG, ensemble), generator


def test_evaluate_without_generator_names_the_stage(tmp_path, capsys):
    config = tmp_path / "p.toml"
    config.write_text(toml({**TINY, "name": "missing"}))
    assert main(["evaluate", "--config", str(config), "--artifacts", str(tmp_path), "--quiet"]) == 2
    assert "run `apd sample" in capsys.readouterr().err


@pytest.mark.parametrize(("methods", "message"), [
    ('["sgld", "bogus"]', "'evaluate.methods' has unknown method 'bogus' (choose from sgd, "),
    ('["apd", "kept"]', "'evaluate.methods' must include 'sgld', the reference every method is compared with")])
def test_evaluate_refuses_methods_it_cannot_compare_in_one_line(tmp_path, capsys, methods, message):
    config = tmp_path / "p.toml"
    config.write_text(toml(TINY))
    argv = ["evaluate", "--config", str(config), "--artifacts", str(tmp_path), "--set", f"evaluate.methods={methods}"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("settings", [{}, {"per_chain": True}, {"mode_embedding": 2},
                                      {"per_chain": True, "seeds": 2}])
def test_interrupted_distillation_resumes_to_the_same_generator(pipeline, tmp_path, monkeypatch, caplog, settings):
    """Interrupted after 100 GAN trainer steps (per chain: steps of the chains trained as one; conditioned on
    the chain: of the one generator; two seeds: of both seeds' chains trained as one batch, as on a GPU), the
    resumed run ends with the generators an uninterrupted run gives. The checkpoint names the kind of device
    its random streams are on; one generator's, said to be a card's, is not resumed on the CPU: that run
    starts afresh, to the same generator."""
    from apd.distillation.gan import GANTrainer
    from apd.pipeline import distill
    from apd.pipeline.layout import checkpoint_of

    root, _ = pipeline
    monkeypatch.setattr(distill, "trains_seeds_together", lambda ctx, seeds: len(seeds) > 1)
    if settings:  # both read the store's chains: two of them
        copy_samples_as_two_chains(root, tmp_path / "straight")
        distill.run_distill(tiny_context(tmp_path / "straight", distill=settings))
        straight = tiny_context(tmp_path / "straight").layout
        references = [torch.load(straight.generator_last_of(k), weights_only=True)
                      for k in range(settings.get("seeds", 1))]
        copy_samples_as_two_chains(root, tmp_path / "resumed")
    else:
        references = [torch.load(tiny_context(root).layout.generator_last, weights_only=True)]
        copy_samples(root, tmp_path / "resumed")
    real_step, calls = GANTrainer.step_by_chain, []

    def step_then_interrupt(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 101:
            raise KeyboardInterrupt
        return real_step(self, *args, **kwargs)

    monkeypatch.setattr(GANTrainer, "step_by_chain", step_then_interrupt)
    ctx = tiny_context(tmp_path / "resumed", distill=settings)
    with pytest.raises(KeyboardInterrupt):
        distill.run_distill(ctx)
    monkeypatch.setattr(GANTrainer, "step_by_chain", real_step)
    checkpoint = checkpoint_of(ctx.layout.generator_of(0))
    saved = torch.load(checkpoint, weights_only=True)
    assert saved["streams"] == "cpu"
    if not settings:
        torch.save({**saved, "streams": "cuda"}, checkpoint)
    with caplog.at_level(logging.INFO):
        distill.run_distill(ctx)
    if settings:
        assert "resuming distillation at generator step 80" in caplog.text  # the checkpoint of step 80 (every 40)
    else:
        assert "resuming" not in caplog.text and "from another configuration" in caplog.text
    for k, reference in enumerate(references):
        resumed = torch.load(ctx.layout.generator_last_of(k), weights_only=True)
        assert set(resumed) == set(reference)
        for key, value in reference.items():
            torch.testing.assert_close(resumed[key], value, msg=key)


def test_one_generator_per_chain_stored_at_int8_is_what_evaluate_loads(pipeline, tmp_path, monkeypatch):
    """per_chain with precision int8: each chain's GAN sees only its chain's rows; generator.pt holds int8
    codes and block scales only; it loads as two generators weighted by the chains' shares, equal to the
    kept generator read back from int8; storage is counted in those bytes, and the stored generator is
    judged again."""
    from apd.distillation.chain_generators import ChainGenerators
    from apd.distillation.precision import in_samples, module_bytes, round_trip
    from apd.distillation.training import StoreBatches
    from apd.pipeline import distill

    copy_samples_as_two_chains(pipeline[0], tmp_path)
    drawn: dict[int, set] = {}
    real_call = StoreBatches.__call__

    def recording_call(self):  # the rows each restricted batch stream draws from
        if self.rows is not None:
            drawn.setdefault(int(self.rows[0]), set()).update(self.rows.tolist())
        return real_call(self)

    monkeypatch.setattr(StoreBatches, "__call__", recording_call)
    ctx = tiny_context(tmp_path, distill={"per_chain": True, "precision": "int8", "steps": 40})
    path = distill.run_distill(ctx)
    with SampleStore.open(ctx.layout.samples) as store:
        n, chains = len(store), store.chains
    assert {first: sorted(rows) for first, rows in drawn.items()} == {
        0: list(range(n // 2)), n // 2: list(range(n // 2, n))} and set(chains[: n // 2]) == {0}
    saved = torch.load(path, weights_only=True)
    floats = {k for k, v in saved.items() if v.is_floating_point()}
    assert floats and all(k.endswith(".scale") for k in floats)
    assert all(v.dtype == torch.int8 for k, v in saved.items() if k.endswith(".int8"))
    manifest = json.loads(path.with_suffix(".json").read_text())
    model, spec = load_generator(path, manifest)
    assert isinstance(model.generator, ChainGenerators) and len(model.generator.generators) == 2
    torch.testing.assert_close(model.generator.shares, torch.tensor([0.5, 0.5]))
    first = model.generator.generators[0].net[0].weight
    assert torch.equal(first, round_trip(first, "int8"))  # already on int8's grid: read back from it
    storage = manifest["storage"]
    assert storage["precision"] == "int8" and manifest["architecture"]["chains"] == 2
    assert storage["in_sgld_samples"] == round(in_samples(module_bytes(model, "int8"), spec.numel), 2)
    assert storage["in_sgld_samples"] < 0.3 * model.stored_parameters() / spec.numel
    assert set(manifest["selection"]["stored"]) >= {"criterion", "kl", "bald_gap"}
    assert APDGenerator(model, spec).storage_in_samples() == pytest.approx(storage["in_sgld_samples"], abs=0.005)


def test_a_generator_conditioned_on_the_chains_runs_from_the_cli_and_loads_as_evaluate_loads_it(pipeline, tmp_path):
    """``apd distill --set distill.mode_embedding=3`` on a store of two chains: the one generator reads each
    chain's embedding, its manifest counts the embeddings and shares in its storage, and ``apd.load`` gives
    the posterior evaluate judges, whose draws split between the chains by share."""
    import apd
    from apd.distillation.conditioned import ConditionedGenerator
    from apd.distillation.precision import in_samples, module_bytes

    root, config = pipeline
    copy_samples_as_two_chains(root, tmp_path)
    assert main(["distill", "--config", str(config), "--artifacts", str(tmp_path), "--quiet",
                 "--set", "distill.mode_embedding=3", "--set", "distill.steps=40"]) == 0
    path = tmp_path / "tiny" / "generator.pt"
    manifest = json.loads(path.with_suffix(".json").read_text())
    model, spec = load_generator(path, manifest)
    assert isinstance(model.generator, ConditionedGenerator) and model.generator.embedding.shape == (2, 3)
    assert (manifest["architecture"]["chains"], manifest["architecture"]["mode_embedding"]) == (2, 3)
    torch.testing.assert_close(model.generator.shares, torch.tensor([0.5, 0.5]))
    network = sum(t.numel() for t in model.generator.net.parameters())
    assert manifest["storage"]["generator_parameters"] == network + 2 * 3 + 2 + model.codec.stored_parameters()
    assert manifest["storage"]["in_sgld_samples"] == round(in_samples(module_bytes(model, "float32"), spec.numel), 2)
    post = apd.load(tmp_path / "tiny", "apd")
    assert post.storage_in_samples() == pytest.approx(manifest["storage"]["in_sgld_samples"], abs=0.005)
    assert post.predict_probs(torch.zeros(3, 64), 4).shape == (4, 3, 10)
    assert torch.bincount(post.model.generator.draw_chains(6), minlength=2).tolist() == [3, 3]


def test_a_generator_stored_at_int4_holds_two_codes_a_byte_and_is_read_back_from_them(pipeline, tmp_path):
    """precision int4: generator.pt holds packed 4-bit codes (uint8) and block scales only, and loads as the
    kept generator read back from int4, counted in those bytes."""
    from apd.distillation.precision import in_samples, module_bytes, module_tensors, round_trip
    from apd.pipeline import distill

    copy_samples(pipeline[0], tmp_path)
    ctx = tiny_context(tmp_path, distill={"precision": "int4", "steps": 20})
    path = distill.run_distill(ctx)
    saved = torch.load(path, weights_only=True)
    codes = {k: v for k, v in saved.items() if k.endswith(".int4")}
    assert codes and all(v.dtype == torch.uint8 for v in codes.values())
    assert all(k.endswith((".int4", ".scale")) for k, v in saved.items() if v.is_floating_point() or k in codes)
    manifest = json.loads(path.with_suffix(".json").read_text())
    model, spec = load_generator(path, manifest)
    weights = [t for t in module_tensors(model) if t.numel() > 1]  # the generator's and the codec's
    assert len(weights) > len(list(model.generator.parameters()))
    assert all(torch.equal(t, round_trip(t, "int4")) for t in weights)  # on int4's grid: read back from it
    assert manifest["storage"]["precision"] == "int4"
    assert manifest["storage"]["in_sgld_samples"] == round(in_samples(module_bytes(model, "int4"), spec.numel), 2)


def test_generator_networks_and_codec_mean_at_their_own_precision_are_saved_and_read_back_at_it(pipeline, tmp_path):
    """precision int4 with generators_at and mean_at int8: the codec's basis and scales are stored as 4-bit
    codes, its mean and the generator networks' as 8-bit ones; the loaded generator is on each tensor's grid,
    counted in those bytes, and judged once more as stored."""
    from apd.distillation.precision import PartPrecisions, in_samples, module_bytes, named_module_tensors, round_trip
    from apd.pipeline import distill

    copy_samples(pipeline[0], tmp_path)
    ctx = tiny_context(tmp_path, distill={"precision": "int4", "generators_at": "int8", "mean_at": "int8",
                                          "steps": 20})
    path = distill.run_distill(ctx)
    for name in ("generator.pt", "generator-last.pt"):
        saved = torch.load(path.with_name(name), weights_only=True)
        codes = {k.rsplit(".", 1)[0]: k.rsplit(".", 1)[1] for k in saved if k.endswith((".int4", ".int8"))}
        assert codes.pop("codec.mean") == "int8" and set(codes.values()) == {"int4", "int8"}, name
        assert all((precision == "int4") == k.startswith("codec.") for k, precision in codes.items()), name
    manifest = json.loads(path.with_suffix(".json").read_text())
    model, spec = load_generator(path, manifest)
    assert model.stored_as == PartPrecisions("int4", "int8", "int8")
    tensors = named_module_tensors(model)
    assert {name for name, _ in tensors} >= {"codec.mean", "codec.basis", "codec.scale"}
    for name, t in tensors:
        precision = "int4" if name in ("codec.basis", "codec.scale") else "int8"
        assert t.numel() == 1 or torch.equal(t, round_trip(t, precision)), name
    stored = (module_bytes(model.codec, lambda name: "int8" if name == "mean" else "int4")
              + module_bytes(model.generator, "int8"))
    assert model.stored_bytes() == stored < module_bytes(model, "int8")
    assert manifest["storage"]["generators_at"] == "int8" and manifest["architecture"]["generators_at"] == "int8"
    assert manifest["storage"]["mean_at"] == "int8" and manifest["architecture"]["mean_at"] == "int8"
    assert manifest["storage"]["in_sgld_samples"] == round(in_samples(stored, spec.numel), 2)
    assert set(manifest["selection"]["stored"]) >= {"criterion", "kl", "bald_gap", "accuracy"}


def test_matched_residual_is_saved_scaled(pipeline, tmp_path):
    """With the residual on, the saved codec holds α times the fitted per-weight scale, α from the
    matching (recorded in the manifest), in both saved generators."""
    from apd.distillation.codec import fit_codec
    from apd.distillation.residual import MAX_SCALE
    from apd.pipeline import distill

    copy_samples(pipeline[0], tmp_path)
    ctx = tiny_context(tmp_path, distill={"residual": {"model": "diagonal"}, "steps": 40})
    path = distill.run_distill(ctx)
    manifest = json.loads(path.with_name("generator.json").read_text())
    alpha = manifest["residual_scale"]
    assert 0.0 < alpha < MAX_SCALE and manifest["sgld_val_mean_bald"] > 0
    with SampleStore.open(path.with_name("samples.h5")) as store:
        fit = store.read(evenly_spaced(len(store), ctx.cfg.distill.fit_samples))
    fitted = fit_codec("subspace", fit, 8, residual=True, seed=ctx.cfg.seed).residual
    for name in ("generator.pt", "generator-last.pt"):
        saved = torch.load(path.with_name(name), weights_only=True)["codec.residual"]
        torch.testing.assert_close(saved, alpha * fitted, msg=name)


def test_aligned_distillation_permutes_what_the_codec_and_the_gan_see(pipeline, tmp_path):
    """align = "permutation": the codec is fit to the aligned fit samples, every store row (fit or not) is
    aligned to their mean, batches read from disk equal those held in memory, and the manifest says so."""
    from apd.distillation.alignment import align_set, permute
    from apd.distillation.training import StoreBatches, store_permutations
    from apd.pipeline import distill

    copy_samples(pipeline[0], tmp_path)
    ctx = tiny_context(tmp_path, distill={"align": "permutation", "fit_samples": 50, "steps": 40})
    path = distill.run_distill(ctx)
    record = json.loads(path.with_name("generator.json").read_text())["alignment"]
    assert record["method"] == "permutation" and record["fit_samples"] == 50
    assert record["mean_distance_after"] <= record["mean_distance_before"]
    spec = ParamSpec.from_module(mlp([64, 32, 10]))
    with SampleStore.open(path.with_name("samples.h5")) as store:
        rows = evenly_spaced(len(store), 50)
        fit = align_set(store.read(rows), spec)
        saved_mean = torch.load(path, weights_only=True)["codec.mean"]
        torch.testing.assert_close(saved_mean, fit.reference, atol=1e-5, rtol=0)
        perms = store_permutations(store, spec, rows, fit)
        assert len(perms) == len(store) > 50 and torch.equal(perms[rows], fit.perms)
        codec = _load_apd(path).model.codec
        batches = [StoreBatches(store, codec, 16, gb, 0, torch.device("cpu"), perms, spec) for gb in (4.0, 0.0)]
        assert batches[0].codes is not None and batches[1].codes is None
        torch.testing.assert_close(batches[0](), batches[1](), atol=1e-5, rtol=0)
        x = torch.randn(10, 64)
        theta = store.read_all()
        torch.testing.assert_close(predict_probs(spec, permute(theta, spec, perms), x), predict_probs(spec, theta, x),
                                   atol=1e-6, rtol=0)


def test_chains_in_other_unit_orders_are_aligned_chain_by_chain(tmp_path):
    """align = "chains": a second chain that is the first with its hidden units permuted (plus noise) gets
    one permutation for all its rows, which puts its mean back on the first chain's; functions unchanged."""
    from apd.config import DistillConfig
    from apd.distillation.alignment import hidden_activations, hidden_widths, permute
    from apd.pipeline.recipes import training_samples

    ctx = tiny_context(tmp_path)
    spec = ParamSpec.from_module(mlp(ctx.net_sizes))
    g = torch.Generator().manual_seed(0)
    with torch.random.fork_rng(devices=[]):  # a seeded init in which every hidden unit fires on some image:
        torch.manual_seed(1)  # units silent on all of them cannot be matched by activations (its docstring)
        theta = spec.flatten(mlp(ctx.net_sizes))
    assert bool((hidden_activations(theta, spec, ctx.data.x_train[:1000])[0].std(0) > 0).all())
    shuffle = torch.cat([torch.randperm(w, generator=g) for w in hidden_widths(spec)])
    centres = torch.stack([theta, permute(theta, spec, shuffle)])
    chains = np.repeat([0, 1], 12)
    rows = centres[torch.from_numpy(chains)] + 0.01 * torch.randn(24, spec.numel, generator=g)
    with SampleStore.create(tmp_path / "samples.h5", spec, {"test": True}) as s:
        s.append_many(rows, steps=np.arange(24), chains=chains)
    with SampleStore.open(tmp_path / "samples.h5") as store:
        data = training_samples(ctx, store, DistillConfig(align="chains", fit_samples=24))
    assert data.alignment["method"] == "chains" and data.alignment["chains"] == [0, 1]
    assert len(data.perms) == 24 and all(torch.equal(data.perms[i], data.perms[12]) for i in range(12, 24))
    aligned = permute(rows, spec, data.perms)
    gap = (aligned[12:].mean(0) - aligned[:12].mean(0)).norm() / (rows[12:].mean(0) - rows[:12].mean(0)).norm()
    assert gap < 0.05  # the second chain's mean lands on the first's
    assert data.alignment["mean_distance_after"][0] < 0.05 * data.alignment["mean_distance_before"][0]
    torch.testing.assert_close(data.fit, aligned)
    x = torch.randn(10, ctx.net_sizes[0], generator=g)
    torch.testing.assert_close(predict_probs(spec, aligned, x), predict_probs(spec, rows, x), atol=1e-6, rtol=0)


def test_kronecker_residual_round_trips_with_its_scale(pipeline, tmp_path):
    from apd.pipeline import distill

    copy_samples(pipeline[0], tmp_path)
    ctx = tiny_context(tmp_path, distill={"residual": {"model": "kronecker", "kronecker_rank": 10}, "steps": 40})
    path = distill.run_distill(ctx)
    alpha = json.loads(path.with_name("generator.json").read_text())["residual_scale"]
    assert alpha > 0
    for name in ("generator.pt", "generator-last.pt"):
        state = torch.load(path.with_name(name), weights_only=True)
        assert state["codec.kronecker.scale"].item() == pytest.approx(alpha) and state["codec.residual"].numel() == 0
        assert state["codec.kronecker.input_basis_0"].shape == (65, 10)  # the top 10 of 64 pixels + bias
    draws = _load_apd(path).sample_weights(3, torch.Generator().manual_seed(0))
    assert draws.shape == (3, ParamSpec.from_module(mlp([64, 32, 10])).numel) and torch.isfinite(draws).all()


def test_mixture_with_one_component_is_the_diagonal_gaussian(pipeline):
    root, _ = pipeline
    with SampleStore.open(root / "tiny" / "samples.h5") as store:
        samples = store.read_all()
        mixture = GaussianMixture(samples, 1, store.spec)
        torch.testing.assert_close(mixture.means[0], samples.mean(0), atol=1e-5, rtol=0)
        torch.testing.assert_close(mixture.stds[0], samples.std(0, unbiased=False), atol=1e-4, rtol=1e-3)
        sgld = SGLDSamples(store)
        rows = sgld.sample_weights(len(store), torch.Generator().manual_seed(0))
        assert torch.unique(rows, dim=0).shape[0] == len(store)  # without replacement


def test_mixture_is_fit_to_samples_spread_over_the_whole_store(pipeline):
    """MoG-1 fit to k of n samples is the Gaussian of the k evenly spaced rows (not the last k)."""
    root, _ = pipeline
    with SampleStore.open(root / "tiny" / "samples.h5") as store:
        rows = evenly_spaced(len(store), 50)
        assert rows[0] == 0 and rows[-1] == len(store) - 1 and len(rows) == 50
        mixture = fit_mixture(store, 1, 50, seed=0, device=torch.device("cpu"), perms=None)
        torch.testing.assert_close(mixture.means[0], store.read(rows).mean(0), atol=1e-5, rtol=0)


def test_mixture_is_fit_to_the_samples_aligned_as_apd_sees_them(tmp_path):
    """A store of one network in 16 hidden-unit orders: the MoG `apd evaluate` fits (its loader) sees the samples
    aligned as the generator does, one network, so its spread is near zero and its members compute the network's
    function; fit to the rows as stored, it spreads over the copies."""
    from contextlib import ExitStack

    from apd.distillation.alignment import hidden_widths, permute
    from apd.methods import MethodName
    from apd.pipeline.methods import METHODS, Sources
    from apd.pipeline.recipes import store_alignment

    ctx = tiny_context(tmp_path, distill={"align": "permutation", "fit_samples": 16},
                       evaluate={"mog_components": [1], "mog_fit_samples": 16})
    spec = ParamSpec.from_module(mlp(ctx.net_sizes))
    g = torch.Generator().manual_seed(0)
    theta = spec.flatten(mlp(ctx.net_sizes))
    rows = torch.stack([permute(theta, spec, torch.cat([torch.randperm(w, generator=g) for w in hidden_widths(spec)]))
                        for _ in range(16)])
    with SampleStore.create(ctx.layout.samples, spec, {"test": True}) as s:
        s.append_many(rows, steps=np.arange(16), chains=0)
    with ExitStack() as stack:
        sources = Sources(ctx, stack, spec)
        aligned = METHODS[MethodName.MOG].load(sources)
        as_stored = fit_mixture(sources.store, 1, 16, 0, torch.device("cpu"), perms=None)
        assert store_alignment(ctx, sources.store) is store_alignment(ctx, sources.store)  # prepared once a run
    assert float(aligned.stds.max()) < 1e-3 < 0.05 < float(as_stored.stds.mean())
    x = torch.randn(20, ctx.net_sizes[0], generator=g)
    torch.testing.assert_close(aligned.predict_probs(x, 3, torch.Generator().manual_seed(1)),
                               predict_probs(spec, theta[None], x).expand(3, -1, -1), atol=1e-3, rtol=0)


def test_generator_choice_is_recorded_with_its_criterion(pipeline):
    """generator.json names the criterion, its value at every evaluation and the step kept, which is the
    evaluation with the lowest criterion; no test or OOD data enter it."""
    root, _ = pipeline
    manifest = json.loads((root / "tiny" / "generator.json").read_text())
    selection, history = manifest["selection"], manifest["history"]
    assert [h["step"] for h in history] == [40, 80, 120]
    assert all(h["criterion"] == pytest.approx(h["kl"] + h["bald_gap"], abs=2e-6) for h in history)
    best = min(history, key=lambda h: h["criterion"])
    assert selection["kept_step"] == best["step"] and selection["rule"] == "function-space"
    assert "validation" in selection["criterion"]


@pytest.mark.slow
@pytest.mark.timeout(4 * 3600)
def test_default_digits_pipeline(tmp_path):
    """`make sample distill evaluate` on the default pipeline: APD keeps ≥ 98 % of SGLD's accuracy, and
    SGLD's and APD's BALD AUROC on gaussian and uniform noise beat MC dropout's."""
    ctx = RunContext(cfg=load_config("pipelines/digits.toml"), artifacts_root=tmp_path, quiet=True)
    from apd.pipeline.distill import run_distill
    from apd.pipeline.evaluate import run_evaluate
    from apd.pipeline.sample import run_sample

    run_sample(ctx)
    run_distill(ctx)
    results = run_evaluate(ctx)
    acc = results["accuracy"]
    assert acc["apd"]["acc"]["mean"] >= 0.98 * acc["sgld"]["acc"]["mean"]
    for ood in ("gaussian", "uniform"):
        bald = results["ood"][ood]["bald"]
        for method in ("sgld", "apd"):
            assert bald[method]["auroc"]["mean"] > bald["mcdropout"]["auroc"]["mean"]


@pytest.mark.slow
@pytest.mark.timeout(4 * 3600)
def test_online_distillation_on_digits(tmp_path):
    """Online APD (SGLD and WGAN-GP alternating, no sample store) keeps ≥ 97 % of the SGLD ensemble's
    test accuracy, 100 networks each, averaged over 10 draws."""
    from apd.metrics import accuracy
    from apd.pipeline.distill import run_distill
    from apd.pipeline.sample import sample_sgld

    overrides = ["distill.mode=online", "distill.align=none", "distill.mode_embedding=0", "distill.buffer_size=500",
                 "distill.t_sgld=10", "distill.t_gan=20", "distill.steps=3000"]  # online: no chains to tell apart
    ctx = RunContext(cfg=load_config("pipelines/digits.toml", overrides), artifacts_root=tmp_path, quiet=True)
    run_distill(ctx)
    assert not (tmp_path / "digits" / "samples.h5").exists()  # online needs no store
    apd = _load_apd(ctx.layout.generator)
    sample_sgld(ctx)
    generator, data = torch.Generator().manual_seed(0), ctx.data
    with SampleStore.open(tmp_path / "digits" / "samples.h5") as store:
        sgld = SGLDSamples(store)
        sgld_acc = sum(accuracy(sgld.predict_probs(data.x_test, 100, generator).mean(0), data.y_test)
                       for _ in range(10)) / 10
    apd_acc = sum(accuracy(apd.predict_probs(data.x_test, 100, generator).mean(0), data.y_test)
                  for _ in range(10)) / 10
    print(f"online APD {apd_acc:.4f} vs SGLD {sgld_acc:.4f}: {apd_acc / sgld_acc:.4f}")
    assert apd_acc >= 0.97 * sgld_acc


def test_online_distillation_runs_without_a_store_draws_its_own_stream_and_is_reused(tmp_path, capsys):
    """Online distillation on the CPU from the command line, the tiny pipeline's chains feeding a buffer of 60
    between GAN rounds: no store is written, the generator holds more samples than the buffer's warm-up (the
    chains went on between rounds), a second run reuses it, and a run in another folder trains the same
    generator to the bit (its chains, batches and GAN draw from the named streams alone)."""
    raw = json.loads(json.dumps(TINY))
    raw["distill"] |= {"mode": "online", "align": "none", "buffer_size": 60, "t_sgld": 10, "t_gan": 20}
    config = tmp_path / "tiny.toml"
    config.write_text(toml(raw))
    generators = []
    for root in (tmp_path / "a", tmp_path / "b"):
        assert main(["distill", "--config", str(config), "--artifacts", str(root), "--quiet"]) == 0
        assert not (root / "tiny" / "samples.h5").exists()
        summary = json.loads((root / "tiny" / "generator.json").read_text())
        assert summary["sgld_samples_seen"] >= 60 + 10 * (TINY["distill"]["steps"] // 20 - 1)
        generators.append(torch.load(root / "tiny" / "generator.pt", weights_only=True))
    assert generators[0].keys() == generators[1].keys()
    assert all(torch.equal(generators[0][name], generators[1][name]) for name in generators[0])
    capsys.readouterr()
    assert main(["distill", "--config", str(config), "--artifacts", str(tmp_path / "a")]) == 0
    assert "reusing" in capsys.readouterr().err


@pytest.mark.cuda
def test_tiny_pipeline_runs_on_cuda(tmp_path):
    """Every stage on a CUDA device, every random draw into a device tensor from a generator on that
    device (a CPU generator for a CUDA tensor fails); residuals and mixtures included."""
    raw = json.loads(json.dumps(TINY))
    raw["distill"]["residual"] = {"model": "kronecker", "kronecker_rank": 10}
    raw["evaluate"]["adversarial"] = {"enabled": True, "examples": 20, "samples": 10, "whitebox_examples": 10}
    config = tmp_path / "tiny.toml"
    config.write_text(toml(raw))
    for stage in ("sample", "distill", "evaluate"):
        assert main([stage, "--config", str(config), "--artifacts", str(tmp_path), "--device", "cuda", "--quiet"]) == 0
    results = json.loads((tmp_path / "tiny" / "eval" / "results.json").read_text())
    assert results["device"].startswith("cuda") and results["accuracy"]["apd"]["acc"]["mean"] > 0.8


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_the_tiny_pipeline_with_fashion_fc1s_settings_runs(tmp_path, device):
    """The settings of fcNN1's pipeline that the tiny pipeline lacks, every stage on the CPU (``--device cpu``)
    and on a CUDA device with no flag (``device = "auto"`` picks it): two chains from the prior, aligned
    samples, one generator per chain stored at float16, two generator seeds (trained as one batch on a card),
    the burn-in from the trace (SGLD's samples after it set against APD's in the aligned frame), the attacks; a
    short check before fcNN1 itself."""
    raw = json.loads(json.dumps(TINY))
    raw["sgld"] |= {"chains": 2, "workers": 2, "init": "prior"}
    raw["distill"] |= {"per_chain": True, "align": "permutation", "precision": "float16", "seeds": 2, "workers": 2}
    raw["evaluate"] |= {"burn_in_from_trace": True,
                        "adversarial": {"enabled": True, "examples": 20, "samples": 10, "whitebox_examples": 10}}
    config = tmp_path / "tiny.toml"
    config.write_text(toml(raw))
    for stage in ("sample", "distill", "evaluate"):
        flags = ["--device", "cpu"] if device == "cpu" else []
        assert main([stage, "--config", str(config), "--artifacts", str(tmp_path), "--quiet", *flags]) == 0
    root = tmp_path / "tiny"
    results = json.loads((root / "eval" / "results.json").read_text())
    assert results["device"].startswith(device) and results["replicates"]["apd"]["seeds"] == 2
    assert results["fidelity"]["apd"]["sgld_frame"] == "aligned"
    batched = [json.loads((root / name).read_text()).get("trained_with_seeds")
               for name in ("generator.json", "generator-seed1.json")]
    assert batched == ([[0, 1]] * 2 if device == "cuda" else [None, None])  # one worker per seed on a CPU


@pytest.mark.cuda
@pytest.mark.parametrize(("sgld", "distill", "stages"), [
    ({}, {"mode": "online", "align": "none", "buffer_size": 100, "t_sgld": 10, "t_gan": 20}, ("distill",)),
    ({"chains": 2}, {"mode_embedding": 4}, ("sample", "distill")),
], ids=["online", "told-its-chain"])
def test_online_and_chain_told_distillation_run_on_cuda(tmp_path, sgld, distill, stages):
    """Online distillation (the chains' and the GAN's recorded steps replayed in turn on one card) and one
    generator told its chain (its own recorded GAN step) distill on a CUDA device with no flags."""
    raw = json.loads(json.dumps(TINY))
    raw["sgld"] |= sgld
    raw["distill"] |= distill
    config = tmp_path / "tiny.toml"
    config.write_text(toml(raw))
    for stage in stages:
        assert main([stage, "--config", str(config), "--artifacts", str(tmp_path), "--quiet"]) == 0
    assert json.loads((tmp_path / "tiny" / "generator.json").read_text())["machine"]["device"].startswith("cuda")


def test_a_convolutional_pipeline_runs_every_stage(tmp_path, capsys):
    """``net.conv``: SGLD, the baselines, the peers, APD and the evaluation (attacks included) on a LeNet-style
    CNN; every artifact holds the CNN's weights, and the API rebuilds its baselines from their manifests."""
    from apd.api import load

    raw = json.loads(json.dumps(TINY))
    raw["net"] = {"conv": [4], "hidden": [32]}  # 8 × 8 digits → 4 maps of 4 × 4 → 32 → 10
    raw["evaluate"]["methods"] = ["sgd", "mcdropout", "sgld", "apd", "mog", "kept", "stein", "swag", "ensemble"]
    raw["evaluate"].update(yardstick_sizes=[2], figures=False)
    raw["evaluate"]["adversarial"] = {"enabled": True, "examples": 20, "samples": 10, "whitebox_examples": 10}
    config = tmp_path / "tiny.toml"
    config.write_text(toml(raw))
    for stage in ("sample", "distill", "evaluate"):
        assert main([stage, "--config", str(config), "--artifacts", str(tmp_path), "--quiet"]) == 0
    with SampleStore.open(tmp_path / "tiny" / "samples.h5") as store:
        assert store.spec.conv_layers() == [(0, 100, 4, 1)] and store.spec.numel == 104 + 64 * 32 + 32 + 330
    results = json.loads((tmp_path / "tiny" / "eval" / "results.json").read_text())
    accuracy = {m: results["accuracy"][m]["acc"]["mean"] for m in ("sgld", "apd", "sgd", "swag", "ensemble")}
    assert min(accuracy.values()) > 0.8, accuracy
    sgd = load(tmp_path / "tiny", "sgd")
    assert not sgd.spec.is_mlp and sgd.predict_probs(torch.zeros(3, 64), 1).shape == (1, 3, 10)
    # the studies that build MLPs of their own say so in one line
    assert main(["experiment", "modes", "--config", str(config), "--artifacts", str(tmp_path), "--quiet"]) == 2
    assert "`apd experiment modes` is for MLPs" in capsys.readouterr().err


def test_other_libraries_info_stays_quiet_and_ours_is_shown(capsys):
    """A library's INFO note (laplace-torch logs one on the root logger when imported) never reaches the user;
    our INFO does, and --quiet keeps our warnings only."""
    import logging

    from apd.pipeline.runtime import setup_logging

    try:
        setup_logging(quiet=False)
        logging.info("a library's note")
        logging.getLogger("apd.pipeline.sample").info("our progress")
        logging.getLogger("some.library").warning("a library's warning")
        err = capsys.readouterr().err
        assert "our progress" in err and "a library's warning" in err and "a library's note" not in err
        setup_logging(quiet=True)
        logging.getLogger("apd.pipeline.sample").info("hidden")
        logging.getLogger("apd.pipeline.sample").warning("shown")
        err = capsys.readouterr().err
        assert "hidden" not in err and "shown" in err
    finally:
        logging.basicConfig(level=logging.WARNING, force=True)


def test_a_methods_numbers_do_not_depend_on_the_other_methods_compared(pipeline, tmp_path):
    root, config = pipeline
    results = {}
    for methods in (["sgld", "mog"], ["sgld", "modes", "mog"]):
        out = tmp_path / "-".join(methods)
        copy_samples(root, out)
        assert main(["evaluate", "--config", str(config), "--artifacts", str(out), "--quiet",
                     "--set", f"evaluate.methods={json.dumps(methods)}", "--set", "evaluate.yardstick_sizes=[1]",
                     "--set", "evaluate.figures=false"]) == 0
        results[len(methods)] = json.loads((out / "tiny" / "eval" / "results.json").read_text())
    alone, beside = results[2], results[3]
    assert "modes" in beside["accuracy"] and "modes" not in alone["accuracy"]
    for name in ("sgld", "mog"):
        assert alone["accuracy"][name] == beside["accuracy"][name]
        assert all(alone["ood"][s][score][name] == beside["ood"][s][score][name]
                   for s in alone["ood"] for score in alone["ood"][s])
    assert alone["fidelity"]["mog"] == beside["fidelity"]["mog"]
    k = str(alone["yardstick"]["equal_storage"]["mog"]["k"])
    assert alone["yardstick"]["kept"][k] == beside["yardstick"]["kept"][k]


def test_a_method_fit_to_aligned_samples_is_set_against_sgld_aligned(pipeline, tmp_path):
    root, config = pipeline
    copy_samples(root, tmp_path)
    assert main(["evaluate", "--config", str(config), "--artifacts", str(tmp_path), "--quiet",
                 "--set", 'evaluate.methods=["sgld", "mog"]', "--set", 'distill.align="permutation"',
                 "--set", "evaluate.yardstick_sizes=[1]", "--set", "evaluate.figures=false"]) == 0
    results = json.loads((tmp_path / "tiny" / "eval" / "results.json").read_text())
    assert results["fidelity"]["mog"]["sgld_frame"] == "aligned"
    assert results["fidelity"]["mog"]["bald_members"] == results["ensemble"]["mog"]


def _tiny_apd_at_int8(root: Path) -> tuple[RunContext, dict, APDGenerator, APDGenerator]:
    """The tiny pipeline's context and evaluation results, and its generator (as loaded, and as a method)
    stored at int8."""
    from apd.distillation.precision import PartPrecisions

    model = _load_apd(root / "tiny" / "generator.pt")
    model.model.stored_as = PartPrecisions("int8")
    return (tiny_context(root), json.loads((root / "tiny" / "eval" / "results.json").read_text()), model,
            APDGenerator(model.model, model.spec))


def test_a_method_stored_at_int8_meets_float32_kept_samples_and_the_int8_ones_its_storage_buys(pipeline, caplog):
    """The yardstick sets a generator stored at int8 (storage S) against ⌈S⌉ float32 samples, against the
    ⌈S / s_int8⌉ samples that int8 buys (each stored at int8) and against the fewest stored at int8 about their
    chains' means (the means at int8, their bytes counted) that take S; all show in the tables, and the
    progress names each set as it is judged."""
    from apd.distillation.precision import PartPrecisions, in_samples, stored_bytes
    from apd.evaluation.yardstick import reference_sums
    from apd.pipeline.comparison_tables import kept_comparisons, yardstick_table
    from apd.pipeline.evaluate import sgld_reference, yardstick
    from apd.pipeline.recipes import evaluation_inputs

    root, _ = pipeline
    ctx, results, model, method = _tiny_apd_at_int8(root)
    assert method.precision == "int8" and method.mean_precision == "int8"
    model.model.stored_as = PartPrecisions("int4", mean="int8")  # the means kept beside APD's: at its own mean's
    assert (method.precision, method.mean_precision) == ("int4", "int8")
    model.model.stored_as = PartPrecisions("int8")
    worth, dim = method.storage_in_samples(), model.spec.numel
    inputs = evaluation_inputs(ctx)
    with SampleStore.open(root / "tiny" / "samples.h5") as store:
        stored = StoredPredictions(store, inputs.stacked("cpu"), "cpu")
        reference = sgld_reference(results, reference_sums(stored, inputs, ctx.cfg.evaluate.yardstick_reference))
        with caplog.at_level(logging.INFO):
            y = yardstick(ctx, {"apd": method}, inputs, reference, stored)
        chains = len(set(store.chains))
    entry = y["equal_storage"]["apd"]
    k_int8 = math.ceil(worth / in_samples(stored_bytes(dim, "int8"), dim) - 1e-9)
    assert entry["k"] == math.ceil(worth) and entry["at_precision"] == {"precision": "int8", "k": k_int8,
                                                                         "key": f"{k_int8} int8"}
    assert k_int8 > 3 * entry["k"]
    one = stored_bytes(dim, "int8")
    k_around = next(k for k in range(1, k_int8 + 1) if (k + min(k, chains)) * one >= worth * 4 * dim)
    around = f"{k_around} int8 around chain means at int8"
    assert entry["around_means"] == {"precision": "int8", "mean_at": "int8", "k": k_around, "key": around}
    assert entry["k"] < k_around < k_int8
    curve = [str(r["k"]) for r in y["curve"]]
    expected = curve + ([] if str(entry["k"]) in curve else [str(entry["k"])]) + [f"{k_int8} int8", around]
    assert [m for m in caplog.messages if m.startswith("yardstick: ")] == [
        f'yardstick: judging kept samples "{key}"' for key in expected]
    assert list(y["kept"]) == sorted(expected[:-2], key=int) + expected[-2:]
    row = y["kept"][f"{k_int8} int8"]
    assert row["precision"] == "int8" and row["k"] == k_int8 and row["in_sgld_samples"] <= worth + 0.27
    assert y["kept"][around]["precision"] == "int8 around chain means at int8"
    assert worth <= y["kept"][around]["in_sgld_samples"] <= worth + 0.27
    assert [size for size, _, _ in kept_comparisons(y, "apd")] == [str(entry["k"]), f"{k_int8} int8", around]
    table = yardstick_table({**results, "yardstick": y, "quality": {}})
    assert list(dict.fromkeys(r[2] for r in table.rows)) == [str(entry["k"]), f"{k_int8} int8", around]
    # the margins table gives, beside each comparison, what SGLD's own ensemble wins against the same samples
    from apd.evaluation.yardstick import ranks_over_kept
    from apd.pipeline.comparison_tables import kept_margins_table

    reference, sgld = y["reference"], results["quality"]["sgld"]  # SGLD's gaps per draw
    found = ranks_over_kept(sgld["set_gaps"], sgld["nll_gap"], row,
                            {"bald": reference["bald_auroc"], "max_prob": reference["max_prob_auroc"]})
    margins = kept_margins_table({**results, "yardstick": y}).markdown
    line = next(text for text in margins.splitlines()
                if text.startswith("| APD | ") and f"| {k_int8} int8 | BALD" in text)
    assert line.rstrip(" |").endswith(f"| {found['wins']}/{found['compared']}")


def test_the_yardstick_keeps_one_storage_after_another_where_only_one_fits(pipeline, monkeypatch):
    """With room for one storage's predictions of the whole store, the yardstick of a method stored at int8
    predicts each stored sample at most once per storage (float32, int8, int8 about the chains' means: each
    storage's predictions give way to the next one's), and its numbers are those judged with room for all."""
    from apd.evaluation.yardstick import reference_sums
    from apd.pipeline.evaluate import sgld_reference, yardstick
    from apd.pipeline.recipes import evaluation_inputs
    from tests.tiny_pipeline import counted_predictions, one_storage

    root, _ = pipeline
    ctx, results, _, method = _tiny_apd_at_int8(root)
    inputs = evaluation_inputs(ctx)
    with SampleStore.open(root / "tiny" / "samples.h5") as store:
        roomy = StoredPredictions(store, inputs.stacked("cpu"), "cpu")
        reference = sgld_reference(results, reference_sums(roomy, inputs, ctx.cfg.evaluate.yardstick_reference))
        with_room = yardstick(ctx, {"apd": method}, inputs, reference, roomy)
        predicted = counted_predictions(monkeypatch)
        tight = StoredPredictions(store, inputs.stacked("cpu"), "cpu", kept_bytes=one_storage(root))
        assert yardstick(ctx, {"apd": method}, inputs, reference, tight) == with_room
        assert {key.split(" ", 1)[-1] for key in with_room["kept"] if " " in key} == {
            "int8", "int8 around chain means at int8"}
        assert 2 * len(store) < sum(predicted) <= 3 * len(store)


def test_the_mode_mixture_weighs_each_chains_aligned_mean_against_its_plain_one(pipeline, tmp_path):
    root, config = pipeline
    out = tmp_path / "aligned"
    copy_samples(root, out)
    assert main(["evaluate", "--config", str(config), "--artifacts", str(out), "--quiet",
                 "--set", 'evaluate.methods=["sgld", "modes"]', "--set", 'distill.align="permutation"',
                 "--set", "evaluate.yardstick_sizes=[1]", "--set", "evaluate.figures=false"]) == 0
    results = json.loads((out / "tiny" / "eval" / "results.json").read_text())
    modes = results["peers"]["modes"]
    assert modes["align"] == "permutation" and len(modes["aligned"]) == 1  # the tiny store's one chain
    as_stored, aligned = modes["val_nll"]["as_stored"][0], modes["val_nll"]["aligned"][0]
    assert modes["aligned"][0] == (aligned < as_stored) or aligned == as_stored  # (rounded to 4 places)
    tables = (out / "tiny" / "eval" / "tables.md").read_text()
    assert "| mode mixture | each chain's mean |" in tables
    assert f"chain 0: {as_stored:.3f} as stored, {aligned:.3f} aligned" in tables


def test_an_evaluation_without_figures_writes_its_tables_and_a_reuse_draws_them_later(pipeline, tmp_path):
    """``evaluate.figures = false``: the tables and no figure, under the stage hash the figures' run has (the
    setting changes no number, nor does ``evaluate.threads``, which the results record as the evaluation ran
    on it); reusing it with figures draws them from the same files, reusing it again keeps them, and `apd
    report` draws them again."""
    from apd.config import config_hash

    root, config = pipeline
    copy_samples(root, tmp_path)
    settings = ["--set", 'evaluate.methods=["sgld", "modes"]', "--set", "evaluate.yardstick_sizes=[1]"]
    argv = ["--config", str(config), "--artifacts", str(tmp_path), "--quiet", *settings]
    assert main(["evaluate", *argv, "--set", "evaluate.figures=false", "--set", "evaluate.threads=2"]) == 0
    eval_dir = tmp_path / "tiny" / "eval"
    assert (eval_dir / "tables.md").is_file() and not (eval_dir / "figures").exists()
    results = json.loads((eval_dir / "results.json").read_text())
    assert results["machine"]["threads"] == 2 != torch.get_num_threads()  # [evaluate] threads, while evaluating
    drawn = tiny_context(tmp_path, evaluate={"methods": ["sgld", "modes"], "yardstick_sizes": [1], "figures": True}).cfg
    assert json.loads((eval_dir / "evaluate.json").read_text())["config_hash"] == config_hash(drawn, "evaluate")
    assert main(["evaluate", *argv]) == 0  # reused, and the figures it lacks drawn
    drawn = {path.name: path.stat().st_mtime_ns for path in (eval_dir / "figures").glob("*.png")}
    assert set(drawn) >= {"hist_bald.png", "reliability.png", "storage_quality.png"}
    assert main(["evaluate", *argv]) == 0  # reused again: the figures kept as they are
    assert {path.name: path.stat().st_mtime_ns for path in (eval_dir / "figures").glob("*.png")} == drawn
    time.sleep(0.01)
    assert main(["report", *argv]) == 0  # drawn again
    assert all(path.stat().st_mtime_ns > drawn[path.name] for path in (eval_dir / "figures").glob("*.png"))


def _seeds_in_turn_and_together(root: Path, tmp_path: Path, monkeypatch, settings: dict,
                                device: str = "cpu") -> list[tuple[dict, dict, dict, dict]]:
    """Generator seeds 0 and 1 of ``settings`` distilled from the tiny pipeline's samples (two chains) in turn
    and as one batch (:func:`~apd.pipeline.distill.trains_seeds_together` made to say so); each seed's
    generator files and manifests, in turn and together."""
    from apd.pipeline import distill

    for how, together in (("turn", False), ("together", True)):
        copy_samples_as_two_chains(root, tmp_path / how)
        monkeypatch.setattr(distill, "trains_seeds_together", lambda ctx, seeds, together=together: together)
        cfg = tiny_context(tmp_path / how, distill={**settings, "seeds": 2}).cfg
        distill.run_distill(RunContext(cfg=cfg, artifacts_root=tmp_path / how, device_name=device, quiet=True))
    def files(how: str, suffix: str) -> tuple[dict, dict]:
        generator = tmp_path / how / "tiny" / f"generator{suffix}.pt"
        return torch.load(generator, weights_only=True), json.loads(generator.with_suffix(".json").read_text())

    return [(*files("turn", suffix), *files("together", suffix)) for suffix in ("", "-seed1")]


@pytest.mark.parametrize(("settings", "tolerance"), [({"per_chain": True}, {"rtol": 1e-5, "atol": 1e-6}),
                                                     ({}, {"rtol": 1e-3, "atol": 1e-4})])
def test_generator_seeds_trained_as_one_batch_are_the_seeds_trained_in_turn(pipeline, tmp_path, monkeypatch,
                                                                            settings, tolerance):
    """Trained as one stack, each seed's GANs draw from their own streams as they do alone, so each seed's
    generator, judged steps and kept step are those of the seed trained alone, to float rounding: one per
    chain, the stack of both seeds' four GANs against each seed's stack of two (the same batched kernels); one
    generator, a stack of two against one unstacked GAN each (other kernels, so rounding parts them more).
    Each manifest records the seeds it trained with, the seconds being the group's. ``in_memory_gb`` bounds
    what the stage holds at once: one seed's codes fit it, so the seeds in turn hold theirs; two do not, so
    together each reads its batches from the store (the same batches)."""
    from apd.distillation.training import StoreBatches

    held, real_init = [], StoreBatches.__init__

    def recording_init(self, *args, **kwargs) -> None:
        real_init(self, *args, **kwargs)
        held.append(self.codes is not None)

    monkeypatch.setattr(StoreBatches, "__init__", recording_init)
    with SampleStore.open(pipeline[0] / "tiny" / "samples.h5") as store:
        one_seed_gb = len(store) * TINY["distill"]["subspace_rank"] * 4 / 2**30
    settings = {**settings, "in_memory_gb": 1.5 * one_seed_gb}
    for turn, turn_record, together, together_record in _seeds_in_turn_and_together(pipeline[0], tmp_path,
                                                                                    monkeypatch, settings):
        assert set(turn) == set(together)
        for key, value in turn.items():
            torch.testing.assert_close(together[key], value, msg=key, **tolerance)
        assert together_record["selection"]["kept_step"] == turn_record["selection"]["kept_step"]
        for mine, theirs in zip(together_record["history"], turn_record["history"], strict=True):
            assert mine == pytest.approx(theirs, rel=tolerance["rtol"] * 10, abs=1e-5)
        assert together_record["trained_with_seeds"] == [0, 1] and "trained_with_seeds" not in turn_record
    assert held == [True, True, False, False]


@pytest.mark.cuda
def test_generator_seeds_trained_as_one_batch_on_cuda_are_the_seeds_trained_in_turn(pipeline, tmp_path, monkeypatch):
    """On a CUDA device (where the seeds train as one batch unasked), the stack's recorded CUDA graph gives each
    seed the generator and kept step it has trained alone there, to float rounding (which Adam can grow into
    steps of its learning rate, 1e-3, on a coordinate whose gradient nearly cancels; on the CPU the other seed's
    generator is 0.2 or more away in every weight tensor)."""
    from apd.pipeline import distill

    assert distill.trains_seeds_together(tiny_context(tmp_path, distill={"per_chain": True, "seeds": 2}), [0, 1])
    for turn, turn_record, together, together_record in _seeds_in_turn_and_together(
            pipeline[0], tmp_path, monkeypatch, {"per_chain": True}, device="cuda"):
        for key, value in turn.items():
            torch.testing.assert_close(together[key], value, msg=key, rtol=1e-3, atol=5e-3)
        assert together_record["selection"]["kept_step"] == turn_record["selection"]["kept_step"]
        assert together_record["machine"]["device"].startswith("cuda")


def test_generator_seeds_are_trained_and_judged_each_on_its_own(pipeline, tmp_path):
    """``[distill] seeds = 2`` on the tiny pipeline's artifacts: seed 0 is the generator already there (reused),
    seed 1 is trained into generator-seed1.pt from its own streams, and each seed is the same whether 2 or 3
    are trained, here or (3: seeds 1 and 2 on two worker processes) elsewhere; `apd evaluate` judges both,
    seed 0 as the main tables judge APD, with the spread across seeds a sample std (ddof 1) and a win counted
    only where both seeds win; `apd.load` gives either seed."""
    import shutil

    import apd
    from apd.pipeline import distill
    from apd.pipeline.evaluate import run_evaluate
    from apd.pipeline.manifests import file_digest

    root = pipeline[0] / "tiny"
    two, three = tmp_path / "two", tmp_path / "three"
    for target in (two, three):
        shutil.copytree(root, target / "tiny", ignore=shutil.ignore_patterns("eval", "experiments"))
    ctx = tiny_context(two, distill={"seeds": 2}, evaluate={"methods": ["sgld", "apd"], "figures": False})
    distill.run_distill(ctx)
    on_two = tiny_context(three, distill={"seeds": 3, "workers": 2})
    on_two.cfg.threads = torch.get_num_threads()  # the workers compute on the threads this process does
    distill.run_distill(on_two)
    for target in (two, three):  # seed 0, the pipeline's one generator, is reused
        assert file_digest(target / "tiny" / "generator.pt") == file_digest(root / "generator.pt")
    assert not (two / "tiny" / "generator-seed2.pt").exists()
    ours, theirs = (torch.load(d / "tiny" / "generator-seed1.pt", weights_only=True) for d in (two, three))
    assert all(torch.equal(ours[key], theirs[key]) for key in ours)
    seeds = [json.loads((three / "tiny" / f"generator{s}.json").read_text()) for s in ("", "-seed1", "-seed2")]
    assert [m["generator_seed"] for m in seeds] == [0, 1, 2] and len({m["files"]["generator.pt" if i == 0 else
                                                                           f"generator-seed{i}.pt"]
                                                                          for i, m in enumerate(seeds)}) == 3

    results = run_evaluate(ctx)
    entry = results["replicates"]["apd"]
    assert entry["seeds"] == 2 and [s["generator"] for s in entry["per_seed"]] == ["generator.pt", "generator-seed1.pt"]
    first, second = entry["per_seed"]
    for key in ("bald_gap", "nll_gap", "kl", "kl_ood"):
        assert first[key] == pytest.approx(results["quality"]["apd"][key])
        assert entry["values"][key]["std"] == pytest.approx(np.std([first[key], second[key]], ddof=1))
    size = str(results["yardstick"]["equal_storage"]["apd"]["k"])
    found = entry["against"][size]
    for key, count in found["beats"].items():
        per_seed = [s["against"][size]["standings"][key] for s in (first, second)]
        assert count == sum(p["beats"] for p in per_seed)
    assert found["wins"] == [s["against"][size]["set_by_set"]["wins"] for s in (first, second)]
    tables = (two / "tiny" / "eval" / "tables.md").read_text()
    assert "## Generator seeds" in tables and "Across its 2 generator seeds, APD" in tables

    x = 2 * torch.rand(5, 64) - 1
    draws = [apd.load(two / "tiny", "apd", seed=k).predict_probs(x, 2, torch.Generator().manual_seed(0))
             for k in (0, 1)]
    assert not torch.allclose(draws[0], draws[1])
    with pytest.raises(ValueError, match="generator seeds"):
        apd.load(two / "tiny", "sgld", seed=1)

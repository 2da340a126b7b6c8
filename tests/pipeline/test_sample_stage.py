from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from apd.cli import main
from apd.config_load import from_dict
from apd.errors import DivergenceError
from apd.nets import mlp
from apd.pipeline.layout import checkpoint_of, manifest_of, partial_of
from apd.pipeline.runtime import RunContext
from apd.pipeline.sample import run_sample, sample_sgld
from apd.samplers import chain as chain_module
from apd.samplers.store import SampleStore

SMALL = {
    "name": "small",
    "data": {"dataset": "digits", "train_size": 1000, "val_size": 300},
    "net": {"hidden": [16]},
    "sgld": {"lr": 0.1, "prior_var": 0.1, "iterations": 600, "burn_in": 100, "thin": 10, "chains": 2,
             "eval_every": 100, "checkpoint_every": 200},
    "baselines": {"epochs": 10, "lr": 0.2, "mc_passes": 5},
}


def context(tmp_path, **overrides) -> RunContext:
    raw = {key: (dict(value) if isinstance(value, dict) else value) for key, value in SMALL.items()}
    for section, values in overrides.items():
        raw[section] = {**raw.get(section, {}), **values}
    return RunContext(cfg=from_dict(raw), artifacts_root=tmp_path, quiet=True)


def read_store(path):
    with SampleStore.open(path) as store:
        return store.read_all().numpy(), store.steps, store.chains


def test_sampling_stores_thinned_chains(tmp_path):
    ctx = context(tmp_path)
    sample_sgld(ctx)
    samples, steps, chains = read_store(ctx.layout.samples)
    per_chain = (600 - 100) // 10
    assert samples.shape == (2 * per_chain, 64 * 16 + 16 + 16 * 10 + 10)
    assert steps[:per_chain].tolist() == list(range(109, 600, 10))
    assert chains.tolist() == [0] * per_chain + [1] * per_chain
    assert np.isfinite(samples).all()
    assert not np.array_equal(samples[0], samples[per_chain])  # chains start from different points
    with SampleStore.open(ctx.layout.samples) as store:
        assert store.meta["dataset"] == "digits" and store.meta["num_data"] == 1000
        assert np.isfinite(store.log_liks).all() and (store.log_liks < 0).all()


def test_interrupted_and_resumed_run_stores_the_same_samples(tmp_path, monkeypatch):
    reference = context(tmp_path / "a")
    sample_sgld(reference)
    expected = read_store(reference.layout.samples)

    ctx = context(tmp_path / "b")
    real_append, calls = SampleStore.append_many, []

    def append_then_interrupt(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 25:  # iteration 349, after the checkpoint at iteration 200 (10 kept iterations before it)
            raise KeyboardInterrupt
        return real_append(self, *args, **kwargs)

    monkeypatch.setattr(SampleStore, "append_many", append_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        sample_sgld(ctx)
    monkeypatch.setattr(SampleStore, "append_many", real_append)
    assert checkpoint_of(ctx.layout.samples).is_file() and partial_of(ctx.layout.samples).is_file()
    assert not manifest_of(ctx.layout.samples).exists() and not ctx.layout.samples.exists()
    sample_sgld(ctx)
    resumed = read_store(ctx.layout.samples)
    for got, want in zip(resumed, expected, strict=True):
        np.testing.assert_array_equal(got, want)
    assert not checkpoint_of(ctx.layout.samples).exists() and not partial_of(ctx.layout.samples).exists()


def test_complete_stage_is_reused_and_force_redoes_it(tmp_path, caplog):
    ctx = context(tmp_path, sgld={"chains": 1})
    sample_sgld(ctx)
    stamp = ctx.layout.samples.stat().st_mtime_ns
    with caplog.at_level("INFO"):
        sample_sgld(ctx)
    assert "reusing" in caplog.text
    assert ctx.layout.samples.stat().st_mtime_ns == stamp
    ctx.force = True
    sample_sgld(ctx)
    assert ctx.layout.samples.stat().st_mtime_ns != stamp


def test_divergence_is_one_clear_error_and_leaves_the_complete_store(tmp_path, monkeypatch):
    """A resample that diverges stops with one clear error; the complete store from before is unchanged."""
    ctx = context(tmp_path, sgld={"chains": 1})
    sample_sgld(ctx)
    before = ctx.layout.samples.read_bytes(), manifest_of(ctx.layout.samples).read_bytes()
    ctx.force = True
    real_append, calls = SampleStore.append_many, []

    def poison_after_ten(self, *args, **kwargs):
        calls.append(1)
        index = real_append(self, *args, **kwargs)
        if len(calls) == 10:
            raise_nan.append(True)
        return index

    raise_nan: list[bool] = []
    real_update = chain_module.langevin_update_

    def update_with_nan(params, *args):
        real_update(params, *args)
        if raise_nan:
            for p in params:
                p.fill_(math.nan)

    monkeypatch.setattr(SampleStore, "append_many", poison_after_ten)
    monkeypatch.setattr(chain_module, "langevin_update_", update_with_nan)
    with pytest.raises(DivergenceError, match=r"SGLD diverged at iteration \d+ .*smaller sgld.lr"):
        sample_sgld(ctx)
    assert (ctx.layout.samples.read_bytes(), manifest_of(ctx.layout.samples).read_bytes()) == before


def test_cli_divergence_exit_code(tmp_path, capsys):
    config = tmp_path / "diverge.toml"
    config.write_text('name = "d"\n[data]\ntrain_size = 1000\nval_size = 300\n'
                      '[sgld]\nlr = 1e7\niterations = 300\nburn_in = 10\nthin = 10\n')
    code = main(["sample", "--config", str(config), "--artifacts", str(tmp_path), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and "diverged" in err[0] and "smaller sgld.lr" in err[0]


def test_baselines_are_plain_state_dicts(tmp_path):
    ctx = context(tmp_path, sgld={"chains": 1, "iterations": 200})
    run_sample(ctx)
    for name, dropout in (("sgd", 0.0), ("mcdropout", 0.5)):
        state = torch.load(ctx.layout.baseline(name), weights_only=True)
        net = mlp([64, 16, 10], dropout=dropout)
        net.load_state_dict(state)
        net.eval()
        accuracy = (net(ctx.data.x_test).argmax(-1) == ctx.data.y_test).float().mean()
        assert accuracy > 0.7


@pytest.mark.slow
def test_digits_pipeline_sgld_beats_sgd_on_nll(tmp_path):
    """The default digits pipeline: SGLD's 100-sample ensemble has a lower test NLL than SGD and an
    accuracy within 1 point of it, judged over 10 draws of 100 samples."""
    from apd.config_load import load_config
    from apd.nets import ParamSpec, predict_probs

    ctx = RunContext(cfg=load_config("pipelines/digits.toml"), artifacts_root=tmp_path, quiet=True)
    run_sample(ctx)
    data = ctx.data
    sgd = mlp(ctx.net_sizes)
    sgd.load_state_dict(torch.load(ctx.layout.baseline("sgd"), weights_only=True))
    sgd.eval()
    with torch.no_grad():
        sgd_probs = torch.softmax(sgd(data.x_test), -1)
    sgd_nll = -sgd_probs[torch.arange(len(data.y_test)), data.y_test].log().mean().item()
    sgd_acc = (sgd_probs.argmax(-1) == data.y_test).float().mean().item()
    rng = np.random.default_rng(0)
    accs, nlls = [], []
    with SampleStore.open(ctx.layout.samples) as store:
        spec = ParamSpec.from_module(sgd)
        for _ in range(10):
            weights = store.read(rng.choice(len(store), 100, replace=False))
            mean = predict_probs(spec, weights, data.x_test).mean(0)
            accs.append((mean.argmax(-1) == data.y_test).float().mean().item())
            nlls.append(-mean[torch.arange(len(data.y_test)), data.y_test].log().mean().item())
    print(f"SGD acc {sgd_acc:.4f} nll {sgd_nll:.4f}; SGLD acc {np.mean(accs):.4f} nll {np.mean(nlls):.4f}")
    assert np.mean(nlls) < sgd_nll
    assert abs(np.mean(accs) - sgd_acc) <= 0.01 or np.mean(accs) > sgd_acc


def test_stored_log_likelihood_is_that_of_the_stored_weights(tmp_path):
    """Each row's ``log_lik`` is the minibatch mean log-likelihood of exactly the stored weights θ_t on
    iteration t's minibatch."""
    import torch.nn.functional as F

    from apd.data import MinibatchOrder
    from apd.nets import ParamSpec, predict_logits
    from apd.pipeline.sample_chains import chain_seeds

    ctx = context(tmp_path, sgld={"chains": 1, "iterations": 300})
    sample_sgld(ctx)
    order = MinibatchOrder(len(ctx.data.y_train), ctx.cfg.sgld.batch_size, chain_seeds(ctx, 0).batches)
    with SampleStore.open(ctx.layout.samples) as store:
        spec = ParamSpec.from_module(mlp(ctx.net_sizes))
        for row in (0, len(store) // 2, len(store) - 1):
            idx = order.indices(int(store.steps[row]))
            logits = predict_logits(spec, store.read([row]), ctx.data.x_train[idx])[0]
            expected = -F.cross_entropy(logits, ctx.data.y_train[idx]).item()
            assert store.log_liks[row] == pytest.approx(expected, abs=1e-5)


def test_chain_streams_are_distinct_from_each_other_and_from_the_baselines(tmp_path):
    """Initialisation, minibatch order and noise of every chain, and the baselines' streams, are all
    different seeds (before, chain 7's initialisation equalled the SGD baseline's)."""
    from apd.pipeline.sample_chains import chain_seeds

    ctx = context(tmp_path)
    seeds = [s for c in range(16) for s in vars(chain_seeds(ctx, c)).values()]
    seeds += [ctx.seed("baseline", name, stream) for name in ("sgd", "mcdropout")
              for stream in ("init", "batches", "dropout")]
    assert len(set(seeds)) == len(seeds)

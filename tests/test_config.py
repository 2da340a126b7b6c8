from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from apd.config import PipelineConfig, config_hash
from apd.config_load import SHIPPED, from_dict, load_config, shipped_pipelines
from apd.distillation.generator import part_precisions
from apd.distillation.precision import PartPrecisions
from apd.errors import ConfigError

PIPELINES = sorted(Path("pipelines").glob("*.toml"))


@pytest.mark.parametrize("path", PIPELINES, ids=lambda p: p.stem)
def test_shipped_pipelines_load_by_path_and_by_name(path):
    cfg = load_config(path)
    assert cfg.name == path.stem
    assert cfg.source == str(path)
    by_name = load_config(path.stem)
    assert by_name.source == path.stem and dataclasses.replace(by_name, source=str(path)) == cfg


def test_the_shipped_pipelines_live_in_the_package_and_pipelines_links_there():
    assert Path("pipelines").is_symlink() and Path("pipelines").resolve() == SHIPPED
    assert shipped_pipelines() == sorted(path.stem for path in PIPELINES) and "digits" in shipped_pipelines()


def test_a_name_that_is_neither_a_file_nor_shipped_is_one_config_error():
    with pytest.raises(ConfigError, match=r"^digit: neither a pipeline file nor a shipped pipeline \(digits, "):
        load_config("digit")
    with pytest.raises(ConfigError, match=r"^nowhere/digits\.toml: no such pipeline file$"):
        load_config("nowhere/digits.toml")


def test_paper_settings_in_fashion_fc1():
    cfg = load_config("pipelines/fashion-fc1.toml")
    assert (cfg.sgld.lr, cfg.sgld.prior_var, cfg.sgld.batch_size) == (0.05, 0.02, 100)
    assert (cfg.sgld.iterations, cfg.sgld.burn_in, cfg.sgld.chains, cfg.sgld.init) == (200_000, 500, 4, "prior")
    assert cfg.net.hidden == [100]
    assert load_config("pipelines/fashion-fc2.toml").net.hidden == [400, 400]


def test_two_chain_control_is_fashion_fc1_with_two_chains():
    fc1 = dataclasses.asdict(load_config("pipelines/fashion-fc1.toml"))
    control = dataclasses.asdict(load_config("pipelines/fashion-fc1-two-chains.toml"))
    assert control["sgld"].pop("chains") == 2 and fc1["sgld"].pop("chains") == 4
    for cfg in (fc1, control):
        del cfg["name"], cfg["source"]
    assert control == fc1


def test_defaults_fill_missing_sections():
    cfg = from_dict({"name": "x"})
    assert cfg.sgld == PipelineConfig().sgld
    assert cfg.distill.gen_hidden == [100, 100, 100]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"sgld": {"lrr": 0.1}}, "unknown key 'sgld.lrr'"),
        ({"colour": "red"}, "unknown key 'colour'"),
        ({"sgld": {"lr": "fast"}}, "'sgld.lr' must be a finite number"),
        ({"sgld": {"iterations": 1.5}}, "'sgld.iterations' must be an integer"),
        ({"sgld": {"iterations": True}}, "'sgld.iterations' must be an integer"),
        ({"sgld": {"lr": -0.1}}, "'sgld.lr' must be greater than 0"),
        ({"baselines": {"dropout": 1.0}}, "'baselines.dropout' must be less than 1"),
        ({"data": {"dataset": "cifar"}}, "'data.dataset' must be one of"),
        ({"net": {"hidden": [100, 0]}}, "'net.hidden' must be a list of positive integers"),
        ({"net": {"hidden": 100}}, "'net.hidden' must be a list of int"),
        ({"sgld": 3}, "sgld: expected a table"),
        ({"sgld": {"burn_in": 10, "iterations": 10}}, "'sgld.burn_in' (10) must be less than"),
        ({"sgld": {"thin": 5000, "iterations": 1000, "burn_in": 0}}, "the chains would keep no sample"),
        ({"sgld": {"schedule": "cyclical", "cycles": 500, "iterations": 1000, "burn_in": 0, "thin": 3}},
         "the chains would keep no sample"),
        ({"sgld": {"schedule": "cyclical", "cycles": 2000, "iterations": 1000, "burn_in": 0}},
         "'sgld.cycles' (2000) must be at most 'sgld.iterations'"),
        ({"sgld": {"prior_var": float("inf")}}, "'sgld.prior_var' must be a finite number"),
        ({"baselines": {"weight_decay": float("inf")}}, "'baselines.weight_decay' must be a finite number"),
        ({"peers": {"swag_lrs": [0.1, float("nan")]}}, "'peers.swag_lrs[1]' must be a finite number"),
        ({"evaluate": {"networks": 1}}, "'evaluate.networks' must be at least 2"),
        ({"device": "tpu"}, "'device' must be"),
        ({"device": "cuda:99999999999999999999"}, "'device' must be"),  # no such card number: not a traceback
        ({"distill": {"standardize": 1}}, "'distill.standardize' must be true or false"),
        ({"distill": {"align": "sort"}}, "'distill.align' must be one of"),
        ({"distill": {"align": "permutation", "mode": "online"}}, "'distill.align' = 'permutation' needs"),
        ({"distill": {"mode_embedding": -1}}, "'distill.mode_embedding' must be at least 0"),
        ({"distill": {"mode_embedding": 4, "mode": "online"}}, "'distill.mode_embedding' needs 'distill.mode'"),
        ({"distill": {"mode_embedding": 4, "per_chain": True}}, "set one of them off"),
        ({"net": {"conv": [6, 0]}}, "'net.conv' must be a list of positive integers"),
        ({"net": {"conv": [6]}, "data": {"dataset": "toy2d"}, "evaluate": {"adversarial": {"enabled": False}}},
         "'net.conv' needs images"),
        ({"net": {"conv": [6]}, "distill": {"align": "permutation"}}, "'distill.align' = 'permutation' permutes"),
        ({"net": {"conv": [6]}, "distill": {"residual": {"model": "kronecker"}}}, "factors an MLP's layers"),
        ({"net": {"conv": [6]}}, "'evaluate.methods' has 'modes', defined for MLPs only"),
        ({"net": {"hidden": []}, "distill": {"align": "permutation"}}, "a network without 'net.hidden' layers"),
        ({"evaluate": {"scores": ["bald", "maxprob"]}}, "'maxprob' is none of them"),
        ({"evaluate": {"scores": []}}, "'evaluate.scores' must name some of entropy"),
        ({"evaluate": {"mog_components": []}}, "'evaluate.mog_components' must list at least one"),
    ],
)
def test_invalid_values_name_key_and_file(raw, message):
    with pytest.raises(ConfigError) as err:
        from_dict(raw, where="p.toml")
    assert str(err.value).startswith("p.toml: ")
    assert message in str(err.value)


def test_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="no such pipeline file"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("name = [\n")
    with pytest.raises(ConfigError, match=r"bad.toml: invalid TOML"):
        load_config(bad)


def test_hash_is_stable_and_sensitive():
    a = from_dict({"name": "x", "sgld": {"lr": 0.1}})
    b = from_dict({"sgld": {"lr": 0.1}, "name": "x"})
    assert config_hash(a) == config_hash(b)
    assert len(config_hash(a)) == 16
    c = from_dict({"name": "x", "sgld": {"lr": 0.2}})
    assert config_hash(a) != config_hash(c)
    # An evaluation setting does not change the sampling stage's hash, but does change evaluation's.
    d = from_dict({"name": "x", "sgld": {"lr": 0.1}, "evaluate": {"runs": 3}})
    assert config_hash(a, "sample") == config_hash(d, "sample")
    assert config_hash(a, "evaluate") != config_hash(d, "evaluate")
    aligned = from_dict({"name": "x", "sgld": {"lr": 0.1}, "distill": {"align": "permutation"}})
    assert config_hash(a, "distill") != config_hash(aligned, "distill")
    assert config_hash(a, "sample") == config_hash(aligned, "sample")


def test_an_mlp_pipeline_hashes_as_before_net_conv_existed():
    """``net.conv`` at its default (an MLP) leaves the hashes as they were before the field existed (the values
    below are those of commit 32a8d45), so sample stores made then stay reusable; convolution layers change
    every stage's hash. A deliberate change of the defaults changes the pinned value too (the yardstick's 200
    random subsets, up from 5, changed the whole config's; the mixture growth made optional changed it again)."""
    mlp = from_dict({"name": "x"})
    assert (config_hash(mlp), config_hash(mlp, "sample")) == ("83b66f7da701325a", "51b0978d77b79856")
    methods = ["sgld", "apd", "kept"]
    cnn = from_dict({"name": "x", "net": {"conv": [4]}, "evaluate": {"methods": methods}})
    plain = from_dict({"name": "x", "evaluate": {"methods": methods}})
    for stage in ("sample", "distill", "evaluate"):
        assert config_hash(cnn, stage) != config_hash(plain, stage)


def test_a_generator_at_one_precision_hashes_as_before_distill_generators_at_existed():
    """``distill.generators_at`` empty (the generator networks at ``precision``) leaves the hashes as they were
    before the field existed (commit 86da1b2's values), so generators distilled then stay reusable; a
    precision of their own changes the distill and evaluate hashes, not the sample stage's. (The evaluate hash
    changed since with the yardstick's default of 200 random subsets and with the mixture growth made
    optional.)"""
    plain = from_dict({"name": "x"})
    assert (config_hash(plain, "distill"), config_hash(plain, "evaluate")) == ("51d11f35ae544470", "fddf2332005b2d2c")
    assert part_precisions(plain.distill) == PartPrecisions("float32", "float32", "float32")
    mixed = from_dict({"name": "x", "distill": {"precision": "int4", "generators_at": "int8"}})
    codec_only = from_dict({"name": "x", "distill": {"precision": "int4"}})
    assert (part_precisions(mixed.distill).generators, part_precisions(codec_only.distill).generators) == ("int8",
                                                                                                          "int4")
    for stage in ("distill", "evaluate"):
        assert config_hash(mixed, stage) != config_hash(codec_only, stage)
    assert config_hash(mixed, "sample") == config_hash(codec_only, "sample")
    with pytest.raises(ConfigError, match="generators_at"):
        from_dict({"name": "x", "distill": {"generators_at": "int2"}})


def test_a_codec_mean_at_its_own_precision_changes_the_hash_and_an_empty_one_does_not():
    """``distill.mean_at`` empty (the mean at ``precision``) hashes as before the field existed; a precision
    of its own is the mean's alone and changes the distill and evaluate hashes, not the sample stage's."""
    codec_only = from_dict({"name": "x", "distill": {"precision": "int4"}})
    assert config_hash(from_dict({"name": "x", "distill": {"precision": "int4", "mean_at": ""}}),
                       "distill") == config_hash(codec_only, "distill")
    mean = from_dict({"name": "x", "distill": {"precision": "int4", "mean_at": "int8"}})
    assert part_precisions(mean.distill) == PartPrecisions("int4", "int4", "int8")
    for stage in ("distill", "evaluate"):
        assert config_hash(mean, stage) != config_hash(codec_only, stage)
    assert config_hash(mean, "sample") == config_hash(codec_only, "sample")
    with pytest.raises(ConfigError, match="mean_at"):
        from_dict({"name": "x", "distill": {"mean_at": "int2"}})


def test_the_mixture_growth_asked_for_hashes_as_every_evaluation_before_it_became_optional():
    """``evaluate.mog_growth`` on gives the hashes pinned before it existed (the growth table was always made),
    so the evaluations published then stay current; off, the default, changes only the evaluate stage's."""
    grown, plain = from_dict({"name": "x", "evaluate": {"mog_growth": True}}), from_dict({"name": "x"})
    assert (config_hash(grown), config_hash(grown, "evaluate")) == ("2fe0737cb84851b4", "35173567c8d65c85")
    for stage in ("sample", "baselines", "peers", "distill"):
        assert config_hash(grown, stage) == config_hash(plain, stage)


def test_a_generator_that_does_not_read_the_chain_hashes_as_before_mode_embedding_existed():
    """``distill.mode_embedding`` 0 leaves every hash as it was (the pinned values above hold with it); a chain
    embedding changes the distill and evaluate hashes, not the sample stage's."""
    plain, conditioned = from_dict({"name": "x"}), from_dict({"name": "x", "distill": {"mode_embedding": 4}})
    assert config_hash(plain) == config_hash(from_dict({"name": "x", "distill": {"mode_embedding": 0}}))
    for stage in ("distill", "evaluate"):
        assert config_hash(plain, stage) != config_hash(conditioned, stage)
    assert config_hash(plain, "sample") == config_hash(conditioned, "sample")


def test_the_yardstick_takes_at_least_200_subsets_and_the_trace_burn_in_only_changes_evaluation():
    plain = from_dict({"name": "x"})
    assert plain.evaluate.yardstick_subsets == 200 and not plain.evaluate.burn_in_from_trace
    with pytest.raises(ConfigError, match="yardstick_subsets"):
        from_dict({"name": "x", "evaluate": {"yardstick_subsets": 199}})
    traced = from_dict({"name": "x", "evaluate": {"burn_in_from_trace": True}})
    assert config_hash(traced, "evaluate") != config_hash(plain, "evaluate")
    assert config_hash(traced, "sample") == config_hash(plain, "sample")
    off = from_dict({"name": "x", "evaluate": {"burn_in_from_trace": False}})
    assert config_hash(off) == config_hash(plain)


def test_evaluation_threads_say_how_it_runs_not_what_it_makes():
    one = from_dict({"name": "x", "evaluate": {"threads": 1}})
    two = from_dict({"name": "x", "evaluate": {"threads": 2}})
    assert two.evaluate.threads == 2
    assert config_hash(one, "evaluate") == config_hash(two, "evaluate")
    with pytest.raises(ConfigError, match="threads"):
        from_dict({"name": "x", "evaluate": {"threads": -1}})


def test_int_accepted_for_float():
    assert from_dict({"sgld": {"lr": 1}}).sgld.lr == 1.0


def test_overrides(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text('name = "p"\n[sgld]\nlr = 0.1\n')
    cfg = load_config(path, ["sgld.lr=0.2", "distill.gen_hidden=[64, 64]", "distill.generator=subspace",
                             "seed=3"])
    assert (cfg.sgld.lr, cfg.distill.gen_hidden, cfg.distill.generator, cfg.seed) == (0.2, [64, 64], "subspace", 3)
    with pytest.raises(ConfigError, match="with --set: 'sgld.lr' must be greater than 0"):
        load_config(path, ["sgld.lr=-1"])
    with pytest.raises(ConfigError, match="expected section.key=value"):
        load_config(path, ["sgld.lr"])
    with pytest.raises(ConfigError, match="unknown key 'sgld.speed'"):
        load_config(path, ["sgld.speed=1"])


def test_flat_keys_of_the_last_release_still_load_with_one_line_each(caplog):
    """``subspace_residual*``, ``kronecker_rank`` and ``adv_*`` move into [distill.residual] and
    [evaluate.adversarial], each with a one-line deprecation warning."""
    raw = {"distill": {"subspace_residual": True, "subspace_residual_model": "kronecker", "kronecker_rank": 7,
                       "subspace_residual_scale": "fitted"},
           "evaluate": {"adversarial": True, "adv_examples": 12, "adv_sources": ["sgld"], "pgd_steps": 3}}
    with caplog.at_level("WARNING"):
        cfg = from_dict(raw)
    assert (cfg.distill.residual.model, cfg.distill.residual.kronecker_rank, cfg.distill.residual.scale) == (
        "kronecker", 7, "fitted")
    adversarial = cfg.evaluate.adversarial
    assert adversarial.enabled and adversarial.examples == 12 and adversarial.sources == ["sgld"]
    assert adversarial.pgd_steps == 3
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 8 and all("deprecated" in w and "\n" not in w for w in warnings)
    off = from_dict({"distill": {"subspace_residual": False, "subspace_residual_model": "kronecker"}})
    assert off.distill.residual.model == "none" and not off.distill.has_residual()


def test_the_configs_score_names_are_those_apd_computes():
    from apd.methods import SCORE_NAMES
    from apd.uncertainty import SCORE_FUNCTIONS

    assert tuple(SCORE_FUNCTIONS) == SCORE_NAMES

"""Laplace approximations (laplace-torch) of a small SGD network as weight-space posteriors."""

from __future__ import annotations

import copy
import re

import pytest
import torch
import torch.nn.functional as F

from apd.nets import ParamSpec, mlp, network, predict_probs
from apd.posteriors.laplace import LaplaceGLM, LaplacePosterior, fit_kfac, fit_laplace, fit_last_layer
from tests.helpers import assert_gaussian_moments, tensors_stay_on

# asdl (imported by laplace-torch) still calls torch.jit.script
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")

SCALES = (0.1, 0.3, 1.0)
LAPLACE_METHODS = ("laplace-kfac", "laplace-ll", "laplace-glm")
MEMBERS = 2000  # members per prediction where two devices' predictions are compared


def _data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.3).long()
    return x, y


@pytest.fixture(scope="module")
def trained():
    torch.manual_seed(0)
    net = mlp([4, 16, 3])
    x, y = _data(200, 1)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.2, weight_decay=0.01)
    for _ in range(150):
        optimizer.zero_grad()
        F.cross_entropy(net(x), y).backward()
        optimizer.step()
    x_val, y_val = _data(100, 2)
    return net, x, y, x_val, y_val


@pytest.fixture(scope="module")
def kfac(trained) -> LaplacePosterior:
    net, x, y, x_val, y_val = trained
    return fit_kfac(net, x, y, x_val, y_val, scales=SCALES, marglik_evals=50)


@pytest.fixture(scope="module")
def last_layer(trained) -> LaplacePosterior:
    net, x, y, x_val, y_val = trained
    return fit_last_layer(net, x, y, x_val, y_val, scales=SCALES, marglik_evals=50)


@pytest.mark.parametrize(("settings", "message"), [
    ({"subset": "subnetwork"}, "unsupported Laplace structure subnetwork/kron"),
    ({"hessian": "diag"}, "unsupported Laplace structure all/diag"),
    ({"prior": "diagonal"}, "prior must be 'layerwise' or 'scalar', got 'diagonal'"),
    ({"scales": ()}, "scales must be positive"), ({"scales": (0.1, 0.0)}, "scales must be positive"),
    ({"nll_tolerance": -0.01}, "nll_tolerance non-negative")])
def test_a_laplace_structure_prior_or_scale_it_does_not_have_is_refused(trained, settings, message):
    net, x, y, x_val, y_val = trained
    with pytest.raises(ValueError, match=re.escape(message)):
        fit_laplace(net, x, y, x_val, y_val, **settings)


def test_a_convolutional_network_is_refused(trained):
    _, _, y, _, y_val = trained
    cnn = network([64, 8, 3], [2])  # 8 × 8 images: a convolution, then an MLP head
    images = torch.randn(len(y), 64)
    with pytest.raises(ValueError, match="defined for an MLP, not a convolutional network"):
        fit_laplace(cnn, images, y, images[:len(y_val)], y_val)


def test_members_are_flat_vectors_in_paramspec_order(trained, kfac, last_layer):
    net, x, *_ = trained
    spec = ParamSpec.from_module(net)
    for post in (kfac, last_layer):
        assert post.spec == spec
        assert torch.equal(post.base, spec.flatten(net))  # the caller's network is left as it was
        weights = post.sample_weights(7, torch.Generator().manual_seed(3))
        assert weights.shape == (7, spec.numel) and weights.dtype == torch.float32
        assert predict_probs(spec, weights, x[:5]).shape == (7, 5, 3)
        assert post.predict_probs(x[:5], 4, torch.Generator().manual_seed(0)).shape == (4, 5, 3)


def test_draws_are_reproducible_with_a_seeded_generator(kfac, last_layer):
    for post in (kfac, last_layer):
        a = post.sample_weights(5, torch.Generator().manual_seed(11))
        b = post.sample_weights(5, torch.Generator().manual_seed(11))
        c = post.sample_weights(5, torch.Generator().manual_seed(12))
        assert torch.equal(a, b)
        assert not torch.equal(a, c)


def test_draws_are_centred_at_the_sgd_weights(kfac, last_layer):
    n = 4000
    for post in (kfac, last_layer):
        draws = post.sample_weights(n, torch.Generator().manual_seed(5)).double()
        varied = draws[:, post.block]
        se = varied.std(0) / n**0.5
        z = (varied.mean(0) - post.base[post.block].double()) / se
        assert z.abs().max() < 5.0, z.abs().max()


def test_last_layer_draws_leave_earlier_layers_at_the_sgd_weights(trained, last_layer):
    spec = last_layer.spec
    start = dict((name, a) for name, a, _, _ in spec.offsets())["2.weight"]
    assert last_layer.block == slice(start, spec.numel)
    draws = last_layer.sample_weights(50, torch.Generator().manual_seed(0))
    assert torch.equal(draws[:, :start], last_layer.base[:start].expand(50, -1))
    assert (draws[:, start:].std(0) > 0).all()


def test_kfac_draws_have_the_approximations_covariance(kfac):
    # Covariance τ²·P⁻¹ with P the KFAC precision laplace-torch holds (its Kronecker factors and the
    # per-tensor prior made dense here, inverted independently of the sampler's eigenbasis route).
    precision = kfac.la.posterior_precision.to_matrix().double()
    cov = torch.linalg.inv(precision) * kfac.scale**2
    draws = kfac.sample_weights(40_000, torch.Generator().manual_seed(7))
    assert_gaussian_moments(draws.double(), kfac.base.double(), cov, mean_tol_sd=0.05, cov_rel_tol=0.15)
    assert torch.allclose(kfac.covariance().double(), cov, rtol=1e-3, atol=1e-7 * cov.abs().max().item())


def test_last_layer_draws_have_the_approximations_covariance(last_layer):
    cov = torch.linalg.inv(last_layer.la.posterior_precision.double()) * last_layer.scale**2
    draws = last_layer.sample_weights(20_000, torch.Generator().manual_seed(8))[:, last_layer.block]
    assert_gaussian_moments(draws.double(), last_layer.base[last_layer.block].double(), cov,
                            mean_tol_sd=0.05, cov_rel_tol=0.15)


def test_a_full_hessian_fit_in_chunks_adds_up_to_the_one_batch_ggn(trained, last_layer, monkeypatch):
    # The GGN is a sum over inputs: bounding the Jacobians of a batch (as fcNN2's last layer needs) must
    # give the matrix of one batch of the whole training split, here 200 inputs in batches of 37.
    import apd.posteriors.laplace as laplace

    net, x, y, x_val, y_val = trained
    classes, parameters = 3, 16 * 3 + 3
    monkeypatch.setattr(laplace, "_JACOBIAN_CHUNK_ELEMENTS", 37 * classes * parameters)
    batches = []
    loader = laplace.DataLoader
    monkeypatch.setattr(laplace, "DataLoader", lambda *a, **kw: batches.append(kw["batch_size"]) or loader(*a, **kw))
    chunked = fit_last_layer(net, x, y, x_val, y_val, scales=SCALES, marglik_evals=50)
    assert batches == [37]
    one_batch = fit_last_layer(net, x, y, x_val, y_val, scales=SCALES, marglik_evals=50, batch_size=len(y))
    assert torch.allclose(chunked.la.H, one_batch.la.H, rtol=1e-5, atol=1e-6)
    assert torch.allclose(chunked.la.H, last_layer.la.H, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(chunked.la.H, 2 * one_batch.la.H)


def test_kfac_of_one_example_is_the_exact_ggn_per_tensor():
    # Known answer: for a single example, KFAC's B ⊗ A of a Linear weight is that weight's exact GGN block
    # (and a bias's factor its exact block), so the precision fit_kfac holds must equal, block by block,
    # the dense GGN + prior that laplace-torch's full Laplace computes by another route. This pins the
    # Kronecker factors' order to the row-major ParamSpec order.
    from laplace import Laplace
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(3)
    net = mlp([4, 5, 3]).double()
    x, y = torch.randn(1, 4, dtype=torch.float64), torch.tensor([1])
    post = fit_kfac(net, x, y, x, y, scales=(1.0,), marglik_evals=20, val_draws=2)
    full = Laplace(net, "classification", subset_of_weights="all", hessian_structure="full")
    full.fit(DataLoader(TensorDataset(x, y), batch_size=1))
    sizes = [p.numel() for p in net.parameters()]
    full.prior_precision = torch.repeat_interleave(torch.tensor(post.info.prior_precision, dtype=torch.float64),
                                                   torch.tensor(sizes))
    kron, dense = post.la.posterior_precision.to_matrix(), full.posterior_precision
    for name, a, b, _ in post.spec.offsets():
        assert torch.allclose(kron[a:b, a:b], dense[a:b, a:b], atol=1e-6), name


def test_glm_predictive_rows_are_distributions(trained, kfac, last_layer):
    _, _, _, x_val, _ = trained
    for post in (kfac, last_layer):
        for link in ("probit", "mc"):
            probs = post.glm_probs(x_val, link_approx=link, n_samples=50, generator=torch.Generator().manual_seed(0))
            assert probs.shape == (100, 3)
            assert (probs >= 0).all()
            assert torch.allclose(probs.sum(-1), torch.ones(100), atol=1e-5)
        mc = [post.glm_probs(x_val, "mc", 20, torch.Generator().manual_seed(4)) for _ in range(2)]
        assert torch.equal(mc[0], mc[1])
        members = post.glm_samples(x_val, 6, torch.Generator().manual_seed(0))
        assert members.shape == (6, 100, 3)
        assert torch.allclose(members.sum(-1), torch.ones(6, 100), atol=1e-5)


def test_kfac_glm_moments_match_laplace_torchs_jacobians(trained, kfac):
    # Known answer: the per-layer eigenbasis route (no Jacobians) against laplace-torch's J P⁻¹ Jᵀ.
    _, _, _, x_val, _ = trained
    f_mu, f_var = kfac.glm_moments(x_val[:40], scale=1.0)
    ref_mu, ref_var = kfac.la._glm_predictive_distribution(x_val[:40])
    assert torch.allclose(f_mu, ref_mu, atol=1e-5)
    assert torch.allclose(f_var, ref_var, rtol=1e-4, atol=1e-6 * ref_var.abs().max().item())
    scaled = kfac.glm_moments(x_val[:40], scale=0.3)[1]
    assert torch.allclose(scaled, 0.09 * f_var, rtol=1e-5)
    assert torch.allclose(kfac.glm_probs(x_val[:40], scale=1.0),
                          kfac.la(x_val[:40], pred_type="glm", link_approx="probit"), atol=1e-5)


def test_scales_are_chosen_by_validation_nll(kfac, last_layer):
    for post in (kfac, last_layer):
        info = post.info
        assert info.scales == list(SCALES) and len(info.val_nll) == len(info.glm_val_nll) == len(SCALES)
        assert post.scale == SCALES[min(range(len(SCALES)), key=info.val_nll.__getitem__)]
        assert post.glm_scale == SCALES[min(range(len(SCALES)), key=info.glm_val_nll.__getitem__)]
        assert all(p > 0 for p in info.prior_precision)
    assert kfac.info.prior_groups == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert last_layer.info.prior_groups == ["2.weight", "2.bias"]


def test_stored_parameters_count_the_mean_and_the_curvature(kfac, last_layer):
    d = kfac.spec.numel  # 4·16 + 16 + 16·3 + 3 = 131
    factors = (16 * 16 + 16 + 4 * 4 + 4) + (16 * 16 + 16) + (3 * 3 + 3 + 16 * 16 + 16) + (3 * 3 + 3)
    assert kfac.stored_parameters() == d + factors + 4 + 1
    p = 16 * 3 + 3
    assert last_layer.stored_parameters() == d + p * (p + 1) // 2 + 2 + 1


def test_nll_tolerance_takes_the_widest_scale_within_it(trained):
    net, x, y, x_val, y_val = trained
    strict = fit_last_layer(net, x, y, x_val, y_val, scales=SCALES, marglik_evals=50)
    loose = fit_last_layer(net, x, y, x_val, y_val, scales=SCALES, marglik_evals=50, nll_tolerance=10.0)
    assert loose.scale == loose.glm_scale == max(SCALES)
    within = [t for t, v in zip(SCALES, strict.info.val_nll, strict=True) if v <= min(strict.info.val_nll) + 0.01]
    medium = fit_last_layer(net, x, y, x_val, y_val, scales=SCALES, marglik_evals=50, nll_tolerance=0.01)
    assert medium.scale == max(within)


@pytest.mark.parametrize("fit", [fit_kfac, fit_last_layer])
def test_a_scalar_prior_is_one_precision(trained, fit):
    net, x, y, x_val, y_val = trained
    post = fit(net, x, y, x_val, y_val, prior="scalar", scales=SCALES, marglik_evals=30)
    assert post.info.prior_groups == ["all"] and len(post.info.prior_precision) == 1
    assert post.sample_weights(3, torch.Generator().manual_seed(0)).shape == (3, post.spec.numel)


def test_glm_predictive_is_a_posterior_without_weights(trained, kfac):
    _, x, *_ = trained
    glm = LaplaceGLM(kfac)
    assert not glm.has_weights and kfac.has_weights
    assert glm.storage_in_samples() == kfac.storage_in_samples()
    with pytest.raises(NotImplementedError):
        glm.sample_weights(3)
    members = glm.members(6, torch.Generator().manual_seed(0))
    probs = members(x[:9])
    assert probs.shape == (6, 9, 3) and probs.dtype == torch.float32
    torch.testing.assert_close(probs.sum(-1), torch.ones(6, 9))
    torch.testing.assert_close(members(x[:9]), probs)  # one draw, shared by every call
    assert glm.predict_probs(x[:9], 6, torch.Generator().manual_seed(1)).shape == (6, 9, 3)


def _fit_and_predict(trained, method: str, device: str, default: str) -> dict[str, torch.Tensor]:
    """Fit ``method`` (one of :data:`LAPLACE_METHODS`) at the one scale τ = 0.3 on ``device`` and predict the
    validation inputs, under :func:`tensors_stay_on` (``device``, ``default``). On the CPU: the prior
    precisions, the exact predictive (the draws' covariance for the weight-space methods, the probit GLM
    predictive [N, C] for laplace-glm), and the mean and sd over :data:`MEMBERS` members of p(y | x) [N, C]."""
    import laplace  # noqa: F401 (its imports make constants of their own, on the default device of their import)

    net, x, y, x_val, y_val = trained
    fit = fit_last_layer if method == "laplace-ll" else fit_kfac
    model, generator = copy.deepcopy(net).to(device), torch.Generator(device=device).manual_seed(0)
    with tensors_stay_on(device, default):
        post = fit(model, x, y, x_val, y_val, scales=(0.3,), marglik_evals=50, generator=generator)
        exact = post.glm_probs(x_val) if method == "laplace-glm" else post.covariance()
        members = (LaplaceGLM(post) if method == "laplace-glm" else post).predict_probs(x_val, MEMBERS, generator)
    assert post.base.device.type == torch.device(device).type
    assert exact.device == members.device == post.base.device
    return {"precision": torch.tensor(post.info.prior_precision), "exact": exact.cpu(),
            "mean": members.mean(0).cpu(), "sd": members.std(0).cpu()}


@pytest.mark.parametrize("method", LAPLACE_METHODS)
def test_fits_and_predictions_make_every_tensor_on_the_weights_device(trained, method):
    # With the meta device as torch's default, a tensor made without naming its device (as laplace-torch's
    # full-GGN fit makes an identity, which a CUDA network's fit found on the CPU) fails here, on a CPU.
    predictions = _fit_and_predict(trained, method, "cpu", default="meta")
    assert torch.isfinite(predictions["mean"]).all() and torch.isfinite(predictions["exact"]).all()


@pytest.mark.cuda
@pytest.mark.parametrize("method", LAPLACE_METHODS)
def test_laplace_on_cuda_predicts_as_on_the_cpu(trained, method):
    """The same fit on CUDA and on the CPU: every tensor on the GPU (the CPU as default device), and the same
    predictions. Tolerances: the prior precisions are L-BFGS optima of the same objective, which float32 sums
    in another order on the GPU (relative 1e-3); a relative change ε of the prior precision moves the
    covariance P⁻¹ by at most ε‖P⁻¹‖₂ (and the probit GLM probabilities by less than ε), so the exact predictive
    agrees within 2e-3 of that scale; the members come from each device's own random stream, so their mean
    probabilities agree within their Monte Carlo error (6 standard errors of the difference, plus 1e-3)."""
    cpu = _fit_and_predict(trained, method, "cpu", default="meta")
    gpu = _fit_and_predict(trained, method, "cuda", default="cpu")
    torch.testing.assert_close(gpu["precision"], cpu["precision"], rtol=1e-3, atol=0)
    scale = 1.0 if method == "laplace-glm" else torch.linalg.matrix_norm(cpu["exact"], ord=2).item()
    torch.testing.assert_close(gpu["exact"], cpu["exact"], rtol=0, atol=2e-3 * scale)
    error = 6 * ((cpu["sd"] ** 2 + gpu["sd"] ** 2) / MEMBERS).sqrt() + 1e-3
    assert ((gpu["mean"] - cpu["mean"]).abs() <= error).all(), (gpu["mean"] - cpu["mean"]).abs().max()

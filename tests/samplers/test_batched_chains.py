"""SGLDChains: C chains stepped as one batch give each chain the trajectory it has alone, the SGLD step of the
tested optimizer, and exact resumption; the fused CUDA update draws the noise it promises."""

from __future__ import annotations

import math
import threading
import time

import pytest
import torch
import torch.nn.functional as F

from apd.config import SGLDConfig
from apd.data import MinibatchOrder, MinibatchOrders
from apd.nets import ParamSpec, network
from apd.samplers import langevin_kernel
from apd.samplers.chain import ChainSeeds, SGLDChains, initial_weights
from apd.samplers.sgld import SGLD

CONFIG = SGLDConfig(lr=0.05, prior_var=0.05, batch_size=20, iterations=10**6, burn_in=0, init="prior")


def net_data(sizes: list[int], n: int = 200, seed: int = 0, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.rand(n, sizes[0], generator=generator) * 2 - 1
    y = torch.randint(0, sizes[-1], (n,), generator=generator)
    return x.to(device), y.to(device)


def seeds(chain: int) -> ChainSeeds:
    return ChainSeeds(100 + chain, 200 + chain, 300 + chain)


def run(chains: list[int], steps: int, sizes: list[int], conv: tuple = (), device: str = "cpu",
        prefetch: bool = False) -> torch.Tensor:
    x, y = net_data(sizes, device=device)
    batch = SGLDChains(sizes, CONFIG, chains, x, y, [seeds(c) for c in chains], prefetch, conv)
    for t in range(steps):
        batch.step(t)
    return batch.theta.cpu()


@pytest.mark.parametrize(("sizes", "conv"), [([16, 12, 3], ()), ([784, 10, 3], (2, 3))], ids=["mlp", "cnn"])
def test_a_chain_stepped_with_seven_others_follows_its_own_trajectory(sizes, conv):
    together = run(list(range(8)), 30, sizes, conv)
    for chain in (0, 5):
        alone = run([chain], 30, sizes, conv)
        torch.testing.assert_close(together[chain], alone[0], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(together[0], together[1])


def test_one_batched_chain_takes_the_step_of_the_sgld_optimizer():
    """The batched chain equals nn.Module + :class:`SGLD` (tested against known posteriors) fed the same
    initialisation, minibatches and noise generator."""
    sizes = [16, 12, 3]
    x, y = net_data(sizes)
    chain_seeds = seeds(0)
    batch = SGLDChains(sizes, CONFIG, [0], x, y, [chain_seeds])
    net = network(sizes)
    spec = ParamSpec.from_module(net)
    spec.load_into(net, initial_weights(sizes, CONFIG, chain_seeds.init))
    optimizer = SGLD(net.parameters(), lr=CONFIG.lr, num_data=len(y), prior_std=math.sqrt(CONFIG.prior_var),
                     seed=chain_seeds.noise, prefetch_noise=False)
    order = MinibatchOrder(len(y), CONFIG.batch_size, chain_seeds.batches)
    for t in range(25):
        idx = order.indices(t)
        loss = F.cross_entropy(net(x[idx]), y[idx])
        optimizer.zero_grad()
        loss.backward()
        batch_loss, kept = batch.step(t, keep=True)
        torch.testing.assert_close(kept[0], spec.flatten(net), rtol=1e-5, atol=1e-6)
        assert batch_loss[0].item() == pytest.approx(loss.item(), abs=1e-6)
        optimizer.step()


@pytest.mark.parametrize("prefetch", [False, True], ids=["drawn-in-step", "prefetched"])
def test_a_resumed_batch_continues_exactly(prefetch):
    sizes = [16, 12, 3]
    x, y = net_data(sizes)
    chains = [0, 1, 2]
    straight = SGLDChains(sizes, CONFIG, chains, x, y, [seeds(c) for c in chains], prefetch)
    first = SGLDChains(sizes, CONFIG, chains, x, y, [seeds(c) for c in chains], prefetch)
    for t in range(40):
        straight.step(t)
        if t < 17:
            first.step(t)
    state = first.state_dict()
    resumed = SGLDChains(sizes, CONFIG, chains, x, y, [seeds(c) for c in chains], prefetch)
    resumed.load_state_dict(state)
    for t in range(17, 40):
        resumed.step(t)
    assert torch.equal(resumed.theta, straight.theta)


def test_a_checkpoint_of_other_chains_is_refused():
    sizes = [16, 12, 3]
    x, y = net_data(sizes)
    two = SGLDChains(sizes, CONFIG, [0, 1], x, y, [seeds(0), seeds(1)])
    three = SGLDChains(sizes, CONFIG, [0, 1, 2], x, y, [seeds(c) for c in range(3)])
    with pytest.raises(ValueError, match="checkpoint holds"):
        three.load_state_dict(two.state_dict())


def test_a_diverged_chain_is_named():
    from apd.errors import DivergenceError

    sizes = [16, 12, 3]
    x, y = net_data(sizes)
    batch = SGLDChains(sizes, CONFIG, [4, 7], x, y, [seeds(4), seeds(7)])
    batch.theta[1, 3] = math.inf
    with pytest.raises(DivergenceError, match="iteration 5 of chain 7 .*smaller sgld.lr"):
        batch.checked_weights(5)


def test_minibatch_orders_are_each_chains_own_order_across_epochs():
    orders = MinibatchOrders(50, 20, [3, 9])
    singles = [MinibatchOrder(50, 20, 3), MinibatchOrder(50, 20, 9)]
    for t in range(7):  # two batches per epoch: four epochs, each built ahead on the worker thread
        both = orders.indices(t)
        assert both.shape == (2, 20)
        for row, single in zip(both, singles, strict=True):
            assert torch.equal(row, single.indices(t))


def _keyed_noise(device: str, chains: int, dim: int, t: int, keys: torch.Tensor) -> torch.Tensor:
    """ξ of the fused update: θ = 0, g = 0 and θ ← 1·θ − 0·g + 1·ξ leave θ = ξ."""
    theta = torch.zeros(chains, dim, device=device)
    coefficients = torch.tensor([1.0, 0.0, 1.0], device=device)
    step_keys = langevin_kernel.step_keys(keys.to(device), t)
    langevin_kernel.keyed_langevin_update_(theta, torch.zeros_like(theta), step_keys, coefficients)
    return theta.cpu()


def _check_keyed_noise(device: str) -> None:
    keys = torch.tensor([11, 12, 2**62 + 7, -5], dtype=torch.int64)
    noise = _keyed_noise(device, 4, 3000, 9, keys)
    assert noise.mean().abs() < 0.05 and (noise.std() - 1).abs() < 0.05
    assert torch.equal(_keyed_noise(device, 1, 3000, 9, keys[2:3]), noise[2:3])  # a chain's noise is its own
    assert not torch.equal(_keyed_noise(device, 4, 3000, 10, keys), noise)  # and new at every iteration
    assert abs(torch.corrcoef(noise[:2])[0, 1]) < 0.1


@pytest.mark.skipif(langevin_kernel.triton is None, reason="Triton is not installed")
def test_keyed_noise_in_the_triton_interpreter(monkeypatch):
    pytest.importorskip("triton")
    if not torch.cuda.is_available():
        import os

        if os.environ.get("TRITON_INTERPRET") != "1":
            pytest.skip("the fused update needs CUDA, or TRITON_INTERPRET=1 to run on the CPU")
    _check_keyed_noise("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.cuda
def test_batched_chains_on_cuda_follow_their_own_trajectories_and_resume_exactly():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    _check_keyed_noise("cuda")
    sizes = [16, 12, 3]
    together = run(list(range(8)), 30, sizes, device="cuda")
    alone = run([5], 30, sizes, device="cuda")
    torch.testing.assert_close(together[5], alone[0], rtol=1e-4, atol=1e-5)
    x, y = net_data(sizes, device="cuda")
    first = SGLDChains(sizes, CONFIG, [0, 1], x, y, [seeds(0), seeds(1)])
    assert first.noise_source == ("philox-keyed" if langevin_kernel.triton is not None else "torch-generator")
    for t in range(10):
        first.step(t)
    resumed = SGLDChains(sizes, CONFIG, [0, 1], x, y, [seeds(0), seeds(1)])
    resumed.load_state_dict(first.state_dict())
    for t in range(10, 20):
        first.step(t)
        resumed.step(t)
    assert torch.equal(first.theta, resumed.theta)


@pytest.mark.cuda
def test_the_recorded_cuda_graph_steps_the_chains_as_the_eager_fused_update_does():
    if not torch.cuda.is_available() or langevin_kernel.triton is None:
        pytest.skip("needs CUDA and Triton")
    for ids in ([0], [0, 1, 2]):
        _check_recorded_steps([16, 12, 3], ids)
    _check_recorded_steps([784, 100, 10], [4])
    _check_recorded_steps([784, 10, 3], [0, 1], conv=(2, 3))


def _check_recorded_steps(sizes: list[int], ids: list[int], conv: tuple[int, ...] = ()) -> None:
    x, y = net_data(sizes, device="cuda")

    def chains(graph: bool) -> SGLDChains:
        batch = SGLDChains(sizes, CONFIG, ids, x, y, [seeds(i) for i in ids], conv=conv, cuda_graph=graph)
        assert batch.graphed == graph
        return batch

    eager, graphed = chains(False), chains(True)
    for t in range(40):
        keep = t % 7 == 3
        eager_loss, eager_kept = eager.step(t, keep)
        graphed_loss, graphed_kept = graphed.step(t, keep)
        torch.testing.assert_close(graphed_loss, eager_loss, rtol=1e-5, atol=1e-6)
        if keep:
            torch.testing.assert_close(graphed_kept, eager_kept, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(graphed.theta, eager.theta, rtol=1e-4, atol=1e-5)
    resumed = chains(True)
    resumed.load_state_dict(graphed.state_dict())
    for t in range(40, 60):
        graphed.step(t)
        resumed.step(t)
    assert torch.equal(graphed.theta, resumed.theta)
    assert graphed.graph_recorded  # recorded, not fallen back to eager steps


@pytest.mark.cuda
def test_the_next_epochs_orders_copied_to_the_card_while_the_step_is_recorded_spoil_nothing(monkeypatch):
    """The thread that builds the next epoch's minibatch orders copies them to the card, and may allocate
    there while the SGLD step is being recorded (here: made to): the recording holds, and the chains step
    as eager ones, into the epoch those orders are for."""
    if not torch.cuda.is_available() or langevin_kernel.triton is None:
        pytest.skip("needs CUDA and Triton")
    recording = threading.Event()
    build, fused_step = MinibatchOrders._build, SGLDChains._fused_step

    def build_while_recording(orders: MinibatchOrders, epoch: int) -> torch.Tensor:
        if epoch > 0:
            recording.wait(30)
        return build(orders, epoch)

    def step_waiting_for_the_build(chains: SGLDChains) -> torch.Tensor:
        if torch.cuda.is_current_stream_capturing():
            recording.set()
            time.sleep(0.5)  # the build's copy to the card happens during the recording
        return fused_step(chains)

    monkeypatch.setattr(MinibatchOrders, "_build", build_while_recording)
    monkeypatch.setattr(SGLDChains, "_fused_step", step_waiting_for_the_build)
    sizes, ids = [16, 12, 3], [0, 1]
    x, y = net_data(sizes, device="cuda")
    graphed = SGLDChains(sizes, CONFIG, ids, x, y, [seeds(i) for i in ids], cuda_graph=True)
    eager = SGLDChains(sizes, CONFIG, ids, x, y, [seeds(i) for i in ids], cuda_graph=False)
    for t in range(25):  # an epoch is 10 steps
        graphed.step(t)
        eager.step(t)
    assert recording.is_set() and graphed.graph_recorded
    torch.testing.assert_close(graphed.theta, eager.theta, rtol=1e-4, atol=1e-5)

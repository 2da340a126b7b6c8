"""Storage precision: hand-worked round trips and byte counts, and a generator stored at lower precision."""

from __future__ import annotations

import math

import pytest
import torch

from apd.distillation.precision import (
    CODE_BLOCK,
    PartPrecisions,
    in_samples,
    module_bytes,
    pack,
    pack_state,
    round_trip,
    round_trip_module_,
    stored_bytes,
    unpack,
    unpack_state,
)


def test_int8_blocks_keep_each_blocks_largest_value_exactly_and_round_the_rest_to_its_step():
    values = torch.zeros(CODE_BLOCK + 3)
    values[:4] = torch.tensor([1.27, -0.5, 0.014, 0.006])  # block 1: s = 1.27 / 127 = 0.01
    values[CODE_BLOCK:] = torch.tensor([-300.0, 2.0, 1.0])  # block 2 (padded): s = 300 / 127
    back = round_trip(values, "int8")
    assert back.shape == values.shape
    step = 300.0 / 127
    expected = torch.zeros_like(values)
    expected[:4] = torch.tensor([1.27, -0.5, 0.01, 0.01])  # 0.014 → 1 step, 0.006 → 1 step
    expected[CODE_BLOCK:] = torch.tensor([-300.0, step, 0.0])  # 2.0 → 1 step, 1.0 → 0 steps
    torch.testing.assert_close(back, expected, rtol=0, atol=1e-6)


def test_int4_blocks_keep_each_blocks_largest_value_and_round_the_rest_to_a_seventh_of_it():
    values = torch.zeros(CODE_BLOCK + 3)
    values[:5] = torch.tensor([-0.7, 0.36, 0.34, 0.04, 0.06])  # block 1: s = 0.7 / 7 = 0.1
    values[CODE_BLOCK:] = torch.tensor([14.0, -5.0, 0.9])  # block 2 (padded): s = 14 / 7 = 2
    back = round_trip(values, "int4")
    expected = torch.zeros_like(values)
    expected[:5] = torch.tensor([-0.7, 0.4, 0.3, 0.0, 0.1])  # 3.6 → 4, 3.4 → 3, 0.4 → 0, 0.6 → 1 steps
    expected[CODE_BLOCK:] = torch.tensor([14.0, -4.0, 0.0])  # −2.5 → −2 steps (half to even), 0.45 → 0
    torch.testing.assert_close(back, expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize(("precision", "code_max"), [("int8", 127), ("int4", 7)])
def test_every_integer_round_trip_error_is_within_half_a_step(precision, code_max):
    g = torch.Generator().manual_seed(0)
    values = torch.randn(5, 1000, generator=g) * torch.logspace(-4, 2, 5)[:, None]
    back = round_trip(values, precision)
    blocks = values.reshape(-1)[: (values.numel() // CODE_BLOCK) * CODE_BLOCK].view(-1, CODE_BLOCK)
    errors = (back - values).reshape(-1)[: blocks.numel()].view(-1, CODE_BLOCK).abs()
    assert bool((errors <= blocks.abs().amax(1, keepdim=True) / code_max / 2 + 1e-12).all())
    assert bool((errors.amax(1) > blocks.abs().amax(1) / code_max / 4).all())  # and of that order: no finer grid


def test_every_round_trip_error_is_within_half_a_step_and_a_zero_block_stays_zero():
    g = torch.Generator().manual_seed(0)
    values = torch.randn(5, 1000, generator=g) * torch.logspace(-4, 2, 5)[:, None]
    values[2] = 0.0
    back = round_trip(values, "int8")
    blocks = values.reshape(-1)[: (values.numel() // CODE_BLOCK) * CODE_BLOCK].view(-1, CODE_BLOCK)
    errors = (back - values).reshape(-1)[: blocks.numel()].view(-1, CODE_BLOCK).abs()
    assert bool((errors <= blocks.abs().amax(1, keepdim=True) / 127 / 2 + 1e-12).all())
    assert bool((back[2] == 0).all())
    half, normal = round_trip(values, "float16"), values.abs() >= 2**-14  # float16's smallest normal number
    assert float(((half - values).abs() / values.abs())[normal].max()) <= 2**-11  # 11 significant bits
    assert float((half - values).abs()[~normal & (values != 0)].max()) <= 2**-25  # subnormals: half a step
    assert torch.equal(round_trip(values, "float32"), values)


def test_a_value_float16_cannot_hold_is_an_error_and_an_unknown_precision_too():
    with pytest.raises(ValueError, match="does not fit float16"):
        round_trip(torch.tensor([1.0, 7e4]), "float16")
    with pytest.raises(ValueError, match="precision must be one of"):
        stored_bytes(10, "int2")


def test_bytes_per_number_and_samples_worth():
    assert stored_bytes(100, "float32") == 400
    assert stored_bytes(100, "float16") == 200
    assert stored_bytes(100, "int8") == 100 + 4 * 2  # two blocks of 64, one scale each
    assert stored_bytes(101, "int4") == 51 + 4 * 2  # two codes a byte
    assert in_samples(stored_bytes(640, "int8"), 640) == pytest.approx(680 / 2560)


@pytest.mark.parametrize("precision", ["float32", "float16", "int8", "int4"])
def test_what_is_stored_takes_exactly_the_bytes_counted(precision):
    for numel in (1, 63, 64, 65, 101, 300):
        values = torch.randn(numel, generator=torch.Generator().manual_seed(numel))
        parts = pack(values, precision)
        assert sum(part.untyped_storage().nbytes() for part in parts.values()) == stored_bytes(numel, precision)
        torch.testing.assert_close(unpack(parts, (numel,), precision), round_trip(values, precision))


@pytest.mark.parametrize("precision", ["int8", "int4"])
def test_codes_padded_to_whole_blocks_as_stored_before_read_back_the_same(precision):
    values = torch.randn(101, generator=torch.Generator().manual_seed(0))
    parts = pack(values, precision)
    code = next(suffix for suffix in parts if suffix != ".scale")
    width = CODE_BLOCK if precision == "int8" else CODE_BLOCK // 2  # entries a block's codes take in the part
    zero = 0 if precision == "int8" else 0x88  # code 0 (int4: 0 + 8 in both nibbles)
    padding = torch.full((2 * width - parts[code].numel(),), zero, dtype=parts[code].dtype)
    padded = {**parts, code: torch.cat([parts[code], padding])}
    torch.testing.assert_close(unpack(padded, (101,), precision), unpack(parts, (101,), precision), rtol=0, atol=0)
    with pytest.raises(ValueError, match="codes"):
        unpack({**parts, code: parts[code][:-1]}, (101,), precision)


def test_a_module_is_stored_tensor_by_tensor_and_read_back_in_place():
    module = torch.nn.Linear(100, 3)  # weight 300 numbers, bias 3
    module.register_buffer("scale", torch.tensor(5.0))
    assert module_bytes(module, "float32") == 4 * 304
    assert module_bytes(module, "int8") == (300 + 4 * 5) + (3 + 4) + 4  # the scalar at float32
    before = {name: t.clone() for name, t in module.state_dict().items()}
    round_trip_module_(module, "int8")
    for name in ("weight", "bias"):
        torch.testing.assert_close(module.state_dict()[name], round_trip(before[name], "int8"), rtol=0, atol=0)
    assert float(module.scale) == 5.0


def test_a_scalar_is_stored_at_float32_whatever_the_modules_precision():
    state = {"w": torch.randn(10, generator=torch.Generator().manual_seed(0)), "data_size": torch.tensor(110_000.0)}
    for precision in ("float16", "int8", "int4"):
        packed = pack_state(state, precision)  # 110,000 does not fit float16
        assert packed["data_size"].dtype == torch.float32 and "data_size.scale" not in packed
        back = unpack_state(packed, state, precision)
        assert float(back["data_size"]) == 110_000.0
        assert torch.equal(back["w"], round_trip(state["w"], precision))
    before = {"w": state["w"], "data_size": torch.tensor(3.0)}  # stored whole at int8, as modules were before
    old = {**pack_state({"w": before["w"]}, "int8"),
           **{"data_size" + suffix: part for suffix, part in pack(before["data_size"], "int8").items()}}
    assert float(unpack_state(old, before, "int8")["data_size"]) == 3.0


def test_a_state_dict_is_stored_in_its_precisions_parts_and_read_back_by_name_and_shape():
    g = torch.Generator().manual_seed(0)
    state = {"w": torch.randn(3, 50, generator=g), "b": torch.randn(7, generator=g), "steps": torch.tensor(4)}
    packed = pack_state(state, "int8")
    assert packed["w.int8"].dtype == torch.int8 and packed["w.int8"].numel() == 150  # a code a number
    assert packed["w.scale"].dtype == torch.float32 and packed["w.scale"].shape == (3,)  # 150 → 3 blocks
    assert torch.equal(packed["steps"], state["steps"])  # not a float: stored as it is
    back = unpack_state(packed, state, "int8")
    for name in ("w", "b"):
        assert torch.equal(back[name], round_trip(state[name], "int8"))
    assert pack_state(state, "float16")["w"].dtype == torch.float16
    nibbles = pack_state(state, "int4")
    assert nibbles["w.int4"].dtype == torch.uint8 and nibbles["w.int4"].numel() == 75
    assert torch.equal(unpack_state(nibbles, state, "int4")["w"], round_trip(state["w"], "int4"))
    same = unpack_state(pack_state(state, "float32"), state, "float32")
    assert all(torch.equal(same[name], value) for name, value in state.items())
    with pytest.raises(KeyError):
        unpack_state({"w.int8": packed["w.int8"]}, {"w": state["w"]}, "int8")
    with pytest.raises(ValueError, match="int8 codes and 3 scales for a tensor of shape \\[2, 50\\]"):
        unpack_state(packed, {**state, "w": state["w"][:2]}, "int8")  # one block too many, silently cut otherwise
    with pytest.raises(ValueError, match="'b.int8' has no place"):
        unpack_state(packed, {"w": state["w"], "steps": state["steps"]}, "int8")


def test_a_generator_with_its_networks_at_another_precision_stores_each_part_at_its_own():
    """DistilledGenerator(precision int4, generators_at int8): the codec's tensors packed at int4, the
    generator networks' at int8, read back on each grid; a stored tensor of neither part has no place."""
    from apd.distillation.codec import WeightCodec
    from apd.distillation.gan import Generator
    from apd.distillation.generator import DistilledGenerator
    from apd.distillation.precision import module_bytes

    torch.manual_seed(0)
    codec = WeightCodec.empty("subspace", 300, 4, residual=False)
    for tensor in codec.state_dict().values():
        tensor.copy_(torch.randn_like(tensor))
    model = DistilledGenerator(Generator(3, [8], 4), codec, PartPrecisions("int4", "int8"))
    packed = model.pack(model.state_dict())
    assert {name.rsplit(".", 1)[1] for name in packed if name.startswith("codec.")} == {"int4", "scale"}
    assert {name.rsplit(".", 1)[1] for name in packed if name.startswith("generator.")} == {"int8", "scale"}
    back = model.unpack(packed)
    for name, tensor in model.state_dict().items():
        assert torch.equal(back[name], round_trip(tensor, "int4" if name.startswith("codec.") else "int8")), name
    assert model.stored_bytes() == module_bytes(model.codec, "int4") + module_bytes(model.generator, "int8")
    assert model.rounds() and not DistilledGenerator(model.generator, codec).rounds()
    with pytest.raises(ValueError, match="'stray.int8' has no place"):
        model.unpack({**packed, "stray.int8": packed["generator.net.0.weight.int8"]})


def test_a_codec_mean_at_its_own_precision_is_stored_and_counted_at_it_and_the_rest_of_the_codec_is_not():
    """PartPrecisions("int4", mean="int8"): the codec's mean packed at int8 (300 codes and 5 block scales:
    300 + 20 bytes), its basis and scales at int4, the generator networks at int4; each read back on its grid."""
    from apd.distillation.codec import WeightCodec
    from apd.distillation.gan import Generator
    from apd.distillation.generator import DistilledGenerator

    torch.manual_seed(0)
    codec = WeightCodec.empty("subspace", 300, 4, residual=False)
    for tensor in codec.state_dict().values():
        tensor.copy_(torch.randn_like(tensor))
    model = DistilledGenerator(Generator(3, [8], 4), codec, PartPrecisions("int4", mean="int8"))
    packed = model.pack(model.state_dict())
    assert {name for name in packed if name.startswith("codec.mean")} == {"codec.mean.int8", "codec.mean.scale"}
    assert {name.rsplit(".", 1)[1] for name in packed if name.startswith(("codec.basis", "codec.scale"))} == {
        "int4", "scale"}
    back = model.unpack(packed)
    for name, tensor in model.state_dict().items():
        assert torch.equal(back[name], round_trip(tensor, "int8" if name == "codec.mean" else "int4")), name
    everything_int4 = DistilledGenerator(model.generator, codec, PartPrecisions("int4")).stored_bytes()
    mean_int4 = math.ceil(300 / 2) + 4 * 5
    assert model.stored_bytes() == everything_int4 - mean_int4 + 300 + 4 * 5


def test_part_precisions_default_to_the_codec_s_and_describe_the_parts_stored_otherwise():
    """Empty parts take the codec's precision; ``describe`` names the parts that differ; the codec alone drops
    the generators'; a precision that is not one is a ValueError."""
    assert PartPrecisions("int4") == PartPrecisions("int4", "int4", "int4")
    assert PartPrecisions("int4").describe() == "int4" and not PartPrecisions().rounds()
    both = PartPrecisions("int4", "int8", "float32")
    assert both.describe() == "int4, generators int8, mean float32" and both.rounds()
    assert both.codec_only() == PartPrecisions("int4", mean="float32")
    assert (both.of("generator.net.0.weight"), both.of("codec.mean"), both.of("codec.basis")) == ("int8", "float32",
                                                                                                 "int4")
    assert both.of("codec.kronecker.scale") == "int4"  # a Kronecker residual's factors go with the codec
    with pytest.raises(ValueError, match="precision must be one of"):
        PartPrecisions("int4", mean="int2")

"""Target networks, the flat weight-vector layout, and batched prediction over many weight vectors.

Every posterior method in the project is, in the end, a set of flat weight vectors θ ∈ R^D for one
architecture: an MLP (:func:`mlp`) or a LeNet-style CNN, convolution layers in front of an MLP head
(:func:`network`). :class:`ParamSpec` maps between a module's parameters and θ; :func:`predict_probs`
evaluates K vectors on N inputs at once, p_k(y | x) = softmax(f(x; θ_k)), returning [K, N, C].
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from apd.errors import ArtifactError

# Elements of the largest activation tensor [k, N, width] in one chunk of predict_probs: 4 M floats
# (16 MB) bounds peak memory for any K and N; at N = 10,000 on fcNN1 chunks of 4 networks measured
# fastest (0.75 of the matmul rate on one thread, against 0.71 for 8 and 0.64 for 16).
_CHUNK_ELEMENTS = 4 * 2**20
_MAX_CHUNK = 128
# From this many inputs on, layer 1 of a chunk is one matmul against the chunk's first-layer weights
# copied side by side; below it, copying the weights costs more than the matmul saves, and a broadcast
# batched matmul reads them in place (measured in benchmarks/bench_predict.py).
_CONCAT_MIN_INPUTS = 2048
# Networks per block of a CNN's prediction. On a CPU its images per block keep one pooling quarter of the
# block's first-layer maps to _CNN_CACHE_ELEMENTS floats (1.5 MB, inside one core's 2 MB L2 cache: the maps
# are written and read back at once); on a GPU, to _CHUNK_ELEMENTS. Its head takes the maps of up to
# _CNN_HEAD_IMAGES images at once: LeNet-5 on the CPU, 20 networks × 16 images a convolution block, 400
# images a head product (measured in benchmarks/bench_predict_cnn.py).
_CNN_CHUNK = 20
_CNN_CACHE_ELEMENTS = 3 * 2**17
_CNN_HEAD_IMAGES = 400
# Up to this many networks a block convolves the images themselves, each network's first filters as
# ordinary output channels: below it, building the patches costs more than the few networks save by
# sharing them (LeNet-5 on 4,000 images, side by side in benchmarks/bench_predict_cnn_few.py)
_CNN_DIRECT_NETWORKS = 4
# Convolution layers of :func:`network`, as LeNet-5's: square KERNEL × KERNEL filters, the first padded by
# KERNEL // 2 (28 × 28 images read as LeNet-5's 32 × 32), the later ones unpadded, each followed by a ReLU
# and POOL × POOL max pooling.
KERNEL, POOL = 5, 2


def _padding(layer: int) -> int:
    return KERNEL // 2 if layer == 0 else 0


def mlp(sizes: list[int], dropout: float = 0.0) -> nn.Sequential:
    """Linear+ReLU stack ``sizes[0] → … → sizes[-1]`` with biases, dropout after each hidden ReLU
    (never on the input), linear output (logits)."""
    if len(sizes) < 2 or any(s < 1 for s in sizes):
        raise ValueError(f"mlp needs at least two positive layer sizes, got {sizes}")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout}")
    layers: list[nn.Module] = []
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        layers.append(nn.Linear(n_in, n_out))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
            if dropout > 0:
                layers.append(nn.Dropout(dropout))
    return nn.Sequential(*layers)


def conv_output_features(features: int, conv: list[int] | tuple[int, ...]) -> int:
    """Inputs of the MLP head behind ``conv`` (channels per layer) on square one-channel images of ``features``
    pixels: c_L · s_L², where s_{l+1} = (s_l + 2·pad_l − KERNEL + 1) / POOL. Raises ``ValueError`` unless the
    images are square and every feature map has a positive side that pooling divides evenly."""
    side = math.isqrt(features)
    if side * side != features:
        raise ValueError(f"a convolutional network needs square images; {features} pixels are not a square")
    for layer in range(len(conv)):
        convolved = side + 2 * _padding(layer) - KERNEL + 1
        if convolved < POOL or convolved % POOL:
            raise ValueError(f"{side}-pixel feature maps of convolution layer {layer + 1} give {convolved}-pixel "
                             f"maps, which {POOL} × {POOL} pooling does not divide evenly")
        side = convolved // POOL
    return conv[-1] * side * side


def network(sizes: list[int], conv: list[int] | tuple[int, ...] = (), dropout: float = 0.0) -> nn.Sequential:
    """The target network of ``sizes = [features, *hidden, classes]``: :func:`mlp` when ``conv`` is empty;
    otherwise a LeNet-style CNN (LeCun et al., 1998) on square one-channel images of ``features`` pixels:
    per entry c of ``conv``, Conv2d(·, c, KERNEL) (the first padded by KERNEL // 2) + ReLU +
    MaxPool2d(POOL), then the flattened maps into ``mlp([c_L · s_L², *hidden, classes], dropout)``
    (:func:`conv_output_features`). Takes flat inputs [N, features]. ``network(784-120-84-10, [6, 16])`` is
    LeNet-5 on 28 × 28 images with ReLU and max pooling (61,706 weights)."""
    if not conv:
        return mlp(sizes, dropout)
    if any(c < 1 for c in conv):
        raise ValueError(f"convolution channels must be positive, got {list(conv)}")
    head_inputs = conv_output_features(sizes[0], conv)  # raises for images the layers cannot take
    side = math.isqrt(sizes[0])
    layers: list[nn.Module] = [nn.Unflatten(1, (1, side, side))]
    for layer, (n_in, n_out) in enumerate(zip([1, *conv[:-1]], conv, strict=True)):
        layers += [nn.Conv2d(n_in, n_out, KERNEL, padding=_padding(layer)), nn.ReLU(), nn.MaxPool2d(POOL)]
    head = mlp([head_inputs, *sizes[1:]], dropout)
    return nn.Sequential(*layers, nn.Flatten(), *head)


@dataclass(frozen=True)
class ParamSpec:
    """Ordered names and shapes of a module's floating-point parameters; θ is their concatenation."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]

    @classmethod
    def from_module(cls, module: nn.Module) -> ParamSpec:
        pairs = [(n, tuple(p.shape)) for n, p in module.named_parameters() if p.is_floating_point()]
        return cls(tuple(n for n, _ in pairs), tuple(s for _, s in pairs))

    @property
    def sizes(self) -> list[int]:
        return [math.prod(shape) for shape in self.shapes]

    @property
    def numel(self) -> int:
        return sum(self.sizes)

    def offsets(self) -> list[tuple[str, int, int, tuple[int, ...]]]:
        """(name, start, stop, shape) of each parameter inside θ."""
        out, start = [], 0
        for name, shape, size in zip(self.names, self.shapes, self.sizes, strict=True):
            out.append((name, start, start + size, shape))
            start += size
        return out

    def flatten(self, module: nn.Module) -> Tensor:
        """θ of ``module`` as a new 1-D tensor (a copy, detached)."""
        params = dict(module.named_parameters())
        missing = [n for n in self.names if n not in params]
        if missing:
            raise ValueError(f"module has no parameter {missing[0]!r} named in the spec")
        return torch.cat([params[n].detach().reshape(-1) for n in self.names])

    def unflatten(self, vec: Tensor) -> dict[str, Tensor]:
        """Named views into ``vec`` (shape [D], or [K, D] giving [K, *shape] views)."""
        if vec.shape[-1] != self.numel:
            raise ValueError(f"weight vector has {vec.shape[-1]} entries, the spec needs {self.numel}")
        lead = vec.shape[:-1]
        return {name: vec[..., a:b].reshape(*lead, *shape) for name, a, b, shape in self.offsets()}

    def load_into(self, module: nn.Module, vec: Tensor) -> None:
        """Copy ``vec`` into ``module``'s parameters (the caller's own module, changed in place)."""
        params = dict(module.named_parameters())
        with torch.no_grad():
            for name, value in self.unflatten(vec).items():
                params[name].copy_(value)

    def conv_layers(self) -> list[tuple[int, int, int, int]]:
        """For a :func:`network` spec: (weight start, bias start, out channels, in channels) per convolution
        layer (the leading 4-D weights), in order; empty for an MLP."""
        entries = self.offsets()
        layers = []
        while 2 * len(layers) + 1 < len(entries) and len(entries[2 * len(layers)][3]) == 4:
            (w_name, w_start, _, w_shape), (b_name, b_start, _, b_shape) = entries[2 * len(layers):2 * len(layers) + 2]
            if w_shape[2:] != (KERNEL, KERNEL) or b_shape != (w_shape[0],):
                raise ValueError(f"spec is not a LeNet-style CNN: {w_name} {w_shape} / {b_name} {b_shape}")
            if layers and layers[-1][2] != w_shape[1]:
                raise ValueError(f"spec is not a LeNet-style CNN: {w_name} takes {w_shape[1]} channels, "
                                 f"the previous layer gives {layers[-1][2]}")
            layers.append((w_start, b_start, w_shape[0], w_shape[1]))
        return layers

    @property
    def is_mlp(self) -> bool:
        """Whether the spec is an :func:`mlp` (no convolution layers)."""
        return not self.conv_layers()

    def linear_layers(self) -> list[tuple[int, int, int, int]]:
        """(weight start, bias start, out, in) per Linear layer, in order: an :func:`mlp` spec's layers, or a
        CNN's head behind its :meth:`conv_layers`.

        Raises ``ValueError`` if they are not an alternating weight/bias chain with matching sizes.
        """
        entries = self.offsets()[2 * len(self.conv_layers()):]
        if len(entries) % 2 or not entries:
            raise ValueError("spec is not an MLP: expected (weight, bias) pairs")
        layers = []
        for (w_name, w_start, _, w_shape), (b_name, b_start, _, b_shape) in zip(
            entries[::2], entries[1::2], strict=True
        ):
            if len(w_shape) != 2 or b_shape != (w_shape[0],):
                raise ValueError(f"spec is not an MLP: {w_name} {w_shape} / {b_name} {b_shape}")
            if layers and layers[-1][2] != w_shape[1]:
                raise ValueError(f"spec is not an MLP: {w_name} takes {w_shape[1]} inputs, "
                                 f"the previous layer gives {layers[-1][2]}")
            layers.append((w_start, b_start, w_shape[0], w_shape[1]))
        return layers

    def trunk_and_tail(self) -> tuple[ParamSpec, ParamSpec]:
        """The network cut after its first linear layer: the trunk (every convolution and the first linear
        layer: θ's leading parameters) and the tail (the later linear layers, an MLP on the trunk's rectified
        outputs), so that f(x; θ) = tail(relu(trunk(x; θ_trunk)); θ_tail). Raises ``ValueError`` for a
        network with one linear layer (no tail)."""
        cut = 2 * len(self.conv_layers()) + 2
        if len(self.linear_layers()) < 2:
            raise ValueError("the network has one linear layer: no layers after its trunk")
        return (ParamSpec(self.names[:cut], self.shapes[:cut]), ParamSpec(self.names[cut:], self.shapes[cut:]))

    def activation_width(self, features: int) -> int:
        """Floats of the widest activation one network makes per input of ``features`` numbers: the widest
        hidden layer of an MLP, the first convolution's feature maps (channels × ``features``) of a CNN."""
        convs = self.conv_layers()
        return convs[0][2] * features if convs else max(out for _, _, out, _ in self.linear_layers())

    @property
    def layer_sizes(self) -> list[int]:
        """``[in, hidden…, out]`` of an :func:`mlp` spec (of a CNN's head)."""
        layers = self.linear_layers()
        return [layers[0][3]] + [out for _, _, out, _ in layers]

    def describe(self) -> str:
        """The network in one line: the channels of each convolution, then the layer sizes of the MLP (of a
        CNN's head), e.g. ``conv6-conv16-400-120-84-10`` (LeNet-5)."""
        return "".join(f"conv{out}-" for _, _, out, _ in self.conv_layers()) + "-".join(map(str, self.layer_sizes))

    def to_json(self) -> str:
        return json.dumps({"names": list(self.names), "shapes": [list(s) for s in self.shapes]})

    @classmethod
    def from_json(cls, text: str) -> ParamSpec:
        try:
            data = json.loads(text)
            return cls(tuple(data["names"]), tuple(tuple(int(d) for d in s) for s in data["shapes"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise ArtifactError(f"malformed parameter spec: {exc}") from None


def auto_chunk(n_inputs: int, max_width: int, n_networks: int) -> int:
    """Networks per chunk so the largest activation tensor stays near ``_CHUNK_ELEMENTS`` floats."""
    by_memory = _CHUNK_ELEMENTS // max(1, n_inputs * max_width)
    return int(max(1, min(n_networks, _MAX_CHUNK, by_memory)))


def gradient_blocks(spec: ParamSpec, features: int, n_networks: int, data_batch: int) -> tuple[int, int]:
    """Networks × inputs per block of a gradient taken through :func:`predict_logits`, where autograd keeps a
    few activation tensors per layer. An MLP's cost per network does not fall with the block's networks, so
    it keeps ``data_batch`` inputs and takes a quarter of :func:`auto_chunk`'s networks; a CNN's falls
    (grouped convolutions; LeNet-5's scores side by side in ``benchmarks/bench_stein.py``), so it takes
    :data:`_CNN_CHUNK` networks and ``data_batch // networks`` inputs, the network-inputs of one network on
    ``data_batch`` inputs."""
    if spec.conv_layers():
        networks = max(1, min(n_networks, _CNN_CHUNK))
        return networks, max(1, data_batch // networks)
    return max(1, auto_chunk(data_batch, spec.activation_width(features), n_networks) // 4), data_batch


def check_input_features(spec: ParamSpec, features: int) -> None:
    """A one-line ``ValueError`` unless inputs of ``features`` numbers each (pixels, for a CNN) fit the
    network of ``spec``."""
    convs, layers = spec.conv_layers(), spec.linear_layers()
    if convs:
        if conv_output_features(features, [c for _, _, c, _ in convs]) != layers[0][3]:
            raise ValueError(f"inputs have {features} pixels, the network's head takes {layers[0][3]} features")
    elif features != layers[0][3]:
        raise ValueError(f"inputs have {features} features, the network takes {layers[0][3]}")


def predict_logits(
    spec_or_module: ParamSpec | nn.Module,
    weights: Tensor,
    x: Tensor,
    chunk: int | None = None,
    compute_dtype: torch.dtype | None = None,
) -> Tensor:
    """Logits f(x; θ_k) of a :func:`network` for K weight vectors: weights [K, D], x [N, ...] → [K, N, C].

    MLP: for many inputs the first layer of a chunk of k networks is one matmul x · [W₁⁽¹⁾ … W₁⁽ᵏ⁾]ᵀ
    ([N, k·h]); for few, a broadcast batched matmul; later layers are batched ``baddbmm``. Chunks of
    ``chunk`` networks (default :func:`auto_chunk`) bound peak memory. CNN: blocks of ``chunk`` networks
    (default :data:`_CNN_CHUNK`) × as many images as keep a quarter of the block's first-layer maps to
    :data:`_CNN_CACHE_ELEMENTS` floats on a CPU (:data:`_CHUNK_ELEMENTS` on a GPU; :func:`_cnn_logits`): the
    first convolution four products of the images' patches with the block's filters, one per pooling
    offset, later ones grouped convolutions (k groups), the head batched ``baddbmm``; blocks of at most
    :data:`_CNN_DIRECT_NETWORKS` networks convolve the images directly (:func:`_cnn_direct_logits`). Computes on
    ``weights.device``; ``compute_dtype`` (e.g. ``torch.bfloat16``) casts weights and inputs for the
    matmuls; the result is float32. Differentiable in ``x`` and ``weights``; never writes
    into a module.
    """
    spec = spec_or_module if isinstance(spec_or_module, ParamSpec) else ParamSpec.from_module(spec_or_module)
    if weights.dim() == 1:
        weights = weights.unsqueeze(0)
    if weights.dim() != 2 or weights.shape[1] != spec.numel:
        raise ValueError(f"weights must be [K, {spec.numel}], got {list(weights.shape)}")
    convs, layers = spec.conv_layers(), spec.linear_layers()
    x = x.reshape(x.shape[0], -1).to(device=weights.device)
    check_input_features(spec, x.shape[1])
    dtype = compute_dtype or weights.dtype
    x = x.to(dtype)
    n_nets, n_inputs = weights.shape[0], x.shape[0]
    if chunk is not None and chunk < 1:
        raise ValueError(f"chunk must be positive, got {chunk}")
    if convs:
        networks = min(n_nets, chunk or _CNN_CHUNK)
        if networks <= _CNN_DIRECT_NETWORKS:
            return torch.cat([_cnn_direct_logits(spec, weights[start:start + networks].to(dtype), x)
                              for start in range(0, n_nets, networks)]).float()
        budget = _CHUNK_ELEMENTS if weights.device.type == "cuda" else _CNN_CACHE_ELEMENTS
        images = max(1, budget * POOL * POOL // (networks * spec.activation_width(x.shape[1])))
        return _cnn_logits(spec, weights.to(dtype), x, networks, images).float()
    chunk = chunk or auto_chunk(n_inputs, spec.activation_width(x.shape[1]), n_nets)
    outputs = []
    for start in range(0, n_nets, chunk):
        block = weights[start:start + chunk].to(dtype)
        outputs.append(_mlp_forward(layers, _by_start(spec, block), x).float())
    return torch.cat(outputs)


def predict_logits_on_trunk(spec: ParamSpec, trunk: Tensor, weights: Tensor, x: Tensor) -> Tensor:
    """Logits [K, N, C] of K networks that share the trunk of ``trunk`` [D] (every convolution and the first
    linear layer, :meth:`ParamSpec.trunk_and_tail`) and differ after it (``weights`` [K, D]; their trunk
    entries are not read): h = relu(W₁ φ(x) + b₁) once, with the trunk's own weights, then
    f_k(x) = tail(h; θ_k) for each row (:func:`predict_logits` of the tail MLP on h). An MC-dropout
    ensemble is such a set: its masks only scale the columns of the later layers. Differentiable in x."""
    head, tail = spec.trunk_and_tail()
    if weights.dim() != 2 or weights.shape[1] != spec.numel or trunk.shape != (spec.numel,):
        raise ValueError(f"trunk must be [{spec.numel}] and weights [K, {spec.numel}], got {list(trunk.shape)} "
                         f"and {list(weights.shape)}")
    h = predict_logits(head, trunk[:head.numel], x)[0].relu()
    return predict_logits(tail, weights[:, head.numel:], h)


def _cnn_logits(spec: ParamSpec, weights: Tensor, x: Tensor, networks: int, images: int) -> Tensor:
    """Logits [K, N, C] of the CNNs ``weights`` [K, D] on shared flat images x [N, side²]: for each
    :data:`_CNN_HEAD_IMAGES` images, their first-layer patches unfolded once (:func:`_pooled_patches`, in
    blocks of ``images``) for every block of ``networks`` networks, whose convolutions
    (:func:`_shared_maps`) run block by block and whose head (:func:`_cnn_head`) takes all those images'
    maps in one batched product."""
    convs, layers = spec.conv_layers(), spec.linear_layers()
    side = math.isqrt(x.shape[1])
    blocks = [_by_start(spec, weights[start:start + networks]) for start in range(0, len(weights), networks)]
    columns = []
    for start in range(0, len(x), _CNN_HEAD_IMAGES):
        stop = min(start + _CNN_HEAD_IMAGES, len(x))
        quarters = [_pooled_patches(x[at:min(at + images, stop)], side) for at in range(start, stop, images)]
        columns.append(torch.cat([
            _cnn_head(layers, params, torch.cat([_shared_maps(convs, params, q, side) for q in quarters]))
            for params in blocks]))
    return torch.cat(columns, 1)


def _cnn_direct_logits(spec: ParamSpec, block: Tensor, x: Tensor) -> Tensor:
    """Logits [k, N, C] of the few CNNs ``block`` [k, D] (k ≤ :data:`_CNN_DIRECT_NETWORKS`) on shared flat
    images x [N, side²], :data:`_CNN_HEAD_IMAGES` at a time: every convolution grouped (:func:`_cnn_forward`
    on the images seen by each of the k networks)."""
    convs, layers, params = spec.conv_layers(), spec.linear_layers(), _by_start(spec, block)
    return torch.cat([_cnn_forward(convs, layers, params, x[start:start + _CNN_HEAD_IMAGES].expand(len(block), -1, -1))
                      for start in range(0, len(x), _CNN_HEAD_IMAGES)], 1)


def _by_start(spec: ParamSpec, block: Tensor) -> dict[int, Tensor]:
    """Each parameter's columns of ``block`` [k, D] ([k, size] views), keyed by the parameter's start in θ.
    One ``split``: its backward writes θ's gradient in one pass, where each slice's backward would fill a
    zero [k, D] tensor of its own and autograd would add them up."""
    starts = [start for _, start, _, _ in spec.offsets()]
    return dict(zip(starts, block.split(spec.sizes, dim=1), strict=True))


def _mlp_forward(layers: list[tuple[int, int, int, int]], params: dict[int, Tensor], x: Tensor) -> Tensor:
    """Forward pass of k MLPs (``params``: :func:`_by_start` of their rows) on shared inputs x [N, in] →
    [k, N, C]."""
    w_start, b_start, n_out, n_in = layers[0]
    w1, b1 = params[w_start], params[b_start]
    k, n_inputs = w1.shape[0], x.shape[0]
    w1 = w1.view(k, n_out, n_in)
    if n_inputs >= _CONCAT_MIN_INPUTS:
        h = torch.addmm(b1.reshape(1, k * n_out), x, w1.reshape(k * n_out, n_in).t())
        h = h.view(n_inputs, k, n_out).transpose(0, 1)  # [k, N, h]
    else:
        h = torch.matmul(x, w1.transpose(1, 2)) + b1.unsqueeze(1)
    if len(layers) == 1:
        return h
    return _linear_stack(layers[1:], params, h.relu_())  # in place: our own intermediate, not read by backward


def _linear_stack(layers: list[tuple[int, int, int, int]], params: dict[int, Tensor], h: Tensor) -> Tensor:
    """Linear layers of k networks (``params``: :func:`_by_start`) on their own inputs h [k, N, in], ReLU
    between them → [k, N, out]."""
    k = h.shape[0]
    for i, (w_start, b_start, n_out, n_in) in enumerate(layers):
        if i:
            h = h.relu_()  # in place: h is our own intermediate, and baddbmm's backward never reads it
        w = params[w_start].view(k, n_out, n_in)
        b = params[b_start].view(k, 1, n_out)
        h = torch.baddbmm(b, h, w.transpose(1, 2))
    return h


def _cnn_forward(convs: list[tuple[int, int, int, int]], layers: list[tuple[int, int, int, int]],
                 params: dict[int, Tensor], x: Tensor) -> Tensor:
    """Forward pass of k CNNs (``params``: :func:`_by_start` of their rows), each on its own flat images
    x [k, N, side²] → [k, N, C]: the k networks' images side by side as channels of one tensor
    [N, k, s, s], every convolution grouped (k groups)."""
    k, n_inputs = x.shape[0], x.shape[1]
    side = math.isqrt(x.shape[-1])
    h = _grouped_convolution(convs[0], params, x.transpose(0, 1).reshape(n_inputs, k, side, side), 0)
    return _cnn_head(layers, params, _later_convolutions(convs, params, h))


def _shared_maps(convs: list[tuple[int, int, int, int]], params: dict[int, Tensor], quarters: Tensor,
                 side: int) -> Tensor:
    """The last convolution's pooled maps [n, k·c, s', s'] of k CNNs (``params``: :func:`_by_start` of their
    rows) on shared images, given as the first convolution's patches at each pooling offset
    (:func:`_pooled_patches`, [POOL², n·(side / POOL)², KERNEL²]).

    A convolution is W · patch + b at every output position, so the first layer's pooled maps are
    relu(max_q (P_q · [W⁽¹⁾ … W⁽ᵏ⁾]ᵀ) + b): one product [n·(s/2)², KERNEL²] · [KERNEL², k·c] per pooling
    offset q, each the size of the pooled maps, reduced by elementwise maxima as they come. Taking the bias
    and the ReLU after the max is exact: max_q(a_q) + b = max_q(a_q + b), and max commutes with the ReLU,
    since rounding is monotone. The rows are the pooled positions of each image in order and the columns
    the k networks' channels: channels-last maps [n, k·c, s/2, s/2] as they stand, which the later grouped
    convolutions (:func:`_later_convolutions`) take without a copy."""
    w_start, b_start, n_out, _ = convs[0]
    k, half = params[w_start].shape[0], side // POOL
    filters = params[w_start].reshape(k * n_out, -1).t()
    h = functools.reduce(torch.maximum, (torch.mm(quarter, filters) for quarter in quarters))
    h = h.add_(params[b_start].reshape(1, k * n_out)).relu_()  # in place: our own maps
    return _later_convolutions(convs, params, h.view(-1, half, half, k * n_out).permute(0, 3, 1, 2))


def _later_convolutions(convs: list[tuple[int, int, int, int]], params: dict[int, Tensor], h: Tensor) -> Tensor:
    """Every convolution after the first of k CNNs on their first layer's pooled maps h [N, k·c, s, s],
    grouped (k groups; :func:`_grouped_convolution`) → [N, k·c', s', s']."""
    for i in range(1, len(convs)):
        h = _grouped_convolution(convs[i], params, h, i)
    return h


def _cnn_head(layers: list[tuple[int, int, int, int]], params: dict[int, Tensor], h: Tensor) -> Tensor:
    """The MLP heads of k CNNs on their last pooled maps h [N, k·c, s, s]: each network's maps flattened as
    nn.Flatten does, batched ``baddbmm`` (:func:`_linear_stack`) → [k, N, C]."""
    n_inputs, k = h.shape[0], params[layers[0][0]].shape[0]
    return _linear_stack(layers, params, h.reshape(n_inputs, k, -1).transpose(0, 1))


def _grouped_convolution(conv: tuple[int, int, int, int], params: dict[int, Tensor], h: Tensor, layer: int) -> Tensor:
    """Convolution ``layer`` of k networks on their maps h [N, k·c_in, s, s], k groups, then pooled
    (:func:`_max_pool`) and rectified: [N, k·c_out, s', s']. The maps are made channels-last first, on which
    this CPU ran the grouped convolutions about 5× faster than on contiguous ones."""
    w_start, b_start, n_out, n_in = conv
    k = params[w_start].shape[0]
    h = h.contiguous(memory_format=torch.channels_last)
    h = F.conv2d(h, params[w_start].reshape(k * n_out, n_in, KERNEL, KERNEL), params[b_start].reshape(k * n_out),
                 padding=_padding(layer), groups=k)
    return _max_pool(h).relu_()  # in place: the pooled maps are our own, and max's backward never reads them


def _pooled_patches(images: Tensor, side: int) -> Tensor:
    """The first convolution's patches of flat one-channel images [n, side²] at each pooling offset:
    [POOL², n·(side / POOL)², KERNEL²], entry (q, m) the patch of output position (POOL·i + a, POOL·j + b),
    q = POOL·a + b and m = (image, i, j) in order, padded by KERNEL // 2, in the filters' (row, column) order;
    a copy of sliding-window views of the padded images (``Tensor.unfold``)."""
    n, pad, half = images.shape[0], _padding(0), side // POOL
    padded = F.pad(images.view(n, side, side), (pad, pad, pad, pad))
    windows = padded.unfold(1, KERNEL, 1).unfold(2, KERNEL, 1)  # [n, side, side, KERNEL, KERNEL]
    by_offset = windows.reshape(n, half, POOL, half, POOL, KERNEL * KERNEL).permute(2, 4, 0, 1, 3, 5)
    return by_offset.reshape(POOL * POOL, n * half * half, KERNEL * KERNEL)


def per_network_logits(spec: ParamSpec, weights: Tensor, x: Tensor) -> Tensor:
    """Logits of K networks, each on its own inputs: weights [K, D], x [K, N, features] → [K, N, C].

    The training step of K SGLD chains on their own minibatches (:class:`apd.samplers.chain.SGLDChains`): an
    MLP is K batched ``baddbmm`` products per layer (:func:`_linear_stack`), a CNN K-group convolutions
    (:func:`_cnn_forward`). Computes in ``weights``' dtype on its device, in one block; differentiable."""
    if weights.dim() != 2 or weights.shape[1] != spec.numel:
        raise ValueError(f"weights must be [K, {spec.numel}], got {list(weights.shape)}")
    if x.dim() != 3 or x.shape[0] != weights.shape[0]:
        raise ValueError(f"inputs must be [{weights.shape[0]}, N, features], one set per network; got {list(x.shape)}")
    convs, layers = spec.conv_layers(), spec.linear_layers()
    x = x.to(device=weights.device, dtype=weights.dtype)
    params = _by_start(spec, weights)
    return _cnn_forward(convs, layers, params, x) if convs else _linear_stack(layers, params, x)


def _max_pool(h: Tensor) -> Tensor:
    """POOL × POOL max pooling with stride POOL of maps h [..., s, s] (:func:`network` makes POOL divide s).
    Without autograd, as elementwise maxima of strided views, since ``F.max_pool2d``'s forward measured up
    to 10× slower on this CPU; with autograd, ``F.max_pool2d``, whose backward is the cheaper one."""
    if h.requires_grad:
        return F.max_pool2d(h, POOL)
    rows = functools.reduce(torch.maximum, (h[..., i::POOL, :] for i in range(POOL)))
    return functools.reduce(torch.maximum, (rows[..., j::POOL] for j in range(POOL)))


def predict_probs(
    spec_or_module: ParamSpec | nn.Module,
    weights: Tensor,
    x: Tensor,
    chunk: int | None = None,
    compute_dtype: torch.dtype | None = None,
) -> Tensor:
    """Class probabilities softmax(f(x; θ_k)) for K weight vectors: [K, D] × [N, ...] → [K, N, C].

    See :func:`predict_logits` for batching, chunking, devices and ``compute_dtype``; the softmax is
    :func:`softmax_over_classes`.
    """
    return softmax_over_classes(predict_logits(spec_or_module, weights, x, chunk, compute_dtype))


def softmax_over_classes(logits: Tensor) -> Tensor:
    """softmax over the last dimension, p_c = exp(z_c − max z) / Σ_c' exp(z_c' − max z), as three
    elementwise passes and two reductions.

    The same function as ``torch.softmax(logits, -1)`` up to rounding (a few ulp). On this CPU torch's fused
    kernel took 18 ns per element for 10 classes (1,000 networks × 100 inputs: 18.5 ms on one thread), these
    passes 2.9 ms: at K = 1,000, N = 100 that is a tenth of an fcNN1 prediction. The max is held constant
    for autograd, so the gradient is the softmax's own.
    """
    shifted = logits - logits.amax(-1, keepdim=True).detach()
    exp = shifted.exp_()
    return exp / exp.sum(-1, keepdim=True)

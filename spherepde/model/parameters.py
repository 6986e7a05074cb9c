"""The parameters of the velocity field layer by layer, beyond the seeds' model (docs/model.md "Beyond the seeds"):

    v(x, t) = P_x( f_t(x) + sum_h V_{h,t} m_h[rho](x) ),
    f_t(x) = W_t x                          (model.feed_forward = "linear", the seeds' model)
    f_t(x) = W2_t sigma(W1_t x + b_t)       (model.feed_forward = "mlp": hidden width n, activation sigma)

with m_h the attention mean of head h (its kernel, beta_h and B_{h,t}; spherepde.model.attention), every matrix
piecewise constant over L equal layers of [0, t_end].  Head 0 is model.kernel, beta, B, V; model.extra_heads adds
the others.  One layer's parameters are one flat vector theta_l of `Layout.size` numbers (the feed-forward's
groups, then B (H, d, d), then V (H, d, d)), so that the solvers carry, step and differentiate one tensor
(M, L, p) whatever the model; the groups of control.train ("W": the feed-forward's, "B", "V") are the trained
entries.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as functional


def softplus(z: torch.Tensor) -> torch.Tensor:
    """log(1 + e^z), to round-off at every z, and by autograd its derivative 1 / (1 + e^-z).  functional.softplus
    returns z itself above its threshold z = 20, short of log(1 + e^z) by e^-z (2.1e-9 just above 20, 10^6 times the
    value's round-off), and its derivative 1 there."""
    return torch.logaddexp(z, torch.zeros_like(z))


ACTIVATIONS = {"tanh": torch.tanh, "relu": torch.relu, "gelu": functional.gelu, "sigmoid": torch.sigmoid,
               "softplus": softplus}


@dataclass(frozen=True)
class Head:
    """One attention head's fixed choices: its kernel ("softmax" | "unnormalized") and beta (inf allowed)."""

    kernel: str
    beta: float

    @property
    def zero_temperature(self) -> bool:
        return math.isinf(self.beta)


@dataclass(frozen=True)
class Layout:
    """Where each parameter group sits in theta_l (module docstring), and which are trained.

    `hidden` = 0 is the linear feed-forward W (d, d); else W1 (n, d), b (n,), W2 (d, n).  `layered` says whether
    any matrix of the case varies over the layers (a list of L matrices; a linear W not counted: a list of them is
    each layer's drive on the seeds' paths, a plain run's W_l or where a training starts); `lambda_reg` maps each
    trained group of control.train to its L2 weight.
    """

    dim: int
    heads: tuple
    hidden: int = 0
    activation: str = "tanh"
    layers: int = 1
    layered: bool = False
    train: tuple = ("W",)
    lambda_reg: tuple = ()

    @property
    def feed_forward_groups(self) -> tuple:
        d, n = self.dim, self.hidden
        return (("W", (d, d)),) if n == 0 else (("W1", (n, d)), ("b", (n,)), ("W2", (d, n)))

    @property
    def groups(self) -> tuple:
        """(name, shape) of every group of theta_l, in order."""
        d, h = self.dim, len(self.heads)
        return self.feed_forward_groups + (("B", (h, d, d)), ("V", (h, d, d)))

    @property
    def size(self) -> int:
        return sum(math.prod(shape) for _, shape in self.groups)

    @property
    def seeds_model(self) -> bool:
        """Whether this is the seeds' model (one head, a linear feed-forward, B and V constant and not trained),
        which spherepde.model.transport's fast paths step."""
        return len(self.heads) == 1 and self.hidden == 0 and not self.layered and set(self.train) <= {"W"}

    def one_fixed_head(self, theta: torch.Tensor, trained: bool = False) -> bool:
        """Whether the attention of the parameters theta (L, p) is one head whose B and V are the same on every
        layer (and, in a training's run (`trained`), not trained): the model the one-head diagnostics (the
        subspaces of V B^T and V, the interaction and free energies) are defined for."""
        if len(self.heads) != 1 or (trained and {"B", "V"} & set(self.train)):
            return False
        parts = self.unpack(theta)
        return all(bool((parts[name] == parts[name][:1]).all()) for name in ("B", "V"))

    def members_of(self, group: str) -> tuple:
        """The groups of theta_l a name of control.train stands for."""
        return tuple(name for name, _ in self.feed_forward_groups) if group == "W" else (group,)

    def unpack(self, theta: torch.Tensor) -> dict:
        """{group: view (..., *shape)} of theta (..., p)."""
        parts, start = {}, 0
        for name, shape in self.groups:
            stop = start + math.prod(shape)
            parts[name] = theta[..., start:stop].reshape(theta.shape[:-1] + shape)
            start = stop
        return parts

    def pack(self, parts: dict) -> torch.Tensor:
        """theta (..., p) from {group: (..., *shape)} (the inverse of `unpack`)."""
        leading = parts["B"].shape[:-3]
        return torch.cat([parts[name].reshape(leading + (-1,)) for name, _ in self.groups], dim=-1)

    def entry_weights(self, like: torch.Tensor) -> torch.Tensor:
        """lambda (p,) of every entry of theta_l: its group's control.lambda_reg, 0 where not trained."""
        weights = dict(self.lambda_reg)
        parts = {}
        for name, shape in self.groups:
            group = "W" if name in self.members_of("W") else name
            parts[name] = like.new_full(shape, weights.get(group, 0.0) if group in self.train else 0.0)
        return self.pack(parts)

    def trained(self, like: torch.Tensor) -> torch.Tensor:
        """Boolean (p,): the entries of theta_l that control.train trains."""
        parts = {name: like.new_full(shape, float(("W" if name in self.members_of("W") else name) in self.train))
                 for name, shape in self.groups}
        return self.pack(parts) > 0

    def feed_forward(self, parts: dict, points: torch.Tensor) -> torch.Tensor:
        """f(x) (M, P, d) at points (P, d) or (M, P, d) for the members' groups (M, *shape) of `unpack`."""
        if self.hidden == 0:
            return torch.matmul(points, parts["W"].transpose(-1, -2))
        hidden = torch.matmul(points, parts["W1"].transpose(-1, -2)) + parts["b"][..., None, :]
        return torch.matmul(ACTIVATIONS[self.activation](hidden), parts["W2"].transpose(-1, -2))


def layer_values(value, layers: int, rank: int = 2) -> list:
    """A case's matrix (rank 2) or vector (rank 1) key as one value per layer: a list of L values stays, one value
    repeats."""
    return list(value) if is_layered(value, rank) else [value] * layers


def start_of_W(case, W: torch.Tensor, placement) -> torch.Tensor:
    """Where a training's W starts: its model.W's list of one per layer (layers, d, d), else `W` (d, d), the
    model's, on every layer."""
    listed = case["model"]["W"]
    return placement.tensor(listed) if is_layered(listed) else W


def is_layered(value, rank: int = 2) -> bool:
    """Whether a matrix (rank 2) or vector (rank 1) key's value is a list of per-layer values."""
    depth, entry = 0, value
    while isinstance(entry, (list, tuple)) and entry:
        entry, depth = entry[0], depth + 1
    return depth == rank + 1


def model_layers(case) -> int:
    """L: control.layers in a training, else the number of matrices of a layered model key (1 when none is)."""
    if case["control"]:
        return case["control"]["layers"]
    counts = {len(value) for value, rank in _layer_keys(case["model"]) if is_layered(value, rank)}
    return max(counts) if counts else 1


def _layer_keys(model: dict, feed_forward: bool = True) -> list:
    """(value, rank) of every key of [model] that may vary over the layers (the feed-forward's with
    `feed_forward`)."""
    keys = ("B", "V") + (("W", "W1", "b", "W2") if feed_forward else ())
    values = [(model[key], 1 if key == "b" else 2) for key in keys if key in model]
    for head in model.get("extra_heads", ()):
        values += [(head["B"], 2), (head["V"], 2)]
    return values


def layout_of(case) -> Layout:
    """The Layout of a resolved case."""
    model, control = case["model"], case["control"]
    heads = (Head(model["kernel"], float(model["beta"])),) + tuple(
        Head(head["kernel"], float(head["beta"])) for head in model.get("extra_heads", ()))
    mlp = model.get("feed_forward", "linear") == "mlp"
    train = tuple(control.get("train", ("W",))) if control else ()
    lambda_reg = control.get("lambda_reg", 0.0) if control else 0.0
    weights = tuple((group, float(lambda_reg[group] if isinstance(lambda_reg, dict) else lambda_reg))
                    for group in train)
    # a linear W per layer is each layer's drive (a plain run's W_l, a training's start), not a model beyond the
    # seeds': the seeds' paths step it, 11 (lmax 64) to 32 (lmax 128) times faster than the layered transport on
    # seed 004's case
    return Layout(dim=case.dim, heads=heads, hidden=model["hidden"] if mlp else 0,
                  activation=model.get("activation", "tanh"), layers=model_layers(case),
                  layered=any(is_layered(value, rank) for value, rank in _layer_keys(model, mlp)),
                  train=train, lambda_reg=weights)


def parameters_of(case, layout: Layout, placement) -> torch.Tensor:
    """theta (L, p) of a resolved case: every group's value on every layer (a training's starting point)."""
    model, L = case["model"], layout.layers
    head_tables = [model] + list(model.get("extra_heads", ()))
    per_layer = {"B": [layer_values(head["B"], L) for head in head_tables],
                 "V": [layer_values(head["V"], L) for head in head_tables]}
    parts = {name: placement.tensor(layer_values(model[name], L, len(shape)))
             for name, shape in layout.feed_forward_groups}
    for name in ("B", "V"):
        parts[name] = placement.tensor(per_layer[name]).transpose(0, 1)  # (H, L, d, d) -> (L, H, d, d)
    return layout.pack(parts)

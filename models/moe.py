"""Sparse mixture-of-experts feed-forward layer (a drop-in replacement for the FFN).

Routing (Shazeer et al. 2017; GShard, Lepikhin et al. 2020; Switch, Fedus et al. 2021):

* router logits ``h = x W_r`` (``Linear(d_model, n_experts, bias=False)``), probabilities
  ``p = softmax(h)`` over experts, and each token picks its ``top_k`` experts.
* Gate weights: for ``top_k == 1`` the raw top-1 probability ``p_i`` (Switch eq. 2, so the
  router is trained by the main loss); for ``top_k > 1`` the top-k probabilities renormalised
  to sum to 1 (GShard Algorithm 1 for top-2; Mixtral, Jiang et al. 2024, whose softmax over the
  top-k logits is the same thing).
* Capacity, in training only: each expert processes at most ``ceil(capacity_factor * n_tokens *
  top_k / n_experts)`` assignments (``capacity_factor=None``: no limit). Assignments over
  capacity are dropped: their contribution is zero and the residual connection outside carries
  the token (Switch Sec. 2.2). Priority is first come first served in token order; with
  ``top_k > 1`` all first choices come before all second choices, etc. (GShard Algorithm 1),
  i.e. the priority order is (choice rank, token index). In evaluation (``self.training`` False)
  nothing is dropped, so a token's output never depends on the other tokens of its batch and
  validation metrics do not depend on the batch size or on how the set is split over processes.
* Padding: ``forward(x, padding_mask)`` (True = padding) routes only the real tokens, so
  ``n_tokens`` counts real tokens only; padding takes no capacity, is left out of the losses and
  statistics below and gets a zero output (shared experts included). The real tokens' outputs,
  losses and statistics are exactly those of the batch of real tokens alone.
* Shared experts (DeepSeekMoE, Dai et al. 2024): ``n_shared_experts`` dense FFNs applied to
  every token and added to the routed output.

Auxiliary losses, recomputed on every forward over the real tokens and stored on the module as
tensors (the caller adds them, weighted, to the training loss):

* ``aux_loss`` -- Switch load-balancing loss ``n_experts * sum_i f_i * P_i`` (Fedus et al.
  2021 eq. 4-6), with ``f_i`` the fraction of the ``n_tokens * top_k`` assignments routed to
  expert i (before capacity dropping; for top-1 the fraction of tokens whose argmax is i)
  and ``P_i`` the mean router probability of expert i. Equals 1 under uniform routing.
* ``z_loss`` -- router z-loss ``mean_tokens(logsumexp(h)^2)`` (Zoph et al. 2022, ST-MoE eq. 5).

Dispatch, with no Python loop over tokens or experts: the routed experts process an
``(n_experts, C, d_model)`` buffer, the expert input of GShard and Switch (Fedus et al. 2021
Sec. 2.2), built by sorting and gathering instead of a one-hot dispatch einsum:

1. the ``k * n_tokens`` assignments, listed in priority order, are sorted by expert with a
   stable argsort, so each expert's assignments stay in priority order;
2. an assignment's position within its expert is its sorted index minus the expert's first
   sorted index (``cumsum(counts) - counts``); it is kept iff ``position < C``, with ``C``
   the largest expert count of the batch, capped at the capacity (a larger buffer would only
   hold empty rows). On a GPU in training with a capacity, ``C`` is the capacity itself (at most
   the number of tokens): a size the host knows without reading the counts back, so the layer
   never waits for the GPU (the same assignments are kept and computed; the buffer only has more
   empty rows, whose FLOPs ``blockbench.cell.perf`` does not count);
3. kept tokens are copied (``index_copy``) to row ``(expert, position)`` of a zero buffer and
   all experts run at once on it: ``experts`` is the FFN of kind ``expert_kind`` whose Linears
   are ``StackedLinear`` (one ``bmm`` each, see ``stack_experts``);
4. each kept assignment reads back its own row, times its gate, and ``index_add`` sums the rows
   into their tokens. Empty buffer rows (bias-only outputs) are never read and dropped assignments
   are added to a spare output row that is cut off, so neither reaches the output or the
   gradients.

The statistics of the last forward stay tensors on the layer's device (``tokens_per_expert``,
``dropped_assignments``), read on the host only where they are logged: a read waits for the GPU.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch
from torch import nn

from .mlp import build_ffn


def runs_ahead(device: torch.device) -> bool:
    """Whether the host runs ahead of the work it queues on ``device``, so that reading a value of it
    (``int(t)``, ``.item()``) waits for that work: on any accelerator. A CPU has done its work when
    each call returns: reading costs nothing there, and the layer reads the largest expert count."""
    return device.type != "cpu"


class StackedLinear(nn.Linear):
    """``n_experts`` independent ``Linear(in_features, out_features)`` layers run as one batched
    matmul: for ``x`` of shape ``(n_experts, C, in_features)``, ``y[e] = x[e] @ weight[e].T + bias[e]``.

    ``weight`` has shape ``(n_experts, out_features, in_features)`` and ``bias``
    ``(n_experts, out_features)``: expert ``e``'s slices are exactly the ``weight`` and ``bias``
    of its ``nn.Linear``. It subclasses ``nn.Linear`` so that the code that finds linear layers
    by type and attribute name treats every expert matrix as the ``nn.Linear`` it stands for:
    ``init_weights`` (N(0, 0.02) weights, zero biases, the residual shrink of ``fc_out``) and
    DeepNet's ``deepnorm_init_`` (redraws ``fc_in``, ``fc_gate``, ``fc_out``, each expert with its own fans).
    """

    def __init__(self, n_experts: int, in_features: int, out_features: int, bias: bool = True):
        nn.Module.__init__(self)  # not nn.Linear.__init__, which would allocate a 2-D weight
        self.n_experts = n_experts
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(torch.empty(n_experts, out_features, in_features))
        self.register_parameter("bias", nn.Parameter(torch.empty(n_experts, out_features)) if bias else None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Each expert as ``nn.Linear.reset_parameters``: ``kaiming_uniform_(a=sqrt(5))`` of the
        weight and the bias are both U(-1/sqrt(in_features), 1/sqrt(in_features))."""
        bound = 1 / math.sqrt(self.in_features)
        nn.init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(n_experts, C, in_features) -> (n_experts, C, out_features)``."""
        weight = self.weight.transpose(1, 2)  # (E, in, out)
        if self.bias is None:
            return torch.bmm(x, weight)
        return torch.baddbmm(self.bias.unsqueeze(1), x, weight)

    def extra_repr(self) -> str:
        return (
            f"n_experts={self.n_experts}, in_features={self.in_features}, "
            f"out_features={self.out_features}, bias={self.bias is not None}"
        )


def stack_experts(build_expert: Callable[[], nn.Module], n_experts: int) -> nn.Module:
    """``n_experts`` FFNs of the kind ``build_expert`` builds, as one module mapping
    ``(n_experts, C, d_model) -> (n_experts, C, d_model)``, expert ``e`` on slice ``e``.

    It is the FFN itself with every ``nn.Linear`` replaced by a ``StackedLinear`` of the same
    shape: every FFN kind applies its Linears to the last dimension and everything else
    (activation, gating product, dropout) elementwise, so the FFN's own ``forward`` on the
    stacked input is all experts at once, and a new FFN kind needs no batched counterpart.
    Dropout draws an independent mask per element, as ``n_experts`` separate FFNs would. A kind
    with parameters outside its Linears cannot be stacked this way and raises ``TypeError``.
    """
    with torch.device("meta"):  # the template's own weights are replaced, never allocated
        experts = build_expert()
    for name, layer in list(experts.named_modules()):
        if isinstance(layer, nn.Linear):
            parent, _, attr = name.rpartition(".")
            stacked = StackedLinear(n_experts, layer.in_features, layer.out_features, bias=layer.bias is not None)
            setattr(experts.get_submodule(parent), attr, stacked)
    unstacked = [name for name, t in experts.state_dict().items() if t.is_meta]
    if unstacked:
        raise TypeError(f"cannot stack {type(experts).__name__} experts: state outside nn.Linear: {unstacked}")
    return experts


class MoEFeedForward(nn.Module):
    """Top-k routed experts plus shared experts, all of FFN kind ``expert_kind`` (see the module
    docstring). ``experts`` holds the routed experts stacked (``experts.fc_in.weight`` has shape
    ``(n_experts, hidden, d_model)``, ...); ``expert(e)`` returns expert ``e`` as a standalone
    FFN; ``build_expert()`` builds one fresh FFN of the experts' kind and shape."""

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        activation: str = "gelu",
        bias: bool = True,
        dropout: float = 0.0,
        *,
        n_experts: int,
        top_k: int,
        capacity_factor: float | None = 1.25,
        n_shared_experts: int = 0,
        expert_kind: str = "mlp",
    ):
        super().__init__()
        if n_experts < 1:
            raise ValueError(f"n_experts must be >= 1, got {n_experts}")
        if not 1 <= top_k <= n_experts:
            raise ValueError(f"top_k must be in [1, n_experts={n_experts}], got {top_k}")
        if capacity_factor is not None and capacity_factor <= 0:
            raise ValueError(f"capacity_factor must be positive or None, got {capacity_factor}")
        if n_shared_experts < 0:
            raise ValueError(f"n_shared_experts must be >= 0, got {n_shared_experts}")
        self.d_model = d_model
        self.n_experts = n_experts
        self.top_k = top_k
        self.capacity_factor = capacity_factor
        self.build_expert = functools.partial(
            build_ffn, expert_kind, d_model, d_ff, activation, bias=bias, dropout=dropout
        )
        self.router = nn.Linear(d_model, n_experts, bias=False)
        self.experts = stack_experts(self.build_expert, n_experts)  # routed, e.g. experts.fc_in.weight (E, F, D)
        self.shared_experts = nn.ModuleList(self.build_expert() for _ in range(n_shared_experts))
        # filled in by every forward
        self.aux_loss: torch.Tensor | None = None
        self.z_loss: torch.Tensor | None = None
        self.tokens_per_expert: torch.Tensor | None = None
        #: assignments dropped over capacity (a 0-dim int64 tensor on the layer's device)
        self.dropped_assignments: torch.Tensor | None = None
        self.assignments = 0  # top_k * real tokens: the assignments routed, dropped ones included
        self.expert_rows = 0  # rows of the experts' buffer, n_experts * C: kept assignments and empty rows

    @property
    def dropped_tokens(self) -> int:
        """Assignments dropped over capacity in the last forward, as a number (a read that waits for
        the device on a GPU; logging reads :attr:`dropped_assignments` instead)."""
        return 0 if self.dropped_assignments is None else int(self.dropped_assignments)

    def capacity(self, n_tokens: int) -> int | None:
        """Max assignments per expert for a batch of ``n_tokens`` real tokens (None = unlimited: no
        ``capacity_factor``, or evaluation mode, where dropping would make a token's output depend
        on its batch)."""
        if self.capacity_factor is None or not self.training:
            return None
        return math.ceil(self.capacity_factor * n_tokens * self.top_k / self.n_experts)

    def expert(self, e: int) -> nn.Module:
        """Routed expert ``e`` as a standalone FFN of ``expert_kind`` (what ``build_ffn`` builds),
        holding a copy of its weights, in this layer's train/eval mode."""
        if not 0 <= e < self.n_experts:
            raise IndexError(f"expert {e} out of range for {self.n_experts} experts")
        with torch.device("meta"):
            ffn = self.build_expert()
        ffn.load_state_dict({name: t[e].clone() for name, t in self.experts.state_dict().items()}, assign=True)
        return ffn.train(self.training)

    def forward(self, x: torch.Tensor, padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``x`` (..., d_model) -> (..., d_model). ``padding_mask`` (``x.shape[:-1]``, True = padding)
        leaves padding out of routing, capacity, losses and statistics; its output is zero."""
        shape = x.shape
        if shape[-1] != self.d_model:
            raise ValueError(f"expected last dim {self.d_model}, got shape {tuple(shape)}")
        tokens = x.reshape(-1, self.d_model)  # (N, D)
        if padding_mask is None:
            return self._route(tokens).reshape(shape)
        if padding_mask.shape != shape[:-1]:
            raise ValueError(
                f"padding_mask of shape {tuple(padding_mask.shape)} does not match the tokens {tuple(shape[:-1])}; "
                "pass one flag per token (True = padding)"
            )
        if torch.compiler.is_compiling():  # selecting the real tokens would break the graph (a data-dependent shape)
            return self._route_masked(tokens, ~padding_mask.reshape(-1)).reshape(shape)
        real = (~padding_mask).reshape(-1).nonzero().squeeze(1)
        out = torch.zeros_like(tokens).index_copy(0, real, self._route(tokens.index_select(0, real)))
        return out.reshape(shape)

    def _assignments(self, tokens: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Router logits, probabilities, and every (token, expert) assignment in priority order
        (choice rank, then token index): the flat expert, token and gate of each, (k*N,) each."""
        n, k = tokens.shape[0], self.top_k
        logits = self.router(tokens)  # (N, E)
        probs = logits.softmax(dim=-1)
        top_p, top_e = probs.topk(k, dim=-1)  # (N, k), ordered by decreasing probability
        gates = top_p / top_p.sum(dim=-1, keepdim=True) if k > 1 else top_p
        flat_token = torch.arange(n, device=tokens.device).repeat(k)
        return logits, probs, top_e.t().reshape(-1), flat_token, gates.t().reshape(-1)

    def _dispatch(
        self,
        tokens: torch.Tensor,
        expert: torch.Tensor,
        token: torch.Tensor,
        gate: torch.Tensor,
        position: torch.Tensor,
        keep: torch.Tensor,
        slots: int,
    ) -> tuple[torch.Tensor, int]:
        """The routed experts' output for ``tokens`` (N, D) from the sorted assignments kept (``keep``)
        at ``position`` in their expert's ``slots`` rows; and the buffer's row count (E * C)."""
        n = tokens.shape[0]
        # dispatch into (E, C, D); dropped assignments all go to a spare row that no expert reads
        n_slots = self.n_experts * slots
        slot = torch.where(keep, expert * slots + position, n_slots)
        buffer = tokens.new_zeros(n_slots + 1, self.d_model).index_copy(0, slot, tokens.index_select(0, token))
        expert_out = self.experts(buffer[:n_slots].view(self.n_experts, slots, self.d_model)).reshape(
            n_slots, self.d_model
        )
        # combine: each kept assignment adds its own row, times its gate, to its token; dropped
        # ones read row 0 and add it to a spare output row n that is cut off
        rows = expert_out.index_select(0, torch.where(keep, slot, 0)) * gate.unsqueeze(-1)
        target = torch.where(keep, token, n)
        return tokens.new_zeros(n + 1, self.d_model).index_add_(0, target, rows.to(tokens.dtype))[:n], n_slots

    def _route_masked(self, tokens: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        """The layer on ``tokens`` (N, D) of which ``real`` (N,) are not padding, without selecting
        them (a compiled graph keeps its shapes): what :meth:`_route` gives on the real tokens alone,
        up to rounding. Padding is routed last within each expert and always dropped, so it takes no
        capacity; it is left out of the losses and statistics, and its output is zero."""
        n, k, n_exp = tokens.shape[0], self.top_k, self.n_experts
        logits, probs, flat_expert, flat_token, flat_gate = self._assignments(tokens)
        flat_real = real.repeat(k)
        counts = torch.zeros(n_exp, dtype=torch.long, device=tokens.device).scatter_add_(
            0, flat_expert, flat_real.long()
        )  # real assignments per expert
        # sorted by expert, real before padding, priority kept inside: padding ranks after every real one
        order = torch.argsort(flat_expert * 2 + (~flat_real).long(), stable=True)
        expert, token, gate, is_real = flat_expert[order], flat_token[order], flat_gate[order], flat_real[order]
        totals = torch.zeros(n_exp, dtype=torch.long, device=tokens.device).scatter_add_(
            0, flat_expert, torch.ones_like(flat_expert)
        )
        position = torch.arange(k * n, device=tokens.device) - (totals.cumsum(0) - totals)[expert]
        n_real = real.sum()
        limit = (
            counts.max()
            if self.capacity_factor is None or not self.training
            else torch.ceil(self.capacity_factor * n_real * k / n_exp).long()
        )  # as self.capacity(n_real), as a tensor
        keep = is_real & (position < limit)
        out, n_slots = self._dispatch(tokens, expert, token, gate, position, keep, slots=n)  # room for every token
        for shared in self.shared_experts:
            out = out + shared(tokens) * real.unsqueeze(-1).to(tokens.dtype)
        weight = real.to(probs.dtype)
        denominator = n_real.clamp(min=1).to(probs.dtype)
        frac = counts.to(probs.dtype) / (denominator * k)
        mean_prob = (probs * weight.unsqueeze(-1)).sum(dim=0) / denominator
        self.aux_loss = n_exp * (frac * mean_prob).sum()
        self.z_loss = (torch.logsumexp(logits, dim=-1).pow(2) * weight).sum() / denominator
        self.tokens_per_expert = frac.detach()
        self.dropped_assignments = (is_real & ~keep).sum()
        self.assignments, self.expert_rows = k * n_real, n_slots
        return out

    def _route(self, tokens: torch.Tensor) -> torch.Tensor:
        """The layer on ``tokens`` (N, D), all real; sets the losses and statistics."""
        n, k, n_exp = tokens.shape[0], self.top_k, self.n_experts
        logits, probs, flat_expert, flat_token, flat_gate = self._assignments(tokens)

        # sorted by expert, priority kept inside; position = rank within the expert's assignments
        # (counted by scatter_add: bincount on a GPU reads the largest index back to the host)
        counts = torch.zeros(n_exp, dtype=torch.long, device=tokens.device).scatter_add_(
            0, flat_expert, torch.ones_like(flat_expert)
        )  # (E,)
        order = torch.argsort(flat_expert, stable=True)
        expert, token, gate = flat_expert[order], flat_token[order], flat_gate[order]
        first = counts.cumsum(0) - counts  # sorted index of each expert's first assignment
        position = torch.arange(k * n, device=tokens.device) - first[expert]
        capacity = self.capacity(n)
        if capacity is not None and runs_ahead(tokens.device):
            slots = min(capacity, n)  # C without reading the counts: no expert gets a token twice
        elif torch.compiler.is_compiling():
            # a compiled graph cannot read the counts without a graph break: room for every token
            slots = n if capacity is None else min(capacity, n)
        else:
            max_count = int(counts.max())
            slots = max_count if capacity is None else min(capacity, max_count)  # C
        keep = position < slots
        out, n_slots = self._dispatch(tokens, expert, token, gate, position, keep, slots)
        for shared in self.shared_experts:
            out = out + shared(tokens)

        # auxiliary losses and statistics
        if n > 0:
            frac = counts.to(probs.dtype) / (n * k)  # f_i, not differentiable
            mean_prob = probs.mean(dim=0)  # P_i
            self.aux_loss = n_exp * (frac * mean_prob).sum()
            self.z_loss = torch.logsumexp(logits, dim=-1).pow(2).mean()
        else:
            frac = torch.zeros(n_exp, dtype=probs.dtype, device=tokens.device)
            self.aux_loss = logits.new_zeros(())
            self.z_loss = logits.new_zeros(())
        self.tokens_per_expert = frac.detach()
        self.dropped_assignments = (~keep).sum()
        self.assignments, self.expert_rows = k * n, n_slots
        return out

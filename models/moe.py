"""Sparse mixture-of-experts feed-forward layer (a drop-in replacement for the FFN).

Routing (Shazeer et al. 2017; GShard, Lepikhin et al. 2020; Switch, Fedus et al. 2021):

* router logits ``h = x W_r`` (``Linear(d_model, n_experts, bias=False)``), probabilities
  ``p = softmax(h)`` over experts, and each token picks its ``top_k`` experts.
* Gate weights: for ``top_k == 1`` the raw top-1 probability ``p_i`` (Switch eq. 2, so the
  router is trained by the main loss); for ``top_k > 1`` the top-k probabilities renormalised
  to sum to 1 (GShard Algorithm 1 for top-2; Mixtral, Jiang et al. 2024, whose softmax over the
  top-k logits is the same thing).
* Capacity: each expert processes at most ``ceil(capacity_factor * n_tokens * top_k /
  n_experts)`` assignments (``capacity_factor=None``: no limit). Assignments over capacity are
  dropped: their contribution is zero and the residual connection outside carries the token
  (Switch Sec. 2.2). Priority is first come first served in token order; with ``top_k > 1``
  all first choices come before all second choices, etc. (GShard Algorithm 1), i.e. the
  priority order is (choice rank, token index).
* Shared experts (DeepSeekMoE, Dai et al. 2024): ``n_shared_experts`` dense FFNs applied to
  every token and added to the routed output.

Auxiliary losses, recomputed on every forward and stored on the module as tensors (the caller
adds them, weighted, to the training loss):

* ``aux_loss`` -- Switch load-balancing loss ``n_experts * sum_i f_i * P_i`` (Fedus et al.
  2021 eq. 4-6), with ``f_i`` the fraction of the ``n_tokens * top_k`` assignments routed to
  expert i (before capacity dropping; for top-1 the fraction of tokens whose argmax is i)
  and ``P_i`` the mean router probability of expert i. Equals 1 under uniform routing.
* ``z_loss`` -- router z-loss ``mean_tokens(logsumexp(h)^2)`` (Zoph et al. 2022, ST-MoE eq. 5).

Dispatch has no Python loop over tokens: assignments are sorted by expert (stable argsort),
counted with ``bincount``, gathered with ``index_select`` and scattered back with
``index_add_``; only the experts are looped over.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .mlp import build_ffn


class MoEFeedForward(nn.Module):
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
        self.router = nn.Linear(d_model, n_experts, bias=False)
        self.experts = nn.ModuleList(
            build_ffn(expert_kind, d_model, d_ff, activation, bias=bias, dropout=dropout) for _ in range(n_experts)
        )
        self.shared_experts = nn.ModuleList(
            build_ffn(expert_kind, d_model, d_ff, activation, bias=bias, dropout=dropout)
            for _ in range(n_shared_experts)
        )
        # filled in by every forward
        self.aux_loss: torch.Tensor | None = None
        self.z_loss: torch.Tensor | None = None
        self.tokens_per_expert: torch.Tensor | None = None
        self.dropped_tokens: int = 0

    def capacity(self, n_tokens: int) -> int | None:
        """Max assignments per expert for a batch of ``n_tokens`` tokens (None = unlimited)."""
        if self.capacity_factor is None:
            return None
        return math.ceil(self.capacity_factor * n_tokens * self.top_k / self.n_experts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        if shape[-1] != self.d_model:
            raise ValueError(f"expected last dim {self.d_model}, got shape {tuple(shape)}")
        tokens = x.reshape(-1, self.d_model)  # (N, D)
        n, k, n_exp = tokens.shape[0], self.top_k, self.n_experts

        logits = self.router(tokens)  # (N, E)
        probs = logits.softmax(dim=-1)
        top_p, top_e = probs.topk(k, dim=-1)  # (N, k), ordered by decreasing probability
        gates = top_p / top_p.sum(dim=-1, keepdim=True) if k > 1 else top_p

        # assignments in priority order: (choice rank, token index)
        flat_expert = top_e.t().reshape(-1)  # (k*N,)
        flat_token = torch.arange(n, device=x.device).repeat(k)
        flat_gate = gates.t().reshape(-1)

        counts = torch.bincount(flat_expert, minlength=n_exp)  # (E,)
        order = torch.argsort(flat_expert, stable=True)  # grouped by expert, priority kept inside
        capacity = self.capacity(n)
        kept = counts if capacity is None else counts.clamp(max=capacity)

        out = torch.zeros_like(tokens)
        start = 0
        for e, (count, keep) in enumerate(zip(counts.tolist(), kept.tolist())):
            if keep > 0:
                idx = order[start : start + keep]
                tok = flat_token.index_select(0, idx)
                y = self.experts[e](tokens.index_select(0, tok)) * flat_gate.index_select(0, idx).unsqueeze(-1)
                out.index_add_(0, tok, y.to(out.dtype))
            start += count
        for shared in self.shared_experts:
            out = out + shared(tokens)

        # auxiliary losses and statistics
        if n > 0:
            frac = counts.to(probs.dtype) / (n * k)  # f_i, not differentiable
            mean_prob = probs.mean(dim=0)  # P_i
            self.aux_loss = n_exp * (frac * mean_prob).sum()
            self.z_loss = torch.logsumexp(logits, dim=-1).pow(2).mean()
        else:
            frac = torch.zeros(n_exp, dtype=probs.dtype, device=x.device)
            self.aux_loss = logits.new_zeros(())
            self.z_loss = logits.new_zeros(())
        self.tokens_per_expert = frac.detach()
        self.dropped_tokens = int((counts - kept).sum().item())
        return out.reshape(shape)

"""§5.4 label smoothing on the tied output projection (§3.4), computed for real target tokens only.

Padding positions are dropped before the vocabulary-sized projection: the decoder states where the target
is not ``<pad>`` are gathered (``real_targets``) and only they are projected. The loss is returned as a
sum over tokens, so that the caller divides by the token count of a whole update (``step.py``).

The padding is found in the targets (``y </s>``), never in the decoder's input (``<s> y``): where the start
token is ``<pad>`` itself (Marian), it is fed and attended to like any token, and no target holds it. The
smoothing spreads ε over the whole vocabulary, as the paper does: ids that are never targets (``<pad>``,
``<s>``, whether they are one id or two) get ε/V like every other, so a folder trained here learns exactly
what it did before, and the search keeps ``never_generate`` ids out of every translation. A logits bias
(``logits_bias``, Marian's) is part of the projection, in the loss and its gradient as in the model's logits.

Training uses ``fused_label_smoothed_sum``: projection, log-sum-exp, loss and the gradient of both inputs
in one pass over chunks of rows, while each chunk is still in cache. ``F.cross_entropy(...,
label_smoothing=eps)`` walks the (tokens, vocab) logits about a dozen times (log-softmax, the smoothing
sum, the NLL gradient's zero-fill and scatter, their sum, log-softmax backward); for a small model that
buffer costs more than the layers. The gradient is computed in the forward (the loss is a scalar, so
backward only scales it), as Liger's fused linear cross-entropy does. Per row, with z the logits and V the
vocabulary size:

    z         = h · Wᵀ (+ b)
    loss      = lse(z) - (1 - eps) · z_target - eps · mean(z)
    d loss/dz = softmax(z) - (1 - eps) · onehot(target) - eps / V    (so d loss/db = Σ over rows of it)

which is ``F.cross_entropy(z, target, label_smoothing=eps, reduction="sum")`` row by row.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.model.transformer import Transformer

CHUNK_ROWS = 512  # rows of logits alive at once: 512 × 10 000 fp32 = 20 MB


def real_targets(states: Tensor, tgt_out: Tensor, pad_id: int) -> tuple[Tensor, Tensor]:
    """(batch, tgt_len, d_model) states and (batch, tgt_len) targets → those of real targets, (n, d) and (n,).

    Keyed on the targets, which hold no start token: a ``<s>`` that is ``<pad>`` (Marian) is never dropped."""
    keep = (tgt_out != pad_id).flatten()
    return states.flatten(0, 1)[keep], tgt_out.flatten()[keep]


def label_smoothed_sum(
    rows: Tensor, weight: Tensor, target: Tensor, smoothing: float, bias: Tensor | None = None
) -> Tensor:
    """Σ over rows of the smoothed cross-entropy of ``rows @ weightᵀ (+ bias)`` (n, vocab): the plain way, for
    validation."""
    logits = (rows @ weight.t()).float()  # (n, vocab)
    if bias is not None:
        logits = logits + bias.float()
    return F.cross_entropy(logits, target, label_smoothing=smoothing, reduction="sum")


class _FusedLabelSmoothed(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        rows: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        target: Tensor,
        smoothing: float,
        compute_dtype: torch.dtype,
    ) -> Tensor:
        with torch.autocast(rows.device.type, enabled=False):
            h, w = rows.to(compute_dtype), weight.to(compute_dtype)
            n_rows, vocab = h.size(0), w.size(0)
            acc_dtype = torch.promote_types(compute_dtype, torch.float32)  # fp32 (fp64 in tests)
            grad_rows = torch.empty(n_rows, h.size(1), dtype=compute_dtype, device=h.device)
            grad_weight = torch.zeros(weight.shape, dtype=acc_dtype, device=h.device)
            b = None if bias is None else bias.to(acc_dtype)
            grad_bias = torch.zeros(vocab if b is not None else 0, dtype=acc_dtype, device=h.device)
            total = torch.zeros((), dtype=acc_dtype, device=h.device)
            for start in range(0, n_rows, CHUNK_ROWS):
                stop = min(start + CHUNK_ROWS, n_rows)
                index = torch.arange(stop - start, device=h.device)
                t = target[start:stop]
                z = (h[start:stop] @ w.t()).to(acc_dtype)  # (rows, vocab)
                if b is not None:
                    z += b
                z_target = z[index, t]
                z_sum = z.sum(dim=1)
                z_max = z.amax(dim=1, keepdim=True)
                z.sub_(z_max).exp_()  # in place: exp(z - max)
                exp_sum = z.sum(dim=1, keepdim=True)
                lse = z_max.squeeze(1) + exp_sum.squeeze(1).log()
                total += (lse - (1.0 - smoothing) * z_target - (smoothing / vocab) * z_sum).sum()
                z.div_(exp_sum).sub_(smoothing / vocab)  # softmax - eps/V
                z[index, t] -= 1.0 - smoothing  # - (1 - eps)·onehot: now d loss / dz
                if b is not None:
                    grad_bias += z.sum(dim=0)
                g = z.to(compute_dtype)
                torch.mm(g, w, out=grad_rows[start:stop])
                grad_weight += (g.t() @ h[start:stop]).to(acc_dtype)
        ctx.save_for_backward(grad_rows, grad_weight, grad_bias)
        ctx.dtypes = rows.dtype, weight.dtype, None if bias is None else bias.dtype
        return total

    @staticmethod
    def backward(ctx: Any, grad_total: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        grad_rows, grad_weight, grad_bias = ctx.saved_tensors
        rows_dtype, weight_dtype, bias_dtype = ctx.dtypes
        return (
            (grad_rows * grad_total).to(rows_dtype),
            (grad_weight * grad_total).to(weight_dtype),
            None if bias_dtype is None else (grad_bias * grad_total).to(bias_dtype),
            None,
            None,
            None,
        )


def fused_label_smoothed_sum(
    rows: Tensor,
    weight: Tensor,
    target: Tensor,
    smoothing: float,
    compute_dtype: torch.dtype | None = None,
    bias: Tensor | None = None,
) -> Tensor:
    """``label_smoothed_sum`` in one pass, differentiable in ``rows`` (n, d), ``weight`` (vocab, d) and ``bias``
    (vocab,) where the projection has one.

    The two projection matmuls run in ``compute_dtype`` (by default autocast's, e.g. bf16, else the rows');
    log-sum-exp, loss and gradient arithmetic stay in fp32 (or fp64). Returns a scalar of that type.
    """
    if compute_dtype is None:
        device = rows.device.type
        compute_dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else rows.dtype
    return _FusedLabelSmoothed.apply(rows, weight, bias, target, smoothing, compute_dtype)


class SmoothedLoss(nn.Module):
    """The training objective as one module, so that DDP wraps all of it: Σ of the smoothed cross-entropy."""

    def __init__(self, model: Transformer, smoothing: float) -> None:
        super().__init__()
        self.model = model
        self.smoothing = smoothing

    def forward(self, src_ids: Tensor, tgt_in: Tensor, tgt_out: Tensor) -> Tensor:
        """(batch, src_len), (batch, tgt_len) ×2 → the loss summed over the real target tokens (scalar)."""
        states = self.model.teacher_forced_states(src_ids, tgt_in)  # (batch, tgt_len, d_model)
        rows, target = real_targets(states, tgt_out, self.model.config.special_tokens.pad)
        embedding = self.model.embedding
        return fused_label_smoothed_sum(rows, embedding.weight, target, self.smoothing, bias=embedding.bias)

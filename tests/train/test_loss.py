"""The tied projection and smoothed loss on real targets only: today's loss and gradients, to float rounding."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from aiayn.core.config import ModelConfig, SpecialTokens
from aiayn.model.transformer import Transformer
from aiayn.train.loss import (
    CHUNK_ROWS,
    SmoothedLoss,
    fused_label_smoothed_sum,
    label_smoothed_sum,
    real_targets,
)
from aiayn.train.precision import autocast, bf16_native

CONFIG = ModelConfig(
    vocab_size=300, d_model=32, n_heads=4, d_ff=64, n_encoder_layers=2, n_decoder_layers=2, dropout=0.0
)
# An imported Marian checkpoint's choices: </s> 0, <pad> last and the decoder's start, a logits bias.
MARIAN_LIKE = CONFIG.replace(
    special_tokens=SpecialTokens(pad=299, unk=1, bos=299, eos=0), logits_bias=True, activation="swish"
)


def padded_batch(
    seed: int, rows: int = 6, tokens: SpecialTokens = CONFIG.special_tokens
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random sentences of different lengths, right-padded: (rows, src_len), (rows, tgt_len) ×2."""
    g = torch.Generator().manual_seed(seed)
    src_len = torch.randint(2, 12, (rows,), generator=g)
    tgt_len = torch.randint(1, 10, (rows,), generator=g)
    src = torch.full((rows, int(src_len.max())), tokens.pad, dtype=torch.long)
    tgt_in = torch.full((rows, int(tgt_len.max()) + 1), tokens.pad, dtype=torch.long)
    tgt_out = torch.full_like(tgt_in, tokens.pad)
    for i in range(rows):
        s, t = int(src_len[i]), int(tgt_len[i])
        src[i, :s] = torch.randint(4, CONFIG.vocab_size - 1, (s,), generator=g)  # no special token
        src[i, s - 1] = tokens.eos
        y = torch.randint(4, CONFIG.vocab_size - 1, (t,), generator=g)
        tgt_in[i, : t + 1] = torch.cat([torch.tensor([tokens.bos]), y])
        tgt_out[i, : t + 1] = torch.cat([y, torch.tensor([tokens.eos])])
    return src, tgt_in, tgt_out


def todays_loss(model: Transformer, batch: tuple[torch.Tensor, ...], smoothing: float) -> torch.Tensor:
    """What the trainer computed before: every position projected, padding ignored, the mean over tokens."""
    src, tgt_in, tgt_out = batch
    logits = model(src, tgt_in)  # (batch, tgt_len, vocab)
    pad = model.config.special_tokens.pad
    return F.cross_entropy(logits.flatten(0, 1).float(), tgt_out.flatten(), ignore_index=pad, label_smoothing=smoothing)


@pytest.mark.parametrize("config", [CONFIG, MARIAN_LIKE], ids=["paper", "marian-like"])
def test_projecting_only_real_targets_gives_todays_loss_and_gradients(config: ModelConfig) -> None:
    """Where the start token is <pad> itself, it is still fed and every real target counted; a logits bias is in
    the loss and gets its gradient."""
    torch.manual_seed(0)
    model = Transformer(config)
    if model.embedding.bias is not None:
        torch.nn.init.normal_(model.embedding.bias, 0.0, 0.5)
    special = config.special_tokens
    batch = padded_batch(1, tokens=special)
    assert bool((batch[1][:, 0] == special.pad).all()) == (special.bos == special.pad)
    tokens = int((batch[2] != special.pad).sum())
    assert tokens < batch[2].numel()  # there is padding to skip

    today = todays_loss(model, batch, 0.1)
    today_grads = torch.autograd.grad(today, list(model.parameters()))
    summed = SmoothedLoss(model, 0.1)(*batch)
    ours_grads = torch.autograd.grad(summed / tokens, list(model.parameters()))
    torch.testing.assert_close(summed / tokens, today, rtol=1e-6, atol=0)
    for ours, theirs in zip(ours_grads, today_grads, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-7)

    states = model.teacher_forced_states(batch[0], batch[1])
    rows, target = real_targets(states, batch[2], special.pad)
    assert rows.shape == (tokens, CONFIG.d_model)
    plain = label_smoothed_sum(rows, model.embedding.weight, target, 0.1, model.embedding.bias)
    torch.testing.assert_close(plain / tokens, today, rtol=1e-6, atol=0)


@pytest.mark.parametrize("n_rows", [1, CHUNK_ROWS, 2 * CHUNK_ROWS + 37])
@pytest.mark.parametrize("with_bias", [False, True])
def test_the_fused_pass_is_cross_entropy_exactly_in_float64(n_rows: int, with_bias: bool) -> None:
    torch.manual_seed(n_rows)
    rows = torch.randn(n_rows, 16, dtype=torch.float64, requires_grad=True)
    weight = (0.3 * torch.randn(50, 16, dtype=torch.float64)).requires_grad_()
    bias = torch.randn(50, dtype=torch.float64, requires_grad=True) if with_bias else None
    target = torch.randint(0, 50, (n_rows,))
    logits = rows @ weight.t() if bias is None else rows @ weight.t() + bias
    reference = F.cross_entropy(logits, target, label_smoothing=0.1, reduction="sum")
    fused = fused_label_smoothed_sum(rows, weight, target, 0.1, bias=bias)
    torch.testing.assert_close(fused, reference, rtol=1e-12, atol=1e-12)
    inputs = (rows, weight) if bias is None else (rows, weight, bias)
    want = torch.autograd.grad(0.3 * reference, inputs)
    got = torch.autograd.grad(0.3 * fused, inputs)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.skipif(not bf16_native(torch.device("cpu")), reason="this CPU has no native bf16")
def test_bf16_autocast_keeps_the_loss_close() -> None:
    torch.manual_seed(0)
    model = Transformer(CONFIG)
    batch = padded_batch(2)
    fp32 = SmoothedLoss(model, 0.1)(*batch)
    with autocast("bf16", torch.device("cpu")):
        bf16 = SmoothedLoss(model, 0.1)(*batch)
    assert bf16.dtype == torch.float32
    torch.testing.assert_close(bf16, fp32, rtol=2e-2, atol=0)

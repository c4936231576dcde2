"""Unit tests of the paper's parts on tiny configs: shapes, masks, positions, cache, tying, known tutorial bugs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from aiayn.core.config import PRESETS, ModelConfig
from aiayn.engines.pytorch import TorchEngine
from aiayn.model.layers import sinusoidal_positions
from aiayn.model.masks import causal_mask, padding_mask
from aiayn.model.transformer import Transformer

PAD = 0


def tiny_config(**changes: object) -> ModelConfig:
    base = ModelConfig(
        vocab_size=50, d_model=16, n_heads=4, d_ff=32, n_encoder_layers=2, n_decoder_layers=2, dropout=0.0
    )
    return base.replace(**changes)


def tiny_model(seed: int = 0, **changes: object) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(tiny_config(**changes)).eval()


def random_ids(batch: int, length: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(4, 50, (batch, length), generator=gen)


def test_base_preset_has_the_papers_65m_parameters() -> None:
    model = Transformer(PRESETS["base"].replace(vocab_size=37000))
    assert abs(model.num_parameters() - 65e6) / 65e6 <= 0.03


def test_base_preset_matches_table_3() -> None:
    base = PRESETS["base"]
    assert (base.n_encoder_layers, base.d_model, base.d_ff, base.n_heads, base.dropout) == (6, 512, 2048, 8, 0.1)
    assert base.d_head == 64 and not base.norm_first


def test_three_way_weight_tying() -> None:
    model = tiny_model()
    matrices = [p for name, p in model.named_parameters() if p.dim() == 2 and p.shape[0] == model.config.vocab_size]
    assert len(matrices) == 1, "source, target embeddings and output projection must be one matrix"
    hidden = torch.randn(1, 3, 16)
    assert torch.equal(model.embedding.logits(hidden), hidden @ model.embedding.weight.t())


def test_embedding_is_scaled_by_sqrt_d_model() -> None:
    model = tiny_model()
    ids = torch.tensor([[5, 6]])
    assert torch.allclose(model.embedding(ids), model.embedding.weight[ids] * math.sqrt(16))


def test_sinusoidal_positions_are_the_papers_interleaved_formula() -> None:
    d_model = 8
    table = sinusoidal_positions(torch.arange(5), d_model)
    for pos in range(5):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_positions_have_no_length_limit_and_offsets_agree() -> None:
    long = sinusoidal_positions(torch.arange(5000), 16)
    assert long.shape == (5000, 16) and torch.isfinite(long).all()
    assert torch.allclose(sinusoidal_positions(torch.arange(4990, 5000), 16), long[4990:], atol=1e-5)
    model = tiny_model()
    src = random_ids(1, 3000, 1)
    assert torch.isfinite(model.encode(src)).all()


def test_padding_mask_masks_keys_not_queries() -> None:
    ids = torch.tensor([[7, 8, PAD]])
    mask = padding_mask(ids, PAD)
    assert mask.shape == (1, 1, 1, 3)  # broadcasts over queries: every query sees the real keys
    assert mask[0, 0, 0].tolist() == [True, True, False]


def test_causal_mask_lets_position_i_see_0_to_i() -> None:
    mask = causal_mask(4, 4, torch.device("cpu"))[0, 0]
    assert torch.equal(mask, torch.tril(torch.ones(4, 4, dtype=torch.bool)))
    # With two cached positions the two new queries are positions 2 and 3.
    assert causal_mask(2, 4, torch.device("cpu"))[0, 0].tolist() == [[True, True, True, False], [True] * 4]


def test_layer_norm_is_standard_with_biased_variance() -> None:
    model = tiny_model()
    norm = model.encoder_layers[0].self_attn_residual.norm
    x = torch.randn(2, 3, 16)
    expected = (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + norm.eps)
    assert torch.allclose(norm(x), expected, atol=1e-5)


def test_post_ln_has_no_final_norm_and_pre_ln_has_one() -> None:
    assert tiny_model().encoder_norm is None and tiny_model().decoder_norm is None
    pre = tiny_model(norm_first=True)
    assert pre.encoder_norm is not None and pre.decoder_norm is not None


def test_post_ln_normalises_after_the_residual_sum() -> None:
    model = tiny_model()
    layer = model.encoder_layers[0]
    x = torch.randn(1, 4, 16)
    out = layer(x, torch.ones(1, 1, 1, 4, dtype=torch.bool))
    # A post-LN layer ends with LayerNorm, so each position has mean 0 and variance 1 (before its affine
    # parameters, which start at 1 and 0).
    assert torch.allclose(out.mean(-1), torch.zeros(1, 4), atol=1e-5)
    assert torch.allclose(out.var(-1, unbiased=False), torch.ones(1, 4), atol=1e-3)


def test_cross_attention_has_its_own_weights() -> None:
    model = tiny_model()
    layer = model.decoder_layers[0]
    assert layer.cross_attn is not layer.self_attn
    assert not torch.equal(layer.cross_attn.w_q.weight, layer.self_attn.w_q.weight)
    # Changing only the cross-attention weights changes the output: the decoder really uses them.
    src, tgt = random_ids(1, 5, 1), random_ids(1, 4, 2)
    before = model(src, tgt)
    with torch.no_grad():
        layer.cross_attn.w_v.weight.mul_(2.0)
    assert not torch.allclose(model(src, tgt), before)


@pytest.mark.parametrize("norm_first", [False, True])
def test_changing_a_future_target_token_leaves_earlier_outputs_unchanged(norm_first: bool) -> None:
    model = tiny_model(norm_first=norm_first)
    src, tgt = random_ids(2, 6, 1), random_ids(2, 5, 2)
    changed = tgt.clone()
    changed[:, 3] = (changed[:, 3] + 1) % 46 + 4
    a, b = model(src, tgt), model(src, changed)
    assert torch.allclose(a[:, :3], b[:, :3], atol=1e-6)
    assert not torch.allclose(a[:, 3:], b[:, 3:])


@pytest.mark.parametrize("norm_first", [False, True])
def test_padding_a_batch_leaves_real_positions_unchanged(norm_first: bool) -> None:
    model = tiny_model(norm_first=norm_first)
    src, tgt = random_ids(1, 5, 1), random_ids(1, 4, 2)
    alone = model(src, tgt)
    longer_src = random_ids(1, 9, 3)
    padded_src = torch.cat([torch.cat([src, torch.full((1, 4), PAD)], 1), longer_src])
    padded_tgt = torch.cat([torch.cat([tgt, torch.full((1, 3), PAD)], 1), random_ids(1, 7, 4)])
    batched = model(padded_src, padded_tgt)
    assert torch.allclose(batched[0, :4], alone[0], atol=1e-5)
    assert torch.allclose(model.encode(padded_src)[0, :5], model.encode(src)[0], atol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
def test_cached_decoding_equals_full_redecoding(norm_first: bool) -> None:
    model = tiny_model(norm_first=norm_first)
    src = random_ids(3, 7, 1)
    src[1, 4:] = PAD
    tgt = random_ids(3, 6, 2)
    full = model(src, tgt)
    cache = model.start_cache(model.encode(src))
    src_allowed = model.source_mask(src)
    steps = []
    # One token, then two at once: prefill and single steps go through the same cache.
    for lo, hi in [(0, 1), (1, 3), (3, 4), (4, 6)]:
        out = model.decode(tgt[:, lo:hi], cache, src_allowed)
        assert out.cache.past_len == hi
        cache = out.cache
        steps.append(out.logits)
    assert torch.allclose(torch.cat(steps, 1), full, atol=1e-5)


def test_cache_select_reorders_rows() -> None:
    """The decoder state's one ``select`` (``aiayn.engines.state``) over the model's cache, as the engine runs it."""
    engine = TorchEngine(tiny_model())
    _, state = engine.step(engine.start(random_ids(2, 5, 1).numpy()), random_ids(2, 3, 2).numpy())
    picked = engine.select(state, np.array([1, 1, 0]))
    cache, picked = engine.cache(state), engine.cache(picked)
    assert picked.past_len == 3
    assert torch.equal(picked.self_kv[0][0], cache.self_kv[0][1])  # layer 0's key
    assert torch.equal(picked.cross_kv[3][2], cache.cross_kv[3][0])  # layer 1's value


def test_dropout_options_reach_their_modules() -> None:
    model = Transformer(tiny_config(dropout=0.3, attention_dropout=0.1, activation_dropout=0.2))
    layer = model.decoder_layers[0]
    assert model.dropout.p == 0.3 and layer.self_attn_residual.dropout.p == 0.3
    assert layer.cross_attn.dropout.p == 0.1 and layer.feed_forward.dropout.p == 0.2


def test_config_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="divisible"):
        tiny_config(n_heads=5)
    with pytest.raises(ValueError, match="unknown config keys"):
        ModelConfig.from_dict({"d_modle": 3})
    assert ModelConfig.from_dict(tiny_config().to_dict()) == tiny_config()

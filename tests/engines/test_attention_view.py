"""The attention view built from the weights gives the contract decoder's cross-attention weights: the same layers,
norms, positions and activations, padding and the causal mask included."""

from __future__ import annotations

import numpy as np
import pytest

from aiayn.core.folder import ModelFolder
from aiayn.engines import ONNX_PORTABLE
from aiayn.engines.onnx.portable.engine import PortableOnnxEngine
from aiayn.engines.onnx.serving.attention_view import AttentionView
from aiayn.engines.placement import Placement


@pytest.mark.parametrize("fixture", ["tiny_folder", "marian_like_folder", "marian_gelu_folder"])
def test_the_view_is_the_contract_decoders_cross_attention(fixture: str, request: pytest.FixtureRequest) -> None:
    folder = ModelFolder.open(request.getfixturevalue(fixture))
    tokens = folder.config.special_tokens
    rng = np.random.default_rng(0)
    words = [i for i in range(folder.config.vocab_size) if i not in (tokens.pad, tokens.bos, tokens.eos, tokens.unk)]
    src_ids = rng.choice(words, (2, 9))
    src_ids[:, -1] = tokens.eos
    src_ids[1, 6:] = tokens.pad  # the second source is shorter: its padding gets no weight
    src_ids[1, 5] = tokens.eos
    out_ids = rng.choice(words, (2, 7))
    out_ids[:, 0] = tokens.bos
    view = AttentionView.build(folder).cross_attention(src_ids, out_ids)
    contract = PortableOnnxEngine.load(folder, Placement(ONNX_PORTABLE)).cross_attention(src_ids, out_ids)
    assert view.shape == (2, folder.config.n_heads, 7, 9)
    np.testing.assert_allclose(view, contract, atol=1e-5)
    assert not view[1, :, :, 6:].any()
    np.testing.assert_allclose(view.sum(-1), 1.0, atol=1e-5)

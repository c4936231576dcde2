"""Each engine's search output carries the sum of its tokens' log-probabilities, as a teacher-forced PyTorch
pass over the same output computes them: on a tiny random model (outputs cut at their limit) and on the bundled
en-de (outputs that end with </s>), greedy and beam."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from aiayn.core.folder import ModelFolder
from aiayn.engines import ENGINES
from aiayn.engines.load import load_engine, translator_for
from aiayn.engines.options import EngineOptions
from aiayn.model.weights import load_model
from aiayn.search.output import Output
from aiayn.search.translator import SearchSettings

SENTENCES = ["Two dogs play in the snow.", "a small dog runs after two blue birds!", "the red cat sleeps."]


def teacher_forced_log_prob(model: torch.nn.Module, src_ids: list[int], output: Output, bos: int, eos: int) -> float:
    """log P(output, then </s> if it ended | source) from one forward pass."""
    targets = [*output.tokens, *([eos] if output.ended else [])]
    with torch.no_grad():
        logits = model(torch.tensor([src_ids]), torch.tensor([[bos, *output.tokens]]))[0]  # (tgt_len, vocab)
        log_probs = torch.log_softmax(logits.float(), dim=-1)[: len(targets)]
        return float(log_probs.gather(1, torch.tensor(targets)[:, None]).sum())


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("beam", [1, 4])
def test_scores_are_the_models_log_probabilities(
    tiny_folder: Path, bundled: dict[str, Path], engine: str, beam: int
) -> None:
    for path, extra, ended in ((tiny_folder, 6, False), (bundled["en-de"], 50, True)):
        folder = ModelFolder.open(path)
        model = load_model(folder)
        special = folder.config.special_tokens
        translator = translator_for(folder, load_engine(folder, EngineOptions(engine, "cpu")))
        src_ids = [translator.source_ids(s) for s in SENTENCES]
        settings = SearchSettings.of(folder, beam_size=beam, max_extra_len=extra)
        outputs = translator.outputs(src_ids, settings)
        assert [o.tokens for o in outputs] == translator.translate_ids(src_ids, settings)
        assert all(o.ended == ended for o in outputs)  # the random model never ends, the trained one always
        for src, out in zip(src_ids, outputs, strict=True):
            expected = teacher_forced_log_prob(model, src, out, special.bos, special.eos)
            assert out.log_prob == pytest.approx(expected, abs=1e-3 * out.scored_tokens)
            assert out.log_prob < 0

"""Lanes: several batches searched at once over one engine give the outputs of one lane, on real sentences."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from aiayn.core.folder import ModelFolder
from aiayn.engines.onnx.fused import FusedOnnxEngine
from aiayn.search.translator import SearchSettings, Translator


@pytest.mark.parametrize("beam", [1, 4])
def test_two_lanes_over_one_session_give_one_lanes_outputs(
    bundled: dict[str, Path], multi30k_dir: Path, beam: int
) -> None:
    folder = ModelFolder.open(bundled["en-de"])
    with gzip.open(multi30k_dir / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
        sentences = f.read().splitlines()[:120]
    engine = FusedOnnxEngine.load(folder, threads=1)  # one session: both lanes run it at once
    one, two = (Translator(engine, folder.tokenizer, folder.config.max_len, 8, 4096, lanes) for lanes in (1, 2))
    ids = [one.source_ids(s) for s in sentences]
    settings = SearchSettings(beam)
    expected = one.outputs(ids, settings)
    assert two.outputs(ids, settings) == expected  # 15 batches of 8, taken by two lanes
    assert [o.tokens for o in two.outputs(ids[:1], settings)] == [expected[0].tokens]  # one batch, one lane

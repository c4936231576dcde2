"""Batch-mates change no translation, at full size: the 1 000 sentences of test_2016_flickr, each translated alone
and in batches of 32, greedy and beam 4, with both bundled models in w8, w4 and int8 (docs/speed.md, "Batch-mates
on every CPU"). The suite checks the same on few sentences (tests/engines/test_weight_only.py); this is the long run,
for a quiet machine or the background:

    PYTHONPATH=$PWD nice -n 10 python scripts/batch_mates.py [--data DIR] [--sentences N] [--variants w8,w4,int8]

It lives in scripts/, outside the package: a developer's measurement, run by hand, not by the suite.
"""

from __future__ import annotations

import argparse
import time

from aiayn.core.folder import ModelFolder, bundled_models
from aiayn.data.multi30k import find_data_dir, load_parallel
from aiayn.engines import BLOCK_VARIANTS, ONNX
from aiayn.engines.load import load_engine, translator_for
from aiayn.engines.onnx.serving.engine import ServingEngine
from aiayn.engines.onnx.serving.host_buffers import HostBuffers
from aiayn.engines.onnx.serving.kernel_rows import instruction_set
from aiayn.engines.options import EngineOptions
from aiayn.search.translator import SearchSettings, Translator

SPLIT = "test_2016_flickr"
VARIANTS = (*BLOCK_VARIANTS, "int8")  # the CPU's quantized variants, each batch-independent by construction


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=None, help="the Multi30k folder (default: where the suite finds it)")
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated (default: %(default)s)")
    args = parser.parse_args()
    data = find_data_dir(args.data)
    if data is None:
        parser.error("Multi30k not found: give --data DIR or set AIAYN_DATA")
    print(f"{instruction_set()}; {SPLIT}, first {args.sentences} sentences, alone against batches of 32")
    for name, path in bundled_models().items():
        folder = ModelFolder.open(path)
        corpus = load_parallel(SPLIT, folder.config.src_lang, folder.config.tgt_lang, data)
        for variant in args.variants.split(","):
            engine = load_engine(folder, EngineOptions(ONNX, "cpu", variant, lanes=1))
            assert isinstance(engine, ServingEngine) and isinstance(engine.buffers, HostBuffers)
            src_ids = [translator_for(folder, engine).source_ids(s) for s in corpus.src[: args.sentences]]
            alone = Translator(engine, folder.tokenizer, folder.config.max_len, max_sentences=1)
            together = Translator(engine, folder.tokenizer, folder.config.max_len, max_sentences=32)
            for beam in (1, 4):
                started = time.perf_counter()
                settings = SearchSettings(beam_size=beam)
                one = [alone.outputs([s], settings)[0] for s in src_ids]
                many = together.outputs(src_ids, settings)
                same = sum(a.tokens == b.tokens for a, b in zip(one, many, strict=True))
                bits = sum(a.log_prob == b.log_prob for a, b in zip(one, many, strict=True))
                print(
                    f"{name} {variant} beam {beam} (rows padded to {engine.buffers.row_multiple}): "
                    f"{same}/{len(src_ids)} translations identical, {bits}/{len(src_ids)} log-probabilities equal "
                    f"bit for bit "
                    f"({time.perf_counter() - started:.0f} s)",
                    flush=True,
                )


if __name__ == "__main__":
    main()

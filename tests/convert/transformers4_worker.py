"""What transformers 4 has and 5 removed, on an exported folder: run by test_export_transformers.py in its own
environment (transformers 4.57, Optimum's ONNX exporter), ``python transformers4_worker.py REQUEST.json``.

The request names the folder, the texts and their source ids, the largest output and a scratch folder; the answer,
written to the request's ``answer`` file: the versions, how far the decoder's loaded position table is from the
one in model.safetensors, ``pipeline("translation")``'s texts (greedy) and the greedy ids of Optimum's ONNX export
run by ``ORTModelForSeq2SeqLM``. The test module imports ``padded`` and ``generated`` from here too, so both
environments generate alike; this file imports nothing of aiayn's and no transformers at its top.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

DECODER_POSITIONS = "model.decoder.embed_positions.weight"


def padded(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(batch, longest) ids right-padded with ``pad``, and the mask of the real ones."""
    import torch

    longest = max(len(row) for row in rows)
    ids = torch.tensor([[*row, *[pad] * (longest - len(row))] for row in rows])
    mask = torch.tensor([[1] * len(row) + [0] * (longest - len(row)) for row in rows])
    return ids, mask


def generated(
    model: Any, src: list[list[int]], beams: int, max_output: int, length_penalty: float = 1.0
) -> list[list[int]]:
    """``model.generate``'s ids per source (a MarianMTModel or PegasusForConditionalGeneration, or Optimum's model of
    its ONNX export), all in one
    padded batch (as our search batches), without the start token and what follows </s>; at most ``max_output``
    tokens, as our search is limited by the tests."""
    import torch

    eos, pad = model.config.eos_token_id, model.config.pad_token_id
    ids, mask = padded(src, pad)
    search = {"num_beams": beams, "length_penalty": length_penalty, "do_sample": False, "max_new_tokens": max_output}
    with torch.no_grad():
        rows = model.generate(input_ids=ids, attention_mask=mask, **search).tolist()
    return [row[1:][: row[1:].index(eos)] if eos in row[1:] else row[1:] for row in rows]


def position_table_difference(folder: Path) -> float | None:
    """max |loaded − stored| over the decoder's position table, where model.safetensors holds one (a native
    folder's, whose row 0 carries <s>): 0 where transformers loads it rather than recomputing its sinusoids."""
    from safetensors.torch import load_file
    from transformers import AutoModelForSeq2SeqLM

    stored = load_file(str(folder / "model.safetensors")).get(DECODER_POSITIONS)
    if stored is None:
        return None
    loaded = AutoModelForSeq2SeqLM.from_pretrained(str(folder)).get_parameter(DECODER_POSITIONS)
    return float((loaded.detach().float() - stored.float()).abs().max())


def pipeline_translations(folder: Path, texts: list[str], max_output: int) -> list[str]:
    """``pipeline("translation")``'s greedy texts, a sentence at a time as the pipeline goes."""
    from transformers import pipeline

    translate = pipeline("translation", model=str(folder))
    results = translate(texts, num_beams=1, do_sample=False, max_new_tokens=max_output)
    return [result["translation_text"] for result in results]


def optimum_greedy(folder: Path, onnx: Path, src: list[list[int]], max_output: int) -> list[list[int]]:
    """Optimum's ONNX export of the folder (encoder, decoder and its cached step, as ``optimum-cli export onnx``
    writes them), loaded by ``ORTModelForSeq2SeqLM``: its greedy ids."""
    from optimum.exporters.onnx import main_export
    from optimum.onnxruntime import ORTModelForSeq2SeqLM

    main_export(str(folder), output=str(onnx), task="text2text-generation-with-past", device="cpu")
    return generated(ORTModelForSeq2SeqLM.from_pretrained(str(onnx)), src, beams=1, max_output=max_output)


def answer(request: dict[str, Any]) -> dict[str, Any]:
    from importlib.metadata import version

    folder, max_output = Path(request["folder"]), int(request["max_output"])
    return {
        "versions": {name: version(name) for name in ("transformers", "optimum-onnx", "optimum", "torch")},
        "position_table_difference": position_table_difference(folder),
        "pipeline": pipeline_translations(folder, request["texts"], max_output),
        "optimum": optimum_greedy(folder, Path(request["onnx"]), request["sources"], max_output),
    }


if __name__ == "__main__":
    request = json.loads(Path(sys.argv[1]).read_text())
    Path(request["answer"]).write_text(json.dumps(answer(request)))

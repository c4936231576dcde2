"""The contract as a stranger reads it: plain ONNX Runtime, NumPy and `tokenizers`, driven only by the table
in docs/onnx.md (aiayn is used to find the bundled folder, through the `bundled` fixture, and nothing else)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from tokenizers import Tokenizer

DOC = Path(__file__).resolve().parents[2] / "docs" / "onnx.md"
NUMPY = {"int64": np.int64, "float32": np.float32, "bool": np.bool_}
ORT_TYPES = {"int64": "tensor(int64)", "float32": "tensor(float)", "bool": "tensor(bool)"}


def per_layer(group: list[dict[str, object]], n_layers: int) -> list[dict[str, object]]:
    """``cross_key.i``, ``cross_value.i`` → ``cross_key.0``, ``cross_value.0``, ``cross_key.1``, ..."""
    return [{**row, "name": str(row["name"])[: -len("i")] + str(i)} for i in range(n_layers) for row in group]


def read_contract() -> tuple[dict[str, list[dict[str, object]]], int, dict[str, int]]:
    """Each graph's rows (role, name, dtype, shape) in graph order, the number of decoder layers and the
    special ids, all from the doc."""
    text = DOC.read_text(encoding="utf-8")
    n_layers = int(re.search(r"i = 0\.\.(\d+)", text).group(1)) + 1
    special = {name: int(i) for name, i in re.findall(r"`(<[/a-z]+>)` (\d+)", text)}
    row_pattern = r"\| (in|out) \| `([^`]+)` \| (\w+) \| \[([^\]]*)\] \|"
    graphs: dict[str, list[dict[str, object]]] = {}
    for file, table in re.findall(r"\*\*`(\w+\.onnx)`\*\*\n\n((?:\|.*\n)+)", text):
        rows: list[dict[str, object]] = []
        group: list[dict[str, object]] = []  # the key and value rows of one per-layer kind (cross_, past_, ...)
        for role, name, dtype, shape in re.findall(row_pattern, table):
            dims = [int(d) if d.isdigit() else d for d in shape.split(", ") if d]
            row = {"role": role, "name": name, "dtype": dtype, "shape": dims}
            kind = name.split("_")[0] if name.endswith(".i") else None
            if group and kind != str(group[0]["name"]).split("_")[0]:
                rows, group = rows + per_layer(group, n_layers), []
            if kind:
                group.append(row)
            else:
                rows.append(row)
        graphs[file] = rows + per_layer(group, n_layers)
    return graphs, n_layers, special


class DocDecoder:
    """Greedy decoding written from docs/onnx.md alone: its tables, special ids and steps."""

    def __init__(self, folder: Path) -> None:
        self.graphs, _, special = read_contract()
        self.pad, self.bos, self.eos = special["<pad>"], special["<s>"], special["</s>"]
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        self.encoder, self.decoder = (
            ort.InferenceSession(str(folder / file), options, providers=["CPUExecutionProvider"])
            for file in ("encoder.onnx", "decoder.onnx")
        )
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))

    def translate(self, sentence: str, padding: int = 0) -> str:
        graphs = self.graphs
        src_ids = np.array([self.tokenizer.encode(sentence, add_special_tokens=False).ids + [self.eos]])
        src_ids = np.pad(src_ids, ((0, 0), (0, padding)), constant_values=self.pad)  # padding must not matter
        encoder_outputs = [r["name"] for r in graphs["encoder.onnx"] if r["role"] == "out"]
        encoded = dict(
            zip(encoder_outputs, self.encoder.run(None, {"src_ids": src_ids.astype(np.int64)}), strict=True)
        )
        dtypes = {str(r["name"]): NUMPY[str(r["dtype"])] for r in graphs["decoder.onnx"]}
        feeds = {"src_mask": (src_ids != self.pad).astype(dtypes["src_mask"])}
        for row in (r for r in graphs["decoder.onnx"] if r["role"] == "in"):
            name = str(row["name"])
            if name in encoded:
                feeds[name] = encoded[name]
            elif name.startswith("past_"):  # the first step: past_len 0
                shape = [1 if d == "batch" else 0 if d == "past_len" else d for d in row["shape"]]
                feeds[name] = np.zeros(shape, dtype=dtypes[name])
        out_names = [str(r["name"]) for r in graphs["decoder.onnx"] if r["role"] == "out"]
        output, token = [], self.bos
        real_length = int((src_ids != self.pad).sum())
        for position in range(real_length + 50):  # the doc's length cap
            feeds["tgt_ids"] = np.array([[token]], dtype=dtypes["tgt_ids"])
            feeds["position_offset"] = np.array(position, dtype=dtypes["position_offset"])
            outputs = dict(zip(out_names, self.decoder.run(None, feeds), strict=True))
            assert outputs["log_probs"].shape[:2] == (1, 1)
            token = int(outputs["log_probs"][0, -1].argmax())
            if token == self.eos:
                break
            output.append(token)
            for name in out_names:
                if name.startswith("present_"):
                    feeds[name.replace("present_", "past_")] = outputs[name]
        return str(self.tokenizer.decode(output, skip_special_tokens=True))


def test_the_doc_alone_is_enough_to_translate(bundled: dict[str, Path]) -> None:
    folder = bundled["de-en"]
    decoder = DocDecoder(folder)
    for session, file in ((decoder.encoder, "encoder.onnx"), (decoder.decoder, "decoder.onnx")):
        declared = [(r["name"], ORT_TYPES[str(r["dtype"])]) for r in decoder.graphs[file]]
        assert [(t.name, t.type) for t in (*session.get_inputs(), *session.get_outputs())] == declared
    assert decoder.translate("Zwei Hunde spielen im Schnee.", padding=2) == "Two dogs play in the snow."


UNTIDY = [
    "Zwei Hunde\tspielen im Schnee.",
    "Zwei  Hunde spielen   im Schnee.\t",
    "\u3000Ein Mann\u00a0fährt\u2028Fahrrad.",
    "Eine Frau\x0bliest ein\x0cBuch 😀 im Park.",
    "Ein Kind ﬁndet einen Ball ☃.",
]


def test_the_doc_decoder_translates_untidy_input_as_the_cli(
    bundled: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    from aiayn.cli import main

    decoder = DocDecoder(bundled["de-en"])
    for text in UNTIDY:
        assert main(["translate", "--model", "de-en", "--beam", "1", "--device", "cpu", text]) == 0
        assert capsys.readouterr().out.rstrip("\n") == decoder.translate(text), repr(text)


def test_the_doc_declares_every_decoder_tensor_once() -> None:
    graphs, n_layers, _ = read_contract()
    names = [r["name"] for r in graphs["decoder.onnx"]]
    assert len(names) == len(set(names))
    assert sum(str(n).startswith("past_") for n in names) == 2 * n_layers


def test_the_docs_metadata_keys_and_fingerprint_recipe_hold(bundled: dict[str, Path]) -> None:
    import hashlib
    import json

    import onnx

    text = DOC.read_text(encoding="utf-8")
    recipe = re.search(r"```python\n(.*?)```", text[text.index("## Provenance") :], re.S)
    assert recipe is not None
    for folder in bundled.values():
        model = json.loads((folder / "config.json").read_text(encoding="utf-8"))["model"]
        fingerprint = hashlib.sha256(json.dumps(model, sort_keys=True).encode()).hexdigest()[:16]
        weights = hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()
        for file in ("encoder.onnx", "decoder.onnx"):
            metadata = {p.key: p.value for p in onnx.load(str(folder / file), load_external_data=False).metadata_props}
            assert all(f"| `{key}` |" in text for key in metadata)
            assert metadata["aiayn.config_fingerprint"] == fingerprint
            assert metadata["aiayn.weights_sha256"] == weights
            assert metadata.get("aiayn.variant", "fp32") == "fp32"
    assert "json.dumps(model, sort_keys=True)" in recipe.group(1)

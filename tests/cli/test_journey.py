"""A user's journey on a pair Multi30k lacks, with made-up language tags: train → export → eval on their own test
files → translate → the page's API, each step asking only the model folder."""

from __future__ import annotations

import json
import random
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from gradio_client import Client

from aiayn.cli import main

# ISO 639's codes for local use: no table of ours knows them.
SRC, TGT = "qaa", "qab"
WORDS = "red blue green cat dog bird runs sleeps jumps big small old".split()
SIZES = ["vocab_size=64", "d_model=32", "n_heads=4", "d_ff=64", "n_encoder_layers=1", "n_decoder_layers=1"]


def write_split(folder: Path, split: str, n: int) -> tuple[Path, Path]:
    """Aligned files ``split.qaa`` / ``split.qab``: the target is the source's words reversed."""
    rng = random.Random(split)
    src = [" ".join(rng.sample(WORDS, rng.randint(2, 5))) for _ in range(n)]
    paths = folder / f"{split}.{SRC}", folder / f"{split}.{TGT}"
    paths[0].write_text("".join(f"{s}\n" for s in src), encoding="utf-8")
    paths[1].write_text("".join(f"{' '.join(reversed(s.split()))}\n" for s in src), encoding="utf-8")
    return paths


def test_a_made_up_pair_from_training_to_the_page(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], serve_page: Callable[..., Any]
) -> None:
    train, valid, test = (write_split(tmp_path, split, n) for split, n in (("train", 400), ("valid", 30), ("test", 20)))
    model = tmp_path / "runs" / f"{SRC}-{TGT}"
    flags = ["--out", str(model), "--max-steps", "40", "--warmup", "10", "--max-tokens", "512", "--device", "cpu"]
    for size in SIZES:
        flags += ["--set", size]
    assert main(["train", "--train-files", *map(str, train), "--valid-files", *map(str, valid), *flags]) == 0
    out, err = capsys.readouterr()
    assert "stopped after 40 steps" in err and f"aiayn export {model}" in err and "small corpus" in out

    # Before any export, the folder translates with the default engine: one line out for each line in.
    assert main(["translate", "--model", str(model), "--beam", "1", "red cat runs\nbig dog"]) == 0
    fresh = capsys.readouterr().out
    assert fresh.count("\n") == 2

    # Export proves the graphs on the validation pairs training kept in the folder, not on Multi30k.
    assert main(["export", str(model)]) == 0
    out = capsys.readouterr().out
    assert "greedy 30/30 identical, beam-4 30/30 identical (ONNX vs PyTorch)" in out
    assert (model / "encoder.onnx").is_file() and (model / "decoder.onnx").is_file()

    assert main(["eval", "--model", str(model), "--test-files", *map(str, test), "--beam", "4"]) == 0
    out = capsys.readouterr().out
    assert f"{model.name} test.{SRC} (20 sentences" in out and "BLEU lowercased" in out and "chrF" in out
    assert main(["eval", "--model", str(model), "--split", "val", "--beam", "1"]) == 0  # the kept validation sample
    assert "val (30 sentences" in capsys.readouterr().out

    assert main(["translate", "--model", str(model), "--beam", "1", "red cat runs\nbig dog"]) == 0
    assert capsys.readouterr().out == fresh  # the exported graphs give what the weights gave
    assert main(["translate", "--model", str(model), "--beam", "4", "red cat runs"]) == 0
    cli_beam = capsys.readouterr().out.strip()

    with serve_page(["--model", str(model)], tmp_path / "serve.log") as page:
        url = page.url
        client = Client(url, verbose=False)
        translation, _status = client.predict("red cat runs", f"{SRC}-{TGT}", 4, api_name="/translate")
        assert translation == cli_beam
        page = urllib.request.urlopen(url, timeout=10).read().decode()
        assert "qaa → qab" in page and "Examples (validation sentences kept in the model folder)" in page
        assert f"trained on train.{SRC} + train.{TGT} (400 pairs)" in page  # what the model knows, from its record
        api = client.view_api(print_info=False, return_format="dict")
        assert [p["parameter_name"] for p in api["named_endpoints"]["/translate"]["parameters"]] == [
            "text",
            "direction",
            "beam_size",
        ]
        body = json.dumps({"sentences": ["red cat runs"], "direction": f"{SRC}-{TGT}", "beam": 4}).encode()
        request = urllib.request.Request(f"{url}v1/translate", body, {"Content-Type": "application/json"})
        assert json.loads(urllib.request.urlopen(request, timeout=30).read())["translations"] == [cli_beam]


def test_eval_of_a_pair_without_multi30k_asks_for_test_files(
    tmp_path: Path, tiny_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    folder = tmp_path / "m"
    shutil.copytree(tiny_folder, folder)
    config = json.loads((folder / "config.json").read_text())
    config["model"]["src_lang"], config["model"]["tgt_lang"] = SRC, TGT
    (folder / "config.json").write_text(json.dumps(config))
    for graph in folder.glob("*.onnx"):  # exported for the old pair's config; a user's folder before `aiayn export`
        graph.unlink()
    assert main(["eval", "--model", str(folder)]) == 2
    err = capsys.readouterr().err
    assert f"{SRC}→{TGT} is not a Multi30k pair: give --test-files SRC REF or --test-tsv FILE" in err
    # Files whose names name another pair are refused, not scored.
    other = tmp_path / "test.en", tmp_path / "test.de"
    for path in other:
        path.write_text("a\n", encoding="utf-8")
    assert main(["eval", "--model", str(folder), "--test-files", *map(str, other)]) == 2
    assert "the test set is en→de but m translates qaa→qab" in capsys.readouterr().err
    tsv = tmp_path / "mine.tsv"
    tsv.write_text("red cat\tcat red\nbig dog\tdog big\n", encoding="utf-8")
    assert main(["eval", "--model", str(folder), "--test-tsv", str(tsv), "--beam", "1", "--engine", "onnx"]) == 0
    assert "mine.tsv (2 sentences, onnx, greedy)" in capsys.readouterr().out

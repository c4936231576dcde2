"""Multi-process training through torchrun and DistributedDataParallel, two CPU processes on gloo."""

from __future__ import annotations

import gzip
import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

WORDS = "red blue green cat dog bird runs sleeps jumps big small old".split()


def write_corpus(folder: Path) -> None:
    rng = random.Random(0)
    for split, n in (("train", 400), ("val", 20)):
        src = [" ".join(rng.sample(WORDS, rng.randint(2, 5))) for _ in range(n)]
        for lang, lines in (("en", src), ("de", [" ".join(reversed(s.split())) for s in src])):
            with gzip.open(folder / f"{split}.{lang}.gz", "wt", encoding="utf-8") as f:
                f.write("\n".join(lines) + "\n")


@pytest.mark.skipif(shutil.which("torchrun", path=str(Path(sys.executable).parent)) is None, reason="no torchrun")
def test_two_gloo_processes_train_one_model(tmp_path: Path) -> None:
    write_corpus(tmp_path)
    out = tmp_path / "model"
    sizes = ["vocab_size=64", "d_model=32", "n_heads=4", "d_ff=64", "n_encoder_layers=1", "n_decoder_layers=1"]
    command = [
        str(Path(sys.executable).parent / "torchrun"),
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "aiayn.cli",
        "train",
        "--src",
        "en",
        "--tgt",
        "de",
        "--data",
        str(tmp_path),
        "--out",
        str(out),
        "--device",
        "cpu",
        "--epochs",
        "2",
        "--max-tokens",
        "256",
        "--warmup",
        "20",
    ]
    for size in sizes:
        command += ["--set", size]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads((out / "training.json").read_text())
    assert record["hardware"]["processes"] == 2
    assert len(record["epochs"]) == 2 and (out / "model.safetensors").is_file()

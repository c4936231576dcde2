"""Prepare and train at scale: throughput and peak memory over a generated corpus (a benchmark, not a test).

    python -m aiayn.bench.scale --pairs 5000000 --workdir /tmp/scale [--steps 20] [--json FILE]

Writes a corpus of ``--pairs`` random sentence pairs (plain text, train.en / train.de, 5 to 40 words of a
20 000-word invented vocabulary) and times ``aiayn prepare`` on it (pairs/s); then trains a few steps
(``--max-steps``) on it and on Multi30k en-de, each prepared the same way, and compares the peak resident
memory of the two training processes: what a corpus 170 times larger costs in memory. Each command runs
in its own process; its peak RSS is its VmHWM, read until it exits.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from aiayn.data.multi30k import find_data_dir

WORDS = 20_000
POLL_S = 0.2


def invented_words(rng: np.random.Generator) -> np.ndarray:
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    return np.array(["".join(rng.choice(letters, rng.integers(2, 10))) for _ in range(WORDS)])


def write_corpus(folder: Path, split: str, pairs: int, seed: int) -> tuple[Path, Path]:
    """``pairs`` lines in split.en and split.de; the target is the source's words in reverse, upper-cased."""
    rng = np.random.default_rng(seed)
    words = invented_words(np.random.default_rng(0))
    paths = folder / f"{split}.en", folder / f"{split}.de"
    with paths[0].open("w", encoding="utf-8") as src_file, paths[1].open("w", encoding="utf-8") as tgt_file:
        for start in range(0, pairs, 100_000):
            for length in rng.integers(5, 41, min(100_000, pairs - start)):
                sentence = words[rng.integers(0, WORDS, length)]
                src_file.write(" ".join(sentence) + ".\n")
                tgt_file.write(" ".join(sentence[::-1]).upper() + ".\n")
    return paths


def peak_rss_of(command: list[str]) -> dict[str, Any]:
    """Run ``command``; its wall time and peak resident memory (VmHWM, polled until it exits)."""
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak_kb = 0
    while process.poll() is None:
        try:
            status = Path(f"/proc/{process.pid}/status").read_text()
            peak_kb = max(peak_kb, int(status.split("VmHWM:")[1].split()[0]))
        except (FileNotFoundError, IndexError, ProcessLookupError):
            pass
        time.sleep(POLL_S)
    out, err = process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{err[-3000:]}")
    return {"seconds": round(time.perf_counter() - started, 1), "peak_rss_mb": round(peak_kb / 1024), "stdout": out}


def aiayn(*args: str) -> list[str]:
    return [sys.executable, "-m", "aiayn.cli", *args]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=5_000_000)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=20, help="training steps of each run (--max-steps)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    work = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    train_files = write_corpus(work, "train", args.pairs, seed=1)
    valid_files = write_corpus(work, "valid", 1000, seed=2)
    generated_s = time.perf_counter() - started
    corpus = ["--train-files", *map(str, train_files), "--valid-files", *map(str, valid_files)]
    big = peak_rss_of(aiayn("prepare", *corpus, "--out", str(work / "prepared-big")))
    multi30k = find_data_dir()
    small = peak_rss_of(
        aiayn("prepare", "--src", "en", "--tgt", "de", "--out", str(work / "prepared-multi30k"))
        + (["--data", str(multi30k)] if multi30k else [])
    )
    training: dict[str, Any] = {}
    for name in ("big", "multi30k"):
        flags = ["--prepared", str(work / f"prepared-{name}"), "--out", str(work / f"model-{name}")]
        run = peak_rss_of(aiayn("train", *flags, "--max-steps", str(args.steps), "--device", "cpu", "--epochs", "1"))
        training[name] = {k: v for k, v in run.items() if k != "stdout"}
    result = {
        "pairs": args.pairs,
        "corpus_bytes": sum(p.stat().st_size for p in train_files),
        "generated_s": round(generated_s, 1),
        "prepare": {
            "seconds": big["seconds"],
            "pairs_per_s": round(args.pairs / big["seconds"]),
            "peak_rss_mb": big["peak_rss_mb"],
            "counts": json.loads(big["stdout"]),
        },
        "prepare_multi30k": {"seconds": small["seconds"], "peak_rss_mb": small["peak_rss_mb"]},
        "train_steps": args.steps,
        "train_peak_rss_mb": {name: run["peak_rss_mb"] for name, run in training.items()},
        "train_rss_difference_mb": training["big"]["peak_rss_mb"] - training["multi30k"]["peak_rss_mb"],
        "train_seconds": {name: run["seconds"] for name, run in training.items()},
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()

"""What a run trains on: the folder `aiayn prepare` wrote (--prepared), or its corpus prepared into --out/data.

Preparing happens once: a resumed run, or a new run on the same files and settings, finds the folder
already there (``prepare(..., reuse=True)`` compares the files' hashes). A resumed or continued run imposes its
model's tokenizer; a new run's tokenizer is trained while preparing. Under DDP, rank 0 prepares while the
others wait. The run's source lengths also set how long a sentence may get before the service translates it
clause by clause (``clauses_section``, ``text/clauses.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch.distributed as dist

from aiayn.core.config import ModelConfig
from aiayn.core.tokenizer import SubwordTokenizer
from aiayn.data.prepare import PreparedData, PrepareSettings, prepare, tokenizer_sha256
from aiayn.data.sources import PairSource
from aiayn.train.options import TrainOptions

SPLIT_PERCENTILE = 90  # sentences longer than 90% of the training sources are split into clauses


def clauses_section(source_tokens: Sequence[int]) -> dict[str, Any]:
    """The ``clauses`` section of config.json, from the training sources' token counts (</s> included)."""
    limit = int(np.percentile(np.asarray(source_tokens), SPLIT_PERCENTILE))
    rule = f"{SPLIT_PERCENTILE}th percentile of the training sources, in tokens with </s>"
    return {"split_over_tokens": limit, "rule": rule}


def prepared_given(path: Path, tokenizer: SubwordTokenizer | None) -> PreparedData:
    """--prepared DIR, checked to hold ids of the model's tokenizer when the run has one already."""
    data = PreparedData.open(path)
    if tokenizer is not None and data.record["tokenizer"]["sha256"] != tokenizer_sha256(tokenizer):
        raise ValueError(
            f"--prepared {path} holds ids of another tokenizer than the model's; give the corpus files instead, "
            "so that they are prepared with the model's tokenizer"
        )
    return data


def prepared_languages(options: TrainOptions) -> tuple[str, str]:
    """The language pair of --prepared DIR."""
    if options.prepared is None:
        raise ValueError("no training data: give training and validation pairs, or --prepared DIR")
    data = PreparedData.open(options.prepared)
    return data.src_lang, data.tgt_lang


def run_data(
    options: TrainOptions,
    into: Path,
    train: PairSource | None,
    valid: PairSource | None,
    preset: ModelConfig,
    tokenizer: SubwordTokenizer | None,
    is_main: bool,
) -> PreparedData:
    """The run's prepared data; ``tokenizer``: the model's (resume, --init-from), None to train one."""
    if options.prepared is not None:
        return prepared_given(Path(options.prepared), tokenizer)
    if train is None or valid is None:
        raise ValueError("no training data: give training and validation pairs, or --prepared DIR")
    settings = PrepareSettings(
        vocab_size=tokenizer.vocab_size if tokenizer is not None else preset.vocab_size,
        special_tokens=preset.special_tokens,
        max_length=options.max_length or preset.max_len,
        tokenizer_sample=options.tokenizer_sample,
    )
    # The run's own data folder (its folder was claimed, or is the run resumed): replaced when it no longer fits.
    data = prepare(into, train, valid, settings, tokenizer, reuse=True, overwrite=True) if is_main else None
    if dist.is_available() and dist.is_initialized():
        dist.barrier()  # rank 0 has written the folder
    return data if data is not None else PreparedData.open(into)

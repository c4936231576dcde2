"""What a training run is asked to do (``TrainOptions``), and eq. 3's learning-rate schedule."""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

# Eq. 3's settings when neither the options nor the run being continued give them.
SCHEDULE_DEFAULTS: dict[str, Any] = {"lr_scale": 1.0, "warmup_steps": 4000}


@dataclass
class TrainOptions:
    out: Path
    preset: str = "tiny"
    overrides: dict[str, Any] = field(default_factory=dict)  # ModelConfig fields changed from the preset
    epochs: int = 60
    max_tokens: int = 4096  # per batch, padding included (§5.1 used ~25000 per side on 8 GPUs)
    # Eq. 3's scale and warm-up; None: the run's own on resume, the parent's with init_from, else SCHEDULE_DEFAULTS.
    lr_scale: float | None = None
    warmup_steps: int | None = None
    label_smoothing: float = 0.1
    clip_norm: float | None = None
    seed: int = 1
    device: str = "auto"
    checkpoint_every: int = 500  # steps between mid-epoch checkpoints
    keep_last: int = 10  # epoch checkpoints kept for averaging
    average_last: int = 0  # average the last N epoch checkpoints at the end, kept if val BLEU improves
    resume: bool = False
    max_steps: int | None = None  # stop early (a test of resume, a quick run)
    time_limit_minutes: float | None = None  # no new epoch after this much training time; then average
    init_from: Path | None = None  # a model folder to continue training from (its config, tokenizer, weights)
    update_freq: int = 1  # micro-batches accumulated into one update (--update-freq)
    precision: str = "auto"  # auto, fp32 or bf16 (``precision.py``)
    max_length: int | None = None  # subword tokens a side; longer pairs are skipped. None: the config's max_len
    tokenizer_sample: int = 1_000_000  # pairs the BPE tokenizer learns from at most
    prepared: Path | None = None  # a folder written by `aiayn prepare`, instead of preparing into --out/data
    command: str = field(default_factory=lambda: shlex.join(["aiayn", *sys.argv[1:]]))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (paths as text), as the checkpoint and training.json keep them."""
        return {name: str(value) if isinstance(value, Path) else value for name, value in vars(self).items()}


def learning_rate(step: int, d_model: int, warmup_steps: int, scale: float) -> float:
    """Eq. 3: lrate = scale · d_model^-0.5 · min(step^-0.5, step · warmup_steps^-1.5)."""
    step = max(step, 1)
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


def with_schedule(options: TrainOptions, inherited: dict[str, Any]) -> TrainOptions:
    """``options`` with eq. 3's unset settings taken from ``inherited`` (the options of the run being resumed
    or continued), else from SCHEDULE_DEFAULTS: continuing a run never restarts it on another schedule."""
    chosen = {}
    for name, default in SCHEDULE_DEFAULTS.items():
        value = getattr(options, name)
        if value is None:
            value = inherited.get(name)
        chosen[name] = default if value is None else value
    return replace(options, **chosen)

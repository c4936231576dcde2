"""What a training run is asked to do (``TrainOptions``), and eq. 3's learning-rate schedule."""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

# Eq. 3's settings, and the cool-down after it, when neither the options nor the run being continued give them.
SCHEDULE_DEFAULTS: dict[str, Any] = {"lr_scale": 1.0, "warmup_steps": 4000, "cooldown": 0.2}
# A new run's own, by preset, over SCHEDULE_DEFAULTS. The tiny model learns far faster at 2.5× eq. 3's rate
# (en-fr, 25 minutes on one core: validation BLEU 48.1 against 40.3 at 1×; docs/training.md).
PRESET_SCHEDULES: dict[str, dict[str, Any]] = {"tiny": {"lr_scale": 2.5}}
DEFAULT_EPOCHS = 60  # when neither --epochs, --max-steps nor --time-limit bounds the run
# A warm-up longer than this share of the planned run is shortened to it (``fitted_schedule``).
WARMUP_SHARE = 0.25


@dataclass
class TrainOptions:
    out: Path
    preset: str = "tiny"
    overrides: dict[str, Any] = field(default_factory=dict)  # ModelConfig fields changed from the preset
    epochs: int | None = None  # None: DEFAULT_EPOCHS, unless max_steps or time_limit_minutes bounds the run
    max_tokens: int = 4096  # per batch, padding included (§5.1 used ~25000 per side on 8 GPUs)
    # Eq. 3's scale and warm-up, the cool-down; None: the run's own on resume, the parent's with init_from, else
    # the preset's PRESET_SCHEDULES over SCHEDULE_DEFAULTS.
    lr_scale: float | None = None
    warmup_steps: int | None = None
    cooldown: float | None = None  # share of a planned run over which the rate falls to zero (``cooled``)
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

    @property
    def epoch_limit(self) -> int | None:
        """Epochs the run may make: --epochs, else DEFAULT_EPOCHS unless steps or time bound the run instead."""
        if self.epochs is not None:
            return self.epochs
        return None if self.max_steps is not None or self.time_limit_minutes is not None else DEFAULT_EPOCHS

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (paths as text), as the checkpoint and training.json keep them."""
        return {name: str(value) if isinstance(value, Path) else value for name, value in vars(self).items()}


def learning_rate(step: int, d_model: int, warmup_steps: int, scale: float) -> float:
    """Eq. 3: lrate = scale · d_model^-0.5 · min(step^-0.5, step · warmup_steps^-1.5)."""
    step = max(step, 1)
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


def cooled(rate: float, done: float, cooldown: float) -> float:
    """``rate`` over the last ``cooldown`` share of a run falling linearly to zero, ``done`` the share made.

    Eq. 3 alone ends a run at a rate near its peak's, the weights still wandering where the loss is low rather
    than settling there; annealing over the run's last fifth settles them (warm-up, eq. 3, then a linear
    cool-down, as the "warmup-stable-decay" schedules do). ``done`` is counted in steps or in the time limit, so a
    machine that slows down still cools down before the limit stops it. 0 keeps eq. 3 throughout, as the paper.
    """
    if cooldown <= 0:
        return rate
    return rate * min(1.0, max(0.0, (1.0 - done) / cooldown))


def fitted_schedule(planned_steps: int, warmup_steps: int, lr_scale: float) -> dict[str, Any] | None:
    """Eq. 3 fitted to a run too short for its warm-up, or None when the warm-up fits.

    A warm-up over WARMUP_SHARE of the planned steps would leave the run in it (4000 steps of a 171-step run
    never leave the first, tiny rates), so the warm-up becomes that share. The scale is lowered with it so that
    the peak rate stays eq. 3's peak for the asked warm-up: a short run reaches it sooner, never exceeds it.
    """
    fitted = max(1, int(planned_steps * WARMUP_SHARE))
    if fitted >= warmup_steps:
        return None
    return {
        "planned_steps": planned_steps,
        "warmup_steps": fitted,
        "lr_scale": lr_scale * (fitted / warmup_steps) ** 0.5,
        "asked_warmup_steps": warmup_steps,
    }


def with_schedule(options: TrainOptions, inherited: dict[str, Any]) -> TrainOptions:
    """``options`` with the schedule's unset settings taken from ``inherited`` (the options of the run being
    resumed or continued), else from its preset's PRESET_SCHEDULES and SCHEDULE_DEFAULTS: continuing a run never
    restarts it on another schedule, and a run recorded before the cool-down existed goes on without one."""
    defaults = dict(SCHEDULE_DEFAULTS)
    if inherited:
        defaults["cooldown"] = inherited.get("cooldown", 0.0)
    elif options.init_from is None:  # a new run (an imported parent has no record: eq. 3 as the paper's)
        defaults.update(PRESET_SCHEDULES.get(options.preset, {}))
    chosen = {}
    for name, default in defaults.items():
        value = getattr(options, name)
        if value is None:
            value = inherited.get(name)
        chosen[name] = default if value is None else value
    return replace(options, **chosen)

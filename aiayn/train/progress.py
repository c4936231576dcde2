"""Where a training run stands: one record, saved whole in every checkpoint and restored whole by --resume."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any


@dataclass
class Progress:
    step: int = 0  # optimizer updates of this run
    epoch: int = 0  # epochs finished
    batch_in_epoch: int = 0  # updates of the epoch in progress already made (each of --update-freq batches)
    epoch_loss_sum: float = 0.0  # of the epoch in progress, for its mean loss
    epoch_tokens: int = 0
    history: list[dict[str, float]] = field(default_factory=list)  # per epoch: losses, validation BLEU
    best_bleu: float = -1.0
    wall_seconds: float = 0.0
    cpu_seconds: float = 0.0  # of this process, all threads: comparable across machines of other core counts
    commands: list[str] = field(default_factory=list)  # the first command, then each --resume
    # Steps the weights were trained for before this run (--init-from): eq. 3 goes on from there.
    schedule_offset: int = 0
    parent: dict[str, Any] = field(default_factory=dict)  # the record of the folder continued from
    averaged: dict[str, Any] = field(default_factory=dict)  # what checkpoint averaging gave
    # Eq. 3 fitted to the planned run (``options.fitted_schedule``), decided once and kept by --resume.
    fitted_schedule: dict[str, Any] | None = None
    stopped_by: str = ""  # why the run ended: epochs, max-steps, time limit, interrupted

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Progress:
        """From a checkpoint (which holds other keys too: weights, optimizer, random state)."""
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})

    def end_epoch(self) -> float:
        """Close the epoch in progress; returns its mean training loss per token."""
        mean = self.epoch_loss_sum / max(self.epoch_tokens, 1)
        self.batch_in_epoch, self.epoch_loss_sum, self.epoch_tokens = 0, 0.0, 0
        self.epoch += 1
        return mean

"""Where a training run stands: its updates (``Progress``) and its training time (``Clock``), both saved in every
checkpoint and restored whole by --resume; and why it ended (``StopReason``)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from typing import Any


class StopReason(StrEnum):
    """Why a run ended; its value is what training.json records as ``stopped_by``."""

    EPOCHS = "epochs"  # --epochs, or DEFAULT_EPOCHS where nothing else bounds the run
    MAX_STEPS = "max-steps"
    TIME_LIMIT = "time limit"


@dataclass
class Progress:
    step: int = 0  # optimizer updates of this run
    epoch: int = 0  # epochs finished
    batch_in_epoch: int = 0  # updates of the epoch in progress already made (each of --update-freq batches)
    epoch_loss_sum: float = 0.0  # of the epoch in progress, for its mean loss
    epoch_tokens: int = 0
    history: list[dict[str, float]] = field(default_factory=list)  # per epoch: losses, validation BLEU
    best_bleu: float = -1.0
    commands: list[str] = field(default_factory=list)  # the first command, then each --resume
    # Steps the weights were trained for before this run (--init-from): eq. 3 goes on from there.
    schedule_offset: int = 0
    parent: dict[str, Any] = field(default_factory=dict)  # the record of the folder continued from
    averaged: dict[str, Any] = field(default_factory=dict)  # what checkpoint averaging gave
    # Eq. 3 fitted to the planned run (``options.fitted_schedule``), decided once and kept by --resume.
    fitted_schedule: dict[str, Any] | None = None
    stopped_by: str = ""  # a StopReason's value once the run has ended: plain text, as training.json records it

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Progress:
        """From a checkpoint (which holds other keys too: weights, optimizer, random state, the clock)."""
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})

    def count_update(self, loss: float, tokens: int) -> None:
        """One more update made, its mean loss per token over ``tokens`` target tokens."""
        self.step += 1
        self.batch_in_epoch += 1
        self.epoch_loss_sum += loss * tokens
        self.epoch_tokens += tokens

    def epoch_loss(self) -> float:
        """The mean training loss per token of the epoch in progress."""
        return self.epoch_loss_sum / max(self.epoch_tokens, 1)

    def end_epoch(self) -> float:
        """Close the epoch in progress; returns its mean training loss per token."""
        mean = self.epoch_loss()
        self.batch_in_epoch, self.epoch_loss_sum, self.epoch_tokens = 0, 0.0, 0
        self.epoch += 1
        return mean


@dataclass
class Clock:
    """The run's training time, the one count that --time-limit, the record and the progress bar read.

    The time from a ``restart`` or a ``tick`` to the next ``tick`` is counted; from a tick to a restart (the
    checkpoint and record written after an epoch) it is not.
    """

    wall_seconds: float = 0.0
    cpu_seconds: float = 0.0  # of this process, all threads: comparable across machines of other core counts
    # (wall, CPU) readings the next tick counts from; never saved: a resumed run counts from its own restart.
    since: tuple[float, float] = field(
        default_factory=lambda: (time.perf_counter(), time.process_time()), init=False, repr=False, compare=False
    )

    def to_dict(self) -> dict[str, float]:
        """What a checkpoint keeps of it, beside ``Progress``'s fields."""
        return {"wall_seconds": self.wall_seconds, "cpu_seconds": self.cpu_seconds}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Clock:
        """From a checkpoint; one written before CPU time was kept starts that count at 0."""
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.init and f.name in data})

    def restart(self) -> None:
        self.since = time.perf_counter(), time.process_time()

    def tick(self) -> float:
        """Count the time since the last restart or tick; returns its wall seconds."""
        wall, cpu = time.perf_counter(), time.process_time()
        elapsed = wall - self.since[0]
        self.wall_seconds += elapsed
        self.cpu_seconds += cpu - self.since[1]
        self.since = wall, cpu
        return elapsed

"""§5 Training: token-sized batches, Adam with the eq. 3 schedule, label smoothing, checkpoints and resume.

A run writes a model folder: config.json and tokenizer.json first, then
model.safetensors (the best weights by validation BLEU), training.json and
training.png after every epoch, and checkpoints/ for --resume and averaging.
"""

from __future__ import annotations

import os
import platform
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from tqdm import tqdm

from aiayn.core.folder import CLAUSES_SECTION, VALIDATION_SAMPLE_PAIRS, ModelFolder
from aiayn.data.batching import BatchPlan, plan_batches
from aiayn.data.prepare import PreparedData
from aiayn.data.sources import PairSource
from aiayn.engines.pytorch import resolve_device
from aiayn.model.transformer import Transformer
from aiayn.model.weights import load_folder_weights, load_state_strict, save_weights
from aiayn.train.batches import to_tensors
from aiayn.train.checkpoint import average_state_dicts, load_checkpoint, save_atomic
from aiayn.train.corpus import clauses_section
from aiayn.train.loss import SmoothedLoss
from aiayn.train.options import TrainOptions, cooled, fitted_schedule, learning_rate, with_schedule
from aiayn.train.precision import resolve_precision
from aiayn.train.progress import Clock, Progress, StopReason
from aiayn.train.record import write_record
from aiayn.train.start import LAST_CHECKPOINT, RESUME_FIX, Start, choose_start, open_data_and_folder
from aiayn.train.step import accumulate_gradients
from aiayn.train.validate import calibrate_kept_weights, validate

SMALL_CORPUS_PAIRS = 10_000  # under this, a run is warned what to expect
# With only --time-limit bounding a run, its pace over this many steps plans it (``plan_schedule``).
PLAN_AFTER_STEPS = 30
NO_RECORD = (
    "--init-from {path} has no {record} (an imported checkpoint): eq. 3's learning rate starts at step 0, with a "
    "warm-up (--warmup and --lr-scale set it yourself)"
)


def hardware_summary(device: torch.device, world_size: int, precision: str) -> dict[str, Any]:
    summary: dict[str, Any] = {
        "device": str(device),
        "precision": precision,
        "processes": world_size,
        "cpu_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }
    if device.type == "cuda":
        summary["gpu"] = torch.cuda.get_device_name(device)
    return summary


def parent_summary(parent: ModelFolder) -> dict[str, Any]:
    """What a continued run keeps of its parent's record: where eq. 3 stands, and the chain of commands.

    A parent without a record was not trained here (an imported checkpoint): no step of eq. 3 was taken, so
    the schedule starts at step 0, its warm-up fitted to this run unless --warmup sets one (``NO_RECORD``).
    """
    record = parent.training_record()
    return {
        "folder": str(parent.path),
        "schedule_steps": int(record.get("schedule_steps", record.get("steps", 0))),  # its parents' steps too
        "wall_seconds": record.get("wall_seconds"),
        "hardware": record.get("hardware"),
        "commands": record.get("commands", []),
        "best_val_bleu": record.get("best_val_bleu"),
        "parent": record.get("parent", {}),  # the chain of continued runs, back to the first
        "provenance": parent.provenance(),  # what it knew: the corpus it was trained on, or the checkpoint imported
        "options": record.get("options", {}),
    }


class Trainer:
    """One training run: the model, its optimizer, its ``Progress`` and its ``Clock``, which checkpoints hold whole."""

    def __init__(self, options: TrainOptions, train: PairSource | None, val: PairSource | None) -> None:
        self.rank = int(os.environ.get("RANK", 0))
        self.world_size = int(os.environ.get("WORLD_SIZE", 1))
        self.device = torch.device(resolve_device(options.device))
        if self.world_size > 1 and self.device.type == "cuda":
            self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        self.precision = resolve_precision(options.precision, self.device)
        start = choose_start(options.resume, Path(options.out), options.init_from)
        parent = ModelFolder.open(options.init_from) if start is Start.CONTINUE and options.init_from else None
        self.data, self.folder = open_data_and_folder(start, options, train, val, parent, self.is_main)
        self.checkpoint_dir = self.folder.checkpoint_dir
        self.lengths = self.data.train.lengths()  # (pairs,) ×2, read once: batches are planned from them
        self.plan: tuple[int, BatchPlan] | None = None  # (epoch, its batches), planned once per epoch
        if self.is_main:
            self.note_data(start, val)

        torch.manual_seed(options.seed)
        self.config = self.folder.config
        self.model = Transformer(self.config).to(self.device)
        # Fused: one kernel for all parameters instead of a loop over ~100 tensors (same update, to rounding).
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=0.0, betas=(0.9, 0.98), eps=1e-9, fused=True)
        self.progress = Progress(commands=[options.command])
        self.clock = Clock()
        inherited: dict[str, Any] = {}  # the options of the run this one goes on from
        if start is Start.RESUME:
            last = self.checkpoint_dir / LAST_CHECKPOINT
            fix = RESUME_FIX.format(path=last, out=options.out)
            inherited = self.restore(load_checkpoint(last, fix), options.command)
        elif parent is not None:
            # The parent's fp16 weights (perhaps an average); Adam starts afresh, eq. 3 where the parent left off.
            load_folder_weights(self.model, parent)
            summary = parent_summary(parent)
            inherited = summary.pop("options")
            if self.is_main and not parent.record_file.is_file():
                tqdm.write(NO_RECORD.format(path=parent.path, record=parent.record_file.name))
            self.progress.schedule_offset, self.progress.parent = summary["schedule_steps"], summary
        # Eq. 3's warm-up is fitted to the planned run only where nobody chose it: not --warmup, not the run
        # this one goes on from.
        self.fits_schedule = options.warmup_steps is None and inherited.get("warmup_steps") is None
        self.options = with_schedule(options, inherited)
        # The whole objective (forward, projection, loss) is the module DDP wraps.
        self.objective: torch.nn.Module = SmoothedLoss(self.model, self.options.label_smoothing)
        if self.world_size > 1:
            self.objective = torch.nn.parallel.DistributedDataParallel(self.objective)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def note_data(self, start: Start, val: PairSource | None) -> None:
        """Say what the data holds, and keep in the folder what later steps need of it."""
        # How long a sentence may get before the service splits it (text/clauses.py).
        self.folder.write_section(CLAUSES_SECTION, clauses_section(self.lengths[0] + 1))
        tqdm.write(describe_counts(self.data))
        small = self.data.record["counts"]["train"]["kept"]
        if small < SMALL_CORPUS_PAIRS:
            tqdm.write(
                f"warning: {small} training pairs is a small corpus (under {SMALL_CORPUS_PAIRS}): expect "
                "translations of sentences like the training ones at best, and little beyond them"
            )
        if start is not Start.RESUME and val is not None and val.describe().get("kind") != "multi30k":
            # The user's own validation pairs, so that export and checks of the folder need no corpus (a
            # resumed run's folder has them already).
            self.folder.write_validation_sample(list(islice(val.pairs(), VALIDATION_SAMPLE_PAIRS)))

    def state_dict(self) -> dict[str, Any]:
        return {
            **self.progress.to_dict(),
            **self.clock.to_dict(),
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "cpu_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "options": self.options.to_dict(),
        }

    def restore(self, state: dict[str, Any], command: str) -> dict[str, Any]:
        """Continue from a checkpoint; returns the options it was written with."""
        load_state_strict(self.model, state["model"], str(self.checkpoint_dir / LAST_CHECKPOINT))
        self.optimizer.load_state_dict(state["optimizer"])
        self.progress, self.clock = Progress.from_dict(state), Clock.from_dict(state)
        self.progress.commands = [*self.progress.commands, command]
        if self.is_main:
            tqdm.write(f"resuming from step {self.progress.step} (epoch {self.progress.epoch + 1})")
        torch.set_rng_state(state["cpu_rng"])
        if state["cuda_rng"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        options: dict[str, Any] = state["options"]
        return options

    def epoch_updates(self) -> list[list[np.ndarray]]:
        """This process's updates of the epoch in progress, each a list of ``update_freq`` batches of pair indices.

        Every process takes every world_size-th batch, ``update_freq`` of them an update; all take the same
        number of updates (the last few batches of an epoch are left out when they do not divide evenly).
        """
        epoch = self.progress.epoch
        if self.plan is None or self.plan[0] != epoch:
            self.plan = epoch, plan_batches(*self.lengths, self.options.max_tokens, self.options.seed, epoch)
        batches = self.plan[1]
        per_update = self.options.update_freq
        usable = len(batches) - len(batches) % (self.world_size * per_update)
        mine = range(self.rank, usable, self.world_size)
        return [[batches[i] for i in mine[k : k + per_update]] for k in range(0, len(mine), per_update)]

    def train_step(self, update: list[np.ndarray], steps_per_epoch: int) -> tuple[float, int]:
        """One update from its batches: eq. 3's rate (cooled down at the run's end), label-smoothed
        cross-entropy, Adam. Returns (loss, tokens)."""
        special = self.config.special_tokens
        micro_batches = [to_tensors(self.data.train.padded(rows, special), self.device) for rows in update]
        schedule_step = self.progress.schedule_offset + self.progress.step + 1
        lr = learning_rate(schedule_step, self.config.d_model, *self.schedule())
        lr = cooled(lr, self.share_done(steps_per_epoch), self.options.cooldown)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum, tokens = accumulate_gradients(self.objective, micro_batches, special.pad, self.precision)
        if self.options.clip_norm:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.options.clip_norm)
        self.optimizer.step()
        return loss_sum.item() / tokens, tokens

    def save_checkpoint(self) -> None:
        if self.is_main:
            save_atomic(self.state_dict(), self.checkpoint_dir / LAST_CHECKPOINT)

    def schedule(self) -> tuple[int, float]:
        """Eq. 3's (warm-up, scale): fitted to the planned run where it was, else as the options say."""
        fitted = self.progress.fitted_schedule
        if fitted:
            return fitted["warmup_steps"], fitted["lr_scale"]
        return self.options.warmup_steps, self.options.lr_scale

    def step_bounds(self, steps_per_epoch: int) -> list[int]:
        """The steps --max-steps and --epochs allow (none, one or both)."""
        options = self.options
        bounds = [options.max_steps] if options.max_steps is not None else []
        if options.epoch_limit is not None:
            bounds.append(options.epoch_limit * steps_per_epoch)
        return bounds

    def share_done(self, steps_per_epoch: int) -> float:
        """The share of the run made before the coming update: of its steps or of --time-limit, whichever is
        further along (0 for a run nothing bounds); so the last update still learns a little."""
        shares = [self.progress.step / bound for bound in self.step_bounds(steps_per_epoch)]
        used = self.time_used()
        return max([0.0, *shares, *([used] if used is not None else [])])

    def planned_steps(self, steps_per_epoch: int) -> int | None:
        """The steps --epochs, --max-steps and --time-limit allow, or None while the time limit's pace is unknown."""
        options, step = self.options, self.progress.step
        bounds = self.step_bounds(steps_per_epoch)
        if options.time_limit_minutes is not None:
            if step < PLAN_AFTER_STEPS:
                return None
            seconds_per_step = self.clock.wall_seconds / step
            bounds.append(int(options.time_limit_minutes * 60 / seconds_per_step))
        return min(bounds) if bounds else None

    def plan_schedule(self, steps_per_epoch: int) -> None:
        """Decide once whether eq. 3's warm-up fits the planned run, and shorten it where it does not."""
        if self.progress.fitted_schedule is not None:
            return
        planned = self.planned_steps(steps_per_epoch)
        if planned is None:
            return
        warmup, scale = self.options.warmup_steps, self.options.lr_scale
        if not self.fits_schedule:
            self.progress.fitted_schedule = {}  # decided: the chosen warm-up stays
            if self.is_main and planned < warmup:
                tqdm.write(
                    f"warning: the warm-up ({warmup} steps, as chosen) is longer than this run's ~{planned} steps: "
                    "the learning rate will still be rising when it ends, so expect it to learn little"
                )
            return
        self.progress.fitted_schedule = fitted_schedule(planned, warmup, scale) or {}
        if self.is_main and self.progress.fitted_schedule:
            fitted = self.progress.fitted_schedule
            peak = learning_rate(warmup, self.config.d_model, warmup, scale)
            tqdm.write(
                f"warm-up: {warmup} steps is too long for a run of about {planned} steps; {fitted['warmup_steps']} "
                f"instead (a quarter of the run, to the same peak rate {peak:.2e}; --warmup N sets it yourself)"
            )

    def end_epoch(self, train_loss: float) -> None:
        """Validate, keep the best weights in the folder, checkpoint the epoch, and write the training record."""
        if not self.is_main:
            return
        progress = self.progress
        metrics = self.validate_and_keep_best(progress.epoch, train_loss)
        save_atomic({"model": self.model.state_dict()}, self.checkpoint_dir / f"epoch{progress.epoch:04d}.pt")
        for old in sorted(self.checkpoint_dir.glob("epoch*.pt"))[: -self.options.keep_last]:
            old.unlink()
        tqdm.write(
            f"epoch {progress.epoch}: train loss {train_loss:.3f}, val loss {metrics['val_loss']:.3f}, "
            f"val BLEU {metrics['val_bleu']:.2f} (best {progress.best_bleu:.2f})"
        )

    def end_mid_epoch(self, steps_per_epoch: int) -> None:
        """A run stopped inside an epoch (--max-steps, --time-limit) is validated where it stands, so that its
        weights are kept too."""
        progress = self.progress
        validated_here = bool(progress.history) and progress.history[-1]["step"] == progress.step
        if not self.is_main or progress.step == 0 or validated_here:
            return
        epoch = progress.epoch + progress.batch_in_epoch / max(steps_per_epoch, 1)
        metrics = self.validate_and_keep_best(round(epoch, 3), progress.epoch_loss(), partial=True)
        tqdm.write(f"step {progress.step}: val loss {metrics['val_loss']:.3f}, val BLEU {metrics['val_bleu']:.2f}")

    def validate_and_keep_best(self, epoch: float, train_loss: float, partial: bool = False) -> dict[str, float]:
        progress = self.progress
        metrics = self.validate(self.model)
        entry = {"epoch": epoch, "step": progress.step, "train_loss": train_loss, **metrics}
        entry["cpu_minutes"] = round(self.clock.cpu_seconds / 60, 2)
        entry["wall_minutes"] = round(self.clock.wall_seconds / 60, 2)
        progress.history.append({**entry, **({"partial": True} if partial else {})})
        if metrics["val_bleu"] >= progress.best_bleu:  # on a tie the later, longer-trained weights win
            progress.best_bleu = metrics["val_bleu"]
            save_weights(self.model, self.folder)
        return metrics

    def validate(self, model: Transformer) -> dict[str, float]:
        return validate(model, self.folder, self.data, self.device, self.options.max_tokens)

    def write_record(self) -> None:
        if not self.is_main:
            return
        progress, clock = self.progress, self.clock
        write_record(
            self.folder,
            {
                "commands": progress.commands,
                "seed": self.options.seed,
                "options": self.options.to_dict(),
                "wall_seconds": round(clock.wall_seconds, 1),
                "steps": progress.step,
                "schedule_steps": progress.schedule_offset + progress.step,  # where eq. 3 stands, parents included
                "parameters": self.model.num_parameters(),
                "hardware": hardware_summary(self.device, self.world_size, self.precision),
                "data": self.data.record,  # where the pairs came from: files, line counts, hashes; what was skipped
                "best_val_bleu": progress.best_bleu,
                "epochs": progress.history,
                "stopped_by": progress.stopped_by,
                "cpu_seconds": round(clock.cpu_seconds, 1),
                "fitted_schedule": progress.fitted_schedule,
                "averaged": progress.averaged,
                "parent": progress.parent,
            },
        )

    def run(self) -> None:
        """Train until its epochs are done or --max-steps or --time-limit stops the run, checkpointing so that a
        kill loses little; then validate where it stopped, average (§6.1) and record which of the three it was."""
        options, progress, clock = self.options, self.progress, self.clock
        steps_per_epoch = len(self.epoch_updates())
        self.plan_schedule(steps_per_epoch)
        planned = self.planned_steps(steps_per_epoch)
        bar = tqdm(total=planned, initial=progress.step, disable=not self.is_main, unit="step", dynamic_ncols=True)
        self.model.train()
        self.write_record()  # with this run's command, even if it is killed before its first epoch ends
        stop = self.stop_before_epoch()
        while stop is None:
            clock.restart()
            for update in self.epoch_updates()[progress.batch_in_epoch :]:
                loss, tokens = self.train_step(update, steps_per_epoch)
                progress.count_update(loss, tokens)
                seconds = clock.tick()
                self.plan_schedule(steps_per_epoch)
                bar.update(1)
                bar.set_postfix(
                    loss=f"{loss:.3f}",
                    lr=f"{self.optimizer.param_groups[0]['lr']:.2e}",
                    tok_s=f"{tokens * self.world_size / max(seconds, 1e-9):.0f}",
                    epoch=progress.epoch + 1,
                )
                if progress.step % options.checkpoint_every == 0:
                    self.save_checkpoint()
                stop = self.stop_after_update()
                if stop is not None:
                    break
            if stop is not None:  # inside the epoch, which is left open for --resume to finish
                break
            self.end_epoch(progress.end_epoch())
            clock.tick()  # validating is part of the training time a --time-limit allows
            self.save_checkpoint()
            self.write_record()
            stop = self.stop_before_epoch()
        bar.close()

        progress.stopped_by = stop.value
        if stop is not StopReason.EPOCHS:
            self.end_mid_epoch(steps_per_epoch)
        self.save_checkpoint()
        if options.average_last > 1 and stop is not StopReason.MAX_STEPS:
            self.average_and_keep_if_better(options.average_last)
        if self.is_main and self.folder.weights_file.is_file():  # when an unsure translation is flagged
            calibrate_kept_weights(self.folder, self.data, self.device)
        self.write_record()

    def stop_before_epoch(self) -> StopReason | None:
        """What ends the run before its next epoch, if anything: its epochs done, the time the last one's
        validation took, or a limit met before --resume took the run up."""
        epochs = self.options.epoch_limit
        if epochs is not None and self.progress.epoch >= epochs:
            return StopReason.EPOCHS
        if self.out_of_time():
            return StopReason.TIME_LIMIT
        return StopReason.MAX_STEPS if self.steps_done() else None

    def stop_after_update(self) -> StopReason | None:
        """What ends the run after the update just made, if anything: an epoch of a large corpus may take hours,
        so the time limit holds within one."""
        if self.steps_done():
            return StopReason.MAX_STEPS
        return StopReason.TIME_LIMIT if self.out_of_time() else None

    def steps_done(self) -> bool:
        return self.options.max_steps is not None and self.progress.step >= self.options.max_steps

    def out_of_time(self) -> bool:
        used = self.time_used()
        return used is not None and used >= 1.0

    def time_used(self) -> float | None:
        """The share of --time-limit spent, or None without one. Rank 0's clock decides, so that every rank
        takes the same rate and stops after the same step."""
        limit = self.options.time_limit_minutes
        if limit is None:
            return None
        used = self.clock.wall_seconds / (limit * 60)
        if self.world_size > 1:
            shared = torch.tensor([used], dtype=torch.float64, device=self.device)
            dist.broadcast(shared, src=0)
            used = float(shared.item())
        return used

    def average_and_keep_if_better(self, last_n: int) -> None:
        """§6.1: average the last N epoch checkpoints; keep the result if it beats the best on val BLEU."""
        if not self.is_main:
            return
        paths = sorted(self.checkpoint_dir.glob("epoch*.pt"))[-last_n:]
        averaged = Transformer(self.config).to(self.device)
        load_state_strict(averaged, average_state_dicts(paths), f"average of {len(paths)} checkpoints")
        metrics = self.validate(averaged)
        tqdm.write(f"average of the last {len(paths)} epochs: val BLEU {metrics['val_bleu']:.2f}")
        self.progress.averaged = {"checkpoints": [p.name for p in paths], **metrics}
        if metrics["val_bleu"] > self.progress.best_bleu:
            self.progress.best_bleu = metrics["val_bleu"]
            save_weights(averaged, self.folder)


def describe_counts(data: PreparedData) -> str:
    """One line on what preparing kept and skipped."""
    parts = []
    for split, counts in data.record["counts"].items():
        skipped = counts["skipped_too_long"] + counts["skipped_empty"]
        parts.append(
            f"{split}: {counts['kept']} pairs"
            + (
                f" ({skipped} skipped: {counts['skipped_too_long']} over "
                f"{data.record['settings']['max_length']} tokens, {counts['skipped_empty']} empty)"
                if skipped
                else ""
            )
        )
    return f"data {data.path}: " + "; ".join(parts)


def train(options: TrainOptions, train_data: PairSource | None = None, val_data: PairSource | None = None) -> Path:
    """Train into ``options.out`` and return it; under torchrun, one process per rank.

    The pairs are prepared into ``--out/data`` first (once), unless ``options.prepared`` names a folder that
    `aiayn prepare` wrote.
    """
    distributed = int(os.environ.get("WORLD_SIZE", 1)) > 1
    if distributed:
        backend = "nccl" if torch.cuda.is_available() and options.device != "cpu" else "gloo"
        dist.init_process_group(backend)
    try:
        np.random.seed(options.seed)
        Trainer(options, train_data, val_data).run()
    finally:
        if distributed:
            dist.destroy_process_group()
    return Path(options.out)

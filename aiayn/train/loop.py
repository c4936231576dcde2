"""§5 Training: token-sized batches, Adam with the eq. 3 schedule, label smoothing, checkpoints and resume.

A run writes a model folder: config.json and tokenizer.json first, then
model.safetensors (the best weights by validation BLEU), training.json and
training.png after every epoch, and checkpoints/ for --resume and averaging.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from tqdm import tqdm

from aiayn.core.clauses import clauses_section
from aiayn.core.folder import CLAUSES_SECTION, MODEL_SECTION, ModelFolder
from aiayn.data.batching import BatchPlan, plan_batches
from aiayn.data.prepare import PreparedData
from aiayn.data.sources import PairSource
from aiayn.model.transformer import Transformer
from aiayn.model.weights import load_folder_weights, load_state_strict, save_weights
from aiayn.train.batches import to_tensors
from aiayn.train.checkpoint import average_state_dicts, load_checkpoint, save_atomic
from aiayn.train.corpus import prepared_languages, run_data
from aiayn.train.loss import SmoothedLoss
from aiayn.train.options import TrainOptions, learning_rate, with_schedule
from aiayn.train.precision import resolve_precision
from aiayn.train.progress import Progress
from aiayn.train.record import write_record
from aiayn.train.start import LAST_CHECKPOINT, RESUME_FIX, Start, continued_config, decide, preset_config
from aiayn.train.step import accumulate_gradients
from aiayn.train.validate import validate


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for, but PyTorch sees no GPU; use --device cpu")
    return torch.device(name)


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
    """What a continued run keeps of its parent's record: where eq. 3 stands, and the chain of commands."""
    record = parent.training_record()
    if not record:
        raise ValueError(
            f"--init-from {parent.path} has no {parent.record_file.name}, so where its learning-rate schedule left "
            "off is unknown; continue a folder written by `aiayn train`"
        )
    return {
        "folder": str(parent.path),
        "schedule_steps": int(record.get("schedule_steps", record["steps"])),  # its parents' steps too
        "wall_seconds": record.get("wall_seconds"),
        "hardware": record.get("hardware"),
        "commands": record.get("commands", []),
        "best_val_bleu": record.get("best_val_bleu"),
        "parent": record.get("parent", {}),  # the chain of continued runs, back to the first
        "options": record.get("options", {}),
    }


class Trainer:
    """One training run: the model, its optimizer and its ``Progress``, which checkpoints hold whole."""

    def __init__(self, options: TrainOptions, train: PairSource | None, val: PairSource | None) -> None:
        self.rank = int(os.environ.get("RANK", 0))
        self.world_size = int(os.environ.get("WORLD_SIZE", 1))
        self.device = pick_device(options.device)
        if self.world_size > 1 and self.device.type == "cuda":
            self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        self.precision = resolve_precision(options.precision, self.device)
        start = decide(options.resume, Path(options.out), options.init_from)
        parent = ModelFolder.open(options.init_from) if start is Start.CONTINUE and options.init_from else None
        self.data, self.folder = self.open_data_and_folder(start, options, train, val, parent)
        self.checkpoint_dir = self.folder.checkpoint_dir
        self.lengths = self.data.train.lengths()  # (pairs,) ×2, read once: batches are planned from them
        if self.is_main:  # how long a sentence may get before the service splits it (core/clauses.py)
            self.folder.write_section(CLAUSES_SECTION, clauses_section(self.lengths[0] + 1))
        self.plan: tuple[int, BatchPlan] | None = None  # (epoch, its batches), planned once per epoch
        if self.is_main:
            tqdm.write(describe_counts(self.data))

        torch.manual_seed(options.seed)
        self.config = self.folder.config
        self.model = Transformer(self.config).to(self.device)
        # Fused: one kernel for all parameters instead of a loop over ~100 tensors (same update, to rounding).
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=0.0, betas=(0.9, 0.98), eps=1e-9, fused=True)
        self.progress = Progress(commands=[options.command])
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
            self.progress.schedule_offset, self.progress.parent = summary["schedule_steps"], summary
        self.options = with_schedule(options, inherited)
        # The whole objective (forward, projection, loss) is the module DDP wraps.
        self.objective: torch.nn.Module = SmoothedLoss(self.model, self.options.label_smoothing)
        if self.world_size > 1:
            self.objective = torch.nn.parallel.DistributedDataParallel(self.objective)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def open_data_and_folder(
        self,
        start: Start,
        options: TrainOptions,
        train: PairSource | None,
        val: PairSource | None,
        parent: ModelFolder | None,
    ) -> tuple[PreparedData, ModelFolder]:
        """The prepared data, and --out as a model folder: the run's own (resume), or written anew."""
        into = ModelFolder(Path(options.out)).prepared_dir
        preset = preset_config(options.preset, options.overrides)
        if start is Start.RESUME:
            folder = ModelFolder.open(options.out)
            return run_data(options, into, train, val, folder.config, folder.tokenizer, self.is_main), folder
        if parent is not None:
            parent.require([parent.weights_file, parent.tokenizer_file], "--init-from needs a trained model folder")
            # Another language pair or architecture is refused before any preparing.
            langs = (train.src_lang, train.tgt_lang) if train is not None else prepared_languages(options)
            config = continued_config(parent, options.overrides, *langs)
            data = run_data(options, into, train, val, parent.config, parent.tokenizer, self.is_main)
        else:
            data = run_data(options, into, train, val, preset, None, self.is_main)
            langs = {"src_lang": data.src_lang, "tgt_lang": data.tgt_lang}
            config = preset.replace(vocab_size=data.tokenizer.vocab_size, **langs)
        if self.is_main:
            return data, ModelFolder.create(Path(options.out), config, data.tokenizer)
        folder = ModelFolder(Path(options.out), {MODEL_SECTION: config.to_dict()})  # rank 0 writes it
        folder.__dict__["tokenizer"] = data.tokenizer
        return data, folder

    def state_dict(self) -> dict[str, Any]:
        return {
            **self.progress.to_dict(),
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
        self.progress = Progress.from_dict(state)
        self.progress.commands = [*self.progress.commands, command]
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

    def train_step(self, update: list[np.ndarray]) -> tuple[float, int]:
        """One update from its batches: eq. 3's rate, label-smoothed cross-entropy, Adam. Returns (loss, tokens)."""
        special = self.config.special_tokens
        micro_batches = [to_tensors(self.data.train.padded(rows, special), self.device) for rows in update]
        schedule_step = self.progress.schedule_offset + self.progress.step + 1
        lr = learning_rate(schedule_step, self.config.d_model, self.options.warmup_steps, self.options.lr_scale)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum, tokens = accumulate_gradients(self.objective, micro_batches, special.pad, self.precision)
        if self.options.clip_norm:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.options.clip_norm)
        self.optimizer.step()
        self.progress.step += 1
        return loss_sum.item() / tokens, tokens

    def save_checkpoint(self) -> None:
        if self.is_main:
            save_atomic(self.state_dict(), self.checkpoint_dir / LAST_CHECKPOINT)

    def end_epoch(self, train_loss: float) -> None:
        """Validate, keep the best weights in the folder, checkpoint the epoch, and write the training record."""
        if not self.is_main:
            return
        progress = self.progress
        metrics = self.validate(self.model)
        progress.history.append({"epoch": progress.epoch, "step": progress.step, "train_loss": train_loss, **metrics})
        if metrics["val_bleu"] >= progress.best_bleu:  # on a tie the later, longer-trained weights win
            progress.best_bleu = metrics["val_bleu"]
            save_weights(self.model, self.folder)
        save_atomic({"model": self.model.state_dict()}, self.checkpoint_dir / f"epoch{progress.epoch:04d}.pt")
        for old in sorted(self.checkpoint_dir.glob("epoch*.pt"))[: -self.options.keep_last]:
            old.unlink()
        tqdm.write(
            f"epoch {progress.epoch}: train loss {train_loss:.3f}, val loss {metrics['val_loss']:.3f}, "
            f"val BLEU {metrics['val_bleu']:.2f} (best {progress.best_bleu:.2f})"
        )

    def validate(self, model: Transformer) -> dict[str, float]:
        return validate(model, self.folder, self.data, self.device, self.options.max_tokens)

    def write_record(self) -> None:
        if not self.is_main:
            return
        progress = self.progress
        write_record(
            self.folder,
            {
                "commands": progress.commands,
                "seed": self.options.seed,
                "options": self.options.to_dict(),
                "wall_seconds": round(progress.wall_seconds, 1),
                "steps": progress.step,
                "schedule_steps": progress.schedule_offset + progress.step,  # where eq. 3 stands, parents included
                "parameters": self.model.num_parameters(),
                "hardware": hardware_summary(self.device, self.world_size, self.precision),
                "data": self.data.record,  # where the pairs came from: files, line counts, hashes; what was skipped
                "best_val_bleu": progress.best_bleu,
                "epochs": progress.history,
                "averaged": progress.averaged,
                "parent": progress.parent,
            },
        )

    def run(self, stop: Callable[[], bool] = lambda: False) -> None:
        """Train to ``options.epochs`` (or ``max_steps``), checkpointing so that a kill loses little."""
        options, progress = self.options, self.progress
        bar = tqdm(
            total=options.epochs * len(self.epoch_updates()),
            initial=progress.step,
            disable=not self.is_main,
            unit="step",
            dynamic_ncols=True,
        )
        self.model.train()
        self.write_record()  # with this run's command, even if it is killed before its first epoch ends
        while progress.epoch < options.epochs and not self.out_of_time():
            started = time.perf_counter()
            for update in self.epoch_updates()[progress.batch_in_epoch :]:
                loss, tokens = self.train_step(update)
                progress.epoch_loss_sum += loss * tokens
                progress.epoch_tokens += tokens
                progress.batch_in_epoch += 1
                elapsed = time.perf_counter() - started
                progress.wall_seconds += elapsed
                started = time.perf_counter()
                bar.update(1)
                bar.set_postfix(
                    loss=f"{loss:.3f}",
                    lr=f"{self.optimizer.param_groups[0]['lr']:.2e}",
                    tok_s=f"{tokens * self.world_size / max(elapsed, 1e-9):.0f}",
                    epoch=progress.epoch + 1,
                )
                if progress.step % options.checkpoint_every == 0:
                    self.save_checkpoint()
                if (options.max_steps is not None and progress.step >= options.max_steps) or stop():
                    self.save_checkpoint()
                    bar.close()
                    return
            started = time.perf_counter()
            self.end_epoch(progress.end_epoch())
            progress.wall_seconds += time.perf_counter() - started
            self.save_checkpoint()
            self.write_record()
        bar.close()
        if options.average_last > 1:
            self.average_and_keep_if_better(options.average_last)
        self.write_record()

    def out_of_time(self) -> bool:
        limit = self.options.time_limit_minutes
        return limit is not None and self.progress.wall_seconds >= limit * 60

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

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
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from tqdm import tqdm

from aiayn.core.folder import MODEL_SECTION, ModelFolder
from aiayn.core.tokenizer import train_tokenizer
from aiayn.data.batching import token_batches
from aiayn.data.multi30k import ParallelCorpus
from aiayn.model.transformer import Transformer
from aiayn.model.weights import load_folder_weights, load_state_strict, save_weights
from aiayn.train.batches import bare_lengths, encode_corpus, make_batch
from aiayn.train.checkpoint import average_state_dicts, load_checkpoint, save_atomic
from aiayn.train.options import TrainOptions, learning_rate, with_schedule
from aiayn.train.progress import Progress
from aiayn.train.record import write_record
from aiayn.train.start import LAST_CHECKPOINT, RESUME_FIX, Start, continued_config, decide, preset_config
from aiayn.train.validate import validate


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for, but PyTorch sees no GPU; use --device cpu")
    return torch.device(name)


def hardware_summary(device: torch.device, world_size: int) -> dict[str, Any]:
    summary: dict[str, Any] = {
        "device": str(device),
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

    def __init__(self, options: TrainOptions, train: ParallelCorpus, val: ParallelCorpus) -> None:
        self.rank = int(os.environ.get("RANK", 0))
        self.world_size = int(os.environ.get("WORLD_SIZE", 1))
        self.device = pick_device(options.device)
        if self.world_size > 1 and self.device.type == "cuda":
            self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        self.val_data = val
        start = decide(options.resume, Path(options.out), options.init_from)
        parent = ModelFolder.open(options.init_from) if start is Start.CONTINUE and options.init_from else None
        self.folder = self.open_folder(start, options, train, parent)
        self.checkpoint_dir = self.folder.checkpoint_dir
        self.train_src, self.train_tgt = encode_corpus(self.folder.tokenizer, train)
        self.val_src, self.val_tgt = encode_corpus(self.folder.tokenizer, val)

        torch.manual_seed(options.seed)
        self.config = self.folder.config
        self.model = Transformer(self.config).to(self.device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=0.0, betas=(0.9, 0.98), eps=1e-9)
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
        self.parallel_model: torch.nn.Module = self.model
        if self.world_size > 1:
            self.parallel_model = torch.nn.parallel.DistributedDataParallel(self.model)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def open_folder(
        self, start: Start, options: TrainOptions, train: ParallelCorpus, parent: ModelFolder | None
    ) -> ModelFolder:
        """--out as a model folder: the run's own (resume), or written anew with a tokenizer and config."""
        if start is Start.RESUME:
            return ModelFolder.open(options.out)
        if parent is not None:
            parent.require([parent.weights_file, parent.tokenizer_file], "--init-from needs a trained model folder")
            config = continued_config(parent, options.overrides, train.src_lang, train.tgt_lang)
            tokenizer = parent.tokenizer
        else:
            preset = preset_config(options.preset, options.overrides)
            tokenizer = train_tokenizer(train.src + train.tgt, preset.vocab_size, preset.special_tokens)
            config = preset.replace(vocab_size=tokenizer.vocab_size, src_lang=train.src_lang, tgt_lang=train.tgt_lang)
        if self.is_main:
            return ModelFolder.create(Path(options.out), config, tokenizer)
        folder = ModelFolder(Path(options.out), {MODEL_SECTION: config.to_dict()})  # rank 0 writes it
        folder.__dict__["tokenizer"] = tokenizer
        return folder

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

    def epoch_batches(self) -> list[list[int]]:
        lengths = bare_lengths(self.train_src, self.train_tgt)
        batches = token_batches(*lengths, self.options.max_tokens, self.options.seed, self.progress.epoch)
        # Every process takes every world_size-th batch; all take the same number of steps.
        usable = len(batches) - len(batches) % self.world_size
        return batches[self.rank : usable : self.world_size]

    def autocast(self) -> AbstractContextManager[Any]:
        if self.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return nullcontext()

    def train_step(self, rows: list[int]) -> tuple[float, int]:
        """One update on one batch: eq. 3's rate, label-smoothed cross-entropy, Adam. Returns (loss, tokens)."""
        tokens = self.config.special_tokens
        src_ids, tgt_in, tgt_out = make_batch(rows, self.train_src, self.train_tgt, tokens, self.device)
        schedule_step = self.progress.schedule_offset + self.progress.step + 1
        lr = learning_rate(schedule_step, self.config.d_model, self.options.warmup_steps, self.options.lr_scale)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        with self.autocast():
            logits = self.parallel_model(src_ids, tgt_in)  # (batch, tgt_len, vocab)
        loss = F.cross_entropy(
            logits.flatten(0, 1).float(),
            tgt_out.flatten(),
            ignore_index=tokens.pad,
            label_smoothing=self.options.label_smoothing,
        )
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.options.clip_norm:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.options.clip_norm)
        self.optimizer.step()
        self.progress.step += 1
        return loss.item(), int((tgt_out != tokens.pad).sum())

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
        return validate(
            model, self.folder, self.val_src, self.val_tgt, self.val_data, self.device, self.options.max_tokens
        )

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
                "hardware": hardware_summary(self.device, self.world_size),
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
            total=options.epochs * len(self.epoch_batches()),
            initial=progress.step,
            disable=not self.is_main,
            unit="step",
            dynamic_ncols=True,
        )
        self.model.train()
        self.write_record()  # with this run's command, even if it is killed before its first epoch ends
        while progress.epoch < options.epochs and not self.out_of_time():
            started = time.perf_counter()
            for rows in self.epoch_batches()[progress.batch_in_epoch :]:
                loss, tokens = self.train_step(rows)
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


def train(options: TrainOptions, train_data: ParallelCorpus, val_data: ParallelCorpus) -> Path:
    """Train into ``options.out`` and return it; under torchrun, one process per rank."""
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

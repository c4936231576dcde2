"""§5 Training: token-sized batches, Adam with the eq. 3 schedule, label smoothing, checkpoints and resume.

A run writes a model folder: config.json and tokenizer.json first, then
model.safetensors (the best weights by validation BLEU), training.json and
training.png after every epoch, and checkpoints/ for --resume and averaging.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import Tensor
from tqdm import tqdm

from aiayn.model.batching import token_batches
from aiayn.model.checkpoint import average_state_dicts, load_checkpoint, save_atomic
from aiayn.model.config import PRESETS, ModelConfig, load_config, save_config
from aiayn.model.data import ParallelCorpus
from aiayn.model.engine import TorchEngine
from aiayn.model.folder import CHECKPOINT_DIR, TOKENIZER_FILE, TRAINING_RECORD_FILE, WEIGHTS_FILE, require_files
from aiayn.model.metrics import score
from aiayn.model.record import write_record
from aiayn.model.tokenizer import SubwordTokenizer, train_tokenizer
from aiayn.model.transformer import Transformer
from aiayn.model.weights import load_state_strict, save_weights
from aiayn.search.translator import SearchSettings, Translator

LAST_CHECKPOINT = "last.pt"
# Config fields that --init-from may change: they alter training, not the weights' shapes or meaning.
REGULARIZATION_FIELDS = frozenset({"dropout", "attention_dropout", "activation_dropout"})
# Eq. 3's settings when neither the options nor the run being continued give them.
SCHEDULE_DEFAULTS = {"lr_scale": 1.0, "warmup_steps": 4000}


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
    command: str = field(default_factory=lambda: shlex.join(["aiayn", *sys.argv[1:]]))


def learning_rate(step: int, d_model: int, warmup_steps: int, scale: float) -> float:
    """Eq. 3: lrate = scale · d_model^-0.5 · min(step^-0.5, step · warmup_steps^-1.5)."""
    step = max(step, 1)
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


def read_parent_record(parent: Path) -> dict[str, Any]:
    """The training record of a folder to continue: where its learning-rate schedule stands, and its settings."""
    path = Path(parent) / TRAINING_RECORD_FILE
    if not path.is_file():
        raise ValueError(
            f"--init-from {parent} has no {TRAINING_RECORD_FILE}, so where its learning-rate schedule left off is "
            "unknown; continue a folder written by `aiayn train`"
        )
    return json.loads(path.read_text(encoding="utf-8"))


def schedule_steps(record: dict[str, Any]) -> int:
    """Steps of eq. 3 behind a folder's weights: its own, plus its parents' when it was itself continued."""
    return int(record.get("schedule_steps", record["steps"]))


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


def encode_corpus(tokenizer: SubwordTokenizer, corpus: ParallelCorpus, eos: int) -> tuple[list[list[int]], ...]:
    """Source ids end with </s>; the target is returned without <s>/</s> (added per batch)."""
    src = [ids + [eos] for ids in tokenizer.encode_batch(corpus.src)]
    return src, tokenizer.encode_batch(corpus.tgt)


def bare_lengths(src: list[list[int]], tgt: list[list[int]]) -> tuple[list[int], list[int]]:
    """Token counts without </s> or <s>: ``token_batches`` adds the one special token of each side itself."""
    return [len(s) - 1 for s in src], [len(t) for t in tgt]


def make_batch(
    rows: list[int], src: list[list[int]], tgt: list[list[int]], config: ModelConfig, device: torch.device
) -> tuple[Tensor, Tensor, Tensor]:
    """Padded source ids, decoder input (<s> y), decoder target (y </s>)."""
    tokens = config.special_tokens
    src_len = max(len(src[i]) for i in rows)
    tgt_len = max(len(tgt[i]) for i in rows) + 1
    src_ids = torch.full((len(rows), src_len), tokens.pad, dtype=torch.long)
    tgt_in = torch.full((len(rows), tgt_len), tokens.pad, dtype=torch.long)
    tgt_out = torch.full((len(rows), tgt_len), tokens.pad, dtype=torch.long)
    for b, i in enumerate(rows):
        src_ids[b, : len(src[i])] = torch.tensor(src[i])
        tgt_in[b, : len(tgt[i]) + 1] = torch.tensor([tokens.bos, *tgt[i]])
        tgt_out[b, : len(tgt[i]) + 1] = torch.tensor([*tgt[i], tokens.eos])
    return src_ids.to(device), tgt_in.to(device), tgt_out.to(device)


def validate(
    model: Transformer,
    tokenizer: SubwordTokenizer,
    val_src: list[list[int]],
    val_tgt: list[list[int]],
    val: ParallelCorpus,
    device: torch.device,
    max_tokens: int,
) -> dict[str, float]:
    """Validation loss (no label smoothing) and greedy BLEU on the validation split."""
    model.eval()
    config = model.config
    total_loss, total_tokens = 0.0, 0
    with torch.inference_mode():
        for rows in token_batches(*bare_lengths(val_src, val_tgt), max_tokens, 0, 0):
            src_ids, tgt_in, tgt_out = make_batch(rows, val_src, val_tgt, config, device)
            logits = model(src_ids, tgt_in)
            total_loss += F.cross_entropy(
                logits.flatten(0, 1).float(), tgt_out.flatten(), ignore_index=config.special_tokens.pad, reduction="sum"
            ).item()
            total_tokens += int((tgt_out != config.special_tokens.pad).sum())
    translator = Translator(TorchEngine(model, device), tokenizer, config.max_len, max_sentences=256)
    hypotheses = translator.translate_ids(val_src, SearchSettings(beam_size=1))
    scores = score([tokenizer.decode(h) for h in hypotheses], val.tgt)
    model.train()
    return {"val_loss": total_loss / total_tokens, "val_bleu": scores.bleu}


class Trainer:
    """One training run; state that --resume restores lives in :meth:`state_dict`."""

    def __init__(self, options: TrainOptions, train: ParallelCorpus, val: ParallelCorpus) -> None:
        self.options = options
        self.out = Path(options.out)
        self.ckpt_dir = self.out / CHECKPOINT_DIR
        self.rank = int(os.environ.get("RANK", 0))
        self.world_size = int(os.environ.get("WORLD_SIZE", 1))
        self.device = pick_device(options.device)
        if self.world_size > 1 and self.device.type == "cuda":
            self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        self.train_data, self.val_data = train, val
        self.tokenizer, self.config = self._tokenizer_and_config()
        eos = self.config.special_tokens.eos
        self.train_src, self.train_tgt = encode_corpus(self.tokenizer, train, eos)
        self.val_src, self.val_tgt = encode_corpus(self.tokenizer, val, eos)

        torch.manual_seed(options.seed)
        self.model = Transformer(self.config).to(self.device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=0.0, betas=(0.9, 0.98), eps=1e-9)
        self.step, self.epoch, self.batch_in_epoch = 0, 0, 0
        self.epoch_loss_sum, self.epoch_tokens = 0.0, 0  # of the epoch in progress, for its mean loss
        self.history: list[dict[str, float]] = []
        self.best_bleu = -1.0
        self.wall_seconds = 0.0
        self.averaged: dict[str, Any] = {}
        self.commands = [options.command]  # the first command, then each --resume
        # Steps the weights were trained for before this run: eq. 3 goes on from there, not from warm-up.
        self.schedule_offset = 0
        self.parent: dict[str, Any] = {}
        inherited: dict[str, Any] = {}  # the options of the run this one goes on from
        if options.resume:
            state = load_checkpoint(self.ckpt_dir / LAST_CHECKPOINT)
            self.load_state_dict(state)
            inherited = state["options"]
        elif options.init_from is not None:
            inherited = self._start_from_parent(Path(options.init_from))
        self.options = with_schedule(options, inherited)
        self.parallel_model: torch.nn.Module = self.model
        if self.world_size > 1:
            self.parallel_model = torch.nn.parallel.DistributedDataParallel(self.model)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def _tokenizer_and_config(self) -> tuple[SubwordTokenizer, ModelConfig]:
        options = self.options
        if options.resume:
            return SubwordTokenizer.load(self.out / TOKENIZER_FILE), load_config(self.out)
        if (self.ckpt_dir / LAST_CHECKPOINT).exists():
            raise FileExistsError(
                f"{self.out} already holds a training run; pass --resume to continue it or choose another --out"
            )
        if options.init_from is not None:
            tokenizer, config = self._parent_tokenizer_and_config(Path(options.init_from))
        else:
            tokenizer, config = self._new_tokenizer_and_config()
        if self.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
            tokenizer.save(self.out / TOKENIZER_FILE)
            save_config(self.out, config)
        return tokenizer, config

    def _parent_tokenizer_and_config(self, parent: Path) -> tuple[SubwordTokenizer, ModelConfig]:
        """The parent folder's vocabulary and architecture; only regularization may change (``--set dropout=...``)."""
        require_files(parent, [WEIGHTS_FILE, TOKENIZER_FILE], "--init-from needs a trained model folder")
        if self.out.resolve() == parent.resolve():
            raise ValueError(f"--out {self.out} is the --init-from folder itself; write the continued run elsewhere")
        config = load_config(parent)
        if (config.src_lang, config.tgt_lang) != (self.train_data.src_lang, self.train_data.tgt_lang):
            raise ValueError(
                f"--init-from {parent} translates {config.src_lang}->{config.tgt_lang}, but --src/--tgt ask for "
                f"{self.train_data.src_lang}->{self.train_data.tgt_lang}"
            )
        changed = {name for name, value in self.options.overrides.items() if getattr(config, name) != value}
        architecture = changed - REGULARIZATION_FIELDS
        if architecture:
            raise ValueError(
                f"--init-from keeps the parent's architecture; --set {', '.join(sorted(architecture))} cannot change "
                f"(only {', '.join(sorted(REGULARIZATION_FIELDS))} can)"
            )
        return SubwordTokenizer.load(parent / TOKENIZER_FILE), config.replace(**self.options.overrides)

    def _new_tokenizer_and_config(self) -> tuple[SubwordTokenizer, ModelConfig]:
        options = self.options
        if options.preset not in PRESETS:
            raise ValueError(f"unknown preset {options.preset!r}; choose one of {', '.join(PRESETS)}")
        preset = PRESETS[options.preset].replace(**options.overrides)
        tokenizer = train_tokenizer(self.train_data.src + self.train_data.tgt, preset.vocab_size, preset.special_tokens)
        config = preset.replace(
            vocab_size=tokenizer.vocab_size, src_lang=self.train_data.src_lang, tgt_lang=self.train_data.tgt_lang
        )
        return tokenizer, config

    def _start_from_parent(self, parent: Path) -> dict[str, Any]:
        """Load the parent's weights (the folder's fp16 ones, which may be an average); Adam starts afresh,
        the learning rate where the parent's schedule left off. Returns the parent's training options."""
        load_state_strict(self.model, load_file(str(parent / WEIGHTS_FILE)), str(parent / WEIGHTS_FILE))
        record = read_parent_record(parent)
        self.schedule_offset = schedule_steps(record)
        self.parent = {
            "folder": str(parent),
            "schedule_steps": self.schedule_offset,
            "wall_seconds": record.get("wall_seconds"),
            "hardware": record.get("hardware"),
            "commands": record.get("commands", []),
            "best_val_bleu": record.get("best_val_bleu"),
            "parent": record.get("parent", {}),  # the chain of continued runs, back to the first
        }
        return record.get("options", {})

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "step": self.step,
            "epoch": self.epoch,
            "batch_in_epoch": self.batch_in_epoch,
            "epoch_loss_sum": self.epoch_loss_sum,
            "epoch_tokens": self.epoch_tokens,
            "history": self.history,
            "best_bleu": self.best_bleu,
            "wall_seconds": self.wall_seconds,
            "commands": self.commands,
            "schedule_offset": self.schedule_offset,
            "parent": self.parent,
            "cpu_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "options": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self.options).items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        load_state_strict(self.model, state["model"], str(self.ckpt_dir / LAST_CHECKPOINT))
        self.optimizer.load_state_dict(state["optimizer"])
        self.step, self.epoch, self.batch_in_epoch = state["step"], state["epoch"], state["batch_in_epoch"]
        self.epoch_loss_sum, self.epoch_tokens = state["epoch_loss_sum"], state["epoch_tokens"]
        self.history, self.best_bleu, self.wall_seconds = state["history"], state["best_bleu"], state["wall_seconds"]
        self.commands = [*state["commands"], self.options.command]
        self.schedule_offset, self.parent = state.get("schedule_offset", 0), state.get("parent", {})
        torch.set_rng_state(state["cpu_rng"])
        if state["cuda_rng"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])

    def epoch_batches(self) -> list[list[int]]:
        batches = token_batches(
            *bare_lengths(self.train_src, self.train_tgt),
            self.options.max_tokens,
            self.options.seed,
            self.epoch,
        )
        # Every process takes every world_size-th batch; all take the same number of steps.
        usable = len(batches) - len(batches) % self.world_size
        return batches[self.rank : usable : self.world_size]

    def autocast(self) -> Any:
        if self.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return nullcontext()

    def train_step(self, rows: list[int]) -> tuple[float, int]:
        src_ids, tgt_in, tgt_out = make_batch(rows, self.train_src, self.train_tgt, self.config, self.device)
        schedule_step = self.schedule_offset + self.step + 1
        lr = learning_rate(schedule_step, self.config.d_model, self.options.warmup_steps, self.options.lr_scale)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        with self.autocast():
            logits = self.parallel_model(src_ids, tgt_in)  # (batch, tgt_len, vocab)
        loss = F.cross_entropy(
            logits.flatten(0, 1).float(),
            tgt_out.flatten(),
            ignore_index=self.config.special_tokens.pad,
            label_smoothing=self.options.label_smoothing,
        )
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.options.clip_norm:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.options.clip_norm)
        self.optimizer.step()
        self.step += 1
        return loss.item(), int((tgt_out != self.config.special_tokens.pad).sum())

    def save_checkpoint(self) -> None:
        if self.is_main:
            save_atomic(self.state_dict(), self.ckpt_dir / LAST_CHECKPOINT)

    def end_epoch(self, train_loss: float) -> None:
        """Validate, keep the best weights in the folder, checkpoint, and write the training record."""
        if not self.is_main:
            return
        metrics = validate(
            self.model, self.tokenizer, self.val_src, self.val_tgt, self.val_data, self.device, self.options.max_tokens
        )
        self.history.append({"epoch": self.epoch + 1, "step": self.step, "train_loss": train_loss, **metrics})
        if metrics["val_bleu"] >= self.best_bleu:  # on a tie the later, longer-trained weights win
            self.best_bleu = metrics["val_bleu"]
            save_weights(self.model, self.out)
        save_atomic({"model": self.model.state_dict()}, self.ckpt_dir / f"epoch{self.epoch + 1:04d}.pt")
        for old in sorted(self.ckpt_dir.glob("epoch*.pt"))[: -self.options.keep_last]:
            old.unlink()
        tqdm.write(
            f"epoch {self.epoch + 1}: train loss {train_loss:.3f}, val loss {metrics['val_loss']:.3f}, "
            f"val BLEU {metrics['val_bleu']:.2f} (best {self.best_bleu:.2f})"
        )

    def write_record(self) -> None:
        if self.is_main:
            write_record(
                self.out,
                {
                    "commands": self.commands,
                    "seed": self.options.seed,
                    "options": self.state_dict()["options"],
                    "wall_seconds": round(self.wall_seconds, 1),
                    "steps": self.step,
                    "schedule_steps": self.schedule_offset + self.step,  # where eq. 3 stands, parents included
                    "parameters": self.model.num_parameters(),
                    "hardware": hardware_summary(self.device, self.world_size),
                    "best_val_bleu": self.best_bleu,
                    "epochs": self.history,
                    "averaged": self.averaged,
                    "parent": self.parent,
                },
            )

    def run(self, stop: Callable[[], bool] = lambda: False) -> None:
        """Train to ``options.epochs`` (or ``max_steps``), checkpointing so that a kill loses little."""
        options = self.options
        steps_per_epoch = len(self.epoch_batches())
        progress = tqdm(
            total=options.epochs * steps_per_epoch,
            initial=self.step,
            disable=not self.is_main,
            unit="step",
            dynamic_ncols=True,
        )
        self.model.train()
        while self.epoch < options.epochs and not self.out_of_time():
            batches = self.epoch_batches()
            started = time.perf_counter()
            for rows in batches[self.batch_in_epoch :]:
                loss, tokens = self.train_step(rows)
                self.epoch_loss_sum += loss * tokens
                self.epoch_tokens += tokens
                self.batch_in_epoch += 1
                elapsed = time.perf_counter() - started
                self.wall_seconds += elapsed
                started = time.perf_counter()
                progress.update(1)
                progress.set_postfix(
                    loss=f"{loss:.3f}",
                    lr=f"{self.optimizer.param_groups[0]['lr']:.2e}",
                    tok_s=f"{tokens * self.world_size / max(elapsed, 1e-9):.0f}",
                    epoch=self.epoch + 1,
                )
                if self.step % options.checkpoint_every == 0:
                    self.save_checkpoint()
                if (options.max_steps is not None and self.step >= options.max_steps) or stop():
                    self.save_checkpoint()
                    progress.close()
                    return
            started = time.perf_counter()
            self.end_epoch(self.epoch_loss_sum / max(self.epoch_tokens, 1))
            self.batch_in_epoch, self.epoch_loss_sum, self.epoch_tokens = 0, 0.0, 0
            self.epoch += 1
            self.wall_seconds += time.perf_counter() - started
            self.save_checkpoint()
            self.write_record()
        progress.close()
        if options.average_last > 1:
            self.average_and_keep_if_better(options.average_last)
        self.write_record()

    def out_of_time(self) -> bool:
        limit = self.options.time_limit_minutes
        return limit is not None and self.wall_seconds >= limit * 60

    def average_and_keep_if_better(self, last_n: int) -> None:
        """§6.1: average the last N epoch checkpoints; keep the result if it beats the best on val BLEU."""
        if not self.is_main:
            return
        paths = sorted(self.ckpt_dir.glob("epoch*.pt"))[-last_n:]
        averaged = Transformer(self.config).to(self.device)
        load_state_strict(averaged, average_state_dicts(paths), f"average of {len(paths)} checkpoints")
        metrics = validate(
            averaged, self.tokenizer, self.val_src, self.val_tgt, self.val_data, self.device, self.options.max_tokens
        )
        tqdm.write(f"average of the last {len(paths)} epochs: val BLEU {metrics['val_bleu']:.2f}")
        self.averaged = {"checkpoints": [p.name for p in paths], **metrics}
        if metrics["val_bleu"] > self.best_bleu:
            self.best_bleu = metrics["val_bleu"]
            save_weights(averaged, self.out)


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

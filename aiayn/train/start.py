"""How a run starts: new, resumed from its own checkpoint, or continued from another model folder.

``choose_start`` is a pure function of the options and what is on disk;
``open_data_and_folder`` then prepares the data and opens or writes --out for
that case, and the trainer builds the model and its progress.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Any

from aiayn.core.config import PRESETS, ModelConfig
from aiayn.core.folder import CHECKPOINT_DIR, NORMALIZATION_BEFORE, RUN_FILES, SEARCH_SECTION, ModelFolder
from aiayn.core.outputs import Command, claim, mark
from aiayn.data.prepare import PreparedData
from aiayn.data.sources import PairSource
from aiayn.train.corpus import prepared_languages, run_data
from aiayn.train.options import TrainOptions

LAST_CHECKPOINT = "last.pt"
# --resume has only last.pt to go on from (the epoch checkpoints hold weights alone), so without it the run
# starts again, or goes on from the best weights kept in the folder as a new, continued run.
RESUME_FIX = (
    "--resume cannot go on without it: delete {path} and run the command again without --resume to start over, "
    "or train on from the folder's best weights into a new folder with --init-from {out} --out NEW_DIR"
)
TRAIN = Command(
    "aiayn train",
    "choose another --out (a folder where `aiayn train` left a run goes on with --resume, or from its weights with "
    "--init-from)",
)
# Config fields that --init-from may change: they alter training, not the weights' shapes or meaning.
REGULARIZATION_FIELDS = frozenset({"dropout", "attention_dropout", "activation_dropout"})
# What `aiayn eval` tunes on val into the ``search`` section: it was chosen for the parent's weights alone.
TUNED_SEARCH_KEYS = frozenset({"length_penalty", "tuned_on"})


class Start(Enum):
    NEW = "new"  # a fresh tokenizer and model
    RESUME = "resume"  # the run in --out goes on from checkpoints/last.pt
    CONTINUE = "continue"  # a new run from a finished folder's tokenizer, config and weights (--init-from)


def choose_start(resume: bool, out: Path, init_from: Path | None) -> Start:
    """The case, or a clear refusal: an --out holding a run needs --resume; a run cannot continue itself."""
    if resume:
        if not (Path(out) / CHECKPOINT_DIR / LAST_CHECKPOINT).is_file():
            raise FileNotFoundError(
                f"no run to resume in {out} (it has no {CHECKPOINT_DIR}/{LAST_CHECKPOINT}); start it without --resume"
            )
        return Start.RESUME
    if (Path(out) / CHECKPOINT_DIR / LAST_CHECKPOINT).exists():
        raise FileExistsError(
            f"{out} already holds a training run; pass --resume to continue it or choose another --out"
        )
    if init_from is None:
        return Start.NEW
    if Path(out).resolve() == Path(init_from).resolve():
        raise ValueError(f"--out {out} is the --init-from folder itself; write the continued run elsewhere")
    return Start.CONTINUE


def preset_config(preset: str, overrides: dict[str, object]) -> ModelConfig:
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    return PRESETS[preset].replace(**overrides)


def continued_config(parent: ModelFolder, overrides: dict[str, object], src_lang: str, tgt_lang: str) -> ModelConfig:
    """The parent folder's architecture; only regularization may change (``--set dropout=...``)."""
    config = parent.config
    if (config.src_lang, config.tgt_lang) != (src_lang, tgt_lang):
        raise ValueError(
            f"--init-from {parent.path} translates {config.src_lang}->{config.tgt_lang}, but --src/--tgt ask for "
            f"{src_lang}->{tgt_lang}"
        )
    changed = {name for name, value in overrides.items() if getattr(config, name) != value}
    architecture = changed - REGULARIZATION_FIELDS
    if architecture:
        raise ValueError(
            f"--init-from keeps the parent's architecture; --set {', '.join(sorted(architecture))} cannot change "
            f"(only {', '.join(sorted(REGULARIZATION_FIELDS))} can)"
        )
    return config.replace(**overrides)


def continued_search(parent: ModelFolder) -> dict[str, Any]:
    """The ``search`` section a continued run's folder starts with: the parent's decoding defaults that belong
    to the kind of model (an imported checkpoint's beam size, length normalisation and penalty), without what was
    tuned on val for the parent's weights (empty for every folder `aiayn train` wrote)."""
    section = parent.section(SEARCH_SECTION)
    if "tuned_on" not in section:
        return section
    kept = {key: value for key, value in section.items() if key not in TUNED_SEARCH_KEYS}
    if NORMALIZATION_BEFORE in section["tuned_on"]:  # chosen on val too: back to the parent's own, if any
        kept.pop("length_normalization", None)
        if section["tuned_on"][NORMALIZATION_BEFORE] is not None:
            kept["length_normalization"] = section["tuned_on"][NORMALIZATION_BEFORE]
    return kept


def open_data_and_folder(
    start: Start,
    options: TrainOptions,
    train: PairSource | None,
    val: PairSource | None,
    parent: ModelFolder | None,
    is_main: bool,
) -> tuple[PreparedData, ModelFolder]:
    """The prepared data, and --out as a model folder: the run's own (resume), or written anew into a folder that
    is new, empty or an earlier run's (a run killed before its first checkpoint), and marked as the run's first."""
    into = ModelFolder(Path(options.out)).prepared_dir
    if start is not Start.RESUME and is_main:
        claim(Path(options.out), TRAIN)
        mark(Path(options.out), TRAIN, RUN_FILES)
    preset = preset_config(options.preset, options.overrides)
    if start is Start.RESUME:
        folder = ModelFolder.open(options.out)
        return run_data(options, into, train, val, folder.config, folder.tokenizer, is_main), folder
    if parent is not None:
        parent.require([parent.weights_file, parent.tokenizer_file], "--init-from needs a trained model folder")
        # Another language pair or architecture is refused before any preparing.
        langs = (train.src_lang, train.tgt_lang) if train is not None else prepared_languages(options)
        config = continued_config(parent, options.overrides, *langs)
        data = run_data(options, into, train, val, parent.config, parent.tokenizer, is_main)
    else:
        data = run_data(options, into, train, val, preset, None, is_main)
        langs = {"src_lang": data.src_lang, "tgt_lang": data.tgt_lang}
        config = preset.replace(vocab_size=data.tokenizer.vocab_size, **langs)
    if is_main:
        if parent is None:
            return data, ModelFolder.create(Path(options.out), config, data.tokenizer)
        folder = ModelFolder.create(Path(options.out), config, parent)  # its very tokenizer files
        search = continued_search(parent)
        if search:  # an imported checkpoint's decoding defaults hold for its fine-tuned weights
            folder.write_section(SEARCH_SECTION, search)
        return data, folder
    return data, ModelFolder.known(Path(options.out), config, data.tokenizer)  # rank 0 writes it

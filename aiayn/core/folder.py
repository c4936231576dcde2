"""The model folder: the one unit that moves between train, export, translate and serve.

``ModelFolder`` is the only reader of a folder's files: it reads ``config.json``
once and knows the tokenizer, the decoding defaults, every file's path, the
weights' hash and the ONNX section; every step asks it (as Hugging Face's
``from_pretrained`` reads a folder once). Torch-free, so the serve path opens
folders too.
"""

from __future__ import annotations

import hashlib
import json
import os
from functools import cached_property
from pathlib import Path
from typing import Any

from aiayn.core.config import ModelConfig
from aiayn.core.contract import variant_file
from aiayn.core.normalizer import is_tidy, tidied
from aiayn.core.outputs import write_file
from aiayn.core.public import public_path
from aiayn.core.tokenizer import SPECIAL_TOKEN_TEXT, TARGET_TOKENIZER_FILE, TOKENIZER_FILE, SubwordTokenizer

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
TRAINING_RECORD_FILE = "training.json"
TRAINING_PLOT_FILE = "training.png"
CHECKPOINT_DIR = "checkpoints"
PREPARED_DIR = "data"  # the run's token ids (``aiayn.data.prepare``), when it prepared its own
CTRANSLATE2_DIR = "ctranslate2"
# Validation pairs of the user's own corpus, kept by `aiayn train` so that export, calibration and checks of the
# folder need no corpus at hand (not written for Multi30k, which the tools find themselves).
VALIDATION_SAMPLE_FILE = "validation.tsv"
VALIDATION_SAMPLE_PAIRS = 1000
DEFAULT_MODEL = "en-de"  # what the CLI and the page use when no model is named
# What a training run writes into its folder (``core/outputs.py``'s manifest; a name ending in / is a folder).
RUN_FILES = (
    CONFIG_FILE,
    TOKENIZER_FILE,
    TARGET_TOKENIZER_FILE,
    WEIGHTS_FILE,
    TRAINING_RECORD_FILE,
    TRAINING_PLOT_FILE,
    VALIDATION_SAMPLE_FILE,
    f"{CHECKPOINT_DIR}/",
    f"{PREPARED_DIR}/",
)

# config.json's sections: ``model`` (the architecture), ``onnx`` (the contract and the hashes the graphs came
# from, written by export), ``search`` (decoding defaults tuned on val, like generation_config.json).
MODEL_SECTION, ONNX_SECTION, SEARCH_SECTION = "model", "onnx", "search"
# In the search section's ``tuned_on``: the normalisation the section held before tuning chose one (None: none).
NORMALIZATION_BEFORE = "length_normalization_before"
# ``clauses``: how long a sentence may get before the service translates it clause by clause (text/clauses.py).
CLAUSES_SECTION = "clauses"
# ``confidence``: the mean log-probability per token under which a translation is called unsure, set on val.
CONFIDENCE_SECTION = "confidence"
# ``imported``: where an imported folder came from (``aiayn import``): ``from`` (a Hub id or a checkpoint folder),
# ``hub`` (whether ``from`` is a Hub id) and ``license`` (its model card's, or None where it states none).
IMPORTED_SECTION = "imported"
# How training.json names the kinds of corpus a run prepared (``aiayn.data``'s ``describe``) to a page's visitor.
CORPUS_KINDS = {"multi30k": "Multi30k image captions", "in memory": "sentence pairs given in memory"}
TRAIN_FIX = "re-create the folder with `aiayn train`"
WEIGHTS_FIX = (
    "restore it from where it came from (`git checkout -- pretrained/` for a bundled model) "
    "or re-create the folder with `aiayn train`"
)

# The bundled, trained folders live beside the package in a checkout (pip install -e .).
PRETRAINED_DIR = Path(os.environ.get("AIAYN_PRETRAINED", Path(__file__).resolve().parents[2] / "pretrained"))


def bundled_models() -> dict[str, Path]:
    """Short name (``en-de``) → folder of every bundled model, the default first."""
    if not PRETRAINED_DIR.is_dir():
        return {}
    folders = sorted(PRETRAINED_DIR.iterdir(), key=lambda p: (p.name != DEFAULT_MODEL, p.name))
    return {p.name: p for p in folders if (p / CONFIG_FILE).is_file()}


def named_or_bundled(names: list[str] | None) -> list[str]:
    """The models a server serves: those ``names`` give, or without any every bundled model (none: one clear
    error)."""
    chosen = names or list(bundled_models())
    if not chosen:
        raise FileNotFoundError("no bundled models found; pass --model DIR or add folders under pretrained/")
    return chosen


def resolve_model(name_or_path: str | Path) -> Path:
    """A bundled model's short name or a folder path → the folder, checked to exist.

    A bundled name wins over a folder of that name in the current directory: ``en-de`` is the bundled model
    wherever the command runs, and such a folder is named as a path (``./en-de``), which no bundled name is.
    """
    bundled = bundled_models()
    if str(name_or_path) in bundled:
        return bundled[str(name_or_path)]
    path = Path(name_or_path)
    if path.is_dir():
        return path
    names = ", ".join(bundled) or "none found in " + str(PRETRAINED_DIR)
    raise FileNotFoundError(
        f"model {str(name_or_path)!r} is neither a folder nor a bundled model (bundled: {names}); "
        "pass a folder written by `aiayn train`"
    )


def safetensors_damage(path: Path) -> str | None:
    """Why ``path`` is not a whole safetensors file, or None. The layout: an 8-byte little-endian header size,
    a JSON header giving each tensor's byte range, then the data, which must end exactly where the file does."""
    size = path.stat().st_size
    with path.open("rb") as f:
        header_size = int.from_bytes(f.read(8), "little")
        if size < 8 or 8 + header_size > size:
            return f"{size} bytes, fewer than its header needs"
        try:
            header = json.loads(f.read(header_size))
            data_end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):  # not JSON, or not safetensors' JSON
            return "its header is not a safetensors header"
    expected = 8 + header_size + data_end
    return None if size == expected else f"{size} bytes where its header says {expected}"


def read_sections(path: Path) -> dict[str, Any]:
    """The whole ``config.json`` at ``path``, refused with a line that names the file when it is no model's."""
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: a model folder needs config.json (train one with `aiayn train`)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON ({err}); {TRAIN_FIX}") from err
    if not isinstance(data, dict) or MODEL_SECTION not in data:
        raise ValueError(f"{path} has no 'model' section; {TRAIN_FIX}")
    return data


class ModelFolder:
    """A model folder, opened once: its config, tokenizer, decoding defaults, files and hashes."""

    def __init__(self, path: Path, sections: dict[str, Any] | None = None) -> None:
        """The folder at ``path``; its config.json is read on first use, unless ``sections`` are its content."""
        self.path = Path(path)
        self.config_file = self.path / CONFIG_FILE
        self.tokenizer_file = self.path / TOKENIZER_FILE
        self.target_tokenizer_file = self.path / TARGET_TOKENIZER_FILE
        self.weights_file = self.path / WEIGHTS_FILE
        self.record_file = self.path / TRAINING_RECORD_FILE
        self.plot_file = self.path / TRAINING_PLOT_FILE
        self.checkpoint_dir = self.path / CHECKPOINT_DIR
        self.prepared_dir = self.path / PREPARED_DIR
        self.ctranslate2_dir = self.path / CTRANSLATE2_DIR
        self.validation_file = self.path / VALIDATION_SAMPLE_FILE
        if sections is not None:
            self.__dict__["sections"] = sections

    @classmethod
    def open(cls, name_or_path: str | Path) -> ModelFolder:
        """A bundled model's short name or a folder path, with its ``config.json`` read and checked."""
        folder = cls(resolve_model(name_or_path))
        folder.config  # noqa: B018  (read now, so a broken folder is refused before any work)
        return folder

    @classmethod
    def create(cls, path: Path, config: ModelConfig, tokenizer: SubwordTokenizer | ModelFolder) -> ModelFolder:
        """A new folder (or one being overwritten by a new run) with its config.json and tokenizer.json.

        ``tokenizer`` is a new run's, written here, or the folder a run continues from, whose tokenizer files
        (``target_tokenizer.json`` too, where it has one) are copied byte for byte: an imported checkpoint's were
        written by another library, and need not come back the same from being read and written again.
        """
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        if isinstance(tokenizer, ModelFolder):
            folder = cls.known(path, config, tokenizer.tokenizer)
            for source, target in (
                (tokenizer.tokenizer_file, folder.tokenizer_file),
                (tokenizer.target_tokenizer_file, folder.target_tokenizer_file),
            ):
                if source.is_file():
                    write_file(target, source.read_bytes())
                else:
                    target.unlink(missing_ok=True)  # a folder re-created from one with a single tokenizer
        else:
            folder = cls.known(path, config, tokenizer)
            tokenizer.save(folder.tokenizer_file)
        folder.write_section(MODEL_SECTION, config.to_dict())
        return folder

    @classmethod
    def known(cls, path: Path, config: ModelConfig, tokenizer: SubwordTokenizer) -> ModelFolder:
        """The folder at ``path`` whose config and tokenizer are known already, nothing read or written: the one
        ``create`` writes, or the one the first process of a run writes while the others train."""
        folder = cls(path, {MODEL_SECTION: config.to_dict()})
        # the cached_property, already known, with this config's source prefix
        folder.__dict__["tokenizer"] = SubwordTokenizer(tokenizer.tokenizer, tokenizer.target, config.source_prefix)
        return folder

    def __repr__(self) -> str:
        return f"ModelFolder({str(self.path)!r})"

    @property
    def name(self) -> str:
        return self.path.name

    def onnx_file(self, graph_file: str, variant: str = "fp32") -> Path:
        """The file of one graph (the contract's ``encoder.onnx``/``decoder.onnx``) in one variant."""
        return self.path / variant_file(graph_file, variant)

    def require(self, files: list[Path], fix: str) -> None:
        """Refuse a folder that lacks any of ``files``, listing all that are missing."""
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise FileNotFoundError(f"model folder {self.path} lacks {', '.join(missing)}; {fix}")

    # What the files hold.
    @cached_property
    def sections(self) -> dict[str, Any]:
        """The whole config.json: ``model`` plus the sections other steps add."""
        return read_sections(self.config_file)

    @cached_property
    def config(self) -> ModelConfig:
        try:
            return ModelConfig.from_dict(self.sections[MODEL_SECTION])
        except (TypeError, ValueError) as err:
            raise ValueError(f"{self.config_file} does not describe a model: {err}") from err

    @cached_property
    def tokenizer(self) -> SubwordTokenizer:
        """tokenizer.json (and target_tokenizer.json), every source encoded with the config's source prefix."""
        return SubwordTokenizer.load(self.tokenizer_file, self.config.source_prefix)

    def tidy_tokenizer(self) -> bool:
        """Give a tokenizer.json written before the text contract moved into the file its tidying normalizer
        (``normalizer.py``; the ids of tidied text stay the same); True if the file was rewritten."""
        raw = self.tokenizer.tokenizer
        if is_tidy(raw):
            return False
        target, prefix = self.tokenizer.target, self.tokenizer.source_prefix  # kept
        tidy = SubwordTokenizer(tidied(raw, SPECIAL_TOKEN_TEXT.values()), target, prefix)
        tidy.save(self.tokenizer_file)
        self.__dict__["tokenizer"] = tidy
        return True

    @cached_property
    def weights_sha256(self) -> str:
        """sha256 of model.safetensors: ties exported graphs to the exact weights they came from."""
        return hashlib.sha256(self.weights_file.read_bytes()).hexdigest()

    def check_weights(self) -> None:
        """Refuse a damaged model.safetensors (cut short by a copy or a download) before any engine reads it."""
        damage = safetensors_damage(self.weights_file)
        if damage:
            raise ValueError(f"{self.weights_file} is damaged ({damage}); {WEIGHTS_FIX}")

    def section(self, name: str) -> dict[str, Any]:
        """One section of config.json (``onnx``, ``search``); empty when the folder has none."""
        value = self.sections.get(name, {})
        return value if isinstance(value, dict) else {}

    def write_section(self, name: str, value: dict[str, Any]) -> None:
        """Set one section of ``config.json``, keeping the others; written atomically, fsynced."""
        self.sections[name] = value
        write_file(self.config_file, (json.dumps(self.sections, indent=2, ensure_ascii=False) + "\n").encode())

    def training_record(self) -> dict[str, Any]:
        """``training.json``: commands, settings, per-epoch history; empty when the folder has none."""
        if not self.record_file.is_file():
            return {}
        try:
            record = json.loads(self.record_file.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise ValueError(f"{self.record_file} is not valid JSON ({err}); {TRAIN_FIX}") from err
        return record if isinstance(record, dict) else {}

    def provenance(self) -> str:
        """What the model knows, in one line for its page and its Space: the corpus it was trained on (training.json),
        or the checkpoint it was imported from and its licence; for a run continued from another folder, both."""
        record, imported = self.training_record(), self.section(IMPORTED_SECTION)
        if not record:
            if not imported:
                return "its folder does not record what it was trained on"
            source = str(imported.get("from"))
            where = source if imported.get("hub") else f"the checkpoint folder {Path(source).name}"
            licence = imported.get("license")
            return f"imported from {where} ({f'licence {licence}' if licence else 'no licence in its model card'})"
        corpus = corpus_line(record.get("data", {}).get("sources", {}).get("train", {}))
        parent = record.get("parent") or {}
        if not parent:
            return f"trained on {corpus}"
        name = Path(str(parent.get("folder"))).name
        # The parent's line as its record kept it, from before names were kept local: judged again.
        was = public_path(str(parent.get("provenance", "trained elsewhere")))
        return f"trained further on {corpus} from {name}, which was {was}"

    def validation_sample(self) -> list[tuple[str, str]]:
        """The validation pairs training kept in the folder (``validation.tsv``: source TAB reference); empty when
        it kept none."""
        if not self.validation_file.is_file():
            return []
        pairs = []
        for number, line in enumerate(self.validation_file.read_text(encoding="utf-8").splitlines(), 1):
            src, tab, tgt = line.partition("\t")
            if not tab:
                raise ValueError(f"{self.validation_file} line {number} has no tab; {TRAIN_FIX}")
            pairs.append((src, tgt))
        return pairs

    def write_validation_sample(self, pairs: list[tuple[str, str]]) -> None:
        """Keep up to VALIDATION_SAMPLE_PAIRS validation pairs (tabs and line breaks inside a side become spaces)."""
        clean = (" ".join(side.split()) for pair in pairs[:VALIDATION_SAMPLE_PAIRS] for side in pair)
        sides = list(clean)
        lines = [f"{src}\t{tgt}\n" for src, tgt in zip(sides[::2], sides[1::2], strict=True)]
        self.validation_file.write_text("".join(lines), encoding="utf-8")

    # What later steps wrote (read here; the runtime objects built from them are made where engines are loaded).
    def search_defaults(self) -> dict[str, Any]:
        """The ``search`` section's decoding defaults that are set: ``length_penalty`` (tuned on val), and for an
        imported checkpoint its own ``beam_size`` and ``length_normalization`` (``aiayn.search.translator``)."""
        section = self.section(SEARCH_SECTION)
        kinds: dict[str, type] = {"beam_size": int, "length_penalty": float, "length_normalization": str}
        return {key: kind(section[key]) for key, kind in kinds.items() if section.get(key) is not None}

    def clause_limit(self) -> int | None:
        """The ``clauses`` section's ``split_over_tokens``: a sentence longer than this (tokens, </s> included) is
        translated clause by clause (never, for a folder without one)."""
        limit = self.section(CLAUSES_SECTION).get("split_over_tokens")
        return None if limit is None else int(limit)

    def min_mean_log_prob(self) -> float | None:
        """The ``confidence`` section's threshold: a sentence whose translation's mean log-probability per token
        is below it is unsure (never, for a folder without one)."""
        threshold = self.section(CONFIDENCE_SECTION).get("min_mean_log_prob")
        return None if threshold is None else float(threshold)

    def min_word_log_prob(self) -> float | None:
        """The ``confidence`` section's word threshold: a translated word whose log-probability is below it is
        marked unsure (never, for a folder without one)."""
        threshold = self.section(CONFIDENCE_SECTION).get("min_word_log_prob")
        return None if threshold is None else float(threshold)


def corpus_line(train: dict[str, Any]) -> str:
    """A training corpus as training.json describes it (``data.sources.train``), for a visitor: its name and size."""
    kind, pairs = train.get("kind"), train.get("pairs")
    files = [Path(f["path"] if isinstance(f, dict) else f).name for f in train.get("files", [])]
    if kind in CORPUS_KINDS:
        name = CORPUS_KINDS[kind]
    elif kind == "hf datasets":
        name = f"the Hugging Face dataset {public_path(str(train.get('name')))}" + (
            f" ({train['config']})" if train.get("config") else ""
        )
    elif files:
        name = " + ".join(files)
    else:
        return "a corpus its folder does not name"
    return name if pairs is None else f"{name} ({pairs:,} pairs)".replace(",", " ")

"""The one description of a model: architecture, special tokens and languages.

Saved as ``config.json`` in every model folder and read back by every step
(training, export, serving). Torch-free, so the serve path can import it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CONFIG_FILE = "config.json"


@dataclass(frozen=True)
class SpecialTokens:
    """Ids of the four special tokens in the shared vocabulary."""

    pad: int = 0
    unk: int = 1
    bos: int = 2
    eos: int = 3


@dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of the encoder-decoder; defaults are the paper's base model (Table 3)."""

    vocab_size: int = 37000
    d_model: int = 512
    n_heads: int = 8
    d_ff: int = 2048
    n_encoder_layers: int = 6
    n_decoder_layers: int = 6
    dropout: float = 0.1  # P_drop of §5.4: sub-layer outputs and embedding sums
    attention_dropout: float = 0.0  # on the attention weights (not in the paper)
    activation_dropout: float = 0.0  # inside the feed-forward, after the ReLU (not in the paper)
    norm_first: bool = False  # False: the paper's post-LN; True: pre-LN with final norms
    layer_norm_eps: float = 1e-6
    max_len: int = 1024  # longest sequence the tools accept; positions themselves have no limit
    src_lang: str = "en"
    tgt_lang: str = "de"
    special_tokens: SpecialTokens = field(default_factory=SpecialTokens)

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}")
        if self.d_model % 2:
            raise ValueError(f"d_model {self.d_model} must be even for the sinusoidal positions")
        ids = dataclasses.astuple(self.special_tokens)
        if len(set(ids)) != len(ids) or max(ids) >= self.vocab_size or min(ids) < 0:
            raise ValueError(f"special token ids {ids} must be distinct and below vocab_size")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown config keys {unknown}; this aiayn knows {sorted(known)}")
        data = dict(data)
        if "special_tokens" in data:
            data["special_tokens"] = SpecialTokens(**data["special_tokens"])
        return cls(**data)

    def fingerprint(self) -> str:
        """A short hash of the architecture and token ids, to tie exported files to this config."""
        text = json.dumps(self.to_dict(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


PRESETS: dict[str, ModelConfig] = {
    # The paper's base model, Table 3.
    "base": ModelConfig(),
    # The small model that suits Multi30k (Wu et al., 2021): 4+4 layers, d_model 128.
    "tiny": ModelConfig(
        vocab_size=10000,
        d_model=128,
        n_heads=4,
        d_ff=256,
        n_encoder_layers=4,
        n_decoder_layers=4,
        dropout=0.3,
    ),
}


# config.json's section of decoding defaults (like Hugging Face's generation_config.json): the length
# penalty tuned on val by `aiayn eval --split val --tune-length-penalty ...`.
SEARCH_SECTION = "search"


def read_config_file(folder: Path) -> dict[str, Any]:
    """The whole ``config.json`` of a model folder: ``model`` plus sections other steps add (``onnx``)."""
    path = Path(folder) / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: a model folder needs config.json (train one with `aiayn train`)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON ({err}); re-create the folder with `aiayn train`") from err
    if not isinstance(data, dict) or "model" not in data:
        raise ValueError(f"{path} has no 'model' section; re-create the folder with `aiayn train`")
    return data


def load_config(folder: Path) -> ModelConfig:
    """The model config of a folder, with an error that names the file."""
    data = read_config_file(folder)
    try:
        return ModelConfig.from_dict(data["model"])
    except (TypeError, ValueError) as err:
        raise ValueError(f"{Path(folder) / CONFIG_FILE} does not describe a model: {err}") from err


def write_config_section(folder: Path, section: str, value: dict[str, Any]) -> None:
    """Set one section of ``config.json``, keeping the others; written atomically."""
    path = Path(folder) / CONFIG_FILE
    data = read_config_file(folder) if path.exists() else {}
    data[section] = value
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(path)


def save_config(folder: Path, config: ModelConfig) -> None:
    write_config_section(folder, "model", config.to_dict())

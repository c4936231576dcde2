"""The one description of a model: architecture, special tokens and languages.

Saved in every model folder's ``config.json`` (``aiayn.core.folder``) and read back by every step
(training, export, serving). Torch-free, so the serve path can import it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class SpecialTokens:
    """Ids of the four special tokens in the shared vocabulary. ``bos`` is the decoder's start token; it may be
    ``pad`` itself, as in Marian (OPUS-MT), whose decoder starts from ``<pad>`` and whose ``</s>`` is id 0."""

    pad: int = 0
    unk: int = 1
    bos: int = 2
    eos: int = 3

    def distinct(self) -> tuple[int, ...]:
        """The ids that must differ: every one but a ``bos`` that doubles as ``pad``."""
        ids = (self.pad, self.unk, self.eos)
        return ids if self.bos == self.pad else (*ids, self.bos)


# The variants a checkpoint may need, each named once; the first of each is the paper's, and the default.
ACTIVATIONS = ("relu", "swish", "gelu")  # eq. 2's max(0, ·); SiLU x·σ(x) (Marian); erf GELU
POSITION_LAYOUTS = ("interleaved", "halves")  # §3.5's sin/cos pairs; Marian's sin of every pair, then every cos
# Fields added after the first folders were written: the fingerprint leaves them out while they hold their
# defaults, so those folders' exported graphs stay tied to their config.
LATER_FIELDS = ("activation", "positions", "scale_embedding", "logits_bias", "never_generate", "source_prefix")


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
    # What imported checkpoints need (``aiayn import``); the defaults are the paper's model as `aiayn train` makes it.
    activation: str = "relu"  # of the feed-forward's hidden layer (eq. 2), one of ACTIVATIONS
    positions: str = "interleaved"  # the sinusoids' layout (§3.5), one of POSITION_LAYOUTS
    scale_embedding: bool = True  # embeddings × √d_model before the positions are added (§3.4)
    logits_bias: bool = False  # a learned bias on the logits (Marian's final_logits_bias)
    never_generate: tuple[int, ...] = ()  # token ids the search never chooses (Marian: <pad>, its bad_words_ids)
    # Token ids the encoder reads before every source sentence's subwords: a multi-target checkpoint's choice of
    # target language (OPUS-MT's >>por<<), which every step that encodes a source adds (``tokenizer.encode_source``).
    source_prefix: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}")
        if self.d_model % 2:
            raise ValueError(f"d_model {self.d_model} must be even for the sinusoidal positions")
        ids = dataclasses.astuple(self.special_tokens)
        distinct = self.special_tokens.distinct()
        if len(set(distinct)) != len(distinct) or max(ids) >= self.vocab_size or min(ids) < 0:
            raise ValueError(
                f"special token ids {ids} must be distinct (only bos may equal pad) and below vocab_size"
            )
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation {self.activation!r} is not one of {', '.join(ACTIVATIONS)}")
        if self.positions not in POSITION_LAYOUTS:
            raise ValueError(f"positions {self.positions!r} is not one of {', '.join(POSITION_LAYOUTS)}")
        banned = set(self.never_generate)
        if any(not 0 <= i < self.vocab_size for i in banned) or self.special_tokens.eos in banned:
            raise ValueError(f"never_generate {self.never_generate} must be ids below vocab_size, </s> not among them")
        if any(not 0 <= i < self.vocab_size for i in self.source_prefix):
            raise ValueError(f"source_prefix {self.source_prefix} must be ids below vocab_size")

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
        for name in ("never_generate", "source_prefix"):
            if name in data:
                data[name] = tuple(data[name])  # a JSON list
        return cls(**data)

    def fingerprint(self) -> str:
        """A short hash of the architecture and token ids, to tie exported files to this config. The folders of a
        multi-target checkpoint (one per target) differ only in the target their sources ask for, which no weight
        or graph holds: it is left out, so that they can share those files."""
        data, defaults = self.to_dict(), ModelConfig()
        for name in LATER_FIELDS:
            if data[name] == getattr(defaults, name):
                del data[name]
        if self.source_prefix:
            del data["tgt_lang"], data["source_prefix"]
        text = json.dumps(data, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


PRESETS: dict[str, ModelConfig] = {
    # The paper's base model, Table 3.
    "base": ModelConfig(),
    # The small model that suits Multi30k (Wu et al., 2021): 4+4 layers, d_model 128; pre-LN, which trained
    # better than post-LN in the same time here (en-de val BLEU 39.4 vs 37.1 after 44 epochs), as the bundled
    # models are.
    "tiny": ModelConfig(
        vocab_size=10000,
        d_model=128,
        n_heads=4,
        d_ff=256,
        n_encoder_layers=4,
        n_decoder_layers=4,
        dropout=0.3,
        norm_first=True,
    ),
}

"""A SentencePiece Unigram model (Marian's ``source.spm``) as an HF ``tokenizers`` file with Marian's ids.

Marian checkpoints (OPUS-MT, transformers' ``MarianTokenizer``) segment text with SentencePiece but number the
pieces with their own ``vocab.json``, shared by source and target. Serving has no SentencePiece, so the import
writes one ``tokenizer.json`` that gives ``MarianTokenizer``'s ids from plain ``tokenizers`` (Python, Rust,
tokenizers.js): the spm's normalizer spec as normalizers, its pieces and scores as a Unigram model laid out at
``vocab.json``'s ids, and a decoder that undoes the metaspace as ``MarianTokenizer.decode`` does.

Moses punctuation normalisation is not part of it: MarianTokenizer sets it up where ``sacremoses`` is installed,
but encoding never calls it (its ``normalize`` method is for callers), so the file leaves punctuation to the spm.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from sentencepiece import sentencepiece_model_pb2
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

MARIAN_SPECIAL_TOKENS = ("</s>", "<unk>", "<pad>")
METASPACE = "▁"
# A vocab.json entry that the spm does not produce (a piece of the other language's spm, a special token) keeps
# its text: MarianTokenizer looks the text of a run of unknown characters up in vocab.json, so a lone "ß" that
# only the target spm has gets that piece's id. It costs this much a character, so the lattice never takes it
# where the spm's own pieces cover the text, and on unknown characters takes as few as it can.
UNREACHABLE_SCORE = -1e6
# The very start and end of the text: Oniguruma's ^ and $ also match at line breaks, and JavaScript has no \A
# or \z; a look-around on any character reads the same in both.
TEXT_START, TEXT_END = r"(?<![\s\S])", r"(?![\s\S])"


def tokenizer_from_sentencepiece(
    spm_file: Path,
    vocab: Mapping[str, int],
    special_tokens: Collection[str] = MARIAN_SPECIAL_TOKENS,
    unk_token: str = "<unk>",
) -> Tokenizer:
    """A tokenizer that encodes as ``MarianTokenizer`` does with ``spm_file`` as its spm (without ``</s>``) and
    decodes as its ``decode(ids, skip_special_tokens=True)`` does, with ``vocab``'s ids.

    ``vocab`` is vocab.json: piece → id, ids 0..n-1. ``special_tokens`` (``unk_token`` among them) are entries
    of it that match whole in the raw text and that decoding drops. A piece of the spm that ``vocab`` lacks is
    left out of the model: MarianTokenizer gives such a piece the <unk> id, and a Unigram model cannot give a
    piece another's id, so the text is segmented without it.
    """
    proto = read_spm(spm_file)
    check_vocab(vocab, special_tokens, unk_token)

    scores = {p.piece: p.score for p in proto.pieces if p.type == p.NORMAL}
    pieces = sorted(vocab, key=vocab.__getitem__)
    unigram = [(piece, scores.get(piece, UNREACHABLE_SCORE * len(piece) - 1)) for piece in pieces]
    # fuse_unk, always on for Unigram, joins a run of unknown characters into one <unk> as SentencePiece does
    tokenizer = Tokenizer(models.Unigram(unigram, unk_id=vocab[unk_token], byte_fallback=False))
    spec = proto.normalizer_spec
    tokenizer.normalizer = normalizers.Sequence(spm_normalizers(spec))
    # split=False: SentencePiece runs one lattice over the whole text. "always": MarianTokenizer encodes the text
    # on either side of a special token on its own, each with the dummy prefix.
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement=METASPACE, prepend_scheme="always" if spec.add_dummy_prefix else "never", split=False
    )
    tokenizer.decoder = decoders.Sequence(
        [
            decoders.Replace(METASPACE, " "),
            decoders.Fuse(),
            # MarianTokenizer strips the decoded text, the dummy prefix's space with it
            decoders.Replace(Regex(rf"{TEXT_START}\s+|\s+{TEXT_END}"), ""),
        ]
    )
    tokenizer.add_special_tokens([AddedToken(token, normalized=False, special=True) for token in special_tokens])
    return tokenizer


def read_spm(spm_file: Path) -> Any:
    """The spm's ``ModelProto``, refused where this module could not reproduce it. ``Any``: protobuf makes the
    classes when the module is imported, so mypy knows none of them."""
    proto = sentencepiece_model_pb2.ModelProto()  # type: ignore[attr-defined]
    proto.ParseFromString(Path(spm_file).read_bytes())
    trainer = proto.trainer_spec
    if trainer.model_type != trainer.UNIGRAM:
        kind = trainer.ModelType.Name(trainer.model_type)
        raise ValueError(f"{spm_file} is a SentencePiece {kind} model; only Unigram ones (as Marian's) convert")
    if trainer.byte_fallback:
        raise ValueError(f"{spm_file} uses byte fallback, whose byte pieces vocab.json does not number; not supported")
    if any(p.type == p.USER_DEFINED for p in proto.pieces):
        raise ValueError(f"{spm_file} has user-defined pieces, which Marian's spm files do not; not supported")
    return proto


def check_vocab(vocab: Mapping[str, int], special_tokens: Collection[str], unk_token: str) -> None:
    if sorted(vocab.values()) != list(range(len(vocab))):
        raise ValueError("vocab.json's ids must be 0..n-1, each once, as the rows of the model's embedding")
    if unk_token not in special_tokens:
        raise ValueError(f"the unknown token {unk_token} must be one of the special tokens {list(special_tokens)}")
    missing = [token for token in special_tokens if token not in vocab]
    if missing:
        raise ValueError(f"the special tokens {missing} are not in vocab.json")


def spm_normalizers(spec: Any) -> list[normalizers.Normalizer]:
    """SentencePiece's normalizer spec as ``tokenizers`` normalizers, in its order (as transformers'
    ``SpmConverter.build_tokenizer_from_spm_proto``)."""
    steps: list[normalizers.Normalizer] = []
    if spec.precompiled_charsmap:
        steps.append(normalizers.Precompiled(spec.precompiled_charsmap))
    if spec.remove_extra_whitespaces:
        # Spaces only: SentencePiece leaves the other white space that the charsmap keeps (U+0085) alone
        steps += [
            normalizers.Replace(Regex(f"{TEXT_START} +| +{TEXT_END}"), ""),
            normalizers.Replace(Regex(" {2,}"), " "),
        ]
    if spec.escape_whitespaces:
        steps.append(normalizers.Replace(" ", METASPACE))
    if spec.add_dummy_prefix:
        # Metaspace adds no prefix to a text that starts with ▁ already; SentencePiece does
        steps.append(normalizers.Replace(Regex(f"{TEXT_START}{METASPACE}"), METASPACE * 2))
    return steps

"""A SentencePiece Unigram model (Marian's ``source.spm``) as an HF ``tokenizers`` file with Marian's ids.

Marian checkpoints (OPUS-MT, transformers' ``MarianTokenizer``) segment text with SentencePiece but number the
pieces with their own ``vocab.json``, shared by source and target. The serving path has no SentencePiece, so
the import writes one ``tokenizer.json`` that gives the ids ``MarianTokenizer`` gives, from plain ``tokenizers``
(Python, Rust, tokenizers.js): SentencePiece's normalizer spec as normalizers, its pieces and scores as a
Unigram model laid out at ``vocab.json``'s ids, and a decoder that undoes the metaspace as SentencePiece does.

MarianTokenizer applies Moses punctuation normalisation before SentencePiece only where ``sacremoses`` is
installed; it is not a dependency here, so neither side applies it and the file does not either.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path

from sentencepiece import sentencepiece_model_pb2
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

MARIAN_SPECIAL_TOKENS = ("</s>", "<unk>", "<pad>")
METASPACE = "▁"
# A vocab.json entry that this spm cannot produce (a piece of the other language's spm, a special token) must
# never win the lattice, or tokenizers would pick it where SentencePiece emits <unk> or other pieces. Pieces are
# stored behind a space, which never reaches the model (the pre-tokenizer turns every space into ▁), and the
# decoder takes it off again; special tokens keep their text (tokenizers finds an added token's id by its text)
# and get a score no path of real pieces falls to.
UNREACHABLE_MARK = " "
UNREACHABLE_SCORE = -1e9
# Anchors at the very start and end of the text: Oniguruma's ^ and $ match at line breaks, \A and \z do not
# exist in JavaScript; a look-around on "any character" reads the same in both.
TEXT_START, TEXT_END = r"(?<![\s\S])", r"(?![\s\S])"

Piece = sentencepiece_model_pb2.ModelProto.SentencePiece


def tokenizer_from_sentencepiece(
    spm_file: Path,
    vocab: Mapping[str, int],
    special_tokens: Collection[str] = MARIAN_SPECIAL_TOKENS,
    unk_token: str = "<unk>",
) -> Tokenizer:
    """The tokenizer that encodes like ``MarianTokenizer`` with ``spm_file`` as its current spm and decodes like
    its ``decode(ids, skip_special_tokens=True)``, with ``vocab``'s ids.

    ``vocab`` maps each piece to its id (vocab.json, ids 0..n-1); ``special_tokens`` are entries of it that
    match whole in raw text and that ``decode`` drops, ``unk_token`` among them. A piece of the spm that
    ``vocab`` lacks is left out of the model, where MarianTokenizer would emit <unk> for it: tokenizers can
    give one id to one piece only.
    """
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(Path(spm_file).read_bytes())
    check_supported(proto, spm_file)
    check_vocab(vocab, special_tokens, unk_token)

    scores = {p.piece: p.score for p in proto.pieces if p.type == Piece.NORMAL}
    by_id = sorted(vocab.items(), key=lambda item: item[1])
    tokenizer = Tokenizer(
        models.Unigram(
            [entry(piece, scores, special_tokens) for piece, _ in by_id], unk_id=vocab[unk_token], byte_fallback=False
        )
    )
    spec = proto.normalizer_spec
    tokenizer.normalizer = normalizers.Sequence(spm_normalizers(spec))
    # split=False: SentencePiece runs one lattice over the whole text, so may the model. "always": MarianTokenizer
    # encodes the text between special tokens piece by piece, each with SentencePiece's dummy prefix.
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement=METASPACE, prepend_scheme="always" if spec.add_dummy_prefix else "never", split=False
    )
    tokenizer.decoder = decoders.Sequence(
        [
            decoders.Strip(content=UNREACHABLE_MARK, left=1, right=0),
            decoders.Replace(METASPACE, " "),
            decoders.Fuse(),
            # MarianTokenizer strips the decoded text, which also drops the dummy prefix's space
            decoders.Replace(Regex(rf"{TEXT_START}\s+|\s+{TEXT_END}"), ""),
        ]
    )
    tokenizer.add_special_tokens([AddedToken(token, normalized=False, special=True) for token in special_tokens])
    return tokenizer


def check_supported(proto: sentencepiece_model_pb2.ModelProto, spm_file: Path) -> None:
    trainer = proto.trainer_spec
    if trainer.model_type != trainer.UNIGRAM:
        kind = trainer.ModelType.Name(trainer.model_type)
        raise ValueError(f"{spm_file} is a SentencePiece {kind} model; only Unigram ones (as Marian's) convert")
    if trainer.byte_fallback:
        raise ValueError(f"{spm_file} uses byte fallback, which Marian's vocab.json cannot number; not supported")
    if any(p.type == Piece.USER_DEFINED for p in proto.pieces):
        raise ValueError(f"{spm_file} has user-defined pieces, which Marian's spm files do not; not supported")


def check_vocab(vocab: Mapping[str, int], special_tokens: Collection[str], unk_token: str) -> None:
    if sorted(vocab.values()) != list(range(len(vocab))):
        raise ValueError("vocab.json's ids must be 0..n-1, each once: the model's embedding rows are numbered so")
    missing = [token for token in (*special_tokens, unk_token) if token not in vocab]
    if missing:
        raise ValueError(f"the special tokens {missing} are not in vocab.json")
    if unk_token not in special_tokens:
        raise ValueError(f"the unknown token {unk_token} must be one of the special tokens {list(special_tokens)}")


def entry(piece: str, scores: Mapping[str, float], special_tokens: Collection[str]) -> tuple[str, float]:
    """One row of the Unigram model: a piece of this spm with its score, or one it never produces, unreachable."""
    if piece in scores:
        return piece, scores[piece]
    if piece in special_tokens:
        return piece, UNREACHABLE_SCORE
    return UNREACHABLE_MARK + piece, UNREACHABLE_SCORE


def spm_normalizers(spec: sentencepiece_model_pb2.NormalizerSpec) -> list[normalizers.Normalizer]:
    """SentencePiece's normalizer spec, in its order (as transformers' ``SpmConverter``)."""
    steps: list[normalizers.Normalizer] = []
    if spec.precompiled_charsmap:
        steps.append(normalizers.Precompiled(spec.precompiled_charsmap))
    if spec.remove_extra_whitespaces:
        # Spaces only: SentencePiece leaves other white space (what the charsmap keeps of it) alone
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

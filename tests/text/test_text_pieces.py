"""Sentence and line handling of the serve path: nothing lost, nothing truncated, limits explicit."""

from __future__ import annotations

import pytest

from aiayn.text.sentences import (
    MAX_CHARS,
    MAX_FILE_CHARS,
    InputTooLong,
    check_length,
    is_spaced,
    layout,
    reassemble,
    split_lines,
    split_long,
    split_sentences,
    starts_sentence,
)


def test_sentences_are_split_and_lines_kept() -> None:
    text = "A dog runs. Two cats sleep!\n\nIs it raining? Yes.\n"
    shape = layout(text, "en")
    assert shape.sentences == ["A dog runs.", "Two cats sleep!", "Is it raining?", "Yes."]
    assert (
        reassemble(shape, [s.upper() for s in shape.sentences]) == "A DOG RUNS. TWO CATS SLEEP!\n\nIS IT RAINING? YES."
    )


def pieces_of(line: str, sentences: list[str]) -> bool:
    """``sentences`` are ``line`` in order with only white space between them and around them."""
    rest = line
    for sentence in sentences:
        gap, found, rest = rest.partition(sentence)
        if not found or gap.strip():
            return False
    return not rest.strip()


@pytest.mark.parametrize(
    ("language", "line", "sentences"),
    [
        ("en", "The price is 3.5 euros and it is fine.", ["The price is 3.5 euros and it is fine."]),
        ("en", 'He said "Go."  Then he left. ', ['He said "Go."', "Then he left."]),
        ("en", "Mr. Smith and Dr. Weber talk. Gut.", ["Mr. Smith and Dr. Weber talk.", "Gut."]),
        ("de", "Herr Dr. Weber sagt z.B. Bello. Gut.", ["Herr Dr. Weber sagt z.B. Bello.", "Gut."]),
        ("en", "Wait... what? No.", ["Wait... what?", "No."]),
        ("en", "Hello. Привет! 2 dogs run. 狗 runs.", ["Hello.", "Привет!", "2 dogs run.", "狗 runs."]),
        # Real two-sentence captions stay two.
        ("de", "Zwei Männer treten auf. Beide spielen Gitarre.", ["Zwei Männer treten auf.", "Beide spielen Gitarre."]),
        ("fr", "Un jeune bébé  dort. Il porte un pyjama.", ["Un jeune bébé  dort.", "Il porte un pyjama."]),
    ],
)
def test_sentences_by_the_language_keep_every_character(language: str, line: str, sentences: list[str]) -> None:
    assert split_sentences(line, language) == sentences
    assert pieces_of(line, sentences)


@pytest.mark.parametrize(
    ("language", "caption"),
    [
        # Names and abbreviations our old regex cut, each piece then translated on its own.
        ("en", "A group of U.S. Navy jets fly in formation."),
        ("en", "Several men are walking and standing in John A. Noble facility."),
        ("en", "J. R. R. Tolkien wrote books."),
        ("en", "A man is walking past a large sign that says E.S.E. Electronics."),
        ("de", "Ein Mann zeigt ein Buch in der U.S. Armee Yongsan Bücherei."),
        ("de", "Mehrere Männer gehen und stehen in einer John A. Noble Einrichtung."),
        ("fr", 'Un homme passe devant un grand panneau où est écrit "E.S.E. Electronics".'),
        ("cs", "Lidé se účastní J. P. Morgan Corporate Challenge."),
        # sentencex cuts these; the next piece does not start like a sentence, or no space comes before it.
        ("en", "A boy with a t-shirt on that says FROG! stands leafing through the pages of a book."),
        ("fr", "Un plongeur S.C.U.B.A. nage dans une eau bleue profonde."),
        ("fr", "Oh, ma tête, espèce de trou du c..., regarde ce que tu fais la prochaine fois."),
        ("cs", "Muž ukazuje knihu v knihovně U.S Army Yongsan."),
    ],
)
def test_a_caption_of_one_sentence_stays_whole(language: str, caption: str) -> None:
    assert split_sentences(caption, language) == [caption]
    assert split_sentences(f"{caption} Two dogs run.", language) == [caption, "Two dogs run."]


def test_a_language_sentencex_does_not_know_gets_its_generic_rules() -> None:
    assert split_sentences("A dog runs. Two cats sleep! no cut", "xx") == ["A dog runs.", "Two cats sleep! no cut"]
    assert split_sentences("A group of U.S. Navy jets fly.", "xx") == ["A group of U.S. Navy jets fly."]


def test_the_language_decides_an_abbreviation() -> None:
    line = "Äpfel, Birnen usw. Dann Kirschen."
    assert split_sentences(line, "de") == [line]
    assert split_sentences(line, "en") == ["Äpfel, Birnen usw.", "Dann Kirschen."]


def test_empty_and_blank_text_give_no_sentences() -> None:
    assert layout("", "en").sentences == [] and layout("   \n  ", "en").sentences == []
    assert reassemble(layout("\n", "en"), []) == ""


def test_long_sentences_are_split_at_words_not_truncated() -> None:
    sentence = " ".join(f"w{i}" for i in range(450))
    pieces = split_long(sentence, lambda s: len(s.split()), limit=100)
    assert " ".join(pieces) == sentence
    assert all(len(p.split()) <= 100 for p in pieces)


def test_a_single_overlong_word_is_refused_with_a_message() -> None:
    with pytest.raises(InputTooLong, match="single word of 50 tokens is over the limit of 10"):
        split_long("x" * 50, len, limit=10)


def test_request_and_file_limits_are_stated() -> None:
    check_length("a" * MAX_CHARS)
    with pytest.raises(InputTooLong, match=f"{MAX_CHARS + 1} characters; at most {MAX_CHARS}"):
        check_length("a" * (MAX_CHARS + 1))
    with pytest.raises(InputTooLong, match=f"the file has .* at most {MAX_FILE_CHARS}"):
        check_length("a" * (MAX_FILE_CHARS + 1), MAX_FILE_CHARS, "the file")


@pytest.mark.parametrize("inside", ["\f", "\v", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"])
def test_only_newline_and_carriage_return_break_lines(inside: str) -> None:
    assert split_lines(f"A dog runs.{inside}A cat sleeps.\r\nTwo birds.\rEnd.\n") == [
        "A dog runs. A cat sleeps.",
        "Two birds.",
        "End.",
    ]
    shape = layout(f"A dog runs.{inside}A cat sleeps.", "en")
    assert shape.sentences == ["A dog runs.", "A cat sleeps."] and len(shape.lines) == 1
    assert split_lines("") == [] and split_lines("\n") == [""]


def test_a_limit_message_says_the_limit_and_offers_an_upload_only_below_the_files() -> None:
    with pytest.raises(InputTooLong) as request:
        check_length("a" * (MAX_CHARS + 1))
    assert str(request.value) == (
        f"the text has {MAX_CHARS + 1} characters; at most {MAX_CHARS} are translated per request here — split it, "
        f"upload it as a .txt file (up to {MAX_FILE_CHARS} characters), or translate a file of any size with "
        "`aiayn translate --input FILE`"
    )
    with pytest.raises(InputTooLong) as upload:
        check_length("a" * (MAX_FILE_CHARS + 1), MAX_FILE_CHARS, "the file")
    assert "split it, or translate a file of any size" in str(upload.value)


def test_long_sentences_are_halved_at_their_middle_word_and_a_sentence_at_the_limit_stays() -> None:
    words = len
    assert split_long("a b c d", lambda s: words(s.split()), limit=4) == ["a b c d"]
    assert split_long("a b c d", lambda s: words(s.split()), limit=3) == ["a b", "c d"]
    assert split_long("ab cd", lambda s: words(s.split()) * 10, limit=10) == ["ab", "cd"]  # two words are enough
    with pytest.raises(InputTooLong, match=f": {'x' * 40}…; add spaces or remove it$"):
        split_long("x" * 50, len, limit=10)


def test_a_sentence_starts_after_its_opening_quotes_and_a_cut_needs_white_space() -> None:
    assert starts_sentence('"A dog') and starts_sentence("«(Zwei") and not starts_sentence('"a dog')
    assert is_spaced("runs.", " A") and is_spaced("runs. ", "A") and not is_spaced("U.S", "Army")
    shape = layout(["A dog runs. A cat sleeps.", "", "Two birds."], "en")  # lines given as lines
    assert shape.sentences == ["A dog runs.", "A cat sleeps.", "Two birds."] and shape.lines == [[0, 1], [], [2]]

"""What a request of the page, its API or the JSON route may ask, checked once for all three: the served
directions by their API value, and a request's text, direction and beam size, and its work: its sentences once
split, at most ``Limits.max_sentences`` (``work_of``). No Gradio: the page turns a ``BadRequest`` into its own
message, the JSON route into a 4xx. Torch-free."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiayn.core.folder import ModelFolder
from aiayn.search.translator import beam_size_of
from aiayn.serve.limits import DEFAULT_LIMITS, Limits
from aiayn.serve.metrics import ModelServed
from aiayn.serve.service import LoadedModel, TimedOut, TranslationService
from aiayn.text.sentences import MAX_CHARS, check_length, layout

LOG = logging.getLogger(__name__)


class BadRequest(ValueError):
    """A request that cannot be answered; its message says what was wrong and is shown as it is."""


def refusal_of(err: Exception) -> str:
    """What a request that raised is told: a bad input's own message (a ``ValueError``: a ``BadRequest``, a text
    too long, a line the model cannot take), else one line that names the failure, its traceback in the server's
    log for whoever runs it."""
    if isinstance(err, ValueError | TimedOut):
        return str(err)
    LOG.error("a request failed", exc_info=err)
    return f"the server failed on this request ({type(err).__name__}); try again, or another text"


@dataclass(frozen=True)
class Direction:
    """A served model as the page and the API name it."""

    value: str  # the API's: its pair, ``en-es``; ``en-es:FOLDER`` where several served models share the pair
    label: str  # the page's: ``en → es``, and ``(FOLDER)`` where several share the pair
    name: str  # what the service loaded it by: a bundled name or a folder
    pair: tuple[str, str]
    model: LoadedModel


@dataclass(frozen=True)
class Request:
    """A checked request, as the service takes it: ``(text, model, beam_size)``."""

    text: str
    model: str  # the name the service loaded it by
    beam_size: int | None  # None: the folder's own


def pair_value(folder: ModelFolder) -> str:
    """The API's direction value of a folder's pair, ``en-es`` (``directions`` adds the folder's name where two
    served folders share a pair)."""
    config = folder.config
    return f"{config.src_lang}-{config.tgt_lang}"


def directions(models: dict[str, LoadedModel]) -> dict[str, Direction]:
    """The served models by their API value, from each folder's own languages (config.json), never its path."""
    pairs = Counter((m.config.src_lang, m.config.tgt_lang) for m in models.values())
    found: dict[str, Direction] = {}
    for name, model in models.items():
        src, tgt = pair = model.config.src_lang, model.config.tgt_lang
        value, label = pair_value(model.folder), f"{src} → {tgt}"
        if pairs[pair] > 1:
            folder = model.folder.path.name
            value, label = f"{value}:{folder}", f"{label} ({folder})"
        if value in found:
            raise ValueError(f"{found[value].name} and {name} are both {label}: serve one, or rename a folder")
        found[value] = Direction(value, label, name, pair, model)
    return found


def models_served(service: TranslationService) -> list[ModelServed]:
    """The info metric's labels for each model ``service`` has loaded (``metrics.serving``), each by its folder's
    name, never its path."""
    variant = service.options.variant
    return [
        ModelServed(d.model.folder.path.name, d.value, d.model.engine.name, d.model.provider, variant)
        for d in directions(dict(service.models)).values()
    ]


def direction_of(served: dict[str, Direction], value: Any) -> Direction:
    if not isinstance(value, str) or value not in served:
        raise BadRequest(f"{value} is not in the list of choices: {', '.join(served)}")
    return served[value]


def beam_of(value: Any) -> int | None:
    """The beam size as a request sent it (``search.translator.beam_size_of``), or None (not sent): the folder's."""
    try:
        return None if value is None else beam_size_of(value)
    except ValueError as err:
        raise BadRequest(str(err)) from None


def work_of(texts: Sequence[str], language: str) -> int:
    """What searching ``texts`` costs: their sentences as ``text.sentences.layout`` splits them in ``language``,
    a text without any counting one (it is still answered)."""
    return sum(max(1, len(layout(text, language).sentences)) for text in texts)


def check_work(texts: Sequence[str], direction: Direction, limit: int, what: str = "the text") -> None:
    """At most ``limit`` sentences in ``texts`` once split (``work_of``), else a ``BadRequest`` that says so."""
    work = work_of(texts, direction.model.config.src_lang)
    if work > limit:
        raise BadRequest(
            f"{what} has {work} sentences; at most {limit} are translated per request here — split it, or "
            "translate a file of any size with `aiayn translate --input FILE`"
        )


def checked(
    served: dict[str, Direction], text: Any, direction: Any, beam_size: Any, limits: Limits = DEFAULT_LIMITS
) -> Request:
    """A request of the page or its API: no text is empty text, at most ``MAX_CHARS`` characters and
    ``limits.max_sentences`` sentences; no beam size is the folder's."""
    chosen, beam = direction_of(served, direction), beam_of(beam_size)
    text = "" if text is None else str(text)
    try:
        check_length(text, MAX_CHARS)
    except ValueError as err:
        raise BadRequest(str(err)) from None
    check_work([text], chosen, limits.max_sentences)
    return Request(text, chosen.name, beam)


def read_upload(path: Path) -> str:
    """An uploaded file's text: UTF-8, with or without a byte order mark."""
    try:
        return path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise BadRequest(
            f"the file is not UTF-8 text (byte {err.start} cannot be read); save it as UTF-8 and upload it again"
        ) from None

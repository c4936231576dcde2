"""LibreTranslate's API beside ``POST /v1/translate``, for the apps and libraries that already speak it
(libretranslatepy, deep-translator's ``LibreTranslator``, chat and wiki plugins that take "a LibreTranslate URL").
Torch-free.

- ``POST /translate``: ``q`` (a string, or a list of them), ``source`` (a served source's code, or ``auto``),
  ``target``, ``format`` (``text``, or ``html``: the text between the tags translated, the markup kept), sent as
  JSON, a form or query parameters; ``{"translatedText": ...}``, a list for a list, with ``detectedLanguage``
  where the source was ``auto``.
- ``GET /languages``: each served source's ``code``, ``name`` and ``targets``.
- ``POST /detect``: ``q``'s language among the served sources, best first, ``[{"language", "confidence"}]``.

They read within the JSON route's limits, count their sentences among its waiting ones, are refused by the same
reasons with the same statuses and ``{"error": "..."}``, and report to the same metrics (``api.py``). ``api_key``
is read by ``api_keys.py``'s gate, where ``--api-keys`` is given. ``alternatives``: up to that many other
translations of each text, the beam's n-best after its first (so at most the folder's beam size less one; none
under a greedy folder), for ``format`` ``text``. Not offered: file translation (``/translate_file``), suggestions,
LibreTranslate's front-end settings: a 404.
"""

from __future__ import annotations

import functools
import html
import re
import threading
from html.parser import HTMLParser
from typing import Any
from urllib.parse import parse_qsl

from fastapi import Request
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from py3langid.langid import MODEL_FILE, LanguageIdentifier
from starlette.concurrency import run_in_threadpool
from starlette.routing import BaseRoute

from aiayn.search.translator import MAX_BEAM
from aiayn.serve.api import (
    API_KEY_SCHEMA,
    MEDIA_TYPE,
    Waiting,
    answered,
    bad_field,
    bounded_body,
    check_api_key,
    check_texts,
    json_of,
    json_route,
    media_type_of,
    refusals_described,
    searched_within,
)
from aiayn.serve.limits import DEFAULT_LIMITS, Limits, Reason, Refused
from aiayn.serve.requests import BadRequest, Direction, check_work, directions
from aiayn.serve.service import TranslationService

FORM = "application/x-www-form-urlencoded"
FORMATS = ("text", "html")
AUTO = "auto"
# The most alternatives a request may ask for: the largest integer every JSON reader holds exactly (JavaScript's
# Number.MAX_SAFE_INTEGER; /openapi.json states its bounds as floats). The beam gives at most MAX_BEAM - 1 of them.
MAX_ALTERNATIVES = 2**53 - 1
ALTERNATIVES_TEXT = re.compile(r"[0-9]{0,15}")  # a form sends the number as text ("" for none)
ALTERNATIVES = {
    "anyOf": [
        {"type": "integer", "minimum": 0, "maximum": MAX_ALTERNATIVES},
        {"type": "string", "pattern": f"^{ALTERNATIVES_TEXT.pattern}$"},
        {"type": "null"},
    ],
    "description": "how many other translations a text asks for (null: none); the beam gives at most its size less one",
}
FIELDS = ("q", "source", "target", "format", "alternatives", "api_key")
DETECT_FIELDS = ("q", "api_key")
# LibreTranslate names each language; the served folders give only codes. The names of ISO 639-1's most translated
# languages, and a code outside them is its own name.
NAMES = {
    "ar": "Arabic", "cs": "Czech", "da": "Danish", "de": "German", "el": "Greek", "en": "English", "es": "Spanish",
    "fi": "Finnish", "fr": "French", "hi": "Hindi", "hu": "Hungarian", "it": "Italian", "ja": "Japanese",
    "ko": "Korean", "nl": "Dutch", "pl": "Polish", "pt": "Portuguese", "ro": "Romanian", "ru": "Russian",
    "sv": "Swedish", "tr": "Turkish", "uk": "Ukrainian", "zh": "Chinese",
}  # fmt: skip
UNSCRIPTED = ("script", "style")  # elements whose content is code, not text: kept as it is


def by_pair(served: dict[str, Direction]) -> dict[tuple[str, str], Direction]:
    """The served directions by (source, target); of several folders of one pair, the first."""
    pairs: dict[tuple[str, str], Direction] = {}
    for direction in served.values():
        pairs.setdefault(direction.pair, direction)
    return pairs


def sources_by_target(served: dict[str, Direction]) -> dict[str, list[str]]:
    """Each served target with the sources served to it."""
    sources: dict[str, list[str]] = {}
    for source, target in by_pair(served):
        sources.setdefault(target, []).append(source)
    return sources


def languages(served: dict[str, Direction]) -> list[dict[str, Any]]:
    """``GET /languages``' answer: each served source with the targets it is served to."""
    targets: dict[str, list[str]] = {}
    for source, target in by_pair(served):
        targets.setdefault(source, []).append(target)
    return [{"code": code, "name": NAMES.get(code, code), "targets": to} for code, to in targets.items()]


@functools.cache
def identifier() -> Any:
    """py3langid's identifier over all its languages, loaded once (about a second) when first asked."""
    return LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)


IDENTIFIER_LOCK = threading.Lock()  # loaded once, whichever thread asks first


def ranked(text: str, candidates: list[str]) -> list[tuple[str, float]]:
    """``candidates`` by how likely ``text`` is in each, best first, with its share of their probability in
    percent (LibreTranslate's confidence); a Refused where the identifier knows none of them."""
    with IDENTIFIER_LOCK:
        found = identifier()
    known = [code for code in candidates if code in found.labels]
    if not known:
        codes = ", ".join(candidates)
        raise bad_field(f"the language of {codes} cannot be detected here; send source as one of {codes}")
    scores = {code: score for code, score in found.rank(text) if code in known}
    total = sum(scores.values()) or 1.0
    order = sorted(known, key=lambda code: -scores[code])  # the candidates' order where the text has no feature
    return [(code, round(100 * scores[code] / total, 1)) for code in order]


def detected(language: tuple[str, float]) -> dict[str, Any]:
    return {"language": language[0], "confidence": language[1]}


class Markup(HTMLParser):
    """An HTML fragment cut into its markup, kept as written, and its text, unescaped, to translate."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[tuple[bool, str]] = []  # (is text, the markup or the text)
        self.inside: list[str] = []

    def keep(self, markup: str) -> None:
        self.parts.append((False, markup))

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.keep(self.get_starttag_text() or "")
        self.inside.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.keep(self.get_starttag_text() or "")

    def handle_endtag(self, tag: str) -> None:
        self.keep(f"</{tag}>")
        if tag in self.inside:
            del self.inside[len(self.inside) - 1 - self.inside[::-1].index(tag) :]

    def handle_data(self, data: str) -> None:
        code = bool(self.inside) and self.inside[-1] in UNSCRIPTED  # passed raw by the parser: kept raw
        self.parts.append((bool(data.strip()) and not code, data))

    def handle_comment(self, data: str) -> None:
        self.keep(f"<!--{data}-->")

    def handle_decl(self, decl: str) -> None:
        self.keep(f"<!{decl}>")

    def handle_pi(self, data: str) -> None:
        self.keep(f"<?{data}>")


def html_parts(fragment: str) -> list[tuple[bool, str]]:
    parser = Markup()
    parser.feed(fragment)
    parser.close()
    return parser.parts


def rejoined(parts: list[tuple[bool, str]], translations: list[str]) -> str:
    """The fragment again, its texts replaced by their translations (escaped), the white space around each kept."""
    given = iter(translations)
    out = []
    for is_text, value in parts:
        if not is_text:
            out.append(value)
            continue
        lead, trail = value[: len(value) - len(value.lstrip())], value[len(value.rstrip()) :]
        out.append(lead + html.escape(next(given), quote=False) + trail)
    return "".join(out)


async def fields_read(request: Request, limit: int) -> dict[str, Any]:
    """The request's fields: its query parameters, and a JSON object's or a form's (which win where both name one);
    a body of another media type refused, naming the ones read."""
    media_type = media_type_of(request)
    body = await bounded_body(request, limit)
    fields: dict[str, Any] = form_fields(request.url.query.encode("latin-1"))
    if not body.strip():
        return fields
    if media_type == MEDIA_TYPE:
        found = json_of(body, DEFAULT_LIMITS.max_number_digits)
        if not isinstance(found, dict):
            raise Refused(Reason.BAD_JSON, 'the body must be a JSON object: {"q": ..., "source": ..., ...}')
        return fields | found
    if media_type == FORM:
        return fields | form_fields(body)
    sent = f"Content-Type {media_type}" if media_type else "no Content-Type"
    raise Refused(Reason.MEDIA_TYPE, f"the body must be sent as Content-Type: {MEDIA_TYPE} or {FORM}, not {sent}")


def form_fields(encoded: bytes) -> dict[str, Any]:
    """A form's or a query's fields; a field sent more than once (``q=a&q=b``), the list of its values."""
    try:
        pairs = parse_qsl(encoded.decode("utf-8"), keep_blank_values=True, errors="strict")
    except (UnicodeDecodeError, ValueError):
        raise Refused(Reason.BAD_JSON, "the form is not UTF-8 text") from None
    fields: dict[str, Any] = {}
    for name, value in pairs:
        if name in fields:
            earlier = fields[name]
            fields[name] = [*(earlier if isinstance(earlier, list) else [earlier]), value]
        else:
            fields[name] = value
    return fields


def texts_of(fields: dict[str, Any], limits: Limits) -> tuple[list[str], bool]:
    """(``q``'s texts, whether ``q`` was a list), checked within the route's limits."""
    q = fields.get("q")
    if q is None or q == []:
        raise bad_field("Invalid request: missing q parameter")
    texts = q if isinstance(q, list) else [q]
    if not all(isinstance(text, str) for text in texts):
        raise bad_field("q must be a string or a list of strings")
    for index, text in enumerate(texts):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise bad_field(f"q[{index}] holds a lone surrogate, which is not text") from None
    check_texts(texts, limits, "q")
    return texts, isinstance(q, list)


def check_known(fields: dict[str, Any], names: tuple[str, ...]) -> None:
    """Every field one of ``names``, else a refusal naming the others; a key, a string."""
    unknown = sorted(set(fields) - set(names))
    if unknown:
        raise bad_field(f"unknown field(s) {', '.join(unknown)}; the fields are {', '.join(names)}")
    check_api_key(fields)


def alternatives_of(value: Any) -> int:
    """``alternatives``: how many other translations a text asks for (none, null or ``""``: 0), as
    ``ALTERNATIVES`` describes it; never more than the widest beam holds."""
    if value is None:
        return 0
    if isinstance(value, str) and ALTERNATIVES_TEXT.fullmatch(value):  # a form's or a query's
        return min(int(value or 0), MAX_BEAM)
    whole = isinstance(value, int | float) and not isinstance(value, bool) and float(value).is_integer()
    if whole and 0 <= value <= MAX_ALTERNATIVES:  # JSON's 2.0 or 1e3 a whole number too, as to JSON Schema
        return min(int(value), MAX_BEAM)
    raise bad_field(f"Invalid request: alternatives parameter is not a number from 0 to {MAX_ALTERNATIVES}")


def code_field(fields: dict[str, Any], name: str) -> str:
    value = fields.get(name)
    if not isinstance(value, str) or not value:
        raise bad_field(f"Invalid request: missing {name} parameter")
    return value


class Asked:
    """A checked ``POST /translate``: its texts, format and the direction of each."""

    def __init__(self, fields: dict[str, Any], served: dict[str, Direction], limits: Limits) -> None:
        check_known(fields, FIELDS)
        self.texts, self.many = texts_of(fields, limits)
        source, target = code_field(fields, "source"), code_field(fields, "target")
        asked_format = fields.get("format")
        self.format = "text" if asked_format is None or asked_format == "" else asked_format
        if not isinstance(self.format, str) or self.format not in FORMATS:
            raise bad_field(f"{self.format} format is not supported; the formats are {', '.join(FORMATS)}")
        self.alternatives = alternatives_of(fields.get("alternatives"))
        if self.alternatives and self.format != "text":
            raise bad_field("alternatives go with format text: an HTML text's are not offered")
        served_to = sources_by_target(served)
        if target not in served_to:
            targets = ", ".join(sorted(served_to))
            raise bad_field(f"target {target} is not supported; the targets served are {targets}")
        sources = served_to[target]
        if source != AUTO and source not in sources:
            raise bad_field(
                f"source {source} is not supported to {target}; the sources served to it are {', '.join(sources)}"
                f" (or {AUTO})"
            )
        self.detected = [ranked(text, sources)[0] for text in self.texts] if source == AUTO else None
        chosen = [language for language, _ in self.detected] if self.detected else [source] * len(self.texts)
        pairs = by_pair(served)
        self.directions = [pairs[(language, target)] for language in chosen]
        try:  # the work, once split (``requests.work_of``): the JSON route's one bound, per direction searched
            for direction in {d.value: d for d in self.directions}.values():
                mine = [text for text, d in zip(self.texts, self.directions, strict=True) if d is direction]
                check_work(mine, direction, limits.max_sentences, "q")
        except BadRequest as err:
            raise bad_field(str(err)) from None

    def pieces(self) -> list[list[tuple[bool, str]]]:
        """Each text as its parts (``html_parts``; a plain text is one part, all text)."""
        return [html_parts(t) if self.format == "html" else [(True, t)] for t in self.texts]


async def searched_by_direction(
    service: TranslationService,
    waiting: Waiting,
    asked: Asked,
    texts: list[list[str]],
    deadline: float,
    limits: Limits,
) -> tuple[list[list[str]], list[list[str]]]:
    """Each text's pieces translated (``texts[i]``, their translations in the same places) and each text's
    alternatives: one search per direction, in the order the texts name them."""
    translations = [[""] * len(one) for one in texts]
    others: list[list[str]] = [[] for _ in texts]
    for value in dict.fromkeys(d.value for d in asked.directions):  # a search per direction, in order
        mine = [i for i, d in enumerate(asked.directions) if d.value == value]
        direction = asked.directions[mine[0]]
        sentences = [text for i in mine for text in texts[i]]
        if not sentences:
            continue
        beam = direction.model.search.beam_size
        n_best = min(asked.alternatives + 1, beam)  # the beam's n-best after its first: never more than it holds
        searched = await searched_within(service, waiting, (sentences, direction, beam), deadline, limits, "q", n_best)
        given = iter(searched["translations"])
        for i in mine:
            translations[i] = [next(given) for _ in texts[i]]
        if asked.alternatives:  # format text: one sentence a text
            for i, found in zip(mine, searched["alternatives"], strict=True):
                others[i] = found[: asked.alternatives]
    return translations, others


TEXTS = {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "minItems": 1}]}


def translate_body(served: dict[str, Direction]) -> dict[str, Any]:
    """``POST /translate``'s body, as LibreTranslate's own API documents it, with the served codes."""
    sources = sources_by_target(served)
    return {
        "type": "object",
        "required": ["q", "source", "target"],
        "additionalProperties": False,
        "anyOf": [{"properties": {"target": {"const": t}, "source": {"enum": [*s, AUTO]}}} for t, s in sources.items()],
        "properties": {
            "q": TEXTS,
            "source": {"type": "string", "description": f"a code served to the target, or {AUTO}"},
            "target": {"enum": list(sources), "description": "a served target's code"},
            "format": {"enum": [*FORMATS, "", None], "description": "default (or empty, or null): text"},
            "alternatives": ALTERNATIVES,
            "api_key": API_KEY_SCHEMA,
        },
    }


# The other doors' bodies and answers, as LibreTranslate's own API documents them, for ``/openapi.json``.
TRANSLATE_ANSWER: dict[str, Any] = {"type": "object", "required": ["translatedText"]}
DETECT_BODY: dict[str, Any] = {
    "type": "object",
    "required": ["q"],
    "additionalProperties": False,
    "properties": {"q": TEXTS, "api_key": API_KEY_SCHEMA},
}
DETECT_ANSWER: dict[str, Any] = {"type": "array", "items": {"type": "object", "required": ["language", "confidence"]}}
LANGUAGES_ANSWER: dict[str, Any] = {
    "type": "array",
    "items": {"type": "object", "required": ["code", "name", "targets"]},
}


def json_doors(service: TranslationService, limits: Limits = DEFAULT_LIMITS) -> list[BaseRoute]:
    """The server's JSON doors over the models ``service`` has loaded: ``POST /v1/translate`` and LibreTranslate's,
    their sentences counted together (one ``Waiting``)."""
    waiting = Waiting(limits.max_waiting)

    async def translate(request: Request) -> JSONResponse:
        async def answer(fields: dict[str, Any], deadline: float) -> dict[str, Any]:
            # In a thread: the language identifier (loaded once, about a second) never holds the event loop.
            asked = await run_in_threadpool(Asked, fields, directions(dict(service.models)), limits)
            pieces = asked.pieces()
            texts = [[value for is_text, value in parts if is_text] for parts in pieces]
            check_texts([text for one in texts for text in one] or [""], limits, "q")
            request.state.sentences, request.state.text = sum(map(len, texts)), asked.texts  # the access log's
            translations, others = await searched_by_direction(service, waiting, asked, texts, deadline, limits)
            out = [rejoined(parts, done) for parts, done in zip(pieces, translations, strict=True)]
            reply: dict[str, Any] = {"translatedText": out if asked.many else out[0]}
            if asked.alternatives:
                reply["alternatives"] = others if asked.many else others[0]
            if asked.detected is not None:
                found_languages = [detected(language) for language in asked.detected]
                reply["detectedLanguage"] = found_languages if asked.many else found_languages[0]
            return reply

        return await answered(request, limits, fields_read, answer)

    async def languages_served(request: Request) -> JSONResponse:
        return JSONResponse(languages(directions(dict(service.models))))

    async def detect(request: Request) -> JSONResponse:
        async def answer(fields: dict[str, Any], deadline: float) -> list[dict[str, Any]]:
            check_known(fields, DETECT_FIELDS)
            texts, _ = texts_of(fields, limits)
            sources = list(dict.fromkeys(s for s, _ in by_pair(directions(dict(service.models)))))
            return [detected(language) for language in await run_in_threadpool(ranked, " ".join(texts), sources)]

        return await answered(request, limits, fields_read, answer)

    return [
        json_route(service, limits, waiting),
        APIRoute(
            "/translate",
            translate,
            methods=["POST"],
            name="libretranslate",
            **described(limits, TRANSLATE_ANSWER, translate_body(directions(dict(service.models)))),
        ),
        APIRoute(
            "/languages",
            languages_served,
            methods=["GET", "POST"],
            name="languages",
            **described(limits, LANGUAGES_ANSWER),
        ),
        APIRoute("/detect", detect, methods=["POST"], name="detect", **described(limits, DETECT_ANSWER, DETECT_BODY)),
    ]


def described(limits: Limits, answer: dict[str, Any], body: dict[str, Any] | None = None) -> dict[str, Any]:
    """A LibreTranslate door's OpenAPI description: its ``answer``, its ``body`` (JSON or a form; None: none) and
    each refusal by its status as the JSON route's (``api.refusals_described``)."""
    ok = {"description": "answered", "content": {MEDIA_TYPE: {"schema": answer}}}
    if body is None:
        return {"responses": {200: ok}}
    content = {MEDIA_TYPE: {"schema": body}, FORM: {"schema": body}}
    return {
        "responses": {200: ok, **refusals_described(limits, f"{MEDIA_TYPE} or {FORM}")},
        "openapi_extra": {"requestBody": {"required": True, "content": content}},
    }

"""`aiayn serve --api-keys FILE`: the JSON doors (``POST /v1/translate``, LibreTranslate's ``POST /translate`` and
``POST /detect``) answer only a request that sends one of the file's keys, each within its own limits; with
``--api-keys-page`` the page and its API too. One ASGI middleware (``KeyGate``) for every door, not a check per route.
Torch-free.

The file holds one key a line, then its optional limits as ``NAME=VALUE``; blank lines and ``#`` comments are
skipped::

    # key                              limits (none: only the server's own)
    3f1c0e8a9b7d4e2f                   per_minute=60 chars=2000
    team-b-0a9c                        per_minute=600

A key is read from the ``Authorization: Bearer KEY`` or ``X-API-Key`` header, the ``api_key`` query parameter, or
the ``api_key`` field of a JSON or form body (where LibreTranslate's clients send it); a browser that opened the page
as ``/?api_key=KEY`` keeps it in a cookie for the page's own requests. No valid key: 403. A key over its requests
per minute: 429 with ``Retry-After``. A request over its key's characters (its ``q`` or ``sentences`` together):
413. Keys are never written anywhere: the access log names a route by its template (no query string), and the
metrics count refusals by reason.
"""

from __future__ import annotations

import hashlib
import math
import re
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from aiayn.serve import metrics
from aiayn.serve.api import PATH as JSON_PATH
from aiayn.serve.api import bounded_body, media_type_of, refusal
from aiayn.serve.health import PATHS as HEALTH_PATHS
from aiayn.serve.limits import DEFAULT_LIMITS, Reason, Refused

KEY_PATTERN = re.compile(r"[A-Za-z0-9._~+/=-]+")  # what a header, a query and a cookie carry as they are
OPEN_PATHS = frozenset({*HEALTH_PATHS, metrics.PATH, "/languages"})  # never guarded: the probes' and the catalogue
JSON_DOORS = frozenset({JSON_PATH, "/translate", "/detect"})  # what a key guards by default
FIELD, COOKIE = "api_key", "aiayn_api_key"
LIMIT_NAMES = {"per_minute": "requests per minute", "chars": "characters per request"}
WINDOW_S = 60.0
TEXT_FIELDS = ("q", "sentences")  # the characters a key's ``chars`` counts: LibreTranslate's and our route's
NO_KEY = "a valid API key is required: send it as api_key (or the Authorization: Bearer header)"


@dataclass
class Key:
    """One key's limits (None: none of its own) and its requests of the last minute."""

    per_minute: int | None = None
    chars: int | None = None
    recent: deque[float] = field(default_factory=deque)

    def admit(self, now: float) -> None:
        """A request counted, or a ``Refused`` saying when the oldest of the minute's leaves the window."""
        while self.recent and self.recent[0] <= now - WINDOW_S:
            self.recent.popleft()
        if self.per_minute is not None and len(self.recent) >= self.per_minute:
            wait_s = max(1, math.ceil(self.recent[0] + WINDOW_S - now))
            raise Refused(
                Reason.KEY_RATE, f"this key sends at most {self.per_minute} requests a minute; try again", wait_s
            )
        self.recent.append(now)


def digest(key: str) -> str:
    """What the table holds of a key: its SHA-256, so that a lookup's time tells nothing of the keys."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def read_keys(path: Path) -> dict[str, Key]:
    """The keys of ``path`` (the module's format), or a ``ValueError`` naming the line; its message never holds a
    key."""
    keys: dict[str, Key] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        words = line.partition("#")[0].split()
        if not words:
            continue
        limits: dict[str, int] = {}
        for word in words[1:]:
            name, _, value = word.partition("=")
            if name not in LIMIT_NAMES or not value.isdigit() or int(value) < 1:
                named = ", ".join(f"{n}=N ({what})" for n, what in LIMIT_NAMES.items())
                raise ValueError(f"{path}, line {number}: a key's limits are {named}, N a whole number from 1")
            limits[name] = int(value)
        if not KEY_PATTERN.fullmatch(words[0]):
            raise ValueError(f"{path}, line {number}: a key holds only letters, digits and ._~+/=-")
        if digest(words[0]) in keys:
            raise ValueError(f"{path}, line {number}: this key is already on an earlier line")
        keys[digest(words[0])] = Key(limits.get("per_minute"), limits.get("chars"))
    if not keys:
        raise ValueError(f"{path} holds no key: one key a line, then its optional limits")
    return keys


def sent_key(scope: Scope, body_fields: dict[str, Any]) -> str | None:
    """The key a request sends, wherever it may: its headers, query string, cookie, or body."""
    headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]}
    bearer = headers.get("authorization", "")
    if bearer[:7].lower() == "bearer ":
        return bearer[7:].strip()
    if "x-api-key" in headers:
        return headers["x-api-key"]
    query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
    if FIELD in query:
        return query[FIELD]
    cookie = SimpleCookie(headers.get("cookie", ""))
    if COOKIE in cookie:
        return cookie[COOKIE].value
    value = body_fields.get(FIELD)
    return value if isinstance(value, str) else None


def fields_of(body: bytes, media_type: str) -> dict[str, Any]:
    """A JSON object's or a form's fields (nothing where the body is neither: the route refuses it itself)."""
    import json

    try:
        if media_type == "application/json":
            found = json.loads(body)
            return found if isinstance(found, dict) else {}
        if media_type == "application/x-www-form-urlencoded":
            return dict(parse_qsl(body.decode("utf-8"), keep_blank_values=True))
    except (ValueError, RecursionError):  # not JSON, not UTF-8, nested too deep
        pass
    return {}


def characters(fields: Iterable[Any]) -> int:
    """The characters of the texts a request asks for: each of its text fields, a string or a list of them."""
    texts = [text for value in fields for text in (value if isinstance(value, list) else [value])]
    return sum(len(text) for text in texts if isinstance(text, str))


class KeyGate:
    """The middleware: a guarded door's request passes only with a valid key within its limits."""

    def __init__(self, app: ASGIApp, keys: dict[str, Key], page: bool, body_limit: int) -> None:
        self.app, self.keys, self.page, self.body_limit = app, keys, page, body_limit

    def guards(self, scope: Scope) -> bool:
        if scope["path"] in JSON_DOORS:
            return bool(scope["method"] == "POST")  # another method is the router's 405, with a key or without
        return self.page and scope["path"] not in OPEN_PATHS

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.guards(scope):
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        media_type = media_type_of(request)
        body, read = b"", False  # read: the body is the gate's now, even empty, and is handed on from here
        try:
            if scope["path"] in JSON_DOORS and media_type in ("application/json", "application/x-www-form-urlencoded"):
                body, read = await bounded_body(request, self.body_limit), True
            fields = fields_of(body, media_type)
            fields = {**dict(parse_qsl(scope.get("query_string", b"").decode("latin-1"))), **fields}
            key = self.checked(sent_key(scope, fields), characters(fields.get(name) for name in TEXT_FIELDS))
        except Refused as refused:  # labelled by its door, or as the page's (a path of the page may hold ids)
            scope.setdefault("state", {})["route"] = scope["path"] if scope["path"] in JSON_DOORS else "(page, no key)"
            await refusal(refused, DEFAULT_LIMITS, unread=not read)(scope, receive, send)
            return
        await self.app(scope, replayed(body, receive) if read else receive, with_cookie(send, key, scope, self.page))

    def checked(self, key: str | None, chars: int) -> str:
        """``key``, once it is seen valid and within its limits."""
        found = self.keys.get(digest(key)) if key else None
        if found is None or key is None:
            raise Refused(Reason.NO_KEY, NO_KEY)
        if found.chars is not None and chars > found.chars:
            raise Refused(
                Reason.KEY_CHARS, f"this request has {chars} characters; this key's are at most {found.chars}"
            )
        found.admit(time.monotonic())
        return key


def replayed(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands the body read by the gate to the route again, then the connection's own."""
    sent = False

    async def again() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return again


def with_cookie(send: Send, key: str, scope: Scope, page: bool) -> Send:
    """The page opened as ``/?api_key=KEY`` (under ``--api-keys-page``): the key set as a cookie on its answer, so
    that the browser's own requests of the page send it."""
    query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
    if not (page and scope["path"] == "/" and query.get(FIELD) == key):
        return send

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            cookie = f"{COOKIE}={key}; Path=/; HttpOnly; SameSite=Strict".encode("latin-1")
            message = {**message, "headers": [*message.get("headers", []), (b"set-cookie", cookie)]}
        await send(message)

    return sending

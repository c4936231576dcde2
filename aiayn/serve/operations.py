"""What operators get around every request of the page server, as one ASGI middleware: the drain's gate (new
requests refused with 503 and ``Retry-After`` while draining), the work in flight counted for the drain and the
``waiting`` gauge, the request metrics and the access log. Torch-free.

A page request is two HTTP requests in Gradio's protocol: one joins Gradio's queue (``POST /gradio_api/queue/join``,
keyed by its session, or ``POST /gradio_api/call/NAME``, keyed by the event id it answers), then a stream sends
the answer (``GET /gradio_api/queue/data?session_hash=KEY`` or ``GET /gradio_api/call/NAME/KEY``), closing once
every event of its key is complete. A page request is accepted when its join is answered 200, and answered when
its key's stream closes; while draining, streams still open, so that accepted requests get their answers.
"""

from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect
from starlette.routing import BaseRoute

from aiayn.serve import metrics
from aiayn.serve.access_log import AccessLine, AccessLog
from aiayn.serve.doors import JOIN_GATE, ASGIApp, Doors, Message, Receive, Scope, Send, joined_fields
from aiayn.serve.downloads import BoundedUploads
from aiayn.serve.drain import GRACE_S, Lifecycle, PageWork
from aiayn.serve.health import PATHS as HEALTH_PATHS
from aiayn.serve.health import health_routes, unavailable
from aiayn.serve.limits import DEFAULT_LIMITS, MAX_BODY_BYTES, Limits, Reason, Refused
from aiayn.serve.openapi import PATH as OPENAPI_PATH
from aiayn.serve.openapi import openapi_route

GRADIO_API = "/gradio_api"
JSON_DOORS = "/v1/"  # the JSON route's (api.PATH) and those added beside it: the work a drain waits for
# The status a request whose client left before its answer is counted and logged with (nginx's, where a client
# closes its request): never a traceback in the server's log.
CLIENT_GONE = 499
OPS_PATHS = (*HEALTH_PATHS, metrics.PATH, OPENAPI_PATH)
DRAINING = "draining: this server is stopping; ask again (another replica, or this one restarted)"


@dataclass(frozen=True)
class OperatorOptions:
    """`aiayn serve`'s settings for the people who run it."""

    metrics: bool = True  # GET /metrics, and the counting behind it
    access_log: str | None = "text"  # access_log.FORMATS, or None: no access log
    log_text: bool = False  # the user's text in the access log
    grace_s: float = GRACE_S
    api_keys: Path | None = None  # --api-keys FILE: the keys the JSON doors ask for (``api_keys.py``)
    api_keys_page: bool = False  # --api-keys-page: the page's too


DEFAULT_OPERATOR = OperatorOptions()


class Kind(Enum):
    OPS = "ops"  # health, metrics and the OpenAPI document: never refused, never counted as work
    JOIN = "join"  # a page request joining Gradio's queue, keyed by its session
    CALL = "call"  # a page request joining Gradio's queue by its API name, keyed by the event id answered
    STREAM = "stream"  # a page request's answer
    HEARTBEAT = "heartbeat"  # a page tab's keep-alive stream, open as long as the tab: never work a drain waits for
    FILE = "file"  # a file the page serves (a translated file's download): answered while draining, not waited for
    JSON = "json"  # the JSON doors: work a drain waits for
    WORK = "work"  # anything else (an upload, its progress, the page's assets): refused while draining, not waited for


def operated(
    lifecycle: Lifecycle, options: OperatorOptions, limits: Limits = DEFAULT_LIMITS
) -> tuple[list[BaseRoute], list[Middleware]]:
    """The OpenAPI document, the health routes and ``/metrics`` (unless turned off), and the middleware, for the
    page server's app: this module's outside (a request refused by the doors is counted and logged too), the
    doors' (``doors.py``) inside it, and the API keys' gate inside those where ``options`` has keys."""
    routes: list[BaseRoute] = [openapi_route(), *health_routes(lifecycle)]
    if options.metrics:
        routes.append(metrics.metrics_route(metrics.enable()))
    log = AccessLog(options.access_log, options.log_text) if options.access_log is not None else None
    middleware = [
        Middleware(Operations, lifecycle=lifecycle, log=log),
        Middleware(Doors, limits=limits),
        Middleware(BoundedUploads),
    ]
    if options.api_keys is not None:  # inside the operations: its refusals are counted and logged as any answer
        from aiayn.serve.api_keys import KeyGate, read_keys  # the JSON route's reading, the service behind it

        keys = read_keys(options.api_keys)  # a bad file refused before any model loads
        middleware.append(Middleware(KeyGate, keys=keys, page=options.api_keys_page, body_limit=MAX_BODY_BYTES))
    return routes, middleware


def kind_of(method: str, path: str) -> Kind:
    if path in OPS_PATHS:
        return Kind.OPS
    if path.startswith(JSON_DOORS):
        return Kind.JSON
    if not path.startswith(GRADIO_API):
        return Kind.WORK
    parts = path[len(GRADIO_API) :].strip("/").split("/")
    if parts[0] == "heartbeat":
        return Kind.HEARTBEAT
    if parts[0].startswith("file=") and method in ("GET", "HEAD"):
        return Kind.FILE
    if parts == ["queue", "join"] and method == "POST":
        return Kind.JOIN
    if parts[0] == "call" and method == "POST":
        return Kind.CALL
    if (parts == ["queue", "data"] or (parts[0] == "call" and len(parts) >= 3)) and method == "GET":
        return Kind.STREAM
    return Kind.WORK


def page_text(request: dict[str, Any]) -> list[str] | None:
    """The text a page request sent (the first of its inputs), for ``--log-text``."""
    data = request.get("data")
    return [data[0]] if isinstance(data, list) and data and isinstance(data[0], str) else None


def event_id(answer: bytes) -> Any:
    """The event id of an API join's answer (``{"event_id": ...}``), or None."""
    try:
        found = json.loads(answer)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    return found.get("event_id") if isinstance(found, dict) else None


def route_of(scope: Scope) -> str:
    """The template of the route that answered (never the raw path: no ids in the labels); the operators' own by
    their path (Starlette routes, which leave no route in the scope here); a request refused before any route, by
    the label its refuser left in the scope's state (``api_keys.KeyGate``)."""
    if scope["path"] in OPS_PATHS:
        return str(scope["path"])
    return str(getattr(scope.get("route"), "path", None) or (scope.get("state") or {}).get("route") or "unmatched")


class Operations:
    """The middleware, over the page server's whole ASGI app."""

    def __init__(self, app: ASGIApp, lifecycle: Lifecycle, log: AccessLog | None) -> None:
        self.app, self.lifecycle, self.log = app, lifecycle, log
        self.pages = PageWork(lifecycle, functools.partial(metrics.waiting, "page"))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        method, path = scope["method"], scope["path"]
        kind = kind_of(method, path)
        key = self.stream_key(scope) if kind is Kind.STREAM else None
        scope.setdefault("state", {})  # where the JSON route says its sentences (the same dict the app's Request sees)
        if self.lifecycle.draining:
            if kind is Kind.JOIN:  # decided once the doors have read its session and event (``joined_fields``)
                scope["state"][JOIN_GATE] = self.join_admitted_while_draining
            elif kind not in (Kind.OPS, Kind.STREAM, Kind.FILE):
                metrics.refused(Reason.DRAINING)
                await unavailable(DRAINING)(scope, receive, send)
                self.ended(method, "(draining)", 503, started, scope)
                return
        status, answer = 500, bytearray()

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                session = joined_fields(scope).get("session_hash")  # parsed by the doors before Gradio read it
                if kind is Kind.JOIN and status == 200 and isinstance(session, str):
                    self.pages.joined(session)
            elif message["type"] == "http.response.body" and kind is Kind.CALL and status == 200:
                answer.extend(message.get("body", b""))
                if not message.get("more_body"):
                    called = event_id(bytes(answer))
                    if isinstance(called, str):
                        self.pages.joined(called)  # before the client can read the id and ask for its stream
            await send(message)

        counted = kind in (Kind.JSON, Kind.JOIN, Kind.CALL)  # never a client's pace: an upload, a download
        if counted:
            self.lifecycle.accepted()
        if kind is Kind.STREAM:
            self.pages.stream_opened(key)
        try:
            await self.app(scope, receive, sending)
        except ClientDisconnect:  # the client left while its body was read: counted and logged, no traceback
            status = CLIENT_GONE
        finally:
            if counted:
                self.lifecycle.answered()
            if kind is Kind.STREAM:
                self.pages.stream_closed(key)
        if status == 503 and kind in (Kind.JOIN, Kind.CALL):
            metrics.refused(Reason.PAGE_QUEUE_FULL)  # Gradio's queue is full (page.MAX_WAITING)
        self.ended(method, route_of(scope), status, started, scope, page_text(joined_fields(scope)))

    @staticmethod
    def stream_key(scope: Scope) -> str | None:
        if scope["path"].rstrip("/").endswith("/queue/data"):
            hashes = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("session_hash")
            return hashes[0] if hashes else None
        return str(scope["path"].rstrip("/").rsplit("/", 1)[-1])

    def join_admitted_while_draining(self, request: dict[str, Any]) -> None:
        """While draining, only an accepted request's follow-up events join (``drain.PageWork``); other joins are
        refused as every other new request is (health and metrics, the answers' streams and the files they name
        still answer)."""
        if not self.pages.admits_while_draining(request.get("session_hash"), request.get("fn_index")):
            raise Refused(Reason.DRAINING, DRAINING)

    def ended(
        self, method: str, route: str, status: int, started: float, scope: Scope, text: list[str] | None = None
    ) -> None:
        seconds = time.perf_counter() - started
        metrics.answered(route, status, seconds)
        if self.log is not None:
            state = scope.get("state") or {}
            said = state.get("text", text)
            self.log.write(AccessLine(method, route, status, 1000 * seconds, state.get("sentences"), said))

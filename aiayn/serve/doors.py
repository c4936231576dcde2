"""The doors of the page server, decided at one layer: which routes it answers, how much of a body each may send,
and which page requests reach Gradio at all. Torch-free.

The server answers its own routes (those whose handler is this package's: the JSON doors, health, metrics, the
OpenAPI document, ``openapi.py``) and, of Gradio's, only what the page and ``gradio_client`` ask for
(``GRADIO_DOORS``); every other route is 404, whatever Gradio mounts. Gradio's direct routes (``/gradio_api/run``,
``/gradio_api/api``), which skip the page's queue, are among the closed (and ``/gradio_api/call/v2``, queued but
used by no client): a page request waits in Gradio's one bounded queue (``page.MAX_WAITING``), joined by
``/gradio_api/queue/join`` or ``/gradio_api/call/{api_name}``.

Every body, on every door, is counted as it streams: a ``Content-Length`` over the door's limit is refused before a
byte is read, a body sent in chunks where it passes the limit (413, one line of JSON, the connection closed). A
page request's join is read whole within that limit and parsed once: not JSON, or nested deeper than Python parses,
is a 400 here, before Gradio parses it again (where it would be a 500).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any
from urllib.parse import parse_qs

from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Match, Mount, compile_path

from aiayn.serve import metrics
from aiayn.serve.limits import RETRY_AFTER_S, UPLOAD_FRAMING_BYTES, Limits, Reason, Refused, json_of, too_large

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

LOG = logging.getLogger(__name__)
PACKAGE = "aiayn."
UPLOAD_PATH = "/gradio_api/upload"
# Where the operations middleware, while draining, leaves the check a join's parsed request must pass (only an
# accepted request's follow-up events join then): raises a ``Refused``.
JOIN_GATE = "join_gate"
JOIN_PATHS = ("/gradio_api/queue/join", "/gradio_api/call/")  # a page request's join: by the page, by its API name
# Gradio's routes the page, gradio_client and Gradio's launch request, as Gradio declares them (gradio/routes.py):
# the page, its config and files, the queue's join and streams, the heartbeat, uploads and the files it serves.
GRADIO_DOORS = frozenset(
    {
        "/",
        "/config",
        "/config/",
        "/theme.css",
        "/favicon.ico",
        "/manifest.json",
        "/robots.txt",
        "/pwa_icon",
        "/pwa_icon/{size}",
        "/assets/{path:path}",
        "/static/{path:path}",
        "/svelte/{path:path}",
        "/gradio_api/startup-events",  # asked once by Gradio's own launch, to run the page's startup events
        "/gradio_api/info",  # the page's API description, read by gradio_client and the page's API view
        "/gradio_api/info/",
        "/gradio_api/heartbeat/{session_hash}",
        "/gradio_api/queue/join",
        "/gradio_api/queue/data",
        "/gradio_api/call/{api_name}",  # the API's join: queued as the page's is
        "/gradio_api/call/{api_name}/",
        "/gradio_api/call/{api_name}/{event_id}",  # and its stream
        "/gradio_api/upload",
        "/gradio_api/upload_progress",
        "/gradio_api/file={path_or_url:path}",
        "/gradio_api/mcp/{path:path}",  # Gradio's MCP server, mounted only where it is turned on
    }
)
GRADIO_PATTERNS = [compile_path(door)[0] for door in sorted(GRADIO_DOORS)]
# Gradio's second API join, which the API's stream template above would admit: no page or client asks for it.
CLOSED_PREFIX = "/gradio_api/call/v2/"
OURS, GRADIOS = "ours", "gradio's"
GRADIO_FAILED = "the page cannot read this request"
NOT_FOUND = "not found: this server answers its page, its JSON routes, /openapi.json, /healthz, /readyz and /metrics"


def ours(route: BaseRoute) -> bool:
    """A route whose handler is this package's."""
    return getattr(getattr(route, "endpoint", None), "__module__", "").startswith(PACKAGE)


def own_routes(routes: Iterable[BaseRoute]) -> list[BaseRoute]:
    """An app's routes of ours (always among its own, never in a router it includes), those of an app mounted at
    the root included (the page mounted in a FastAPI app of its own, Ray Serve's)."""
    found: list[BaseRoute] = []
    for route in routes:
        if isinstance(route, Mount) and route.path == "":
            found += own_routes(route.routes)
        elif ours(route):
            found.append(route)
    return found


def other_page(scope: Scope) -> bool:
    """A request for a page of the app other than its one (``/?page=NAME``): Gradio fails on one it has not."""
    if scope["path"] != "/":
        return False
    pages = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("page", [])
    return any(pages)


def gradio_door(path: str) -> bool:
    """One of Gradio's routes that the page asks for (by its path: Gradio answers a wrong method itself)."""
    return not path.startswith(CLOSED_PREFIX) and any(pattern.match(path) for pattern in GRADIO_PATTERNS)


def body_limit(path: str, limits: Limits) -> int:
    return limits.max_upload_bytes + UPLOAD_FRAMING_BYTES if path == UPLOAD_PATH else limits.max_body_bytes


class Doors:
    """The middleware: every request to a door not served is 404; every body within its door's limit; a page
    request's join parsed once (for Gradio, and the operations middleware's key and text: ``scope["state"]``)."""

    def __init__(self, app: ASGIApp, limits: Limits) -> None:
        self.app, self.limits = app, limits
        self.ours: dict[int, list[BaseRoute]] = {}  # by the id of the app whose routes they are

    def door(self, scope: Scope) -> str | None:
        """Whose door a request knocks at: ``OURS``, ``GRADIOS``, or None (not served)."""
        app = scope.get("app")
        found = self.ours.get(id(app))
        if found is None:
            found = self.ours[id(app)] = own_routes(getattr(app, "routes", []))
        if any(route.matches(scope)[0] is not Match.NONE for route in found):
            return OURS
        if gradio_door(scope["path"]) and not other_page(scope):
            return GRADIOS
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        door = self.door(scope)
        if door is None:
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
            else:
                await JSONResponse({"error": NOT_FOUND}, status_code=404)(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await self.app(scope, receive, send)
            return
        limit = body_limit(scope["path"], self.limits)
        counted = Counted(receive, send, limit, declared_length(scope))
        try:
            if counted.declared is not None and counted.declared > limit:
                raise too_large(limit, counted.declared)
            if scope["method"] == "POST" and scope["path"].startswith(JOIN_PATHS):
                receive = await self.joined(scope, counted)
            else:
                receive = counted.receive
            await self.app(scope, receive, counted.send)
        except Refused as refused:
            await counted.refuse(refused, scope)
        except ClientDisconnect:
            if not counted.refused:
                raise  # the client's own: the operations middleware counts it
        except Exception as err:
            if door is OURS:
                raise  # a failure of ours: its traceback in the log, to be fixed
            # Gradio failing on what a visitor sent (an API name it has not, a header it cannot read): a 400 in
            # one line, and one line in the log, not a 500 and its traceback.
            LOG.warning(
                "%s %s: Gradio failed on this request: %s: %s", scope["method"], scope["path"], type(err).__name__, err
            )
            await counted.refuse(Refused(Reason.BAD_FIELD, GRADIO_FAILED), scope)

    async def joined(self, scope: Scope, counted: Counted) -> Receive:
        """A join's body, read within its limit and parsed once; a ``receive`` that hands it to Gradio."""
        chunks = []
        while True:
            message = await counted.receive()
            if message["type"] == "http.disconnect":
                raise ClientDisconnect()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        request = json_of(body, self.limits.max_number_digits)
        if not isinstance(request, dict):
            raise Refused(Reason.BAD_FIELD, 'a page request must be a JSON object: {"data": [...], ...}')
        state = scope.setdefault("state", {})
        state["page_request"] = request
        if JOIN_GATE in state:
            state[JOIN_GATE](request)
        replay: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]

        async def replayed() -> Message:
            return replay.pop() if replay else await counted.receive()

        return replayed


def declared_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None


class Counted:
    """A request's ``receive`` counting its body against ``limit``, and its ``send``: once the body passes the limit
    the client is answered 413 and the app is told the client left (it sends nothing more)."""

    def __init__(self, receive: Receive, send: Send, limit: int, declared: int | None) -> None:
        self.inner_receive, self.inner_send, self.limit, self.declared = receive, send, limit, declared
        self.size, self.started, self.refused = 0, False, False

    async def receive(self) -> Message:
        if self.refused:
            return {"type": "http.disconnect"}
        message = await self.inner_receive()
        if message["type"] == "http.request":
            self.size += len(message.get("body", b""))
            if self.size > self.limit:
                raise too_large(self.limit)
        return message

    async def send(self, message: Message) -> None:
        if self.refused:
            return
        if message["type"] == "http.response.start":
            self.started = True
        await self.inner_send(message)

    async def refuse(self, refused: Refused, scope: Scope) -> None:
        """The one answer of a refused request (none where the app has started its own), and the refusal counted."""
        metrics.refused(refused.reason)
        if not self.started:
            headers = {"Connection": "close"}
            if refused.status == 503:
                headers["Retry-After"] = str(refused.retry_after_s or RETRY_AFTER_S)
            answer = JSONResponse({"error": str(refused)}, status_code=refused.status, headers=headers)
            await answer(scope, self.inner_receive, self.inner_send)
        self.refused = True


def joined_fields(scope: Scope) -> dict[str, Any]:
    """A page request's join as ``Doors`` parsed it, or nothing."""
    found = (scope.get("state") or {}).get("page_request")
    return found if isinstance(found, dict) else {}

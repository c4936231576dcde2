"""``GET /openapi.json``: the OpenAPI document of the server's own doors (in place of Gradio's, which describes
Gradio's routes, most of them closed here: ``doors.py``). Its JSON routes (FastAPI routes of this package, such as
``POST /v1/translate``, ``api.py``) describe themselves, bodies, limits and error shapes, through FastAPI; the
operators' routes (Starlette's, for the port's answers while the models load) are described here. A JSON door
added later appears in it as it is mounted. Torch-free.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route

from aiayn.serve import metrics
from aiayn.serve.doors import own_routes
from aiayn.serve.health import LIVE_PATH, READY_PATH

PATH = "/openapi.json"
TITLE = "aiayn"
VERSION = "1"


def json_answer(description: str, schema: dict[str, Any], headers: dict[str, Any] | None = None) -> dict[str, Any]:
    """An OpenAPI response of a JSON body."""
    answer: dict[str, Any] = {"description": description, "content": {"application/json": {"schema": schema}}}
    return answer | ({"headers": headers} if headers else {})


RETRY_AFTER = {"Retry-After": {"description": "seconds to wait before asking again", "schema": {"type": "string"}}}
STATUS_SCHEMA = {"type": "object", "required": ["status"], "properties": {"status": {"type": "string"}}}
NOT_READY_SCHEMA = {
    "type": "object",
    "required": ["status", "reason"],
    "properties": {"status": {"type": "string"}, "reason": {"type": "string"}},
}
# The operators' doors, by path (Starlette routes: FastAPI does not describe them).
OPERATOR_DOORS: dict[str, dict[str, Any]] = {
    LIVE_PATH: {
        "summary": "Liveness: 200 while the process serves",
        "responses": {"200": json_answer("the process serves", STATUS_SCHEMA)},
    },
    READY_PATH: {
        "summary": "Readiness: 200 once every model is loaded; 503 while loading or draining",
        "responses": {
            "200": json_answer("ready", STATUS_SCHEMA),
            "503": json_answer("loading or draining", NOT_READY_SCHEMA, RETRY_AFTER),
        },
    },
    metrics.PATH: {
        "summary": "Prometheus metrics, in Prometheus' text format",
        "responses": {"200": {"description": "the metrics", "content": {"text/plain": {"schema": {"type": "string"}}}}},
    },
    PATH: {
        "summary": "This document",
        "responses": {"200": json_answer("the OpenAPI document of this server's own doors", {"type": "object"})},
    },
}


def document_of(routes: list[BaseRoute]) -> dict[str, Any]:
    """The OpenAPI document of ``routes``' own doors: the JSON routes as FastAPI describes them, the operators'."""
    from fastapi.openapi.utils import get_openapi
    from fastapi.routing import APIRoute

    served = own_routes(routes)
    document = get_openapi(
        title=TITLE,
        version=VERSION,
        description="The Transformer of Attention Is All You Need: its JSON routes, health and metrics. "
        "The page's own routes (Gradio's protocol) are not described here.",
        routes=[route for route in served if isinstance(route, APIRoute)],
    )
    paths = document.setdefault("paths", {})
    for route in served:
        if isinstance(route, Route) and not isinstance(route, APIRoute) and route.path in OPERATOR_DOORS:
            paths[route.path] = {"get": {"operationId": route.name, **OPERATOR_DOORS[route.path]}}
    return document


def openapi_route() -> Route:
    """``GET /openapi.json``, the document made once from the app it is served by (its routes fixed by then)."""
    made: dict[int, dict[str, Any]] = {}

    async def openapi(request: Request) -> JSONResponse:
        app = request.scope.get("app")
        found = made.get(id(app))
        if found is None:
            found = made[id(app)] = document_of(list(getattr(app, "routes", [])))
        return JSONResponse(found)

    return Route(PATH, openapi, methods=["GET"], name="openapi")

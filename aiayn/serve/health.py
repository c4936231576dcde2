"""Liveness and readiness: ``GET /healthz`` (200 while the process serves) and ``GET /readyz`` (200 once every
model is loaded and, on a GPU, self-checked; 503 while loading or draining, or with a search worker dead, with a
one-line JSON reason), for a
load balancer or Kubernetes' probes; the server that answers them while the models load; and the check Ray Serve
asks each replica. Torch-free.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from aiayn.serve.drain import RETRY_AFTER_S, Lifecycle

if TYPE_CHECKING:
    from aiayn.serve.service import TranslationService

LIVE_PATH, READY_PATH = "/healthz", "/readyz"
PATHS = (LIVE_PATH, READY_PATH)


def health_routes(lifecycle: Lifecycle) -> list[Route]:
    async def live(_: Request) -> JSONResponse:
        return JSONResponse({"status": "serving"})

    async def ready(_: Request) -> JSONResponse:
        reason = lifecycle.not_ready_because()
        if reason is None:
            return JSONResponse({"status": "ready"})
        headers = {"Retry-After": str(RETRY_AFTER_S)}
        return JSONResponse({"status": lifecycle.status, "reason": reason}, status_code=503, headers=headers)

    return [
        Route(LIVE_PATH, live, methods=["GET"], name="healthz"),
        Route(READY_PATH, ready, methods=["GET"], name="readyz"),
    ]


def unavailable(reason: str) -> JSONResponse:
    """503 with ``Retry-After`` and a one-line JSON error."""
    return JSONResponse({"error": reason}, status_code=503, headers={"Retry-After": str(RETRY_AFTER_S)})


class LoadingServer:
    """The port's answers while the models load, before the page's server takes it over: the health routes, and
    503 for everything else."""

    def __init__(self, lifecycle: Lifecycle, host: str, port: int) -> None:
        import uvicorn

        async def loading(_: Request) -> JSONResponse:
            return unavailable(lifecycle.not_ready_because() or "starting")

        app = Starlette(routes=health_routes(lifecycle))
        app.add_route("/{path:path}", loading, methods=["GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH"])
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)  # in a thread of its own, it leaves the signals to the main thread
        self.thread = threading.Thread(target=self.server.run, name="aiayn-loading-server", daemon=True)

    def __enter__(self) -> LoadingServer:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.server.should_exit = True
        self.thread.join()


def unhealthy_because(service: TranslationService) -> str | None:
    """Why ``service`` cannot translate (no model, a search worker gone), or None: it can."""
    if not service.models:
        return "no model loaded"
    for name, model in service.models.items():
        if any(not worker.is_alive() for worker in model.batcher.workers):
            return f"{name}: a search worker thread has died"
    return None


def check_health(service: TranslationService) -> None:
    """Ray Serve's replica check: raises where the replica cannot translate (``unhealthy_because``)."""
    reason = unhealthy_because(service)
    if reason is not None:
        raise RuntimeError(reason)

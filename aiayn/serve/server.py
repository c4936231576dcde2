"""The page server's one start, for `aiayn serve` and the Space's `app.py`: the page, the JSON route beside it, on
one port, with the process's memory bounded first. Torch-free."""

from __future__ import annotations

import functools
import os
import socket
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from aiayn.core.dependencies import untested_line
from aiayn.engines.options import DEFAULT_OPTIONS, EngineOptions
from aiayn.serve.limits import DEFAULT_LIMITS, Limits
from aiayn.serve.memory import bound_server_memory
from aiayn.serve.operations import DEFAULT_OPERATOR, OperatorOptions

if TYPE_CHECKING:  # imported by ``serve`` once the process's memory is bounded: ONNX Runtime starts a thread
    import gradio as gr
    from fastapi import FastAPI
    from starlette.middleware import Middleware
    from starlette.routing import BaseRoute

    from aiayn.serve.drain import Lifecycle
    from aiayn.serve.service import TranslationService

# Gradio keeps a copy of every component's config per visitor session (~40 KB here), by default for 10 000
# sessions (~400 MB); the oldest beyond this many are dropped. A dropped visitor's page still translates; only
# switching the heatmap's head asks to translate again.
SESSIONS_KEPT = 100
# Gradio's queue rebuilds a pandas summary of its last 10 000 events after every batch, for a monitoring page this
# server does not open, its cost growing with the traffic: through Gradio's environment variables it keeps 100,
# and never summarises them.
GRADIO_SETTINGS = {"GRADIO_ANALYTICS_MAX_EVENTS": "100", "GRADIO_ANALYTICS_CACHE_FREQUENCY": str(2**62)}


LOOPBACK, EVERY_INTERFACE = "127.0.0.1", "0.0.0.0"


def space_host(environ: Mapping[str, str] = os.environ) -> str:
    """Where ``app.py`` listens: every interface where Hugging Face Spaces runs it (its environment names the Space,
    ``SPACE_ID``, or says ``SYSTEM=spaces``, as Gradio reads it), else this machine alone; a laptop running a Space's
    folder is not a public server."""
    on_spaces = bool(environ.get("SPACE_ID")) or environ.get("SYSTEM") == "spaces"
    return EVERY_INTERFACE if on_spaces else LOOPBACK


def port_error(host: str, port: int) -> ValueError:
    return ValueError(
        f"cannot listen on {host}:{port}: the port is in use (or {host} is not an address of this machine); "
        "stop what listens there or choose another --port"
    )


def check_port(host: str, port: int) -> None:
    """Refuse a port that cannot be listened on before the models load (``launch`` only finds out after)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server will: only a listener blocks
        try:
            probe.bind((host, port))
        except OSError:
            raise port_error(host, port) from None


def apply_gradio_settings() -> None:
    """``GRADIO_SETTINGS`` into the environment, where not set already: read when the page's queue is made."""
    for name, value in GRADIO_SETTINGS.items():
        os.environ.setdefault(name, value)


def follow_up_events(app: gr.Blocks) -> frozenset[int]:
    """The page's events that follow another's end (``.success``, ``.failure``: the marks, the attention), by the
    id a join names them with: a drain admits those of the requests it accepted (``drain.PageWork``)."""
    return frozenset(fn_id for fn_id, fn in app.fns.items() if fn.trigger_after is not None)


def page_with_routes(
    service: TranslationService,
    models: list[str] | None,
    limits: Limits = DEFAULT_LIMITS,
    operator: OperatorOptions = DEFAULT_OPERATOR,
    lifecycle: Lifecycle | None = None,
    mcp: bool = False,
) -> FastAPI:
    """The page and the JSON doors as one ASGI app for a server of its own (Ray Serve's), with the settings
    ``launch`` gives Gradio's, and the operators' routes and middleware over ``lifecycle`` (its drain the
    server's to start), ready once built; ``mcp``: the page's events as MCP tools too (Gradio's MCP server,
    ``/gradio_api/mcp/``)."""
    import gradio as gr
    from fastapi import FastAPI

    from aiayn.serve import metrics
    from aiayn.serve.drain import Lifecycle
    from aiayn.serve.health import unhealthy_because
    from aiayn.serve.libretranslate import json_doors
    from aiayn.serve.operations import operated
    from aiayn.serve.page import build_app
    from aiayn.serve.requests import models_served

    lifecycle = lifecycle or Lifecycle()
    routes, middleware = operated(lifecycle, operator, limits)
    blocks = build_app(service, models, limits)
    blocks.state_session_capacity = SESSIONS_KEPT  # launch's state_session_capacity, which mount_gradio_app lacks
    lifecycle.follow_ups = follow_up_events(blocks)
    app = FastAPI(routes=[*json_doors(service, limits), *routes], middleware=middleware)
    lifecycle.ready(functools.partial(unhealthy_because, service))
    metrics.serving(models_served(service))
    return gr.mount_gradio_app(
        app, blocks, "/", max_file_size=limits.max_upload_bytes, mcp_server=mcp, run_history=False
    )


def check_mcp() -> None:
    """``--mcp`` needs Gradio's ``mcp`` extra: one line that says how to install it (Gradio itself only warns)."""
    import importlib.util

    if importlib.util.find_spec("mcp") is None:
        raise ValueError("--mcp needs Gradio's MCP extra: pip install 'gradio[mcp]'")


def launch(
    app: gr.Blocks,
    host: str = "127.0.0.1",
    port: int = 7860,
    share: bool = False,
    routes: Sequence[BaseRoute] = (),
    middleware: Sequence[Middleware] = (),
    limits: Limits = DEFAULT_LIMITS,
    mcp: bool = False,
) -> None:
    """Serve the page, and ``routes`` beside it (``libretranslate.json_doors``), through ``middleware``
    (``operations.operated``), and with ``mcp`` the page's events as MCP tools; returns once the server is up. A
    port in use is one clear error. No run history: a page for anonymous visitors keeps no saved runs, and
    connects no buckets."""
    try:
        app.launch(
            server_name=host,
            server_port=port,
            share=share,
            max_file_size=limits.max_upload_bytes,
            run_history=False,
            prevent_thread_lock=True,
            quiet=True,
            state_session_capacity=SESSIONS_KEPT,
            mcp_server=mcp,
            app_kwargs={"routes": list(routes), "middleware": list(middleware)},
        )
    except OSError:  # Gradio's "Cannot find empty port", whatever the cause
        raise port_error(host, port) from None


def serve(
    models: list[str] | None,
    host: str,
    port: int,
    share: bool = False,
    options: EngineOptions = DEFAULT_OPTIONS,
    split_clauses: bool = True,
    limits: Limits = DEFAULT_LIMITS,
    operator: OperatorOptions = DEFAULT_OPERATOR,
    mcp: bool = False,
) -> int:
    """The page and the JSON doors over ``models`` (default: the bundled ones) until SIGTERM or Ctrl-C, then
    drained (``drain.py``), each model with the engine ``options`` say (``TranslationService``), within ``limits``;
    one line on stderr says where; ``mcp``: the page's events MCP tools too (Gradio's MCP server). While the models
    load, the port answers the health routes (``/readyz``: 503) and 503 to the rest. Returns the requests cut by
    the stop (0: all answered)."""
    bound_server_memory()  # before ONNX Runtime's threads start
    from aiayn.serve import metrics
    from aiayn.serve.drain import Lifecycle, serve_until_stopped
    from aiayn.serve.health import LoadingServer, unhealthy_because
    from aiayn.serve.operations import operated

    apply_gradio_settings()
    warning = untested_line()  # the page leans on how Gradio batches, bounds its queue and keeps sessions
    if warning:
        print(warning, file=sys.stderr)
    check_port(host, port)
    if mcp:
        check_mcp()
    lifecycle = Lifecycle()
    routes, middleware = operated(lifecycle, operator, limits)
    with LoadingServer(lifecycle, host, port):  # answering before Gradio and ONNX Runtime are even imported
        from aiayn.serve.libretranslate import json_doors
        from aiayn.serve.page import build_app
        from aiayn.serve.requests import models_served
        from aiayn.serve.service import TranslationService

        service = TranslationService(options, split_clauses)
        app = build_app(service, models, limits)
    lifecycle.follow_ups = follow_up_events(app)
    launch(
        app, host, port, share, routes=[*json_doors(service, limits), *routes], middleware=middleware, limits=limits,
        mcp=mcp,
    )
    lifecycle.ready(functools.partial(unhealthy_because, service))
    metrics.serving(models_served(service))
    names = ", ".join(service.models)
    first = next(iter(service.models.values()))
    public = f" and {app.share_url}" if app.share_url else ""
    where = f"http://{host}:{port}{public}"
    engine = f"{first.engine.name} engine"
    print(
        f"serving {names} ({options.variant} weights) with ONNX Runtime on {first.provider} ({engine}) at {where}",
        file=sys.stderr,
    )
    return serve_until_stopped(lifecycle, operator.grace_s, functools.partial(app.close, verbose=False))

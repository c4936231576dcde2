"""`aiayn serve --ray`: the page and the JSON route as a Ray Serve application, the searches spread over replicas.

Two deployments. ``Translation``: N replicas of the serving engine, each on its own CPUs, the model folders loaded
once per replica, and the requests of the moment searched together by the replica's batcher, as in one process
(``batching.py``). ``Page``: one replica holding the Gradio page and ``POST /v1/translate`` (a visitor's event
stream must stay with the queue that holds its request), whose service hands every translation to ``Translation``
through a Ray Serve handle. A request whose replica died is asked once more, of another replica; Ray Serve replaces
the dead one. Ray's HTTP proxy, on every node, serves the page. Ray is optional (``pip install -e '.[ray]'``): only
this module imports it, and only when asked. Torch-free.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from aiayn.core.folder import named_or_bundled
from aiayn.engines.options import EngineOptions
from aiayn.serve.drain import POLL_S, Lifecycle, serve_until_stopped
from aiayn.serve.health import check_health
from aiayn.serve.limits import DEFAULT_LIMITS, Limits
from aiayn.serve.operations import DEFAULT_OPERATOR, OperatorOptions
from aiayn.serve.service import Result, TranslationService
from aiayn.text.sentences import MAX_FILE_CHARS, check_length

APP_NAME = "aiayn"
CONNECT_TIMEOUT_S = 5
INSTALL = "pip install -e '.[ray]' (or pip install 'ray[serve]')"
MAX_ONGOING = 256  # requests a translation replica takes at once: its batcher searches those of the moment together
PAGE_MAX_ONGOING = 4096  # HTTP requests the page's replica holds at once: a crowd's posts and event streams
# Ray Serve logs every request by default, a line in each process the request passes (py-spy: 2 % of the page's
# replica's time); errors are logged still.
QUIET = {"log_level": "WARNING", "enable_access_log": False}
CPUS_PER_REPLICA = 1  # the default: a replica's engine runs one lane, the cores are the replicas'


class RayMissing(ValueError):
    """Ray Serve is not installed: the one line that says how to install it."""

    def __init__(self) -> None:
        super().__init__(f"aiayn serve --ray needs Ray Serve, which is not installed: {INSTALL}")


@dataclass(frozen=True)
class Scaling:
    """How many translation replicas, in Ray Serve's own terms: a fixed count, or its autoscaling settings."""

    replicas: int = 1
    min_replicas: int | None = None  # with max_replicas: autoscaling between the two
    max_replicas: int | None = None
    target_ongoing_requests: float | None = None
    cpus_per_replica: float = CPUS_PER_REPLICA

    @property
    def autoscaling(self) -> bool:
        return self.max_replicas is not None

    def deployment_options(self) -> dict[str, Any]:
        """``serve.deployment(...).options(...)``'s keywords for the translation deployment."""
        options: dict[str, Any] = {
            "max_ongoing_requests": MAX_ONGOING,
            "ray_actor_options": {"num_cpus": self.cpus_per_replica},
        }
        if not self.autoscaling:
            return options | {"num_replicas": self.replicas}
        autoscaling: dict[str, Any] = {
            "min_replicas": self.replicas if self.min_replicas is None else self.min_replicas,
            "max_replicas": self.max_replicas,
        }
        if self.target_ongoing_requests is not None:
            autoscaling["target_ongoing_requests"] = self.target_ongoing_requests
        return options | {"autoscaling_config": autoscaling}

    def check(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"--replicas must be at least 1, got {self.replicas}")
        if self.max_replicas is not None:  # autoscaling
            low = self.replicas if self.min_replicas is None else self.min_replicas
            if not 0 <= low <= self.max_replicas:
                raise ValueError(f"--min-replicas {low} must be from 0 to --max-replicas {self.max_replicas}")
        if self.min_replicas is not None and not self.autoscaling:
            raise ValueError("--min-replicas needs --max-replicas (Ray Serve's autoscaling between the two)")
        if self.target_ongoing_requests is not None and not self.autoscaling:
            raise ValueError("--target-ongoing-requests needs --max-replicas (it steers Ray Serve's autoscaling)")


class TranslationReplica:
    """What one replica of the translation deployment runs: a ``TranslationService`` over the served models."""

    def __init__(self, models: Sequence[str], options: EngineOptions, split_clauses: bool) -> None:
        self.service = TranslationService(options, split_clauses)
        for name in models:
            self.service.model(name)
        # Each request waits for its search in a thread of its own, so that the batcher sees them all at once.
        self.waiting = ThreadPoolExecutor(MAX_ONGOING, thread_name_prefix="aiayn-request")

    def check_health(self) -> None:
        """Ray Serve's periodic check: a replica that raises here is replaced."""
        check_health(self.service)

    async def translate_many(
        self, requests: list[tuple[str, str, int | None]], timeout_s: float | None = None, n_best: int = 1
    ) -> list[Result]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.waiting, self.service.translate_many, requests, timeout_s, n_best)

    async def translate_file(self, text: str, model: str, beam_size: int | None, timeout_s: float | None = None) -> str:
        loop = asyncio.get_running_loop()
        translate = self.service.translate_file
        return await loop.run_in_executor(self.waiting, translate, text, model, beam_size, timeout_s)


def replica_lost() -> tuple[type[BaseException], ...]:
    """The errors of a call whose replica died or left before it answered."""
    from ray import exceptions

    return (exceptions.RayActorError, exceptions.ActorUnavailableError)


class RemoteTranslation(TranslationService):
    """The page's service: its models loaded here for what the page shows of them (directions, examples, the
    heatmap's forced pass), every translation asked of the translation deployment; a call whose replica died is
    asked again, once."""

    def __init__(self, handle: Any, options: EngineOptions, split_clauses: bool) -> None:
        super().__init__(options, split_clauses)
        self.handle = handle

    def asked(self, method: str, *args: Any) -> Any:
        try:
            return getattr(self.handle, method).remote(*args).result()
        except replica_lost():  # Ray's router drops the dead replica: the second call goes to another
            return getattr(self.handle, method).remote(*args).result()

    def translate_many(
        self, requests: Sequence[tuple[str, str, int | None]], timeout_s: float | None = None, n_best: int = 1
    ) -> list[Result]:
        """The replica's ``translate_many``, its time limit kept there (its ``TimedOut`` raised here as Ray raises a
        replica's error: an instance of it)."""
        for text, _, _ in requests:
            check_length(text)
        results: list[Result] = self.asked("translate_many", list(requests), timeout_s, n_best)
        return results

    def translate_file(
        self, text: str, model: str, beam_size: int | None = None, timeout_s: float | None = None
    ) -> str:
        check_length(text, MAX_FILE_CHARS, "the file")
        return str(self.asked("translate_file", text, model, beam_size, timeout_s))


class PageIngress:
    """The page's replica: the Gradio page and the JSON route, as ``aiayn serve`` serves them, over the translation
    deployment's handle. Ray Serve builds its ASGI app in the replica (``__serve_build_asgi_app__``)."""

    def __init__(
        self,
        translation: Any,
        models: list[str] | None,
        options: EngineOptions,
        split_clauses: bool,
        limits: Limits = DEFAULT_LIMITS,
        operator: OperatorOptions = DEFAULT_OPERATOR,
    ) -> None:
        from aiayn.serve.server import apply_gradio_settings

        apply_gradio_settings()
        self.service = RemoteTranslation(translation, options, split_clauses)
        self.models, self.limits, self.operator = models, limits, operator
        self.lifecycle = Lifecycle()

    def __serve_build_asgi_app__(self) -> Any:
        from aiayn.serve.server import page_with_routes

        return page_with_routes(self.service, self.models, self.limits, self.operator, self.lifecycle)

    def check_health(self) -> None:
        check_health(self.service)

    def drain(self) -> None:
        """The driver's SIGTERM: readiness 503, new requests refused with 503 and Retry-After (``operations.py``)."""
        self.lifecycle.drain()

    def open_work(self) -> int:
        """The work accepted and not yet answered, once what no client holds is let go (a tab closed between its
        join and its stream), as the page server's own drain sees it."""
        self.lifecycle.sweep()
        return self.lifecycle.open_work


class DrainedPage:
    """The page replica's drain as the driver's ``serve_until_stopped`` runs it, asked through its handle."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    @property
    def open_work(self) -> int:
        return int(self.handle.open_work.remote().result())

    def drain(self) -> None:
        self.handle.drain.remote().result()

    def wait_answered(self, seconds: float) -> int:
        deadline = time.monotonic() + seconds
        while (left := self.open_work) > 0 and time.monotonic() < deadline:
            time.sleep(POLL_S)
        return left


def reachable(address: str) -> None:
    """Refuse at once an ADDRESS where nothing listens (``ray.init`` would retry it for minutes)."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--ray {address}: give the head's HOST:PORT (ray start --head prints it), or auto")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as err:
        raise ValueError(
            f"no Ray cluster answers at {address} ({err.strerror or err}); start one there with `ray start --head`, "
            "or leave ADDRESS out to start one on this machine"
        ) from None


def connect(address: str | None) -> bool:
    """Ray started here (no ``address``: a cluster of this machine alone, which ends with this process) or joined at
    ``address`` (``auto``: the one running on this machine); whether it was started here."""
    import ray

    if address not in (None, "auto"):
        reachable(address)
    try:
        ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
    except ConnectionError as err:
        raise ValueError(
            f"no Ray cluster answers at {address} ({str(err).splitlines()[0]}); start one there with `ray start "
            "--head`, or leave ADDRESS out to start one on this machine"
        ) from None
    return address is None


@dataclass(frozen=True)
class Application:
    """What `aiayn serve --ray` serves: the models, their engine, the replicas, where Ray's proxy listens."""

    models: list[str] | None
    options: EngineOptions
    split_clauses: bool
    scaling: Scaling
    host: str
    port: int
    limits: Limits = DEFAULT_LIMITS
    operator: OperatorOptions = DEFAULT_OPERATOR


def deploy(app: Application) -> None:
    """``app`` on the connected cluster, Ray's HTTP proxy on its host and port on every node; returns once every
    replica is ready."""
    from ray import serve

    logging.getLogger("ray.serve").setLevel(logging.WARNING)  # this process's line says where; errors still show
    serve.start(http_options={"host": app.host, "port": app.port}, logging_config=QUIET)
    grace = app.operator.grace_s  # a replica stopped answers the requests it holds first, for at most this long
    translation = serve.deployment(
        name="Translation", graceful_shutdown_timeout_s=grace, **app.scaling.deployment_options()
    )(TranslationReplica)
    page = serve.deployment(
        name="Page",
        max_ongoing_requests=PAGE_MAX_ONGOING,
        graceful_shutdown_timeout_s=grace,
        ray_actor_options={"num_cpus": 0},  # the replicas' CPUs are the searches'
    )(serve.ingress()(PageIngress))
    models = named_or_bundled(app.models)  # named in the replicas too: each loads them before its first check
    replicas = translation.bind(models, app.options, app.split_clauses)
    ingress = page.bind(replicas, models, app.options, app.split_clauses, app.limits, app.operator)
    serve.run(ingress, name=APP_NAME, route_prefix="/")


def serve_on_ray(address: str | None, app: Application) -> int:
    """`aiayn serve --ray`: the application until Ctrl-C (or SIGTERM), then drained as the page server is
    (``drain.py``: the page's replica refuses new requests, answers those it accepted, for at most the grace
    period) and taken down (and Ray with it where it was started here); one line on stderr says where. Returns the
    requests cut by the stop (0: all answered)."""
    from aiayn.serve.server import check_port

    scaling = app.scaling
    scaling.check()
    try:
        import ray
        from ray import serve
    except ImportError:
        raise RayMissing() from None
    check_port(app.host, app.port)  # Ray's proxy would only say so in its own log
    address = address or os.environ.get("RAY_ADDRESS") or None  # as Ray's own commands read it
    started = connect(address)
    try:
        deploy(app)
        count = f"{scaling.min_replicas}–{scaling.max_replicas}" if scaling.autoscaling else str(scaling.replicas)
        where = "a Ray cluster of this machine" if started else f"the Ray cluster at {address}"
        print(
            f"serving on {where}: {count} translation replica(s) ({app.options.variant} weights), the page and "
            f"POST /v1/translate at http://{app.host}:{app.port} (Ray's HTTP proxy); Ctrl-C to stop",
            file=sys.stderr,
        )
        page = DrainedPage(serve.get_app_handle(APP_NAME))
        return serve_until_stopped(page, app.operator.grace_s, lambda: None)
    finally:
        serve.delete(APP_NAME)
        if started:
            ray.shutdown()

"""Prometheus metrics of a serving process, read at ``GET /metrics`` in Prometheus' text format
(``prometheus_client``, the format every scraper reads). Torch-free.

The serving code reports through this module's functions (``refused(Reason.QUEUE_FULL)``, ``translated(...)``, ...),
which go to the process's ``Metrics`` once ``enable`` made one, and nowhere before (``aiayn serve --no-metrics``,
``aiayn translate``): a caller never checks whether metrics are on. Names and units follow Prometheus' conventions:
counters end in ``_total``, times are in seconds. docs/serve.md ("Operating it") says what each one means.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

from aiayn.serve.details import Details

if TYPE_CHECKING:
    from starlette.routing import Route

PATH = "/metrics"
PREFIX = "aiayn"
# A request's seconds: from a health check's milliseconds to a crowd's wait in the page's queue (up to ~30 s).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60)
SEARCH_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # sentences per search: at most limits.SENTENCES_PER_SEARCH


@dataclass(frozen=True)
class ModelServed:
    """One served model as the info metric labels it."""

    model: str  # its folder's name (a bundled model's is its name): never the path it was given by
    direction: str  # the API's value, ``en-de``
    engine: str
    device: str  # ONNX Runtime's execution provider
    variant: str  # the weights: fp32, w8, ...


class Metrics:
    """The process's metrics in a registry of their own (a test makes a fresh one)."""

    def __init__(self) -> None:
        self.registry = registry = CollectorRegistry()
        ProcessCollector(registry=registry)  # CPU seconds, resident memory, open files
        PlatformCollector(registry=registry)
        self.requests = Counter(
            f"{PREFIX}_http_requests",
            "HTTP requests answered, by route and status",
            ["route", "status"],
            registry=registry,
        )
        self.latency = Histogram(
            f"{PREFIX}_http_request_duration_seconds",
            "Seconds from a request's arrival to the end of its answer (a page stream: to its last event)",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.sentences = Counter(
            f"{PREFIX}_translated_sentences", "Sentences translated, by direction", ["direction"], registry=registry
        )
        self.tokens = Counter(
            f"{PREFIX}_translated_target_tokens",
            "Target tokens of the translations (each sentence's </s> included), by direction",
            ["direction"],
            registry=registry,
        )
        self.waiting = Gauge(
            f"{PREFIX}_waiting",
            "Work accepted and not yet answered: page requests in Gradio's queue or running (route=page), "
            "sentences of JSON requests (route=json)",
            ["route"],
            registry=registry,
        )
        self.batch = Histogram(
            f"{PREFIX}_search_batch_sentences",
            "Sentences (or clauses) searched together in one search",
            buckets=BATCH_BUCKETS,
            registry=registry,
        )
        self.search = Histogram(
            f"{PREFIX}_search_duration_seconds", "Seconds of one search", buckets=SEARCH_BUCKETS, registry=registry
        )
        self.refusals = Counter(f"{PREFIX}_refusals", "Requests refused, by reason", ["reason"], registry=registry)
        self.log_dropped = Counter(
            f"{PREFIX}_access_log_dropped",
            "Access log lines dropped: the log's stream stalled and its queue was full",
            registry=registry,
        )
        self.models = Info(
            f"{PREFIX}_model", "A model served: its engine, device and weights", ["model"], registry=registry
        )

        # Each metric's child for a set of label values, found once: ``labels()`` checks its values and takes a
        # lock on every call, the middleware's largest cost a request. The values are few (route templates,
        # statuses, reasons, directions), so the table stays small.
        self.children: dict[tuple[Any, ...], Any] = {}

    def child(self, metric: Counter | Gauge | Histogram, *values: str) -> Any:
        key = (id(metric), *values)
        found = self.children.get(key)
        if found is None:
            found = self.children[key] = metric.labels(*values)
        return found

    def scrape(self) -> bytes:
        return generate_latest(self.registry)


class Recorder:
    """Where the serving code reports: the enabled ``Metrics``, or nowhere."""

    def __init__(self) -> None:
        self.metrics: Metrics | None = None


RECORDER = Recorder()


def enable() -> Metrics:
    """The process's metrics, made once; every report goes to them from now on."""
    if RECORDER.metrics is None:
        RECORDER.metrics = Metrics()
    return RECORDER.metrics


def answered(route: str, status: int, seconds: float) -> None:
    """An HTTP request ended: its route (the route's template, never the raw path) and status."""
    if (m := RECORDER.metrics) is not None:
        m.child(m.requests, route, str(status)).inc()
        m.child(m.latency, route).observe(seconds)


def refused(reason: str) -> None:
    """A request refused: ``reason`` a ``limits.Reason`` (``bad_json``, ``queue_full``, ``draining``, ...)."""
    if (m := RECORDER.metrics) is not None:
        m.child(m.refusals, reason).inc()


def log_dropped() -> None:
    """An access log line dropped (``access_log.py``)."""
    if (m := RECORDER.metrics) is not None:
        m.log_dropped.inc()


def translated(direction: str, lines: Iterable[Details]) -> None:
    """The lines of one translated request, in ``direction`` (``en-de``)."""
    if (m := RECORDER.metrics) is not None:
        found = list(lines)
        m.child(m.sentences, direction).inc(sum(line.sentences for line in found))
        m.child(m.tokens, direction).inc(sum(line.tokens for line in found))


def waiting(route: str, now: int) -> None:
    """``route``'s work accepted and not yet answered is ``now``, as its one count says (``api.Waiting``,
    ``operations.Operations``)."""
    if (m := RECORDER.metrics) is not None:
        m.child(m.waiting, route).set(now)


def searched(sentences: int, seconds: float) -> None:
    """One search of ``sentences`` sentences (or clauses) took ``seconds``."""
    if (m := RECORDER.metrics) is not None:
        m.batch.observe(sentences)
        m.search.observe(seconds)


def serving(models: Sequence[ModelServed]) -> None:
    """The models this process serves, as the info metric's labels."""
    if (m := RECORDER.metrics) is not None:
        for served in models:
            info = {"direction": served.direction, "engine": served.engine, "device": served.device}
            m.models.labels(served.model).info(info | {"variant": served.variant})


def metrics_route(metrics: Metrics) -> Route:
    """``GET /metrics``: the registry in Prometheus' text format."""
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    async def scrape(_: Request) -> Response:
        return Response(metrics.scrape(), media_type=CONTENT_TYPE_LATEST)

    return Route(PATH, scrape, methods=["GET"], name="metrics")

"""Who may wait for the page: a queue bounded by what can be answered within a stated longest wait, and bad
requests turned away before they wait. Torch-free.

The page's ``translate`` event is batched (Gradio hands the handler every waiting request at once, and the
batcher searches them together), so one bad request in a batch would fail the whole batch. ``admit`` checks each
request as Gradio's queue takes it in, a check of its direction, beam size and length, and sends a bad one to the
event's one-by-one twin, whose handler answers it with the page's message; the batch only ever holds good ones.

Gradio's own ``max_size`` is a count with a fixed message; here the bound is ``MAX_WAITING``: the requests the
page answers in ``LONGEST_WAIT_S`` at its measured rate, and a request beyond it is told so. A waiting visitor
sees its place in the queue and the expected wait; Gradio's estimate takes one request per batch (a queue of
1 000 read as minutes), so the wait shown is the place over the measured rate.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gradio as gr
from gradio.server_messages import EstimationMessage

LONGEST_WAIT_S = 30
# One-sentence beam-4 answers a second through the page's API on a 2-core CPU at 200 visitors (`aiayn bench
# --serve`: 61-75/s, measured while another process kept both cores busy; figures in docs/serve.md). A machine
# that answers faster only waits less than LONGEST_WAIT_S and shows waits longer than they are.
ANSWERS_PER_S = 60
MAX_WAITING = ANSWERS_PER_S * LONGEST_WAIT_S
# Gradio's queue rebuilds a pandas summary of its last 10 000 events after every event (for its monitoring page,
# which this app does not open): at 200 visitors that was ~1 ms of CPU per answer, growing with the crowd.
ANALYTICS_EVENTS_KEPT = 100
ANALYTICS_NEVER_RECOMPUTED = 2**62


def queue_full(max_waiting: int) -> str:
    return (
        f"The page is busy: {max_waiting} requests are waiting, about {LONGEST_WAIT_S} s of work. "
        "Please try again in a minute."
    )


def admit(app: gr.Blocks, batched: int, one_by_one: int, is_valid: Callable[[Sequence[Any]], bool]) -> None:
    """Bound ``app``'s queue at ``MAX_WAITING`` requests, and route a request of the event ``batched`` (its id)
    whose inputs are not ``is_valid`` to the event ``one_by_one`` (same inputs and outputs) instead."""
    queue, max_waiting = app._queue, MAX_WAITING
    push = queue.push
    queue.ANALYTICS_MAX_EVENTS = ANALYTICS_EVENTS_KEPT
    queue.ANAYLTICS_CACHE_FREQUENCY = ANALYTICS_NEVER_RECOMPUTED  # (sic: Gradio's name)

    def estimations(concurrency_id: str, after: int | None = None) -> None:
        """Each waiting request's place and expected wait, sent to it (from place ``after`` on, if given)."""
        waiting = queue.event_queue_per_concurrency_id[concurrency_id].queue
        for rank, event in enumerate(waiting[after or 0 :], start=after or 0):
            eta = (rank + 1) / ANSWERS_PER_S
            queue.send_message(event, EstimationMessage(rank=rank, rank_eta=eta, queue_size=len(waiting)))

    async def admitted(body: Any, request: Any, username: str | None) -> tuple[bool, Any, str]:
        if len(queue) >= max_waiting:
            return False, queue_full(max_waiting), "queue_full"
        if body.fn_index == batched and not is_valid(body.data):
            body.fn_index = one_by_one
        return await push(body, request, username)

    # Gradio has no hooks where a request enters its queue or is told its wait: this instance's methods are
    # replaced, Gradio's classes left as they are.
    setattr(queue, "push", admitted)  # noqa: B010
    setattr(queue, "broadcast_estimations", estimations)  # noqa: B010

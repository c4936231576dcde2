"""One bound on work: the JSON route's waiting sentences are its requests' sentences once split, as its and the
page's per-request bound counts them (``requests.work_of``; the per-request bound: test_api_body.py,
test_requests.py)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from test_api_body import body
from test_hostile_requests import JSON, Held, client, refusal

from aiayn.serve.api import PATH
from aiayn.serve.limits import Limits


def test_the_waiting_bound_counts_sentences_once_split_not_strings() -> None:
    service, limits = Held(), Limits(max_sentences=8, max_waiting=8)
    with client(service, limits) as route, ThreadPoolExecutor(1) as pool:
        held = pool.submit(
            route.post, PATH, content=body(sentences=["A dog. A cat. A cow.", "A man. A boat."]), headers=JSON
        )
        assert service.held.acquire(timeout=10)  # 2 strings, 5 sentences wait
        over = route.post(PATH, content=body(sentences=["A girl. A boy. A bird. A tree."]), headers=JSON)
        assert refusal(over) == (503, "the server is busy: 5 sentences wait (at most 8); try again shortly")
        service.release.set()
        assert held.result().status_code == 200 and len(held.result().json()["translations"]) == 2

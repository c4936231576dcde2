"""`--api-keys FILE` without a server: the file's lines read or refused naming the line (never the key), and the
gate (``api_keys.KeyGate``) over a stand-in app: a key from a header, the query, a JSON or form body; 403 without
one, 413 over its characters, the page guarded only with ``--api-keys-page`` and then kept by a cookie. The gate
in a served `aiayn serve`, with LibreTranslate's clients: test_libretranslate.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from aiayn.cli import main
from aiayn.serve.api_keys import COOKIE, NO_KEY, KeyGate, read_keys

KEY, SMALL = "a-key-1f2e", "small-key-77"


def keys_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "keys.txt"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("k1\nsecret-one per_hour=5\n", "line 2: a key's limits are per_minute=N (requests per minute), chars=N"),
        ("secret-one chars=0\n", "line 1: a key's limits are"),
        ("secret-one\n\nsecret-one\n", "line 3: this key is already on an earlier line"),
        ("secret;one\n", "line 1: a key holds only letters, digits and ._~+/=-"),
        ("# only a comment\n\n", "holds no key"),
    ],
)
def test_a_line_the_file_cannot_hold_is_named_and_its_key_never_shown(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ValueError, match="^.*$") as refused:
        read_keys(keys_file(tmp_path, text))
    assert message in str(refused.value) and "secret" not in str(refused.value)


def client(tmp_path: Path, page: bool) -> TestClient:
    async def echoed(request: Request) -> JSONResponse:
        return JSONResponse({"body": (await request.body()).decode()})

    routes = [
        Route("/translate", echoed, methods=["POST"]),
        Route("/", lambda request: PlainTextResponse("the page")),
        Route("/healthz", lambda request: PlainTextResponse("ok")),
    ]
    keys = read_keys(keys_file(tmp_path, f"{KEY}\n{SMALL} chars=10\n"))
    gate = Middleware(KeyGate, keys=keys, page=page, body_limit=1000)
    return TestClient(Starlette(routes=routes, middleware=[gate]))


def test_a_key_is_taken_wherever_a_client_sends_it_and_the_body_reaches_the_door(tmp_path: Path) -> None:
    doors = client(tmp_path, page=False)
    sent = [
        {"json": {"q": "a", "api_key": KEY}},
        {"data": {"q": "a", "api_key": KEY}},
        {"json": {"q": "a"}, "params": {"api_key": KEY}},
        {"json": {"q": "a"}, "headers": {"Authorization": f"Bearer {KEY}"}},
        {"json": {"q": "a"}, "headers": {"X-API-Key": KEY}},
    ]
    for request in sent:
        answer = doors.post("/translate", **request)  # type: ignore[arg-type]
        body = answer.json()["body"]  # what the door read: the body the gate read first, handed on whole
        assert answer.status_code == 200 and ('"q":"a"' in body.replace(" ", "") or body.startswith("q=a"))
    for request in [{"json": {"q": "a"}}, {"json": {"q": "a", "api_key": "wrong"}}]:
        answer = doors.post("/translate", **request)  # type: ignore[arg-type]
        assert (answer.status_code, answer.json()) == (403, {"error": NO_KEY})
    answer = doors.post("/translate", json={"q": ["12345", "678901"], "api_key": SMALL})
    over = "this request has 11 characters; this key's are at most 10"
    assert (answer.status_code, answer.json()) == (413, {"error": over})
    assert doors.get("/").status_code == 200 and doors.get("/healthz").status_code == 200  # the page: not guarded


def test_an_empty_body_reaches_the_door_and_another_method_is_the_routers_405(tmp_path: Path) -> None:
    """Schemathesis found both on a served process: an empty form body the gate had read reached the door as
    nothing at all (a server waited for it until its time limit: 503), and TRACE got 403, not 405."""
    doors = client(tmp_path, page=False)
    form = {"content-type": "application/x-www-form-urlencoded", "Authorization": f"Bearer {KEY}"}
    answer = doors.post("/translate", content=b"", headers=form)
    assert (answer.status_code, answer.json()) == (200, {"body": ""})
    assert doors.request("TRACE", "/translate").status_code == 405  # no key, and still the method's answer


def test_the_page_needs_a_key_only_when_told_and_keeps_it_in_a_cookie(tmp_path: Path) -> None:
    page = client(tmp_path, page=True)
    assert page.get("/").status_code == 403 and page.get("/healthz").status_code == 200
    opened = page.get("/", params={"api_key": KEY})
    assert opened.status_code == 200 and f"{COOKIE}={KEY}" in opened.headers["set-cookie"]
    assert "HttpOnly" in opened.headers["set-cookie"]
    assert page.get("/").status_code == 200  # the cookie, sent by the client as a browser would


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--api-keys-page"], "--api-keys-page goes with --api-keys FILE"),
        (["--api-keys", "keys.txt", "--api-keys-page", "--mcp"], "--api-keys-page cannot go with --mcp"),
        (["--ray", "--mcp"], "--mcp is served by `aiayn serve` without --ray"),
    ],
)
def test_flags_that_cannot_go_together_are_refused_in_one_line(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", *flags]) == 2
    assert message in capsys.readouterr().err

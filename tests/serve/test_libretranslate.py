"""`aiayn serve --api-keys FILE --mcp` as a process, asked by the apps' own clients, unchanged: libretranslatepy's
``LibreTranslateAPI(url)`` and deep-translator's ``LibreTranslator(custom_url=...)`` (which sends its fields as query
parameters) translate Multi30k's test captions as `aiayn translate` does, list the languages and detect one; without
a valid key both get 403, a key over its rate 429, and nothing of a key reaches the access log or /metrics; the `mcp`
package's client lists the page's translate as a tool and calls it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from deep_translator import LibreTranslator
from deep_translator.exceptions import AuthorizationException
from libretranslatepy import LibreTranslateAPI
from test_hostile_server import schemathesis_passes

from aiayn.data.multi30k import load_parallel
from aiayn.serve.api_keys import NO_KEY

KEY, SLOW_KEY, WRONG_KEY = "key-for-the-tests-5c1f", "slow-key-90ab", "not-a-key-of-the-file"
KEYS = f"# the tests' keys\n{KEY}\n{SLOW_KEY} per_minute=2\n"
CAPTIONS = 24  # of Multi30k's test split, each direction: a few seconds; by hand, 200 (docs/serve.md)


@pytest.fixture(scope="module")
def server(
    bundled: dict[str, Path], tmp_path_factory: pytest.TempPathFactory, serve_page: Callable[..., Any]
) -> Iterator[Any]:
    folder = tmp_path_factory.mktemp("libretranslate")
    keys = folder / "keys.txt"
    keys.write_text(KEYS)
    with serve_page(["--device", "cpu", "--api-keys", str(keys), "--mcp"], folder / "serve.log") as page:
        yield page


def cli_translate(model: str, lines: list[str]) -> list[str]:
    """`aiayn translate --model MODEL` over ``lines``, at the folder's own beam (as the LibreTranslate doors)."""
    command = [sys.executable, "-m", "aiayn.cli", "translate", "--model", model, "--device", "cpu"]
    out = subprocess.run(command, input="\n".join(lines), capture_output=True, text=True, check=True).stdout
    return out.split("\n")[: len(lines)]


def posted(url: str, fields: dict[str, Any], key: str | None = KEY, path: str = "translate") -> tuple[int, Any, Any]:
    """(status, JSON answer, headers) of a JSON request to the door ``path``."""
    body = json.dumps(fields | ({"api_key": key} if key else {})).encode()
    request = urllib.request.Request(f"{url}{path}", body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.loads(answer.read()), answer.headers
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read()), err.headers


@pytest.mark.parametrize(("source", "target"), [("en", "de"), ("de", "en")])
def test_both_clients_translate_the_captions_as_aiayn_translate(
    server: Any, multi30k_dir: Path, source: str, target: str
) -> None:
    captions = load_parallel("test_2016_flickr", source, target, download=False).src[:CAPTIONS]
    expected = cli_translate(f"{source}-{target}", captions)
    libre = LibreTranslateAPI(server.url, api_key=KEY)
    assert [libre.translate(caption, source, target) for caption in captions] == expected
    deep = LibreTranslator(source=source, target=target, custom_url=server.url, api_key=KEY)
    assert [deep.translate(caption) for caption in captions] == expected
    status, answer, _ = posted(server.url, {"q": captions[:5], "source": source, "target": target})  # q a list
    assert (status, answer) == (200, {"translatedText": expected[:5]})


def test_libretranslatepy_lists_the_served_languages_and_detects_one(server: Any) -> None:
    libre = LibreTranslateAPI(server.url, api_key=KEY)
    assert libre.languages() == [
        {"code": "en", "name": "English", "targets": ["de"]},
        {"code": "de", "name": "German", "targets": ["en"]},
    ]
    found = libre.detect("Zwei Hunde spielen im Schnee.")
    assert [f["language"] for f in found] == ["de", "en"] and found[0]["confidence"] > 90


def test_source_auto_is_detected_among_the_served_sources(server: Any) -> None:
    german = "Ein Mann fährt mit dem Fahrrad durch die Stadt."
    status, answer, _ = posted(server.url, {"q": german, "source": "auto", "target": "en"})
    assert status == 200 and answer["detectedLanguage"]["language"] == "de"
    assert answer["translatedText"] == cli_translate("de-en", [german])[0]
    status, answer, _ = posted(server.url, {"q": "Hello", "source": "auto", "target": "fr"})
    assert (status, answer) == (422, {"error": "target fr is not supported; the targets served are de, en"})


def test_html_keeps_its_markup_and_alternatives_are_the_beams_next_best(server: Any) -> None:
    fragment = '<p class="c">Two dogs play in the snow.</p><script>var a = "dog";</script>'
    status, answer, _ = posted(server.url, {"q": fragment, "source": "en", "target": "de", "format": "html"})
    line = cli_translate("en-de", ["Two dogs play in the snow."])[0]
    assert (status, answer) == (200, {"translatedText": f'<p class="c">{line}</p><script>var a = "dog";</script>'})
    asked = {"q": "Two dogs play in the snow.", "source": "en", "target": "de", "alternatives": 9}
    status, answer, _ = posted(server.url, asked)
    assert status == 200 and answer["translatedText"] == line
    others = answer["alternatives"]
    assert 1 <= len(others) <= 3 and line not in others  # the bundled folders' beam is 4: at most 3 others
    status, answer, _ = posted(server.url, {"q": "x", "source": "en", "target": "de", "format": "xml"})
    assert (status, answer) == (422, {"error": "xml format is not supported; the formats are text, html"})


def test_without_a_valid_key_both_clients_get_403_and_over_its_rate_429(server: Any) -> None:
    for key in (None, WRONG_KEY):
        with pytest.raises(urllib.error.HTTPError) as refused:
            LibreTranslateAPI(server.url, api_key=key).translate("A dog runs.", "en", "de")
        assert refused.value.code == 403
        assert json.loads(refused.value.read()) == {"error": NO_KEY}
        with pytest.raises(AuthorizationException):
            LibreTranslator(source="en", target="de", custom_url=server.url, api_key=key or "x").translate("A dog.")
    assert posted(server.url, {"sentences": ["A dog."]}, None, "v1/translate")[0] == 403
    assert posted(server.url, {"sentences": ["A dog."]}, KEY, "v1/translate")[0] == 200
    statuses = [posted(server.url, {"q": "A dog.", "source": "en", "target": "de"}, SLOW_KEY) for _ in range(3)]
    assert [s for s, _, _ in statuses] == [200, 200, 429]
    assert 1 <= int(statuses[2][2]["Retry-After"]) <= 60
    with urllib.request.urlopen(f"{server.url}metrics", timeout=10) as answer:
        metrics = answer.read().decode()
    assert 'aiayn_refusals_total{reason="no_key"}' in metrics and 'reason="key_rate"' in metrics
    lines, deadline = (" POST /translate 403 ", " POST /translate 429 "), time.monotonic() + 30
    while not all(line in (log := server.log.read_text()) for line in lines) and time.monotonic() < deadline:
        time.sleep(0.1)  # the access log writes on its own thread: a line may come just after its answer
    assert all(line in log for line in lines), log[-2000:]
    for key in (KEY, SLOW_KEY, WRONG_KEY):
        assert key not in log and key not in metrics


def test_an_mcp_client_lists_translate_and_gets_aiayn_translates_line(
    server: Any, mcp_translate: Callable[..., tuple[list[str], list[str]]]
) -> None:
    caption = "A little girl climbs the stairs of a wooden playhouse."
    tools, (translation, status) = mcp_translate(server.url, caption, "en-de", 4)
    assert "translate" in tools
    assert translation == cli_translate("en-de", [caption])[0] and "sentence(s)" in status


@pytest.mark.parametrize("header", [None, f"Authorization: Bearer {KEY}"])
def test_schemathesis_holds_the_keyed_doors_to_their_schema_with_a_key_and_without(server: Any, header: str) -> None:
    """Without a key every guarded door answers 403 (another method still 405); with one, as documented."""
    schemathesis_passes(server, *([header] if header else []))

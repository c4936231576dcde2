"""`aiayn serve --ray` on a real Ray cluster of two nodes on this machine: the page and the JSON route through Ray's
HTTP proxy, two translation replicas, one of them killed mid-load, and nothing lost.

Every node is bound to a loopback address, so the test's traffic, Ray's own included, stays on this machine's
loopback interface: 127.0.0.2 for the head, 127.0.0.3 for the second node (Ray 2.60 replaces a node address of
127.0.0.1 by the machine's routable one, and only that literal; the rest of 127/8 is taken as given). The cluster
is the test's own (its own temporary directory and ports) and is stopped at the end, process by process: `ray
stop` would stop every Ray cluster of the machine.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from aiayn.bench.crowd import Connection, ask_page, completed_data
from aiayn.bench.ray_serving import FAILED, Load, json_crowd
from aiayn.bench.serving import free_port, wait_until_serving
from aiayn.engines.options import EngineOptions
from aiayn.serve.service import TranslationService

pytest.importorskip("ray.serve", reason="Ray Serve is an optional extra: pip install -e '.[ray]'")

HEAD, SECOND = "127.0.0.2", "127.0.0.3"
CLIENTS, REQUESTS_PER_CLIENT = 50, 10
KILL_AFTER_S = 1.0
START_TIMEOUT_S = 180
SENTENCES = [
    "Two dogs play in the snow.",
    "A girl jumps into the pool.",
    "A black cat sleeps on the sofa.",
    "A man rides a bike down the street.",
    "Children are playing soccer in a park.",
    "An old woman sells flowers at the market.",
    "Three men are working on a roof.",
]
# The cluster's processes started without token authentication (Ray 2.60 turns it on for `ray start` by default):
# every address is a loopback one, and the test's processes would each need the token.
RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}


@dataclass(frozen=True)
class Cluster:
    address: str
    temp_dir: Path
    env: dict[str, str]


def ray_command() -> str:
    found = shutil.which("ray", path=str(Path(sys.executable).parent)) or shutil.which("ray")
    assert found is not None, "Ray is importable but its `ray` command is not on the PATH"
    return found


def processes_of(temp_dir: Path) -> set[int]:
    """The PIDs of the Ray processes started for ``temp_dir``: those whose command line names it (the GCS, the
    raylets), and every process they started (workers, agents: some rename their command line)."""
    parents: dict[int, int] = {}
    named = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                if str(temp_dir) in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    named.add(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    family = set(named)
    while grown := {pid for pid, parent in parents.items() if parent in family} - family:
        family |= grown
    return family


def replicas(deployment: str) -> list[int]:
    """The PIDs of a deployment's replicas (Ray names each replica's process ``ray::ServeReplica:APP:NAME``)."""
    title = f"ray::ServeReplica:aiayn:{deployment}"
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace").startswith(title):
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    temp_dir = Path(tempfile.mkdtemp(prefix="aiayn-ray-", dir="/tmp"))  # short: Ray's sockets live under it
    env = {**os.environ, **RAY_ENV}
    port = free_port()
    ray = ray_command()
    common = ["--num-cpus=1", "--disable-usage-stats", f"--temp-dir={temp_dir}"]
    try:
        head = [ray, "start", "--head", f"--node-ip-address={HEAD}", f"--port={port}", "--include-dashboard=false"]
        subprocess.run([*head, *common], env=env, check=True, capture_output=True, timeout=START_TIMEOUT_S)
        second = [ray, "start", f"--address={HEAD}:{port}", f"--node-ip-address={SECOND}", *common]
        subprocess.run(
            [*second, '--resources={"second_node": 1}'],
            env=env,
            check=True,
            capture_output=True,
            timeout=START_TIMEOUT_S,
        )
        yield Cluster(f"{HEAD}:{port}", temp_dir, env)
    finally:
        for pid in processes_of(temp_dir):  # all at once: a worker whose raylet died first is orphaned
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(temp_dir, ignore_errors=True)


@dataclass(frozen=True)
class Served:
    port: int  # Ray's HTTP proxy's
    process: subprocess.Popen[bytes]
    log: Path  # its stderr


def readme_ray_command() -> list[str]:
    """The README's `aiayn serve --ray ...` line as typed, less `aiayn` and its comment."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    lines = [line for line in readme.splitlines() if line.startswith("aiayn serve --ray")]
    (found,) = [shlex.split(line, comments=True) for line in lines]
    return found[1:]


@pytest.fixture(scope="module")
def served(cluster: Cluster, bundled: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The README's `aiayn serve --ray --replicas 2` as typed, its defaults kept (the bundled models, no --model),
    but for a free port, on the cluster (``RAY_ADDRESS``, which Ray reads where no ADDRESS is given)."""
    port, log = free_port(), tmp_path_factory.mktemp("ray") / "serve.log"
    command = [sys.executable, "-m", "aiayn.cli", *readme_ray_command(), "--port", str(port)]
    with log.open("wb") as stderr:
        server = subprocess.Popen(
            command, env={**cluster.env, "RAY_ADDRESS": cluster.address}, stdout=subprocess.DEVNULL, stderr=stderr
        )
    try:
        wait_until_serving(server, f"http://127.0.0.1:{port}/")
        yield Served(port, server, log)
    finally:
        server.send_signal(signal.SIGTERM)  # takes the application down, leaves the cluster to the fixture
        server.wait(timeout=120)


@pytest.fixture(scope="module")
def expected(bundled: dict[str, Path]) -> dict[str, str]:
    """What `aiayn translate` gives each sentence (the CLI's own service)."""
    service = TranslationService(EngineOptions(device="cpu"))
    return {s: service.translate(s, "en-de").text for s in SENTENCES}


async def crowd_with_a_replica_killed(port: int) -> tuple[list[tuple[str, str]], int]:
    """The bench's JSON crowd (one sentence a request) through the proxy, one translation replica killed by its
    PID ``KILL_AFTER_S`` into it: every (sentence, answer), and the PID killed."""

    async def kill_one() -> int:
        await asyncio.sleep(KILL_AFTER_S)
        victim = replicas("Translation")[0]
        os.kill(victim, signal.SIGKILL)
        return victim

    load = Load("one sentence", CLIENTS, REQUESTS_PER_CLIENT, 1)
    (_, answers), victim = await asyncio.gather(json_crowd(port, load, SENTENCES, "en-de"), kill_one())
    return answers, victim


def test_two_nodes_hold_the_two_replicas(cluster: Cluster, served: Served) -> None:
    import ray
    from ray import serve

    ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
    try:
        nodes = sorted((node["NodeManagerAddress"], node["Resources"]["CPU"]) for node in ray.nodes() if node["Alive"])
        application = serve.status().applications["aiayn"]
    finally:
        ray.shutdown()
    assert nodes == [(HEAD, 1.0), (SECOND, 1.0)]
    # The README's command (no --model): replicas that were named no model failed Ray's health check from the start.
    health = {name: deployment.status for name, deployment in application.deployments.items()}
    assert (application.status, health) == ("RUNNING", {"Translation": "HEALTHY", "Page": "HEALTHY"})
    assert len(replicas("Translation")) == 2  # a CPU each: one on each node
    assert len(replicas("Page")) == 1


def test_a_replica_killed_under_load_loses_no_request(served: Served, expected: dict[str, str]) -> None:
    before = set(replicas("Translation"))
    answers, victim = asyncio.run(crowd_with_a_replica_killed(served.port))
    assert victim in before
    assert len(answers) == CLIENTS * REQUESTS_PER_CLIENT
    wrong = [(sentence, answer) for sentence, answer in answers if answer != expected[sentence]]
    assert wrong == []  # every answer is `aiayn translate`'s: none lost, none failed
    deadline = time.monotonic() + 120
    while len(set(replicas("Translation")) - {victim}) < 2 and time.monotonic() < deadline:
        time.sleep(1)
    assert len(set(replicas("Translation")) - {victim}) == 2  # Ray replaced it


def test_the_operators_routes_answer_through_the_proxy(
    served: Served, bundled: dict[str, Path], models_info: Callable[[str], list[dict[str, str]]]
) -> None:
    models = models_info(f"http://127.0.0.1:{served.port}/")
    # No --model: the bundled ones, named to the replicas too (unnamed, Ray's first health check failed the deploy).
    assert [(m["model"], m["direction"], m["variant"]) for m in models] == [(n, n, "fp32") for n in bundled]


def test_the_replicas_answer_ray_serves_health_check(bundled: dict[str, Path]) -> None:
    from aiayn.serve.ray_serve import TranslationReplica

    replica = TranslationReplica(["en-de"], EngineOptions(device="cpu"), True)
    replica.check_health()
    replica.service.translate("Two dogs play in the snow.", "en-de")  # its search workers started
    replica.check_health()
    batcher = replica.service.models["en-de"].batcher
    dead = threading.Thread(target=lambda: None)
    dead.start()
    dead.join()
    batcher.workers.append(dead)
    with pytest.raises(RuntimeError, match="en-de: a search worker thread has died"):
        replica.check_health()


def test_the_pages_api_answers_through_the_proxy(served: Served, expected: dict[str, str]) -> None:
    async def ask() -> list[str]:
        connection = await Connection.open(served.port)
        try:
            return [await ask_page(connection, s, "en-de") for s in SENTENCES]
        finally:
            connection.close()

    assert asyncio.run(ask()) == [expected[s] for s in SENTENCES]


def test_the_page_translates_in_chromium_through_the_proxy(served: Served, expected: dict[str, str]) -> None:
    from playwright.sync_api import expect

    from aiayn.bench.web import CHROMIUM, chromium

    if CHROMIUM is None:
        pytest.skip("Chromium is not installed: apt-get install -y chromium (Debian's package)")
    with chromium() as browser:
        page = browser.new_page()
        page.set_default_timeout(60_000)
        page.goto(f"http://127.0.0.1:{served.port}/", wait_until="load")
        page.locator("#source-text textarea").fill(SENTENCES[0])
        page.locator("#translate-button").click()
        expect(page.locator("#translation textarea")).to_have_value(expected[SENTENCES[0]])
        page.close()


def test_sigterm_drains_as_the_page_server_does(served: Served, expected: dict[str, str]) -> None:
    """Last in this file: it stops the application. The requests accepted before SIGTERM are answered, readiness
    and a new request get 503 with Retry-After meanwhile, and the command exits 0, saying it drained.

    A page call whose answer is not yet read holds the drain open (for ``drain.STREAM_OPENS_S``): the work is
    still open when the new request comes, however fast the crowd beside it was answered."""

    async def drained() -> tuple[list[tuple[str, str]], list[tuple[int, str | None]], str]:
        held = await Connection.open(served.port)
        try:
            posted = await held.request("POST", "/gradio_api/call/translate", {"data": [SENTENCES[0], "en-de", 4]})
            event = json.loads(posted)["event_id"]
            crowd = asyncio.create_task(json_crowd(served.port, Load("one sentence", 8, 4, 1), SENTENCES, "en-de"))
            await asyncio.sleep(0.5)  # the crowd's first requests accepted
            served.process.send_signal(signal.SIGTERM)
            seen = []
            while not seen or seen[-1][0] != 503:
                seen.append(await asyncio.to_thread(status_of, served.port, "/readyz"))
                await asyncio.sleep(0.05)
            late = await asyncio.to_thread(status_of, served.port, "/v1/translate", b'{"sentences": ["A dog."]}')
            seen.append(late)
            _, answers = await crowd
            page = str(completed_data(await held.request("GET", f"/gradio_api/call/translate/{event}"))[0])
            return answers, seen, page
        finally:
            held.close()

    answers, seen, page = asyncio.run(drained())
    exit_code = served.process.wait(timeout=120)
    said = served.log.read_text()
    assert seen[-2][0] == 503 and seen[-2][1] and seen[-1][0] == 503 and seen[-1][1], seen  # each with Retry-After
    assert page == expected[SENTENCES[0]]
    answered = [(sentence, answer) for sentence, answer in answers if answer == expected[sentence]]
    refused = [answer for _, answer in answers if answer.startswith(FAILED) and "draining" in answer]
    assert len(answered) + len(refused) == len(answers) and answered, answers  # accepted: answered; after: 503
    assert exit_code == 0 and "drained: every accepted request answered" in said, said


def status_of(port: int, path: str, body: bytes | None = None) -> tuple[int, str | None]:
    """(status, its Retry-After header) of a GET, or of a POST of the JSON ``body``."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.headers.get("Retry-After")
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get("Retry-After")

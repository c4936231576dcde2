"""`aiayn serve --ray`'s flags without a cluster: Ray Serve's own scaling settings, the refusals in one line, and a
CLI that never imports Ray unless asked (tests/serve/test_ray.py runs it on a real cluster)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest

from aiayn.cli import build_parser, main
from aiayn.engines.options import EngineOptions
from aiayn.serve.ray_serve import MAX_ONGOING, Application, RayMissing, Scaling


def test_a_fixed_count_and_autoscaling_are_ray_serves_own_settings() -> None:
    fixed = Scaling(replicas=3).deployment_options()
    assert fixed == {"max_ongoing_requests": MAX_ONGOING, "ray_actor_options": {"num_cpus": 1}, "num_replicas": 3}
    scaled = Scaling(replicas=2, max_replicas=6, target_ongoing_requests=16, cpus_per_replica=2).deployment_options()
    assert "num_replicas" not in scaled and scaled["ray_actor_options"] == {"num_cpus": 2}
    assert scaled["autoscaling_config"] == {"min_replicas": 2, "max_replicas": 6, "target_ongoing_requests": 16}
    assert Scaling(min_replicas=0, max_replicas=4).deployment_options()["autoscaling_config"] == {
        "min_replicas": 0,
        "max_replicas": 4,
    }


@pytest.mark.parametrize(
    ("scaling", "message"),
    [
        (Scaling(min_replicas=1), "--min-replicas needs --max-replicas"),
        (Scaling(target_ongoing_requests=8), "--target-ongoing-requests needs --max-replicas"),
        (Scaling(replicas=5, max_replicas=4), "--min-replicas 5 must be from 0 to --max-replicas 4"),
        (Scaling(replicas=0), "--replicas must be at least 1"),
    ],
)
def test_scaling_that_cannot_work_is_refused_in_one_line(scaling: Scaling, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        scaling.check()


def test_the_flags_fill_the_scaling() -> None:
    args = build_parser().parse_args(["serve", "--ray", "auto", "--replicas", "2", "--max-replicas", "5"])
    assert (args.ray, args.replicas, args.max_replicas, args.cpus_per_replica) == ("auto", 2, 5, 1.0)
    assert build_parser().parse_args(["serve", "--ray"]).ray == ""  # no address: a cluster started for it
    assert build_parser().parse_args(["serve"]).ray is None


def test_a_ray_flag_without_ray_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--replicas", "2"]) == 2
    assert "--replicas goes with --ray" in capsys.readouterr().err


def test_without_ray_the_error_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    monkeypatch.setitem(sys.modules, "ray.serve", None)
    from aiayn.serve.ray_serve import serve_on_ray

    app = Application(None, EngineOptions(), True, Scaling(), "127.0.0.1", 8000)
    with pytest.raises(RayMissing, match=r"pip install -e '\.\[ray\]'"):
        serve_on_ray(None, app)


def test_the_cli_says_it_in_one_line_and_never_imports_ray_otherwise(import_blocker: Callable[[str], str]) -> None:
    script = import_blocker("ray") + (
        "from aiayn.cli import main\n"
        "import aiayn.serve.server, aiayn.serve.page, aiayn.serve.api, aiayn.serve.ray_serve\n"
        "raise SystemExit(main(['serve', '--ray', '--port', '1']))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines == [
        "aiayn serve: error: aiayn serve --ray needs Ray Serve, which is not installed: "
        "pip install -e '.[ray]' (or pip install 'ray[serve]')"
    ]


@pytest.mark.parametrize(
    ("address", "message"),
    [("127.0.0.1:1", "no Ray cluster answers at 127.0.0.1:1"), ("nowhere", "give the head's HOST:PORT")],
)
def test_an_address_where_no_cluster_answers_is_refused_at_once(address: str, message: str) -> None:
    from aiayn.serve.ray_serve import reachable

    with pytest.raises(ValueError, match=message):
        reachable(address)

"""Checkpoints: written whole or not at all, read back or refused in one line that says what to do, averaged."""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import pytest
import torch

from aiayn.core.dependencies import SECURITY_FLOORS
from aiayn.model.weights import UnsafeTorch
from aiayn.train.checkpoint import AVERAGE_FIX, average_state_dicts, load_checkpoint, save_atomic


def test_a_checkpoint_is_written_whole_under_its_name_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "run" / "checkpoints" / "last.pt"  # its folders made on the way
    save_atomic({"step": 7, "model": {"w": torch.ones(2)}}, path)
    save_atomic({"step": 8, "model": {"w": torch.zeros(2)}}, path)  # over the last one
    assert [p.name for p in path.parent.iterdir()] == ["last.pt"]  # no temporary file left beside it
    state = load_checkpoint(path)
    assert state["step"] == 8 and torch.equal(state["model"]["w"], torch.zeros(2))


def test_a_missing_or_unreadable_checkpoint_is_named_with_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=f"^no checkpoint at {tmp_path / 'none.pt'}; start without --resume$"):
        load_checkpoint(tmp_path / "none.pt")
    broken = tmp_path / "broken.pt"
    broken.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match=r"^checkpoint .*broken\.pt cannot be read \(.+\); do this$"):
        load_checkpoint(broken, "do this")
    with pytest.raises(ValueError) as refused:
        load_checkpoint(broken)
    assert str(refused.value).endswith(f"; {AVERAGE_FIX}")


def test_averaging_is_the_mean_of_each_weight_in_float64(tmp_path: Path) -> None:
    paths = [tmp_path / f"epoch{i}.pt" for i in range(3)]
    big = 2.0**25  # float32 adds 1 to it and loses it: the sum is kept in float64
    for path, value in zip(paths, (big, 1.0, 2.0), strict=True):
        save_atomic({"model": {"w": torch.full((2,), value), "b": torch.tensor([value])}}, path)
    averaged = average_state_dicts(paths)
    mean = torch.tensor((big + 3.0) / 3, dtype=torch.float64).float().item()  # float32 sums would give mean - 1
    assert set(averaged) == {"w", "b"} and averaged["w"].dtype == torch.float32
    assert averaged["w"].tolist() == [mean] * 2 and averaged["b"].item() == mean
    assert average_state_dicts(paths[1:2])["w"].tolist() == [1.0, 1.0]


def test_averaging_refuses_no_checkpoints_or_another_runs(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="^no checkpoints to average$"):
        average_state_dicts([])
    a, b = tmp_path / "a.pt", tmp_path / "b.pt"
    save_atomic({"model": {"w": torch.ones(1)}}, a)
    save_atomic({"model": {"v": torch.ones(1)}}, b)
    with pytest.raises(ValueError, match=f"^{b} holds other weights than {a}; average checkpoints of one run only$"):
        average_state_dicts([a, b])


class Payload:
    """What a hostile ``last.pt`` can pickle: unpickling it calls ``open(marker, "w")``, creating the marker."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return open, (str(self.marker), "w")


def hostile_checkpoint(path: Path, marker: Path) -> Path:
    """A checkpoint laid out as ours (weights, a step) with a payload among its values."""
    torch.save({"step": 3, "model": {"w": torch.ones(2)}, "options": Payload(marker)}, path)
    return path


def test_the_payload_runs_when_unpickled_as_torch_did_before(tmp_path: Path) -> None:
    """The control: the file below is a real payload, which ``weights_only=False`` runs."""
    marker = tmp_path / "ran"
    torch.load(hostile_checkpoint(tmp_path / "last.pt", marker), weights_only=False)
    assert marker.is_file()


def test_a_checkpoint_that_pickles_code_is_refused_in_one_line_and_the_code_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    path = hostile_checkpoint(tmp_path / "last.pt", marker)
    with pytest.raises(ValueError) as refused:
        load_checkpoint(path, "delete it and start without --resume")
    line = str(refused.value)  # the callable named as torch names it: io.open is builtins.open
    assert re.fullmatch(
        rf"checkpoint {re.escape(str(path))} cannot be read as data alone \(its pickle asks for GLOBAL [\w.]*open, "
        r"which could run code\), so it is refused unread; delete it and start without --resume",
        line,
    )
    assert refused.value.__cause__ is None and refused.value.__suppress_context__  # no chained traceback to print
    with pytest.raises(ValueError, match=r"asks for GLOBAL [\w.]*open"):  # averaging reads checkpoints the same way
        average_state_dicts([path])
    assert not marker.exists() and path.is_file()  # never run, and the file left as it was for the user to judge


def test_checkpoints_are_not_read_with_a_torch_whose_weights_only_can_be_bypassed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "last.pt"
    save_atomic({"step": 1, "model": {"w": torch.ones(1)}}, path)
    monkeypatch.setattr(torch, "__version__", "2.5.1+cpu")
    with pytest.raises(UnsafeTorch) as refused:
        load_checkpoint(path)
    assert str(refused.value) == (
        f"{path} is not read with torch 2.5.1+cpu: before {SECURITY_FLOORS['torch']} such a file can run code despite "
        f"weights_only (CVE-2025-32434); pip install 'torch>={SECURITY_FLOORS['torch']}'"
    )


def test_a_pickle_of_something_else_than_a_training_state_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "list.pt"
    torch.save([torch.ones(1)], path)
    with pytest.raises(ValueError, match=rf"^checkpoint {path} holds a list, not a training state; do this$"):
        load_checkpoint(path, "do this")


def test_a_bare_pickle_of_a_payload_is_refused_in_one_line_and_never_runs(tmp_path: Path) -> None:
    """Protocol 4's STACK_GLOBAL, which torch's data-only reader does not take at all: refused the same."""
    marker, path = tmp_path / "ran", tmp_path / "last.pt"
    path.write_bytes(pickle.dumps({"step": 1, "options": Payload(marker)}, protocol=4))
    with pytest.raises(ValueError) as refused:
        load_checkpoint(path, "do this")
    assert "\n" not in str(refused.value) and str(refused.value).endswith("; do this")
    assert not marker.exists()

"""Checkpoints: written whole or not at all, read back or refused in one line that says what to do, averaged."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

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

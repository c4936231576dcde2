"""--update-freq: N accumulated micro-batches make the update of one batch of all their tokens (DDP too);
--precision: bf16 where the hardware has it, a clear refusal elsewhere."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from accumulation_worker import MICRO_BATCHES, gradients, joined
from test_train import options, reverse_corpus

from aiayn.core.folder import CHECKPOINT_DIR
from aiayn.train import precision
from aiayn.train.loop import train

TORCHRUN = Path(sys.executable).parent / "torchrun"


def assert_same_gradients(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    """To float rounding; some gradients are zero in exact arithmetic (attention's key bias), hence the atol."""
    assert a.keys() == b.keys()
    for name, tensor in a.items():
        torch.testing.assert_close(tensor, b[name], rtol=1e-5, atol=1e-7, msg=name)


def test_accumulated_micro_batches_give_the_update_of_one_batch_of_all_their_tokens() -> None:
    one_batch = gradients([joined(MICRO_BATCHES)])
    assert_same_gradients(gradients(MICRO_BATCHES), one_batch)  # --update-freq 4
    assert_same_gradients(gradients(MICRO_BATCHES[:2]), gradients([joined(MICRO_BATCHES[:2])]))  # --update-freq 2


@pytest.mark.skipif(not TORCHRUN.exists(), reason="no torchrun")
def test_two_gloo_processes_with_accumulation_match_one_batch(tmp_path: Path) -> None:
    worker = Path(__file__).with_name("accumulation_worker.py")
    out = tmp_path / "gradients.pt"
    command = [str(TORCHRUN), "--standalone", "--nproc_per_node=2", str(worker), str(out)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_same_gradients(torch.load(out), gradients([joined(MICRO_BATCHES)]))


def test_the_trainer_accumulates_and_records_its_precision(tmp_path: Path) -> None:
    def one_epoch(update_freq: int) -> tuple[dict[str, Any], int]:
        folder = train(
            options(tmp_path / str(update_freq), epochs=1, update_freq=update_freq, precision="fp32"),
            reverse_corpus(200, 0, "train"),
            reverse_corpus(10, 1, "val"),
        )
        optimizer = torch.load(folder / CHECKPOINT_DIR / "last.pt", weights_only=True)["optimizer"]
        adam_steps = {int(state["step"]) for state in optimizer["state"].values()}  # one count per parameter
        assert len(adam_steps) == 1
        return json.loads((folder / "training.json").read_text()), adam_steps.pop()

    record, adam_steps = one_epoch(2)
    assert record["options"]["update_freq"] == 2 and record["hardware"]["precision"] == "fp32"
    assert record["data"]["counts"]["train"]["kept"] == 200
    single, single_adam_steps = one_epoch(1)
    # The same epoch's batches, two to an update: half the optimizer's steps (an odd last batch is left out).
    assert single_adam_steps == single["steps"] > 2
    assert adam_steps == record["steps"] == single["steps"] // 2


def test_precision_auto_fp32_and_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.device("cpu")
    assert precision.resolve_precision("auto", cpu) == "fp32"  # on CPUs training stays fp32 unless asked
    assert precision.resolve_precision("fp32", cpu) == "fp32"
    monkeypatch.setattr(precision, "bf16_native", lambda device: True)
    assert precision.resolve_precision("bf16", cpu) == "bf16"
    monkeypatch.setattr(precision, "bf16_native", lambda device: False)
    with pytest.raises(ValueError, match=r"--precision bf16: this CPU .* has no native bf16 .* use --precision fp32"):
        precision.resolve_precision("bf16", cpu)
    with pytest.raises(ValueError, match="unknown precision 'fp16'"):
        precision.resolve_precision("fp16", cpu)

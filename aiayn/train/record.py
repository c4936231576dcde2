"""The training record of a model folder: training.json and a plot of its curves (training.png)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from aiayn.core.folder import ModelFolder
from aiayn.core.outputs import replacing, write_file


def write_record(folder: ModelFolder, record: dict[str, Any]) -> None:
    """Write the record atomically (fsynced) and redraw the plot from its per-epoch history."""
    write_file(folder.record_file, (json.dumps(record, indent=2) + "\n").encode())
    if record.get("epochs"):
        plot_history(record["epochs"], folder.plot_file)


def plot_history(epochs: list[dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display on servers
    import matplotlib.pyplot as plt

    x = [e["epoch"] for e in epochs]
    fig, (loss_ax, bleu_ax) = plt.subplots(1, 2, figsize=(10, 3.6))
    loss_ax.plot(x, [e["train_loss"] for e in epochs], label="train (label-smoothed)")
    loss_ax.plot(x, [e["val_loss"] for e in epochs], label="validation")
    loss_ax.set_xlabel("epoch")
    loss_ax.set_ylabel("cross-entropy per token")
    loss_ax.legend()
    bleu_ax.plot(x, [e["val_bleu"] for e in epochs], color="tab:green")
    bleu_ax.set_xlabel("epoch")
    bleu_ax.set_ylabel("validation BLEU (greedy)")
    fig.tight_layout()
    with replacing(path) as f:  # a temporary twin core/outputs.py knows
        fig.savefig(f, dpi=80, format="png")
    plt.close(fig)

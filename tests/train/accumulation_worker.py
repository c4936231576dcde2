"""One --update-freq 2 update in each of two torchrun processes (gloo): rank r accumulates micro-batches 2r, 2r + 1.

``torchrun --nproc_per_node=2 accumulation_worker.py OUT`` writes the synchronized gradients to OUT;
test_step.py compares them with one process's gradient of one batch holding all four micro-batches.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch import Tensor

from aiayn.core.config import ModelConfig
from aiayn.model.transformer import Transformer
from aiayn.train.loss import SmoothedLoss
from aiayn.train.step import accumulate_gradients

CONFIG = ModelConfig(vocab_size=50, d_model=16, n_heads=2, d_ff=32, n_encoder_layers=1, n_decoder_layers=1, dropout=0.0)
PAD = CONFIG.special_tokens.pad


def micro_batch(seed: int, rows: int) -> tuple[Tensor, Tensor, Tensor]:
    """Sentences of random lengths, right-padded: (rows, src_len), (rows, tgt_len) ×2."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 9, (rows, 2), generator=g)
    src = torch.full((rows, int(lengths[:, 0].max()) + 1), PAD)
    tgt_in = torch.full((rows, int(lengths[:, 1].max()) + 1), PAD)
    tgt_out = tgt_in.clone()
    for i, (s, t) in enumerate(lengths.tolist()):
        src[i, : s + 1] = torch.cat([torch.randint(4, CONFIG.vocab_size, (s,), generator=g), torch.tensor([3])])
        y = torch.randint(4, CONFIG.vocab_size, (t,), generator=g)
        tgt_in[i, : t + 1] = torch.cat([torch.tensor([2]), y])
        tgt_out[i, : t + 1] = torch.cat([y, torch.tensor([3])])
    return src, tgt_in, tgt_out


MICRO_BATCHES = [micro_batch(seed, rows) for seed, rows in enumerate((3, 5, 2, 4))]


def joined(batches: list[tuple[Tensor, Tensor, Tensor]]) -> tuple[Tensor, ...]:
    """One batch holding every sentence of ``batches``, padded to the longest."""

    def cat(parts: list[Tensor]) -> Tensor:
        width = max(p.size(1) for p in parts)
        return torch.cat([torch.nn.functional.pad(p, (0, width - p.size(1)), value=PAD) for p in parts])

    return tuple(cat([b[k] for b in batches]) for k in range(3))


def gradients(batches: list[tuple[Tensor, ...]], distributed: bool = False) -> dict[str, Tensor]:
    """The gradient of one update: a fresh model (seed 0) and ``batches`` accumulated; name → tensor."""
    torch.manual_seed(0)
    model = Transformer(CONFIG)
    objective: torch.nn.Module = SmoothedLoss(model, 0.1)
    if distributed:
        objective = torch.nn.parallel.DistributedDataParallel(objective)
    accumulate_gradients(objective, batches, PAD, "fp32")  # type: ignore[arg-type]
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def main(out: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    grads = gradients(MICRO_BATCHES[2 * rank : 2 * rank + 2], distributed=True)
    if rank == 0:
        torch.save(grads, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])

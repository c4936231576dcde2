"""One optimizer update from ``--update-freq`` micro-batches, in one process or under DDP.

Each micro-batch's loss is a sum over its real target tokens (``loss.SmoothedLoss``); it is divided by the
token count of the whole update (every micro-batch of every process) before its backward, so that N
accumulated micro-batches give the gradient of one batch holding all their tokens (fairseq sums, then
normalizes the same way). DDP averages gradients over the processes, so each loss is also multiplied by
their number; only the last micro-batch's backward communicates (``no_sync`` before it). §5.1's 25 000
source and target tokens a step on 8 GPUs become reachable on fewer devices this way.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from aiayn.train.precision import autocast

Batch = tuple[Tensor, Tensor, Tensor]  # source ids, decoder input, target: (batch, src_len), (batch, tgt_len) ×2


def update_tokens(micro_batches: list[Batch], pad_id: int) -> tuple[int, float]:
    """Real target tokens of this process's micro-batches, and of the whole update (all processes)."""
    tokens = sum(int((tgt_out != pad_id).sum()) for _, _, tgt_out in micro_batches)
    if not (dist.is_available() and dist.is_initialized()):
        return tokens, float(tokens)
    total = torch.tensor(float(tokens), dtype=torch.float64, device=micro_batches[0][0].device)
    dist.all_reduce(total)
    return tokens, float(total.item())


def no_sync_unless_last(objective: nn.Module, last: bool) -> AbstractContextManager[Any]:
    if last or not isinstance(objective, DistributedDataParallel):
        return nullcontext()
    return objective.no_sync()


def accumulate_gradients(
    objective: nn.Module, micro_batches: list[Batch], pad_id: int, precision: str
) -> tuple[Tensor, int]:
    """Backward of the update's mean loss per token, micro-batch by micro-batch; returns this process's
    summed loss (a detached scalar, so no host sync per micro-batch) and its token count."""
    tokens, total_tokens = update_tokens(micro_batches, pad_id)
    processes = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    scale = processes / total_tokens  # DDP divides the summed gradients by the number of processes
    device = micro_batches[0][0].device
    loss_sum = torch.zeros((), device=device)
    for i, (src_ids, tgt_in, tgt_out) in enumerate(micro_batches):
        with no_sync_unless_last(objective, i == len(micro_batches) - 1):
            with autocast(precision, device):
                summed = objective(src_ids, tgt_in, tgt_out)
            (summed * scale).backward()
        loss_sum += summed.detach().float()
    return loss_sum, tokens

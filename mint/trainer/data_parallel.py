"""Data parallelism on a worker group: the rows of a pass split over the group's ranks.

Every rank of a worker group (`mint.trainer.group`) holds a shard of the base and receives the
whole of each call. A `forward` or `forward_backward` pass (`score_split`) runs each rank's share
of the rows only: a contiguous run of the pass's data end to end (`RowShare`), as even as the
losses allow, which every rank computes alike from the same data. N ranks each run about 1/N of
the rows, and the numbers are one process's up to float rounding:

- Losses are sums over data (`mint.trainer.losses`), so the whole batch's loss is the sum of the
  ranks' losses: each rank backpropagates the loss of its own rows. The data one term of a loss
  reads together (DPO's chosen and rejected pair, `Loss.data_per_term`) stay on one rank.
- LoRA adapters are replicated: after the backward, each rank's gradient of its rows is summed
  over the ranks (one all_reduce of the pass's adapters) and added to what the adapters had
  accumulated before the pass, so every rank holds one process's gradient and takes the same
  optimizer step. Sharded weights (full-parameter training) are FSDP2's: their gradients are
  reduce-scattered, summed rather than averaged (`summing_sharded_gradients`).
- The logprobs of the rows (and the reference logprobs a rank computed for DPO) are
  all-gathered, so every rank holds the whole batch's; the loss and metrics a pass reports (means
  over tokens or pairs, clip fractions) are computed from them on the whole batch, as one process
  computes them, before any backward: a loss that refuses its input refuses it on every rank.
- FSDP2 runs collectives at every call of a sharded module, so every rank's pass makes the same
  calls: the pass's shape (`packing.PassShape`: one decoder call or a prefix and a suffix pass, a
  large pass or not, how many head chunks) is agreed by a small all_reduce, and a rank without
  rows (fewer rows than ranks) runs one stand-in token whose loss is 0 times its logprob.

Sampling is not split: decoding steps are forwards too, and ranks whose requests stop at
different steps would make different numbers of them, so every rank decodes the whole batch.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from mint.trainer.group import Group
from mint.trainer.packing import PassShape, lockstep
from mint.trainer.scoring import ReferenceFn, RunningFn, ScoreRequest, loss_inputs, parts_logprobs, spans_of
from mint.trainer.types import Datum, ForwardOutput

# What a rank without rows runs, so that its pass makes the collectives the others make: one
# token (id 0, which every vocabulary has), its loss 0.
STAND_IN = Datum(model_input=[0], loss_fn_inputs={"target_tokens": [0]})


@dataclass(frozen=True)
class RowShare:
    """Which rows of a pass each rank runs: rank r the rows [bounds[r], bounds[r + 1]) of the
    parts' data end to end."""

    bounds: tuple[int, ...]

    @classmethod
    def of(cls, parts: Sequence[ScoreRequest], ranks: int) -> RowShare:
        """Cut the rows into `ranks` contiguous runs as near equal as the cut points allow (never
        inside a term of a loss: `Loss.data_per_term`); where the rows do not divide evenly, the
        earlier ranks take one more."""
        cuts, start = [0], 0
        for part in parts:
            step = part.loss.data_per_term if part.loss is not None else 1
            cuts += [start + offset for offset in range(step, len(part.data), step)] + [start + len(part.data)]
            start += len(part.data)
        each, extra = divmod(start, ranks)
        bounds = [0]
        for rank in range(1, ranks):
            target = rank * each + min(rank, extra)  # where the cut falls with no term to keep whole
            bounds.append(min((cut for cut in cuts if cut >= bounds[-1]), key=lambda cut: (abs(cut - target), -cut)))
        return cls((*bounds, start))

    def rows(self, rank: int) -> range:
        return range(self.bounds[rank], self.bounds[rank + 1])

    def local(self, parts: Sequence[ScoreRequest], rank: int) -> list[list[Datum]]:
        """Each part's data that `rank` runs (perhaps none), in order."""
        low, high = self.bounds[rank], self.bounds[rank + 1]
        local, start = [], 0
        for part in parts:
            stop = start + len(part.data)
            local.append(part.data[max(low, start) - start : max(min(high, stop), start) - start])
            start = stop
        return local


def _numel(datum: Datum) -> int:
    """How many logprobs a datum has: one per position, or K per position for (N, K) targets."""
    return datum.length * (datum.targets_per_position or 1)


def agree(device: torch.device, shape: PassShape) -> PassShape:
    """The shape every rank's pass takes (`packing.lockstep`): two decoder passes only where every
    rank would take them, a large pass where any would, and the most head chunks any would run."""
    votes = torch.tensor([int(not shape.two_passes), int(shape.large), shape.head_chunks], device=device)
    dist.all_reduce(votes, op=dist.ReduceOp.MAX)
    one_pass, large, head_chunks = votes.tolist()
    return PassShape(two_passes=not one_pass, large=bool(large), head_chunks=int(head_chunks))


def score_split(
    group: Group,
    model: nn.Module,
    parts: Sequence[ScoreRequest],
    *,
    backward: bool,
    reference: ReferenceFn,
    running: RunningFn,
    share_prefixes: bool,
    replicated: Sequence[nn.Parameter],
) -> list[ForwardOutput]:
    """`scoring.score_parts` with the rows split over `group`'s ranks (see the module doc); every
    rank calls it with the same parts and gets one process's outputs. `replicated` are the
    parameters that get gradients and are whole on every rank (LoRA adapters), summed over the
    ranks after the backward."""
    share = RowShare.of(parts, group.world_size)
    local = share.local(parts, group.rank)
    stand_in = not any(local)
    rows = [[STAND_IN], *([] for _ in parts[1:])] if stand_in else local  # what this rank's pass runs
    device = model.get_input_embeddings().weight.device
    trains = backward and any(part.loss is not None for part in parts)
    with lockstep(functools.partial(agree, device)):
        local_refs = _local_references(parts, local, reference)
        with torch.set_grad_enabled(backward), running(spans_of([len(data) for data in rows])) as mixed:
            local_logprobs = parts_logprobs(model, rows, mixed, share_prefixes)
            logprobs, refs = _gathered(group, share, parts, [] if stand_in else local_logprobs, local_refs, device)
            with torch.no_grad():  # the whole batch's numbers, on every rank alike
                metrics = [
                    part.outputs(part_logprobs, loss_inputs(part.data, part_refs, device))[1]
                    for part, part_logprobs, part_refs in zip(parts, logprobs, refs, strict=True)
                ]
            if trains:
                earlier = [parameter.grad for parameter in replicated]
                for parameter in replicated:  # the pass's own gradients, apart, to sum over the ranks
                    parameter.grad = None
                _local_loss(parts, local, local_logprobs, local_refs, device).backward()
        if trains:
            _sum_over_ranks(replicated, earlier)
    return [
        ForwardOutput(logprobs=[lp.cpu().tolist() for lp in part_logprobs], metrics=part_metrics)
        for part_logprobs, part_metrics in zip(logprobs, metrics, strict=True)
    ]


def _local_loss(
    parts: Sequence[ScoreRequest],
    local: list[list[Datum]],
    local_logprobs: list[list[torch.Tensor]],
    local_refs: list[list[torch.Tensor] | None],
    device: torch.device,
) -> torch.Tensor:
    """The loss of this rank's rows: each part's loss over its rows here, summed. A rank without
    rows gets 0 times its stand-in's logprob: a backward through every layer all the same, whose
    gradients are 0."""
    values = [
        part.loss.fn(part_logprobs, loss_inputs(data, refs, device), part.config)[0]
        for part, data, part_logprobs, refs in zip(parts, local, local_logprobs, local_refs, strict=True)
        if part.loss is not None and data
    ]
    if not values:
        values = [0.0 * torch.cat([lp.reshape(-1) for part_logprobs in local_logprobs for lp in part_logprobs]).sum()]
    return torch.stack(values).sum()


def _local_references(
    parts: Sequence[ScoreRequest], local: list[list[Datum]], reference: ReferenceFn
) -> list[list[torch.Tensor] | None]:
    """The reference logprobs of this rank's rows of the parts that need them (None for the
    other parts), from ONE reference pass, which every rank runs where any part needs one (a rank
    without such rows runs it on the stand-in)."""
    needing = [part.needs_reference for part in parts]
    if not any(needing):
        return [None] * len(parts)
    data = [datum for rows, needs in zip(local, needing, strict=True) if needs for datum in rows]
    refs = reference(data or [STAND_IN])
    found: list[list[torch.Tensor] | None] = []
    start = 0
    for rows, needs in zip(local, needing, strict=True):
        found.append(refs[start : start + len(rows)] if needs else None)
        start += len(rows) if needs else 0
    return found


def _gathered(
    group: Group,
    share: RowShare,
    parts: Sequence[ScoreRequest],
    local_logprobs: list[list[torch.Tensor]],
    local_refs: list[list[torch.Tensor] | None],
    device: torch.device,
) -> tuple[list[list[torch.Tensor]], list[list[torch.Tensor] | None]]:
    """Every part's logprobs of the whole batch, and the reference logprobs computed for it (None
    for a part that needs none), detached, from every rank's own (`local_logprobs` empty on a rank
    that ran the stand-in): one all_gather of each rank's numbers end to end, padded to the
    longest. Every rank knows from the data how many numbers each one sends, and whose they are."""
    rows = [(index, datum) for index, part in enumerate(parts) for datum in part.data]
    referenced = [refs is not None for refs in local_refs]
    # Each rank's numbers: its rows' logprobs, then the reference logprobs of those that have them.
    layouts = [
        [(row, False) for row in share.rows(rank)]
        + [(row, True) for row in share.rows(rank) if referenced[rows[row][0]]]
        for rank in range(group.world_size)
    ]
    sizes = [[_numel(rows[row][1]) for row, _ in layout] for layout in layouts]
    mine = [lp.detach().float().reshape(-1) for data in local_logprobs for lp in data]
    mine += [ref.float().reshape(-1) for refs in local_refs if refs for ref in refs]
    flat = torch.cat(mine) if mine else torch.zeros(0, device=device)
    width = max(sum(counts) for counts in sizes)
    every = [torch.empty(width, device=flat.device) for _ in range(group.world_size)]
    dist.all_gather(every, torch.nn.functional.pad(flat, (0, width - flat.numel())))
    logprobs: list[list[torch.Tensor]] = [[] for _ in parts]
    refs: list[list[torch.Tensor] | None] = [[] if wanted else None for wanted in referenced]
    for layout, counts, numbers in zip(layouts, sizes, every, strict=True):
        for (row, is_reference), piece in zip(layout, numbers[: sum(counts)].split(counts), strict=True):
            index, datum = rows[row]
            shaped = piece.view(datum.length, -1) if datum.targets_per_position else piece
            (refs[index] if is_reference else logprobs[index]).append(shaped)  # type: ignore[union-attr]
    return logprobs, refs


def _sum_over_ranks(replicated: Sequence[nn.Parameter], earlier: Sequence[torch.Tensor | None]) -> None:
    """Sum the gradients the pass gave `replicated` on each rank (one all_reduce), and add them to
    what each had accumulated before the pass (`earlier`). A parameter that got a gradient on no
    rank keeps what it had (None stays None, as in one process)."""
    if not replicated:
        return
    device = replicated[0].device
    got = torch.tensor([parameter.grad is not None for parameter in replicated], dtype=torch.float32, device=device)
    grads = [
        (parameter.grad if parameter.grad is not None else torch.zeros_like(parameter)).reshape(-1).float()
        for parameter in replicated
    ]
    flat = torch.cat([got, *grads])
    dist.all_reduce(flat)
    summed = flat[len(replicated) :].split([parameter.numel() for parameter in replicated])
    for parameter, before, anywhere, grad in zip(
        replicated, earlier, flat[: len(replicated)].tolist(), summed, strict=True
    ):
        if not anywhere:
            parameter.grad = before
            continue
        grad = grad.view_as(parameter).to(parameter.dtype)
        parameter.grad = grad if before is None else before + grad


def replicated_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The parameters of `model` that train and are whole on every rank (not FSDP2's shards):
    their gradients are summed over the ranks by `score_split`."""
    from torch.distributed.tensor import DTensor

    return [p for p in model.parameters() if p.requires_grad and not isinstance(p, DTensor)]


def summing_sharded_gradients(model: nn.Module) -> None:
    """Make FSDP2 sum `model`'s sharded gradients over the ranks instead of averaging them (its
    default, right where every rank runs the whole batch): with the rows split, each rank's
    gradient is of its own rows' loss, and the batch's gradient is their sum."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # a plain SUM on every backend (gloo too)

"""A worker group: one base sharded with FSDP2 over the ranks of a torch.distributed group.

A base that does not fit one device is held by N processes (`mint worker --base B --nproc N`,
launched by torchrun's elastic agent). Each rank holds 1/N of the base's weights
(`fully_shard` on every decoder layer, the embeddings and the LM head); a forward pass
all-gathers one layer at a time. LoRA adapters are small and replicated: every rank holds the
whole adapter and its Adam moments, and computes the same update.

Rank 0 is an ordinary Mint worker: it consumes the broker's queues, speaks to the database and
the object store, and runs jobs, evals and Tinker models unchanged. The other ranks own no
state of their own: they follow rank 0's commands. Every `ResidentBase` / `TrainingSession`
method that runs the model or changes an adapter is `mirrored`: on rank 0 it first sends its
name and arguments to the followers (pickled over the group's gloo channel, sessions by id,
tensors by value, so followers need no shared filesystem), then runs locally; followers run
the same call. Calls are sent and run under the base's lock, so every rank runs the same
collectives in the same order. Randomness a call would draw (sampling seeds, session ids,
LoRA init seeds) is drawn on rank 0 before the call is sent.

A rank that dies takes the group down: the collective it was part of fails on every other
rank, which then exits (`GROUP_LOST_EXIT`) without touching the job it was running. The
agent stops the rest; the job's lease lapses and the reconciler queues it again, to resume
from its last checkpoint on a group or on a single worker.
"""

from __future__ import annotations

import functools
import io
import logging
import os
import pickle
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, ParamSpec, Protocol, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from mint.errors import MintError

log = logging.getLogger(__name__)

# The exit status of a rank whose group lost a member: the agent sees a failed worker and tears
# the group down (or restarts it, with --max-restarts).
GROUP_LOST_EXIT = 75
# Followers wait for rank 0's next command for as long as the group lives: an idle worker
# receives nothing for hours.
COMMAND_TIMEOUT = timedelta(days=30)
_STOP = "__stop__"

P = ParamSpec("P")
R = TypeVar("R")


class Mirrorable(Protocol):
    """What a mirrored method's owner provides: the group it runs on and its base's lock."""

    def _group_and_lock(self) -> tuple[Group | None, threading.RLock]: ...


@dataclass
class Group:
    """This process's place in a worker group, and the channel rank 0 sends commands on."""

    rank: int
    world_size: int
    device: torch.device
    commands: Any  # the gloo process group for commands (CPU bytes even when the model is on NCCL)
    mesh: Any  # the 1-D device mesh FSDP2 shards over: every rank of the group

    def __post_init__(self) -> None:
        self._local = threading.local()

    @classmethod
    def join(cls) -> Group:
        """Join the group torchrun started (RANK, WORLD_SIZE, MASTER_ADDR/PORT in the environment):
        NCCL on the rank's GPU where there is one, gloo on CPU otherwise."""
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if torch.cuda.is_available():
            device = torch.device("cuda", local_rank)
            torch.cuda.set_device(device)
            backend = "nccl"
        else:
            device = torch.device("cpu")
            backend = "gloo"
        from torch.distributed.device_mesh import init_device_mesh

        dist.init_process_group(backend, timeout=timedelta(minutes=30))
        commands = dist.new_group(backend="gloo", timeout=COMMAND_TIMEOUT)
        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        return cls(dist.get_rank(), dist.get_world_size(), device, commands, mesh)

    @property
    def leading(self) -> bool:
        """Rank 0: the rank that runs the worker and sends commands."""
        return self.rank == 0

    # ---- the model ----------------------------------------------------------------------

    def shard(self, model: nn.Module) -> nn.Module:
        """Shard `model`'s weights over the group with FSDP2: every decoder layer, then the rest of
        the decoder (embeddings, final norm) and the LM head, each a unit of its own (the PEFT
        wrapper calls the decoder's forward directly, so the outer model gets no unit). Weights
        loaded in host memory move to this rank's device as they are sharded: the device only
        ever holds this rank's share. Local to this rank (no collective)."""
        from torch.distributed.fsdp import fully_shard

        mesh = self.mesh
        decoder = model.get_decoder()
        layers = getattr(decoder, "layers", None)
        if layers is None:
            raise ValueError(f"{type(model).__name__} has no decoder.layers to shard")
        for layer in layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(decoder, mesh=mesh)
        head = model.get_output_embeddings()
        if head is not None and not any(head is module for module in decoder.modules()):
            fully_shard(head, mesh=mesh)
        return model

    # ---- commands -----------------------------------------------------------------------

    @contextmanager
    def running_command(self) -> Iterator[None]:
        """While a mirrored call runs, the mirrored calls it makes are part of it: not sent again."""
        depth = getattr(self._local, "depth", 0)
        self._local.depth = depth + 1
        try:
            yield
        finally:
            self._local.depth = depth

    @property
    def in_command(self) -> bool:
        return getattr(self._local, "depth", 0) > 0

    def send(self, message: Any) -> None:
        """Rank 0: broadcast one pickled message to the followers."""
        buffer = io.BytesIO()
        _Pickler(buffer).dump(message)
        payload = torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)
        self._broadcast(torch.tensor([payload.numel()], dtype=torch.int64))
        self._broadcast(payload)

    def receive(self, resolve: Callable[[tuple[str, ...]], Any]) -> Any:
        """A follower: the next message from rank 0, its object references resolved by `resolve`."""
        size = torch.zeros(1, dtype=torch.int64)
        self._broadcast(size)
        payload = torch.empty(int(size.item()), dtype=torch.uint8)
        self._broadcast(payload)
        return _Unpickler(io.BytesIO(payload.numpy().tobytes()), resolve).load()

    def _broadcast(self, tensor: torch.Tensor) -> None:
        try:
            dist.broadcast(tensor, src=0, group=self.commands)
        except Exception as exc:  # a peer is gone: the group cannot go on
            self.abandon(exc)

    def in_turn(self) -> Iterator[int]:
        """Yield once on each rank, one rank after another (rank 0 first), so that what each does
        then (loading a whole base into host memory before sharding it) never overlaps."""
        for turn in range(self.world_size):
            if turn == self.rank:
                yield turn
            dist.barrier()

    def stop(self) -> None:
        """Rank 0, at shutdown: tell the followers to exit."""
        if self.leading and self.world_size > 1:
            self.send((_STOP, None, (), {}))

    def follow(self, resolve: Callable[[tuple[str, ...]], Any]) -> None:
        """A follower's life: run rank 0's commands until it says stop. An error rank 0 would also
        have met (bad input) is skipped, as rank 0 reports it; any other leaves the group."""
        while True:
            try:
                name, target, args, kwargs = self.receive(resolve)
            except MintError:  # the call names a session closed here and on rank 0, which reports it
                continue
            if name == _STOP:
                return
            with self.running_command():
                try:
                    getattr(target, name)(*args, **kwargs)
                except MintError:
                    continue
                except Exception as exc:
                    self.abandon(exc)

    def abandon(self, error: BaseException) -> None:
        """Leave at once: a collective failed or this rank diverged, so no command can run on the
        group again. Nothing is written: the job this rank ran is left to its lease."""
        log.error("worker group rank %d of %d stops: %s", self.rank, self.world_size, error)
        logging.shutdown()
        os._exit(GROUP_LOST_EXIT)


def lost_a_member(error: BaseException) -> bool:
    """Whether `error` came from a collective whose peer is gone (rather than from bad input)."""
    if isinstance(error, dist.DistError):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and any(
        mark in text for mark in ("gloo", "Gloo", "NCCL", "Connection closed", "Connection reset", "Broken pipe")
    )


def mirrored(method: Callable[P, R]) -> Callable[P, R]:
    """Run `method` on every rank of the owner's group: rank 0 sends it, then runs it (see module doc)."""

    @functools.wraps(method)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        owner: Mirrorable = args[0]  # type: ignore[assignment]
        group, lock = owner._group_and_lock()
        if group is None or not group.leading or group.in_command:
            return method(*args, **kwargs)
        with lock:
            group.send((method.__name__, owner, args[1:], kwargs))
            with group.running_command():
                try:
                    return method(*args, **kwargs)
                except Exception as exc:
                    if lost_a_member(exc):
                        group.abandon(exc)
                    raise

    return run


class _Pickler(pickle.Pickler):
    """Pickles a base or session as a reference (`_mirror_ref`), which each follower resolves to its own."""

    def persistent_id(self, obj: Any) -> Any:
        ref = getattr(obj, "_mirror_ref", None)
        return ref() if callable(ref) and not isinstance(obj, type) else None


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, resolve: Callable[[tuple[str, ...]], Any]) -> None:
        super().__init__(file)
        self._resolve = resolve

    def persistent_load(self, pid: Any) -> Any:
        return self._resolve(tuple(pid))

"""A worker group: one base sharded with FSDP2 over the ranks of a torch.distributed group.

A base that does not fit one device is held by N processes (`mint worker --base B --nproc N`,
launched by torchrun's elastic agent). Each rank holds 1/N of the base's weights
(`fully_shard` on every decoder layer, the embeddings and the LM head); a forward pass
all-gathers one layer at a time. LoRA adapters are small and replicated: every rank holds the
whole adapter and its Adam moments, and computes the same update.

The ranks also split the work: a `forward` or `forward_backward` runs each rank's share of the
batch's rows, its gradients summed over the ranks (an all_reduce of the replicated adapters,
FSDP2's reduce-scatter of sharded weights) and its logprobs gathered, so that every rank ends
the call with one process's gradients and outputs (`mint.trainer.data_parallel`). Decoding is
not split: every rank samples the whole batch.

Each rank builds the model on the meta device, shards it, and reads only its own rows of each
weight from the base's safetensors files (`mint.trainer.sharded_loading`): no host ever holds
the whole base, so one larger than a host's memory loads.

Rank 0 is an ordinary Mint worker: it consumes the broker's queues, speaks to the database and
the object store, and runs jobs, evals and Tinker models unchanged. The other ranks own no
state of their own: they follow rank 0's commands. Every `ResidentBase` / `TrainingSession`
method that runs the model or changes an adapter is `mirrored`: on rank 0 it first sends its
name and arguments to the followers (pickled over the group's gloo channel, sessions by id,
tensors by value, so followers need no shared filesystem), then runs locally; followers run
the same call. Calls are sent and run under the base's lock, so every rank runs the same
collectives in the same order. Randomness a call would draw (sampling seeds, session ids,
LoRA init seeds) is drawn on rank 0 before the call is sent.

The command channel is torch.distributed's, which authenticates no one: whatever reaches the
group's ports (MASTER_PORT and the gloo connections) can put bytes on it, so those ports belong
on a network only the group's hosts share. A follower still never unpickles what it is sent
blindly (`decode_command`): the only globals a command may name are Mint's own call types
(`COMMAND_TYPES`), tensors travel as typed bytes (dtype, shape, raw data) rather than through
torch's pickling (whose storages call `torch.load` on nested pickles), losses by their registry
name, bases and sessions by reference, and the method called must be one that is `mirrored`.
Anything else is refused (`ForbiddenCommand`) before any of it runs, and the follower leaves
the group: it can no longer be in step with rank 0.

A rank that dies takes the group down: the collective it was part of fails on every other
rank, which then exits (`GROUP_LOST_EXIT`) without touching the job it was running. The
agent stops the rest; the job's lease lapses and the reconciler queues it again, to resume
from its last checkpoint on a group or on a single worker.
"""

from __future__ import annotations

import functools
import io
import logging
import math
import os
import pickle
import threading
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, ParamSpec, Protocol, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from mint.errors import MintError
from mint.trainer.losses import LOSSES, Loss, get_loss

log = logging.getLogger(__name__)

# The exit status of a rank whose group lost a member: the agent sees a failed worker and tears
# the group down (or restarts it, with --max-restarts).
GROUP_LOST_EXIT = 75
# Followers wait for rank 0's next command for as long as the group lives: an idle worker
# receives nothing for hours.
COMMAND_TIMEOUT = timedelta(days=30)
_STOP = "__stop__"
# The pickle protocol of commands: every rank runs the same Python, so the newest is fine.
COMMAND_PROTOCOL = 5

# The globals a command may name: the types of the mirrored calls' arguments (pydantic models and
# dataclasses, rebuilt field by field, never by running code of the sender's choosing) and the
# default `train_mode` of `ResidentBase._score`. Builtin containers, numbers, strings and bytes
# need none. A new mirrored call whose arguments have a new type adds it here; a test runs every
# real call through `encode_command` / `decode_command`.
COMMAND_TYPES: frozenset[tuple[str, str]] = frozenset(
    {
        ("contextlib", "nullcontext"),
        ("mint.trainer.prompt_scores", "PromptQuery"),
        ("mint.trainer.sampling", "Decoding"),
        ("mint.trainer.sampling", "StopRule"),
        ("mint.trainer.scoring", "ScoreRequest"),
        ("mint.trainer.training_session", "BackwardCall"),
        ("mint.trainer.types", "AdamParams"),
        ("mint.trainer.types", "Datum"),
        ("mint.trainer.types", "LoraOptions"),
        ("mint.trainer.types", "SampleRequest"),
        ("mint.trainer.types", "SamplingParams"),
    }
)
# Methods of a base or session that may travel as a value (a bound method, by reference): the
# LoRA-dropout context `ResidentBase._score` runs a session's pass in.
REFERABLE_METHODS = frozenset({"_lora_dropout"})
# The names of `mirrored` methods: the only ones a follower calls (filled by the decorator).
MIRRORED_METHODS: set[str] = set()

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
        wrapper calls the decoder's forward directly, so the outer model gets no unit). FSDP2
        splits dim 0 of every parameter over the ranks. Weights loaded in host memory move to this
        rank's device as they are sharded: the device only ever holds this rank's share. A model
        on the meta device stays there, for `sharded_loading` to allocate and fill this rank's
        shards alone. A head tied to the input embeddings becomes a parameter of its own, each
        rank holding its rows. Local to this rank (no collective)."""
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
        """Rank 0: broadcast one command (`encode_command`) to the followers."""
        payload = torch.frombuffer(bytearray(encode_command(message)), dtype=torch.uint8)
        self._broadcast(torch.tensor([payload.numel()], dtype=torch.int64))
        self._broadcast(payload)

    def receive(self, resolve: Callable[[tuple[str, ...]], Any]) -> Any:
        """A follower: the next command from rank 0 (`decode_command`), its base and session
        references resolved by `resolve`."""
        size = torch.zeros(1, dtype=torch.int64)
        self._broadcast(size)
        payload = torch.empty(int(size.item()), dtype=torch.uint8)
        self._broadcast(payload)
        return decode_command(payload.numpy().tobytes(), resolve)

    def _broadcast(self, tensor: torch.Tensor) -> None:
        try:
            dist.broadcast(tensor, src=0, group=self.commands)
        except Exception as exc:  # a peer is gone: the group cannot go on
            self.abandon(exc)

    def in_turn(self) -> Iterator[int]:
        """Yield once on each rank, one rank after another (rank 0 first), so that what each does
        then (pulling the base into its cache, `sharded_loading`) never overlaps."""
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
            except ForbiddenCommand as exc:  # not a command rank 0 sends: this rank is out of step
                self.abandon(exc)
                return
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
    MIRRORED_METHODS.add(method.__name__)

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


# ---- the wire form of commands ------------------------------------------------------------


class ForbiddenCommand(pickle.UnpicklingError):
    """A command that names something other than Mint's call types, a mirrored method or a
    known reference: not something rank 0 sends, so it is refused before any of it runs."""


def encode_command(message: Any) -> bytes:
    """The bytes of one command (`(method name, target, args, kwargs)`) as followers decode it."""
    buffer = io.BytesIO()
    _CommandPickler(buffer, protocol=COMMAND_PROTOCOL).dump(message)
    return buffer.getvalue()


def decode_command(payload: bytes, resolve: Callable[[tuple[str, ...]], Any]) -> Any:
    """The command `payload` holds, with its base and session references resolved by `resolve`;
    ForbiddenCommand if it names a global outside `COMMAND_TYPES`, a method that is not
    mirrored, or a reference of an unknown kind. Nothing the payload names runs before then."""
    try:
        message = _CommandUnpickler(io.BytesIO(payload), resolve).load()
    except (MintError, ForbiddenCommand):
        raise
    except Exception as exc:  # truncated or garbled bytes, or fields its types refuse
        raise ForbiddenCommand(f"a worker group command cannot be read ({exc}); refused") from exc
    if not (isinstance(message, tuple) and len(message) == 4 and isinstance(message[0], str)):
        raise ForbiddenCommand("a worker group command is (method name, target, args, kwargs); refused")
    name, _, args, kwargs = message
    if name != _STOP and name not in MIRRORED_METHODS:
        raise ForbiddenCommand(f"a worker group command calls {name!r}, which is not a mirrored method; refused")
    if not (isinstance(args, tuple) and isinstance(kwargs, dict)):
        raise ForbiddenCommand("a worker group command's arguments are a tuple and a dict; refused")
    return message


def _tensor_reference(tensor: torch.Tensor) -> tuple[Any, ...]:
    """A tensor as typed bytes: its dtype's name, shape, raw data, device type and grad flag."""
    data = tensor.detach().to("cpu").contiguous().reshape(-1)
    raw = data.view(torch.uint8).numpy().tobytes() if data.numel() else b""
    dtype = str(tensor.dtype).removeprefix("torch.")
    return ("tensor", dtype, tuple(tensor.shape), raw, tensor.device.type, tensor.requires_grad)


def _tensor_of(dtype_name: Any, shape: Any, raw: Any, device_type: Any, requires_grad: Any) -> torch.Tensor:
    """The tensor `_tensor_reference` described, after checking every field of the description."""
    dtype = getattr(torch, dtype_name, None) if isinstance(dtype_name, str) else None
    if not isinstance(dtype, torch.dtype):
        raise ForbiddenCommand(f"a worker group command holds a tensor of unknown dtype {dtype_name!r}; refused")
    if not (isinstance(shape, tuple) and all(isinstance(size, int) and size >= 0 for size in shape)):
        raise ForbiddenCommand("a worker group command holds a tensor with a malformed shape; refused")
    element_bytes = torch.empty((), dtype=dtype).element_size()
    if not isinstance(raw, bytes) or len(raw) != math.prod(shape) * element_bytes:
        raise ForbiddenCommand("a worker group command holds a tensor whose bytes do not match its shape; refused")
    if device_type not in ("cpu", "cuda") or not isinstance(requires_grad, bool):
        raise ForbiddenCommand("a worker group command holds a tensor with a malformed device or grad flag; refused")
    if raw:
        tensor = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(shape)
    else:
        tensor = torch.empty(shape, dtype=dtype)
    if device_type == "cuda":  # this rank's own device (rank 0's index means another GPU here)
        tensor = tensor.to(torch.device("cuda", torch.cuda.current_device()))
    return tensor.requires_grad_(requires_grad) if requires_grad else tensor


class _CommandPickler(pickle.Pickler):
    """Pickles a command: bases and sessions as references (`_mirror_ref`), which each follower
    resolves to its own; tensors as typed bytes; losses by their registry name; a base's or
    session's method in `REFERABLE_METHODS` as its owner's reference and its name."""

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            return _tensor_reference(obj)
        if isinstance(obj, Loss):
            if LOSSES.get(obj.name) is not obj:  # followers look it up by name: it must be the registry's
                raise pickle.PicklingError(f"loss {obj.name!r} is not the registered loss of that name")
            return ("loss", obj.name)
        if isinstance(obj, types.MethodType) and obj.__name__ in REFERABLE_METHODS:
            owner_ref = getattr(obj.__self__, "_mirror_ref", None)
            if callable(owner_ref):
                return ("method", tuple(owner_ref()), obj.__name__)
        ref = getattr(obj, "_mirror_ref", None)
        if callable(ref) and not isinstance(obj, type):
            return ("object", tuple(ref()))
        return None


class _CommandUnpickler(pickle.Unpickler):
    """Unpickles a command: globals only from `COMMAND_TYPES`, references only of the kinds
    `_CommandPickler` writes."""

    def __init__(self, file: io.BytesIO, resolve: Callable[[tuple[str, ...]], Any]) -> None:
        super().__init__(file)
        self._resolve = resolve

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in COMMAND_TYPES:
            raise ForbiddenCommand(
                f"a worker group command names {module}.{name}, which is not one of Mint's call types; refused"
            )
        return super().find_class(module, name)

    def persistent_load(self, pid: Any) -> Any:
        kind = pid[0] if isinstance(pid, tuple) and pid else None
        if kind == "object" and len(pid) == 2 and _is_reference(pid[1]):
            return self._resolved(pid[1])
        if kind == "method" and len(pid) == 3 and _is_reference(pid[1]) and pid[2] in REFERABLE_METHODS:
            return getattr(self._resolved(pid[1]), pid[2])
        if kind == "tensor" and len(pid) == 6:
            return _tensor_of(*pid[1:])
        if kind == "loss" and len(pid) == 2 and isinstance(pid[1], str):
            try:
                return get_loss(pid[1])
            except MintError:
                raise ForbiddenCommand(f"a worker group command names unknown loss {pid[1]!r}; refused") from None
        raise ForbiddenCommand(f"a worker group command holds a reference of unknown kind {kind!r}; refused")

    def _resolved(self, ref: tuple[str, ...]) -> Any:
        """The base or session `ref` names here; MintError (a session closed) passes through."""
        try:
            return self._resolve(ref)
        except MintError:
            raise
        except Exception as exc:
            message = f"a worker group command names {ref!r}, which is no base or session here; refused"
            raise ForbiddenCommand(message) from exc


def _is_reference(ref: Any) -> bool:
    """Whether `ref` is a base or session reference as `_mirror_ref` makes them: a tuple of strings."""
    return isinstance(ref, tuple) and bool(ref) and all(isinstance(part, str) for part in ref)

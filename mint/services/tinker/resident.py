"""What a worker process holds for Tinker: its models, its sampler adapters and the tokenizers it exported.

A model lives in ONE worker process's memory (`mint.services.tinker.models`): this process keeps
its LoRA session (weights and optimizer state) in `held.models` until it is released
(`release_model`). Sampler adapters are loaded on any worker of their base, fetched from the
object store by key, and each worker keeps a few of them per base (`sampler_adapter`, least
recently used out). A base's tokenizer is exported to the object store once per process, for
clients to download. `WorkerIdentity` says which process runs a task, and `LoadBase` gives it
its resident base. The trainer is imported only for types here, so importing this module
imports no torch; only worker processes use it.
"""

from __future__ import annotations

import hashlib
import tempfile
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from mint.services.models import adapters
from mint.storage.archives import pack_folder
from mint.storage.keys import tokenizer_key
from mint.storage.objects import ObjectStore

if TYPE_CHECKING:
    from mint.trainer.session import ResidentBase
    from mint.trainer.training_session import TrainingSession as LoraSession

# Sampler adapters each worker keeps loaded, per base.
SAMPLER_CACHE_SIZE = 8

LoadBase = Callable[[str], "ResidentBase"]


@dataclass(frozen=True)
class WorkerIdentity:
    """The process running a task: its id (`<node>/<pid>`) and whether it consumes its own
    queue (only then can it hold models)."""

    worker_id: str
    reachable: bool


class _Held:
    """What this worker process holds for Tinker: models by id, sampler adapters by archive."""

    def __init__(self) -> None:
        self.models: dict[str, LoraSession] = {}
        self.samplers: OrderedDict[tuple[str, str], str] = OrderedDict()
        self.tokenizers: set[str] = set()


held = _Held()


def peft_name(prefix: str, key: str) -> str:
    # peft adapter names become parameter-name segments: letters and digits only, never "lora".
    return prefix + hashlib.sha256(key.encode()).hexdigest()[:24]


def release_model(model_id: str) -> bool:
    """Free a model's adapter and optimizer state in this process; False if it held none."""
    training = held.models.pop(model_id, None)
    if training is None:
        return False
    if not training.closed:
        training.base.close(training.session_id)
    return True


def export_tokenizer(store: ObjectStore, resident: ResidentBase) -> None:
    name = resident.spec.name
    if name in held.tokenizers:
        return
    if not store.exists(tokenizer_key(name)):
        with tempfile.TemporaryDirectory(prefix="mint-tokenizer-") as scratch:
            resident.tokenizer.save_pretrained(scratch)
            store.put_bytes(tokenizer_key(name), pack_folder(Path(scratch)))
    held.tokenizers.add(name)


def sampler_adapter(store: ObjectStore, resident: ResidentBase, key: str, folder: Path | None = None) -> str:
    """The session name of the sampler adapter stored at `key`, loaded if needed (from
    `folder` when given, else from the object store); the least recently used goes first."""
    cache_key = (resident.spec.name, key)
    name = held.samplers.get(cache_key)
    if name is not None and name in {s.session_id for s in resident.sessions}:
        held.samplers.move_to_end(cache_key)
        return name
    name = peft_name("s", key)
    if folder is not None:
        resident.create_session_from_adapter(folder, session_id=name)
    else:
        with tempfile.TemporaryDirectory(prefix="mint-tinker-sampler-") as scratch:
            adapters.extract_adapter(store.get_bytes(key), Path(scratch))
            resident.create_session_from_adapter(Path(scratch), session_id=name)
    held.samplers[cache_key] = name
    while sum(1 for base, _ in held.samplers if base == resident.spec.name) > SAMPLER_CACHE_SIZE:
        oldest = next(k for k in held.samplers if k[0] == resident.spec.name)
        resident.close(held.samplers.pop(oldest))
    return name

"""Loading a base on a worker group straight into its shards: no rank ever holds the whole base.

A base larger than one host's memory cannot be read whole and then sharded. So each rank of a
worker group (`mint.trainer.group`) builds the model with every parameter on the meta device
(shapes, no storage), shards it with FSDP2 (`Group.shard`: dim 0 of every parameter split over
the ranks), allocates only its own shards on its device, and fills them from the base's
safetensors files, reading only its rows of each tensor: a dim-0 slice of a C-order tensor is
one byte range of its file, read straight into the shard (`CheckpointFiles`; plain reads, not
a memory map, whose pages would stay in the rank's resident memory). A rank's host memory holds
its share of the weights and, on a GPU or where dtypes differ, one shard in transit.

Every base reaches this path as safetensors: a `local_path` or `hub` base is already, and a
`seeded` or `gguf_package` base is materialised once as a safetensors snapshot in the worker's
cache (`pull_base_model`, which builds it whole: such bases are tiny test models or SmolLM2).
The ranks pull in turn (`Group.in_turn`), so the first rank of a host builds the snapshot and
the others find it cached.

Two layouts of a parameter in the files are read:
- the parameter's own name (every dense weight, embeddings, norms, the LM head): rows
  `[offset, offset + local rows)` of that tensor;
- the routed experts of an MoE layer fused into one 3D parameter by transformers
  (`mlp.experts.gate_up_proj` (E, 2I, H), `mlp.experts.down_proj` (E, H, I)) while the files
  keep one tensor per expert (`mlp.experts.<e>.gate_proj.weight` ...), as hub checkpoints and
  transformers' `save_pretrained` write them: FSDP2's rows are experts, so a rank reads the
  tensors of its own experts alone, each into its expert's rows of the shard (gate, then up).
Any other layout is refused with the parameter's name rather than loaded wrong.

What is not in the files is made here: non-persistent buffers (the rotary embedding's
`inv_freq`) are recomputed by the model's own initialiser (`_init_weights` on the modules that
hold them, as transformers does after a load), and a head tied to the input embeddings is read
from the embeddings' rows (the files hold it once, under their name): FSDP2 makes it a
parameter of its own, as it does when a whole model is sharded.

`ResidentBase(..., group=group)` and `FullParameterTrainer(..., group=group)` load this way. A
full-parameter trainer's resumable state (torch.distributed.checkpoint) needs nothing more:
`dcp.load` fills the sharded state dict in place, each rank reading what its shards overlap.
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from mint.errors import ConfigurationError
from mint.schemas.base_models import BaseModelSpec
from mint.trainer.host_memory import returning_large_blocks
from mint.trainer.models import base_model_class, base_tokenizer, pull_base_model, torch_dtype
from mint.trainer.peft_files import safetensors_file_header

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from mint.trainer.group import Group

# How the fused experts parameters of transformers' MoE models are kept one expert at a time
# in checkpoints: the fused name's last part, and each layout's per-expert tensors in the order
# they are concatenated (along the expert tensor's dim 0). Qwen/GLM/DeepSeek names, then Mixtral's.
EXPERT_LAYOUTS: dict[str, tuple[tuple[str, ...], ...]] = {
    "gate_up_proj": (("gate_proj", "up_proj"), ("w1", "w3")),
    "down_proj": (("down_proj",), ("w2",)),
}


def load_sharded_base(
    spec: BaseModelSpec, cache_dir: Path, group: Group, *, dtype: str | torch.dtype | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The base sharded over `group` (FSDP2), each rank reading only its shards from the files;
    its tokenizer. The model is in eval mode on the group's device; every rank calls it."""
    folder: Path | None = None
    for _ in group.in_turn():  # the first rank of a host builds a seeded or GGUF base's snapshot
        folder = pull_base_model(spec, cache_dir)
    assert folder is not None  # every rank has its turn
    dtype = torch_dtype(dtype) if isinstance(dtype, str) else dtype
    model = empty_model(spec, folder, dtype or torch_dtype(spec.dtype))
    # A tied head's weight, and where the files keep it: FSDP2 gives the head a shard of its own.
    tied: dict[str, str] = dict(getattr(model, "all_tied_weights_keys", None) or {})
    group.shard(model)
    model.to_empty(device=group.device)
    # Shards in transit (on a GPU, or cast) are freed as soon as they are copied: given back at once.
    with torch.no_grad(), returning_large_blocks(), CheckpointFiles(folder) as files:
        for name, parameter in model.named_parameters():
            read_shard(files, tied.get(name, name) if name not in files else name, parameter)
        for name, buffer in model.named_buffers():
            if name in files:  # persistent buffers: small, whole on every rank
                buffer.copy_(files.whole(name))
    recompute_buffers(model)
    model.eval()
    return model, base_tokenizer(spec, folder)


def empty_model(spec: BaseModelSpec, folder: Path, dtype: torch.dtype) -> PreTrainedModel:
    """The base's architecture from `folder`'s config, every parameter and buffer on the meta
    device (no storage), in `dtype`, its head tied to its embeddings if the config says so."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(folder, local_files_only=True)
    with torch.device("meta"):
        model: PreTrainedModel = base_model_class(spec)._from_config(config, dtype=dtype)
    return model


# safetensors' dtype names (each file's header), as torch dtypes.
SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


@dataclass(frozen=True)
class StoredTensor:
    """Where one tensor lies in a safetensors file: its dtype, shape and first byte."""

    file: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int

    @property
    def row_bytes(self) -> int:
        """Bytes of one row (dim 0): rows are contiguous, C order."""
        return math.prod(self.shape[1:]) * self.dtype.itemsize


class CheckpointFiles:
    """The tensors of a safetensors checkpoint folder by name, read by rows with plain reads.

    Never memory-mapped: a mapped file's pages count in the process's resident memory for as long
    as the mapping lives (through `safe_open`, every row a rank has read), so a rank would appear
    to hold its share twice. A read leaves nothing behind but the tensor it fills.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.tensors: dict[str, StoredTensor] = {}
        for file in sorted(folder.glob("*.safetensors")):
            self.tensors.update(_stored_tensors(file))
        self._handles: dict[Path, io.BufferedReader] = {}

    def __enter__(self) -> CheckpointFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles.values():
            handle.close()
        self._handles.clear()

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        """Rows `[start, stop)` of tensor `name` (dim 0), read alone from its file."""
        stored = self.tensors[name]
        rows = torch.empty((stop - start, *stored.shape[1:]), dtype=stored.dtype)
        self.read_into(name, start, rows)
        return rows

    def whole(self, name: str) -> torch.Tensor:
        """Tensor `name`, whole."""
        stored = self.tensors[name]
        if not stored.shape:  # a scalar: one element, no rows
            scalar = torch.empty((), dtype=stored.dtype)
            self._read(stored, stored.offset, scalar)
            return scalar
        return self.rows(name, 0, stored.shape[0])

    def read_into(self, name: str, start: int, rows: torch.Tensor) -> None:
        """Fill `rows` (contiguous, on CPU, in the tensor's dtype) with tensor `name`'s rows from `start` on."""
        stored = self.tensors[name]
        if rows.dtype != stored.dtype or rows.shape[1:] != stored.shape[1:] or start + rows.shape[0] > stored.shape[0]:
            raise ValueError(
                f"{name} is {stored.dtype} {stored.shape}: rows {start}.. do not fit {rows.dtype} {tuple(rows.shape)}"
            )
        self._read(stored, stored.offset + start * stored.row_bytes, rows)

    def _read(self, stored: StoredTensor, position: int, out: torch.Tensor) -> None:
        if stored.file not in self._handles:
            self._handles[stored.file] = open(stored.file, "rb")  # noqa: SIM115 (closed on exit)
        handle = self._handles[stored.file]
        buffer = out.view(-1).view(torch.uint8).numpy().data
        handle.seek(position)
        if out.numel() and handle.readinto(buffer) != len(buffer):
            raise ConfigurationError(f"{stored.file} ends before its tensors do: the file is truncated")


def _stored_tensors(file: Path) -> dict[str, StoredTensor]:
    """The tensors a safetensors file holds, from its header (an 8-byte little-endian length,
    then JSON: name -> dtype, shape and byte range after the header)."""
    try:
        header, data_start = safetensors_file_header(file)
    except ValueError as error:
        raise ConfigurationError(f"{file} is not a safetensors file: {error}") from None
    tensors = {}
    for name, entry in header.items():
        if entry["dtype"] not in SAFETENSORS_DTYPES:
            raise ConfigurationError(f"{file} holds {name} as {entry['dtype']}, which Mint does not load")
        tensors[name] = StoredTensor(
            file, SAFETENSORS_DTYPES[entry["dtype"]], tuple(entry["shape"]), data_start + entry["data_offsets"][0]
        )
    return tensors


def shard_rows(parameter: torch.Tensor) -> tuple[int, int]:
    """The rows (dim 0) of `parameter`'s global tensor this rank holds: (offset, count). A plain
    tensor (not sharded) is held whole."""
    from torch.distributed.tensor import DTensor, Shard

    if not isinstance(parameter, DTensor):
        return 0, parameter.shape[0]
    if tuple(parameter.placements) != (Shard(0),):
        raise ValueError(f"a parameter sharded as {parameter.placements} is not FSDP2's Shard(0) on one mesh dim")
    mesh = parameter.device_mesh
    count, offset = Shard.local_shard_size_and_offset(parameter.shape[0], mesh.size(), mesh.get_local_rank())
    return offset, count


def read_shard(files: CheckpointFiles, name: str, parameter: torch.Tensor) -> None:
    """Fill this rank's shard of parameter `name` from `files` (see the module doc for layouts)."""
    local = parameter.to_local() if hasattr(parameter, "to_local") else parameter
    offset, count = shard_rows(parameter)
    if local.ndim == 0 or local.shape[0] != count:
        raise ValueError(f"{name}: the local shard holds {tuple(local.shape)}, not {count} rows")
    if count == 0:
        return
    pieces = [(name, offset, local)] if name in files else expert_pieces(files, name, local, offset)
    if pieces is None:
        raise ConfigurationError(
            f"{files.folder} holds no tensor {name!r} (nor its experts one by one): the checkpoint does not "
            "match the architecture; check the base's config.json and weights",
            param="source.path",
        )
    for source, start, target in pieces:
        stored = files.tensors[source]
        if tuple(target.shape[1:]) != stored.shape[1:]:
            raise ConfigurationError(
                f"{name}: {source} in {stored.file.name} has rows of shape {stored.shape[1:]}, "
                f"the model's {tuple(target.shape[1:])}; the checkpoint does not match the architecture",
                param="source.path",
            )
        if target.device.type == "cpu" and target.dtype == stored.dtype and target.is_contiguous():
            files.read_into(source, start, target)  # straight into the shard: nothing in transit
        else:
            target.copy_(files.rows(source, start, start + target.shape[0]))


def expert_pieces(
    files: CheckpointFiles, name: str, local: torch.Tensor, offset: int
) -> list[tuple[str, int, torch.Tensor]] | None:
    """Where the rows of the fused experts parameter `name` (`<prefix>.experts.<fused>`) come from
    when the files keep each expert apart: (tensor name, first row, the part of `local` it fills)
    for each of this rank's experts (`offset` on) and each of its parts (gate, then up); None if
    the files hold no such layout of `name`."""
    prefix, _, fused = name.rpartition(".")
    experts = range(offset, offset + local.shape[0])
    for parts in EXPERT_LAYOUTS.get(fused, ()):
        keys = [[f"{prefix}.{expert}.{part}.weight" for part in parts] for expert in experts]
        if not all(key in files for row in keys for key in row):
            continue
        pieces = []
        for index, row in enumerate(keys):
            first = 0
            for key in row:
                rows = files.tensors[key].shape[0]
                pieces.append((key, 0, local[index, first : first + rows]))
                first += rows
            if first != local.shape[1]:
                raise ConfigurationError(
                    f"{name}: the experts' {' and '.join(parts)} in {files.folder} have {first} rows together, "
                    f"the model's {local.shape[1]}; the checkpoint does not match the architecture",
                    param="source.path",
                )
        return pieces
    return None


def recompute_buffers(model: PreTrainedModel) -> None:
    """Give the non-persistent buffers (not in any checkpoint) their values again, by the model's
    own initialiser on the modules that hold them and no parameter (rotary embeddings); refuse
    a base where that leaves one unset."""
    holders = [module for module in model.modules() if module._non_persistent_buffers_set]
    with torch.no_grad():
        for module in holders:
            if any(True for _ in module.parameters(recurse=False)):
                raise ConfigurationError(
                    f"{type(module).__name__} holds parameters and non-persistent buffers: Mint cannot recompute "
                    "its buffers after a sharded load; load this base on a single worker"
                )
            for name in module._non_persistent_buffers_set:
                buffer = module._buffers.get(name)
                if buffer is not None and buffer.is_floating_point():
                    buffer.fill_(math.nan)  # so that a buffer the initialiser misses is seen
            model._init_weights(module)
    for name, buffer in _non_persistent_buffers(model):
        if not buffer.is_floating_point() or bool(buffer.isnan().any()):
            raise ConfigurationError(
                f"the base's buffer {name!r} is not in its checkpoint and its initialiser does not compute it: "
                "load this base on a single worker"
            )


def _non_persistent_buffers(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    for module_name, module in model.named_modules():
        for name in module._non_persistent_buffers_set:
            buffer = module._buffers.get(name)
            if buffer is not None:
                yield f"{module_name}.{name}" if module_name else name, buffer

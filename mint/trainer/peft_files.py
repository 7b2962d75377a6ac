"""What a PEFT LoRA adapter folder says, read without torch: its `adapter_config.json` as the
LoRA options Mint trains with, and its safetensors file's header (tensor names, dtypes and
shapes). The trainer loads adapters through these checks (`ResidentBase.create_session_from_adapter`),
and the API checks an uploaded adapter with them before a worker loads it into its base.

Mint loads plain LoRA: no DoRA, rsLoRA, bias, extra saved modules or per-layer ranks, and
targets listed by name (not one regex string).
"""

from __future__ import annotations

import json
import os
import struct
from typing import Any

from pydantic import ValidationError

from mint.trainer.types import LoraOptions

PLAIN_LORA = {"peft_type": "LORA", "use_dora": False, "use_rslora": False, "bias": "none"}
UNUSED_LORA = ("modules_to_save", "layers_to_transform", "rank_pattern", "alpha_pattern")
# A safetensors header is at most this long (the format's own limit is 100 MB).
MAX_HEADER_BYTES = 16 * 1024 * 1024
LORA_SUFFIXES = (".lora_A.weight", ".lora_B.weight")


def lora_options(config: Any) -> LoraOptions:
    """The LoRA options of a parsed `adapter_config.json`; ValueError says what Mint cannot load."""
    if not isinstance(config, dict):
        raise ValueError("adapter_config.json is not a JSON object")
    for key, plain in PLAIN_LORA.items():
        if config.get(key, plain) != plain:
            raise ValueError(f"{key} is {config[key]!r}; Mint loads plain LoRA adapters ({key}: {plain!r})")
    for key in UNUSED_LORA:
        if config.get(key):
            raise ValueError(f"{key} is set; Mint loads plain LoRA adapters, without {key}")
    if any(isinstance(config.get(key), str) for key in ("target_modules", "target_parameters")):
        raise ValueError("targets written as one regex string are not supported; list the target names")
    if "r" not in config or "lora_alpha" not in config:
        raise ValueError("adapter_config.json needs r and lora_alpha")
    try:
        return LoraOptions(
            rank=int(config["r"]),
            alpha=float(config["lora_alpha"]),
            dropout=0.0,
            target_modules=sorted(config.get("target_modules") or []),
            target_parameters=sorted(config.get("target_parameters") or []),
        )
    except (TypeError, ValidationError) as exc:
        raise ValueError(str(exc).splitlines()[0] if isinstance(exc, TypeError) else _first_error(exc)) from None


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    return f"{'.'.join(str(part) for part in error['loc']) or 'config'}: {error['msg']}"


def safetensors_header(data: bytes) -> dict[str, dict[str, Any]]:
    """Tensor name -> {"dtype", "shape"} from a safetensors file's header; ValueError if it is not one."""
    if len(data) < 8:
        raise ValueError("too short to be a safetensors file")
    (length,) = struct.unpack("<Q", data[:8])
    if length > min(MAX_HEADER_BYTES, len(data) - 8):
        raise ValueError("its header length is larger than the file")
    try:
        header = json.loads(data[8 : 8 + length])
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"its header is not JSON: {exc}") from None
    except RecursionError:  # Python's parser recurses per level; a header is an object of flat entries
        raise ValueError("its header nests arrays or objects too deeply to be a safetensors header") from None
    if not isinstance(header, dict):
        raise ValueError("its header is not a JSON object")
    header.pop("__metadata__", None)
    return header


def safetensors_file_header(path: str | os.PathLike[str]) -> tuple[dict[str, dict[str, Any]], int]:
    """`safetensors_header` of the file at `path`, read without its tensors, and the offset in the
    file where the tensors' data begins (each entry's `data_offsets` count from there)."""
    with open(path, "rb") as handle:
        head = handle.read(8)
        length = struct.unpack("<Q", head)[0] if len(head) == 8 else 0
        data = head + handle.read(min(length, MAX_HEADER_BYTES))
    return safetensors_header(data), 8 + length


def lora_weight_problems(tensors: dict[str, dict[str, Any]]) -> list[str]:
    """What makes a safetensors header not a LoRA adapter's: tensors that are not LoRA A/B
    matrices, and A matrices without their B (or the reverse)."""
    if not tensors:
        return ["the weights file holds no tensors"]
    problems = [
        f"{name} is not a LoRA weight (names end in {' or '.join(LORA_SUFFIXES)})"
        for name in sorted(tensors)
        if not name.endswith(LORA_SUFFIXES)
    ]
    stems = {name.removesuffix(suffix): suffix for name in tensors for suffix in LORA_SUFFIXES if name.endswith(suffix)}
    for stem in sorted(stems):
        for suffix in LORA_SUFFIXES:
            if stem + suffix not in tensors:
                problems.append(f"{stem + suffix} is missing (every LoRA A has its B)")
    return problems

"""A session's state on disk: safetensors and a small JSON, never pickle.

Training state (`save_state` / `load_state`), in one folder:
- `adapter.safetensors`: the adapter's weights by portable name (peft's key without the adapter name);
- `optimizer.safetensors`: AdamW's `step/`, `exp_avg/`, `exp_avg_sq/` tensors by the same names;
- `state.json`: format, base model, step, the session's LoRA options and init seed.

Sampler weights (`save_weights_for_sampler`): the PEFT format, `adapter_config.json` and
`adapter_model.safetensors` directly in the folder, for `PeftModel.from_pretrained(base, folder)`,
vLLM's LoRARequest, and Mint's AdapterVersions. The config names the base by its registry name
(`base_model_name_or_path`), never the server folder it was loaded from: these files are
downloaded, exported and published, and Mint itself reads a version's base from its records.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from mint.errors import InvalidRequest, NotFound
from mint.trainer import peft_files
from mint.trainer.types import LoraOptions

STATE_FORMAT = 1
STATE_KIND = "mint-training-state"
ADAPTER_FILE = "adapter.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
STATE_FILE = "state.json"
SAMPLER_FILES = ("adapter_config.json", "adapter_model.safetensors")


@dataclass(frozen=True)
class TrainingState:
    """What `read_state` found in a folder."""

    base_model: str
    step: int
    options: LoraOptions
    seed: int
    adapter: dict[str, torch.Tensor]
    optimizer: dict[str, torch.Tensor]


def _cpu(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().to("cpu").contiguous() for name, tensor in tensors.items()}


def write_state(
    folder: Path,
    *,
    base_model: str,
    step: int,
    options: LoraOptions,
    seed: int,
    adapter: Mapping[str, torch.Tensor],
    optimizer: Mapping[str, torch.Tensor],
) -> None:
    """Write a training state into `folder` (created if needed); the JSON goes last, as the commit mark."""
    folder.mkdir(parents=True, exist_ok=True)
    save_file(_cpu(adapter), folder / ADAPTER_FILE)
    save_file(_cpu(optimizer), folder / OPTIMIZER_FILE)
    meta: dict[str, Any] = {
        "format": STATE_FORMAT,
        "kind": STATE_KIND,
        "base_model": base_model,
        "step": step,
        "seed": seed,
        "lora_options": options.model_dump(mode="json"),
    }
    staging = folder / f".{STATE_FILE}.partial"
    staging.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(staging, folder / STATE_FILE)


def read_state(folder: Path) -> TrainingState:
    """Read a folder written by `write_state`; refuses anything else with a message that says what is wrong."""
    state_file = folder / STATE_FILE
    if not state_file.is_file():
        raise NotFound(f"{folder} holds no training state (no {STATE_FILE})", param="path")
    try:
        meta = json.loads(state_file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise InvalidRequest(f"{state_file} cannot be read: {exc}", param="path") from exc
    if not isinstance(meta, dict) or meta.get("kind") != STATE_KIND or meta.get("format") != STATE_FORMAT:
        raise InvalidRequest(
            f"{state_file} is not a Mint training state of format {STATE_FORMAT}; it was written by something else",
            param="path",
        )
    for name in (ADAPTER_FILE, OPTIMIZER_FILE):
        if not (folder / name).is_file():
            raise InvalidRequest(f"training state {folder} is incomplete: {name} is missing", param="path")
    return TrainingState(
        base_model=str(meta["base_model"]),
        step=int(meta["step"]),
        options=LoraOptions.model_validate(meta["lora_options"]),
        seed=int(meta["seed"]),
        adapter=load_file(folder / ADAPTER_FILE),
        optimizer=load_file(folder / OPTIMIZER_FILE),
    )


def write_sampler_weights(peft_model: Any, adapter_name: str, folder: Path, *, base_model: str | None = None) -> Path:
    """Save one adapter of a multi-adapter peft model in the PEFT format, files directly in `folder`.

    peft writes a non-default adapter into a subfolder named after it and adds a README; the two
    files that matter are moved up, each replacing any older copy by one rename. The config's
    `base_model_name_or_path` is `base_model` (the base's registry name; None: left empty).
    """
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".sampler-", dir=folder) as scratch:
        # save_embedding_layers=False: peft would otherwise copy the whole (unchanged) base
        # lm_head into the adapter file because lm_head carries a LoRA.
        peft_model.save_pretrained(scratch, selected_adapters=[adapter_name], save_embedding_layers=False)
        saved = Path(scratch) / adapter_name if adapter_name != "default" else Path(scratch)
        _name_base(saved / SAMPLER_FILES[0], base_model)
        for name in SAMPLER_FILES:
            os.replace(saved / name, folder / name)
    return folder


def _name_base(config_file: Path, base_model: str | None) -> None:
    """Write `base_model` as the config's `base_model_name_or_path`, where peft wrote the folder the
    base was loaded from (MINT_HOME/models/...): a path of this server, which tenants should not
    see and which means nothing where the adapter is downloaded. Written as peft writes configs."""
    config = json.loads(config_file.read_text(encoding="utf-8"))
    config["base_model_name_or_path"] = base_model
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True), encoding="utf-8")


def read_sampler_weights(folder: Path) -> tuple[LoraOptions, dict[str, torch.Tensor]]:
    """The LoRA options and weights of a PEFT-format adapter folder, as `write_sampler_weights`
    writes it (JSON and safetensors only); refused, naming the file, where either is unusable."""
    config_file, weights_file = (folder / name for name in SAMPLER_FILES)
    if not config_file.is_file() or not weights_file.is_file():
        raise NotFound(f"{folder} is not a PEFT adapter: it needs {' and '.join(SAMPLER_FILES)}", param="path")
    try:
        options = peft_files.lora_options(json.loads(config_file.read_text(encoding="utf-8")))
    except (OSError, ValueError, OverflowError, RecursionError) as exc:  # e.g. "r": 1e999, or nesting past recursion
        raise InvalidRequest(f"{config_file} is not a usable LoRA config: {exc}", param="adapter") from exc
    try:
        weights = load_file(weights_file)
    except Exception as exc:  # safetensors raises its own error types for a damaged file
        raise InvalidRequest(f"{weights_file} cannot be read as safetensors: {exc}", param="adapter") from exc
    return options, weights

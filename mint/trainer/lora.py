"""Which weights a session's LoRA adapter adapts, as a peft `LoraConfig`.

Targets are read from the base model's structure once (`TargetCatalogue`), then chosen by a
session's `LoraOptions` switches (`plan_targets`):

- attention: every `nn.Linear` inside an attention block, as peft module targets;
- MLP: the dense MLPs (e.g. GLM's first layer) and the shared experts, router excluded;
- experts: the routed experts' fused 3D parameters (`mlp.experts.gate_up_proj`, (E, 2I, H) and
  `mlp.experts.down_proj`, (E, H, I)), as peft `target_parameters`: one rank-r adapter per expert;
- unembedding: the output embedding (`lm_head`).

The MoE trap (MEASURED.md): on GLM/Qwen/DeepSeek-style MoE bases, peft 0.21 rewrites ANY module
target named `gate_proj`/`up_proj`/`down_proj` (a bare name, a full name or a regex) into the
routed experts' fused tensors, and it would do so again when a saved adapter is loaded with
`PeftModel.from_pretrained`. So on MoE bases the dense and shared MLPs are targeted by their
weight *parameters* (`mlp.gate_proj.weight`, `shared_experts.gate_proj.weight`), which peft
adapts with its parameter wrapper and never rewrites; on dense bases they are ordinary module
targets. `check_wrapped` compares what peft really wrapped with the plan, so a future peft that
rewrites something else fails loudly instead of training the wrong weights.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from peft import LoraConfig
from torch import nn

from mint.errors import Conflict, InvalidRequest, MintError
from mint.schemas.base_models import BaseModelSpec
from mint.trainer.types import LoraOptions

# Session ids name peft adapters: they become a segment of parameter names, so no dots.
_ADAPTER_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{2,63}$")
_ATTENTION_BLOCKS = {"self_attn", "attn", "attention"}
_MLP_BLOCKS = {"mlp", "feed_forward", "block_sparse_moe"}
_EXPERT_BLOCKS = {"experts"}
# Leaf names that peft 0.21 maps onto fused experts on MoE bases (transformers_weight_conversion).
_REWRITTEN_ON_MOE = {"gate_proj", "up_proj", "down_proj", "gate", "w1", "w2", "w3"}
# Parameter targets are written with at least this many trailing name segments
# ("mlp.experts.gate_up_proj", "mlp.gate_proj.weight"), for people reading adapter_config.json.
_PARAMETER_SUFFIX_SEGMENTS = 3
_PEFT_PREFIX = "base_model.model."


def new_adapter_name() -> str:
    """A fresh adapter (session) name."""
    return f"s{secrets.token_hex(6)}"


def check_adapter_name(name: str, *, param: str) -> None:
    """InvalidRequest unless `name` can name a peft adapter: letters, digits, '_' and '-' (it
    becomes a segment of parameter names), and never one of peft's own ('lora_A', ...)."""
    if not _ADAPTER_NAME.match(name) or name in "lora_" or "lora" in name:
        raise InvalidRequest(
            f"session id {name!r} must be 3-64 letters, digits, '_' or '-', start with a letter and not contain 'lora'",
            param=param,
        )


def _is_router(leaf: str) -> bool:
    # GLM/DeepSeek `gate`, Qwen2-MoE `shared_expert_gate`, others' `router`: routing, not MLP.
    return leaf == "gate" or leaf.endswith("_gate") or "router" in leaf


@dataclass(frozen=True)
class TargetCatalogue:
    """Every adaptable weight of a base, by full name, grouped the way `LoraOptions` switches them."""

    attention: tuple[str, ...]
    mlp: tuple[str, ...]
    experts: tuple[str, ...]
    unembed: str | None
    all_modules: tuple[str, ...] = field(repr=False)
    all_parameters: tuple[str, ...] = field(repr=False)

    @classmethod
    def from_model(cls, model: nn.Module) -> TargetCatalogue:
        """Read the catalogue from an unwrapped transformers model (before any adapter is added)."""
        attention, mlp, experts = [], [], []
        for name, module in model.named_modules():
            segments = name.split(".")
            if not isinstance(module, nn.Linear):
                continue
            if _ATTENTION_BLOCKS & set(segments[:-1]):
                attention.append(name)
            elif (
                _MLP_BLOCKS & set(segments[:-1]) and not _EXPERT_BLOCKS & set(segments) and not _is_router(segments[-1])
            ):
                mlp.append(name)
        for name, parameter in model.named_parameters():
            if parameter.ndim == 3 and _EXPERT_BLOCKS & set(name.split(".")[:-1]):
                experts.append(name)
        output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        unembed = next((name for name, module in model.named_modules() if module is output), None)
        return cls(
            attention=tuple(attention),
            mlp=tuple(mlp),
            experts=tuple(experts),
            unembed=unembed,
            all_modules=tuple(name for name, _ in model.named_modules()),
            all_parameters=tuple(name for name, _ in model.named_parameters()),
        )


@dataclass(frozen=True)
class LoraTargets:
    """What one adapter adapts: peft's target lists and the full names they must wrap."""

    target_modules: tuple[str, ...]
    target_parameters: tuple[str, ...]
    # Full names peft must wrap: modules (LoRA linear layers) and parameters (parameter wrappers).
    modules: frozenset[str]
    parameters: frozenset[str]


def _matches(name: str, target: str) -> bool:
    # peft's rule for list targets: the whole name, or a suffix starting at a dot.
    return name == target or name.endswith("." + target)


def _suffix_targets(wanted: Iterable[str], universe: Iterable[str], *, min_segments: int = 1) -> tuple[str, ...]:
    """The shortest name suffixes that match every wanted name and nothing else in `universe`."""
    wanted_set, universe_list = set(wanted), list(universe)
    # Many wanted names share a suffix (q_proj in every layer): judge each suffix once.
    exact: dict[str, bool] = {}
    targets: set[str] = set()
    for name in sorted(wanted_set):
        segments = name.split(".")
        for size in range(min(min_segments, len(segments)), len(segments) + 1):
            suffix = ".".join(segments[-size:])
            if suffix not in exact:
                exact[suffix] = all(other in wanted_set for other in universe_list if _matches(other, suffix))
            if exact[suffix]:
                targets.add(suffix)
                break
    return tuple(sorted(targets))


def _expand(targets: Iterable[str], universe: Iterable[str]) -> frozenset[str]:
    universe_list = list(universe)
    return frozenset(name for name in universe_list if any(_matches(name, target) for target in targets))


def plan_targets(options: LoraOptions, spec: BaseModelSpec, catalogue: TargetCatalogue) -> LoraTargets:
    """Turn the switches (or explicit overrides) into peft targets for this base."""
    wanted_modules: list[str] = []
    wanted_parameters: list[str] = []
    if options.train_attn:
        wanted_modules += catalogue.attention
    if options.train_mlp:
        if spec.moe:
            wanted_parameters += [f"{name}.weight" for name in catalogue.mlp]
        else:
            wanted_modules += catalogue.mlp
    if options.train_experts:
        wanted_parameters += catalogue.experts
    if options.train_unembed and catalogue.unembed is not None:
        wanted_modules.append(catalogue.unembed)

    if options.target_modules is not None:
        if spec.moe:
            trapped = sorted({t for t in options.target_modules if t.rsplit(".", 1)[-1] in _REWRITTEN_ON_MOE})
            if trapped:
                raise InvalidRequest(
                    f"target_modules {trapped} would be rewritten by peft into the routed experts on the MoE base "
                    f"{spec.name!r}; target MLP weights as parameters instead, e.g. 'mlp.gate_proj.weight'",
                    param="target_modules",
                )
        target_modules = tuple(sorted(set(options.target_modules)))
    else:
        target_modules = _suffix_targets(wanted_modules, catalogue.all_modules)
    if options.target_parameters is not None:
        target_parameters = tuple(sorted(set(options.target_parameters)))
    else:
        target_parameters = _suffix_targets(
            wanted_parameters, catalogue.all_parameters, min_segments=_PARAMETER_SUFFIX_SEGMENTS
        )

    modules = _expand(target_modules, catalogue.all_modules)
    parameters = _expand(target_parameters, catalogue.all_parameters)
    if not modules and not parameters:
        raise InvalidRequest(
            f"the LoRA options select no weights of base {spec.name!r}; check target_modules/target_parameters "
            "or turn on a train_* switch that applies to this base",
            param="lora",
        )
    return LoraTargets(target_modules, target_parameters, modules, parameters)


def check_same_parameter_targets(targets: LoraTargets, others: Mapping[str, LoraTargets]) -> None:
    """peft 0.21 nests parameter wrappers per adapter and needs every adapter on a model that adapts
    parameters to adapt the same set; say so (Conflict) before peft fails halfway through an injection."""
    if not targets.target_parameters:
        return
    for name, other in others.items():
        if other.target_parameters and set(other.target_parameters) != set(targets.target_parameters):
            raise Conflict(
                "on one base, sessions that adapt parameters must adapt the same ones (a peft limit): "
                f"session {name!r} adapts {list(other.target_parameters)}, "
                f"these options {list(targets.target_parameters)}; "
                "use the same train_mlp/train_experts switches, or turn both off",
                param="lora",
            )


def build_lora_config(options: LoraOptions, spec: BaseModelSpec, targets: LoraTargets) -> LoraConfig:
    """The peft config for one adapter: rank, alpha and dropout default to the base's."""
    rank = options.rank if options.rank is not None else spec.lora.rank
    alpha = options.alpha if options.alpha is not None else spec.lora.alpha * rank / spec.lora.rank
    dropout = options.dropout if options.dropout is not None else spec.lora.dropout
    if targets.target_parameters and dropout:
        raise InvalidRequest(
            f"dropout must be 0 on base {spec.name!r} with these options: they adapt parameters "
            f"({', '.join(targets.target_parameters)}) and peft's parameter LoRA has no dropout; "
            "set dropout=0, or train_mlp=False and train_experts=False",
            param="dropout",
        )
    return LoraConfig(
        r=rank,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=list(targets.target_modules),
        target_parameters=list(targets.target_parameters),
        # B starts at zero, so a new adapter computes exactly the base model.
        init_lora_weights=True,
        bias="none",
        task_type="CAUSAL_LM",
    )


def new_seed() -> int:
    """A fresh init seed for options that name none (recorded with the session)."""
    return secrets.randbits(62)


@contextmanager
def seeded_init(seed: int) -> Iterator[None]:
    """Seed torch's CPU generator for one adapter init and restore the caller's RNG afterwards.

    peft draws LoRA A (Kaiming uniform) on the CPU before moving it to the base layer's
    device, so seeding the CPU generator is enough for the same seed to give the same adapter.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


# ---- what peft really wrapped ----------------------------------------------------------------


def _unwrapped(name: str) -> str:
    name = name.removeprefix(_PEFT_PREFIX)
    return re.sub(r"(^|\.)base_layer(?=\.|$)", "", name).lstrip(".")


def wrapped_targets(model: nn.Module, adapter_name: str) -> tuple[frozenset[str], frozenset[str]]:
    """(modules, parameters) that carry `adapter_name`'s LoRA weights, by the base's own names."""
    from peft.tuners.lora import LoraLayer

    modules: set[str] = set()
    parameters: set[str] = set()
    for name, module in model.named_modules():
        if not isinstance(module, LoraLayer) or adapter_name not in module.lora_A:
            continue
        parameter_name = getattr(module, "parameter_name", None)
        if type(module).__name__ == "ParamWrapper" and parameter_name:
            parameters.add(f"{_unwrapped(name)}.{parameter_name}")
        else:
            modules.add(_unwrapped(name))
    return frozenset(modules), frozenset(parameters)


def check_wrapped(model: nn.Module, adapter_name: str, targets: LoraTargets) -> None:
    """Refuse an adapter whose wrapped weights differ from the plan (e.g. a peft target rewrite)."""
    modules, parameters = wrapped_targets(model, adapter_name)
    if modules != targets.modules or parameters != targets.parameters:
        unexpected = sorted((modules - targets.modules) | (parameters - targets.parameters))
        missing = sorted((targets.modules - modules) | (targets.parameters - parameters))
        raise MintError(
            f"peft wrapped other weights than planned for adapter {adapter_name!r}: "
            f"unexpected {unexpected[:8]}, missing {missing[:8]}; the peft version may rewrite targets"
        )


def adapter_parameters(model: nn.Module, adapter_name: str) -> dict[str, nn.Parameter]:
    """This adapter's parameters by portable name: peft's saved key, without the adapter name."""
    found: dict[str, nn.Parameter] = {}
    for name, parameter in model.named_parameters():
        segments = name.split(".")
        if adapter_name not in segments:
            continue
        segments.remove(adapter_name)
        found[".".join(segments)] = parameter
    return found

"""Which weights each LoRA option combination wraps on tiny-glm-moe, checked on the peft model itself.

tiny-glm-moe: 4 layers; layer 0 has a dense MLP, layers 1-3 are MoE with 8 routed experts
(fused 3D tensors) and a shared expert. MEASURED.md's trap: peft rewrites any gate/up/down_proj
*module* target on this architecture into the routed experts, so the dense and shared MLPs must
come out as parameter wrappers on their `.weight`, and the routed experts only when asked.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from peft.tuners.lora import LoraLayer

from mint.errors import Conflict, InvalidRequest
from mint.trainer.session import ResidentBase
from mint.trainer.training_session import TrainingSession
from mint.trainer.types import Datum, LoraOptions

pytestmark = pytest.mark.backend_free

pytestmark = [pytest.mark.backend_free, pytest.mark.torch]

LAYERS = range(4)
MOE_LAYERS = range(1, 4)
ATTENTION = {f"model.layers.{i}.self_attn.{p}" for i in LAYERS for p in ("q_proj", "k_proj", "v_proj", "o_proj")}
DENSE_MLP = {f"model.layers.0.mlp.{p}.weight" for p in ("gate_proj", "up_proj", "down_proj")}
SHARED_MLP = {
    f"model.layers.{i}.mlp.shared_experts.{p}.weight" for i in MOE_LAYERS for p in ("gate_proj", "up_proj", "down_proj")
}
EXPERTS = {f"model.layers.{i}.mlp.experts.{p}" for i in MOE_LAYERS for p in ("gate_up_proj", "down_proj")}
UNEMBED = {"lm_head"}


def peft_wrapped(resident: ResidentBase, adapter: str) -> tuple[set[str], set[str]]:
    """(modules, parameters) holding `adapter`'s LoRA weights, read off peft's layers directly."""
    modules, parameters = set(), set()
    for name, module in resident.model.named_modules():
        if not isinstance(module, LoraLayer) or adapter not in module.lora_A:
            continue
        clean = ".".join(part for part in name.split(".") if part != "base_layer")
        if type(module).__name__ == "ParamWrapper":
            parameters.add(f"{clean}.{module.parameter_name}")
        else:
            modules.add(clean)
    return modules, parameters


@pytest.mark.parametrize(
    ("switches", "modules", "parameters"),
    [
        ({}, ATTENTION | UNEMBED, DENSE_MLP | SHARED_MLP | EXPERTS),
        ({"train_mlp": False, "train_experts": False, "train_unembed": False}, ATTENTION, set()),
        ({"train_attn": False, "train_mlp": False, "train_unembed": False}, set(), EXPERTS),
        ({"train_attn": False, "train_experts": False, "train_unembed": False}, set(), DENSE_MLP | SHARED_MLP),
        ({"train_attn": False, "train_mlp": False, "train_experts": False}, UNEMBED, set()),
        ({"train_mlp": False, "train_unembed": False}, ATTENTION, EXPERTS),
    ],
    ids=["defaults", "attention", "experts", "dense-and-shared-mlp", "unembed", "attention-and-experts"],
)
def test_switches_wrap_exactly_the_intended_weights(
    resident: ResidentBase,
    open_session: Callable[..., TrainingSession],
    switches: dict[str, bool],
    modules: set[str],
    parameters: set[str],
) -> None:
    session = open_session(**switches)
    assert peft_wrapped(resident, session.session_id) == (modules, parameters)
    assert (set(session.targets.modules), set(session.targets.parameters)) == (modules, parameters)
    # The dense MLP is never a module target on this MoE base (peft would rewrite it).
    assert not {"gate_proj", "up_proj", "down_proj"} & set(session.targets.target_modules)


def test_explicit_targets_override_the_switches(
    resident: ResidentBase, open_session: Callable[..., TrainingSession]
) -> None:
    session = open_session(
        LoraOptions(train_mlp=False, train_experts=False, train_unembed=False, target_modules=["q_proj"])
    )
    assert peft_wrapped(resident, session.session_id) == ({f"model.layers.{i}.self_attn.q_proj" for i in LAYERS}, set())


def test_module_targets_that_peft_would_rewrite_are_refused(open_session: Callable[..., TrainingSession]) -> None:
    with pytest.raises(InvalidRequest, match="mlp.gate_proj.weight"):
        open_session(LoraOptions(target_modules=["model.layers.0.mlp.gate_proj"]))


def test_sessions_adapting_parameters_must_adapt_the_same_ones(open_session: Callable[..., TrainingSession]) -> None:
    open_session()
    with pytest.raises(Conflict, match="same"):
        open_session(train_mlp=False)
    # Sessions that adapt no parameters fit beside any other.
    open_session(train_mlp=False, train_experts=False)


def test_dropout_is_refused_where_peft_has_no_dropout(open_session: Callable[..., TrainingSession]) -> None:
    with pytest.raises(InvalidRequest, match="dropout"):
        open_session(dropout=0.1)
    session = open_session(dropout=0.1, train_mlp=False, train_experts=False)
    assert session.targets.target_parameters == ()


def test_lora_dropout_acts_in_training_only(
    resident: ResidentBase, open_session: Callable[..., TrainingSession], toy_data: list[Datum]
) -> None:
    session = open_session(dropout=0.5, train_mlp=False, train_experts=False, seed=13)
    session.forward_backward(toy_data, "cross_entropy")
    session.optim_step()
    # Dropout on the LoRA input changes the training pass, never forward or sampling.
    trained_pass = session.forward_backward(toy_data, "cross_entropy").logprobs
    assert session.forward(toy_data).logprobs == session.forward(toy_data).logprobs != trained_pass
    assert not resident.model.training


def test_same_seed_same_adapter_and_a_new_adapter_computes_the_base(
    resident: ResidentBase, open_session: Callable[..., TrainingSession], toy_data: list[Datum]
) -> None:
    first, twin, other = open_session(seed=11), open_session(seed=11), open_session(seed=12)
    first_params, twin_params, other_params = (s.named_parameters() for s in (first, twin, other))
    assert first_params.keys() == twin_params.keys() == other_params.keys()
    assert all(torch.equal(first_params[name], twin_params[name]) for name in first_params)
    lora_a = [name for name in first_params if ".lora_A." in name]
    assert any(not torch.equal(first_params[name], other_params[name]) for name in lora_a)
    # B starts at zero: every new adapter computes exactly the base.
    assert first.forward(toy_data).logprobs == resident.forward(toy_data).logprobs


def test_rank_and_alpha_default_to_the_base_and_scale_together(
    resident: ResidentBase, open_session: Callable[..., TrainingSession]
) -> None:
    session = open_session(rank=4, train_mlp=False, train_experts=False, train_unembed=False)
    q_a = session.named_parameters()["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"]
    assert q_a.shape == (4, 128)
    assert resident.peft_model.peft_config[session.session_id].lora_alpha == 32 * 4 / 16
    experts_a = open_session(rank=2, train_attn=False, train_mlp=False, train_unembed=False).named_parameters()[
        "base_model.model.model.layers.1.mlp.experts.base_layer.lora_A.weight"
    ]
    assert experts_a.shape[0] == 2 * 8  # one rank-2 adapter per routed expert

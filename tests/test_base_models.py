"""Base-model registry and the three bases that need no download.

Registry tests need no torch. The model tests build the tiny MoE bases for real (seeded,
13.6M parameters, under a second each) and dequantize SmolLM2 from its GGUF once (~20 s).
Every cache lives under pytest's tmp folders, never MINT_HOME.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mint.config import PROJECT_ROOT
from mint.errors import ConfigurationError, NotFound
from mint.schemas.base_models import (
    ARCHITECTURES,
    BaseModelSpec,
    get_base_model_spec,
    load_registry,
)

pytestmark = pytest.mark.backend_free

CONFIGS = PROJECT_ROOT / "configs" / "models"
USABLE_BASES = {"smollm2-135m-instruct", "tiny-glm-moe", "tiny-qwen3-moe"}
PRODUCTION_BASES = {"glm-4.5-air", "qwen3-30b-a3b", "deepseek-v3", "kimi-k2", "minimax-m2"}
TINY_MOE = ["tiny-glm-moe", "tiny-qwen3-moe"]
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
CHAT = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def registry() -> dict[str, BaseModelSpec]:
    return load_registry(CONFIGS)


# ---- registry: no torch ------------------------------------------------------------------


def test_registry_loads_the_shipped_bases(registry: dict[str, BaseModelSpec]) -> None:
    assert {name for name, spec in registry.items() if spec.enabled} == USABLE_BASES
    assert {name for name, spec in registry.items() if not spec.enabled} == PRODUCTION_BASES
    for name in PRODUCTION_BASES:
        spec = registry[name]
        assert spec.source.kind == "local_path" and spec.moe and spec.architecture in ARCHITECTURES
    glm = registry["tiny-glm-moe"]
    assert (glm.architecture, glm.moe, glm.context_length, glm.dtype) == ("Glm4MoeForCausalLM", True, 2048, "float32")
    assert glm.source.kind == "seeded" and glm.source.config_class == "Glm4MoeConfig"
    assert glm.lora.target_parameters == ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
    smol = registry["smollm2-135m-instruct"]
    assert smol.source.kind == "gguf_package" and not smol.moe


def test_get_base_model_spec() -> None:
    assert get_base_model_spec("tiny-qwen3-moe", CONFIGS).architecture == "Qwen3MoeForCausalLM"
    with pytest.raises(NotFound) as unknown:
        get_base_model_spec("gpt-9", CONFIGS)
    assert "gpt-9" in unknown.value.message and "tiny-glm-moe" in unknown.value.message
    with pytest.raises(NotFound, match="disabled"):
        get_base_model_spec("deepseek-v3", CONFIGS)
    assert get_base_model_spec("deepseek-v3", CONFIGS, include_disabled=True).name == "deepseek-v3"


def test_duplicate_names_are_refused_naming_both_files(tmp_path: Path) -> None:
    for file_name in ("a.yaml", "b.yaml"):
        shutil.copy(CONFIGS / "tiny-glm-moe.yaml", tmp_path / file_name)
    with pytest.raises(ConfigurationError) as error:
        load_registry(tmp_path)
    assert "tiny-glm-moe" in error.value.message
    assert str(tmp_path / "a.yaml") in error.value.message and str(tmp_path / "b.yaml") in error.value.message


GLM_TEXT = (CONFIGS / "tiny-glm-moe.yaml").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("name: [tiny\n", "not valid YAML", id="bad-yaml"),
        pytest.param("- just\n- a list\n", "mapping", id="not-a-mapping"),
        pytest.param(
            GLM_TEXT.replace("architecture: Glm4MoeForCausalLM", "architecture: os.system"),
            "unknown architecture 'os.system'",
            id="unknown-architecture",
        ),
        pytest.param(GLM_TEXT + "temperature: 0.7\n", "temperature", id="unknown-field"),
        pytest.param(GLM_TEXT.replace("\n  seed: 0\n", "\n  seed: 0\n  sede: 1\n"), "sede", id="unknown-nested-field"),
        pytest.param(GLM_TEXT.replace("name: tiny-glm-moe", "name: Tiny_GLM"), "name", id="bad-name"),
        pytest.param(
            GLM_TEXT.replace("config_class: Glm4MoeConfig", "config_class: LlamaConfig"),
            "does not match architecture",
            id="config-class-mismatch",
        ),
        pytest.param(GLM_TEXT.replace("kind: seeded", "kind: pickle"), "source", id="unknown-source-kind"),
        pytest.param(GLM_TEXT.replace("  dropout: 0.0", "  dropout: 0.1"), "dropout must be 0", id="dropout"),
        pytest.param(
            GLM_TEXT.replace("active_billions: 0.0132", "active_billions: 0.02"),
            "above total_billions",
            id="active-above-total",
        ),
        pytest.param(
            GLM_TEXT.replace("  engine: vllm\n  tensor_parallel_size: 1", "  engine: torch\n  tensor_parallel_size: 2"),
            "the torch engine runs on one device",
            id="torch-engine-in-parallel",
        ),
        pytest.param(
            GLM_TEXT.replace(
                "tensor_parallel_size: 1\n  expert_parallel_size: 1",
                "tensor_parallel_size: 4\n  expert_parallel_size: 6",
            ),
            "must be a multiple of tensor_parallel_size",
            id="expert-parallel-not-a-multiple",
        ),
        pytest.param(GLM_TEXT.replace("  memory_gib: 1\n", "  memory_gib: 0\n"), "memory_gib", id="no-memory"),
    ],
)
def test_bad_files_give_configuration_errors_naming_the_file(tmp_path: Path, text: str, expected: str) -> None:
    (tmp_path / "good.yaml").write_text((CONFIGS / "tiny-qwen3-moe.yaml").read_text(encoding="utf-8"))
    (tmp_path / "bad.yaml").write_text(text, encoding="utf-8")
    with pytest.raises(ConfigurationError) as error:
        load_registry(tmp_path)
    assert str(tmp_path / "bad.yaml") in error.value.message
    assert expected in error.value.message


def test_relative_local_path_is_refused() -> None:
    data: dict[str, Any] = {**_spec_dict("glm-4.5-air"), "source": {"kind": "local_path", "path": "models/glm"}}
    with pytest.raises(ValueError, match="absolute"):
        BaseModelSpec.model_validate(data)


def test_schema_module_does_not_import_torch() -> None:
    # The API process imports the registry; torch must stay out of it (DESIGN.md section 3).
    code = (
        "import sys, mint.schemas.base_models, mint.trainer\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'peft') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PROJECT_ROOT)
    assert result.returncode == 0, result.stderr


def _spec_dict(name: str) -> dict[str, Any]:
    import yaml

    data: dict[str, Any] = yaml.safe_load((CONFIGS / f"{name}.yaml").read_text(encoding="utf-8"))
    return data


# ---- the tiny MoE bases: built, cached, loaded, wrapped -------------------------------------


@pytest.fixture(scope="module")
def tiny_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


def _file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.torch
@pytest.mark.parametrize("name", TINY_MOE)
def test_seeded_pull_is_byte_identical_and_seed_sensitive(
    tmp_path: Path, registry: dict[str, BaseModelSpec], name: str
) -> None:
    pytest.importorskip("torch")
    from mint.trainer.models import MARKER_FILE, load_base_model, pull_base_model, weights_fingerprint

    spec = registry[name]
    first = pull_base_model(spec, tmp_path / "a")
    second = pull_base_model(spec, tmp_path / "b")
    assert first == tmp_path / "a" / name and second == tmp_path / "b" / name
    assert _file_sha256(first / "model.safetensors") == _file_sha256(second / "model.safetensors")
    model_a, _ = load_base_model(spec, tmp_path / "a")
    model_b, _ = load_base_model(spec, tmp_path / "b")
    fingerprint = weights_fingerprint(model_a)
    assert fingerprint == weights_fingerprint(model_b)
    # The fingerprint recorded at build time survives the save/load round trip.
    assert f'"weights_sha256": "{fingerprint}"' in (first / MARKER_FILE).read_text()

    reseeded = spec.model_copy(update={"source": spec.source.model_copy(update={"seed": 1})})
    model_c, _ = load_base_model(reseeded, tmp_path / "c")
    assert weights_fingerprint(model_c) != fingerprint

    # Idempotent: a second pull leaves the folder alone.
    mtime_ns = (first / "model.safetensors").stat().st_mtime_ns
    assert pull_base_model(spec, tmp_path / "a") == first
    assert (first / "model.safetensors").stat().st_mtime_ns == mtime_ns
    # Other weights under the same name would silently break every adapter trained on the old ones.
    with pytest.raises(ConfigurationError, match="different source"):
        pull_base_model(reseeded, tmp_path / "a")
    assert not [p for p in (tmp_path / "a").iterdir() if p.name != name], "staging folder left behind"


@pytest.mark.torch
@pytest.mark.parametrize("name", TINY_MOE)
def test_tiny_moe_runs_a_chat_prompt(tiny_cache: Path, registry: dict[str, BaseModelSpec], name: str) -> None:
    torch = pytest.importorskip("torch")
    from transformers import AutoTokenizer

    from mint.trainer.models import load_base_model, pull_base_model

    spec = registry[name]
    model, tokenizer = load_base_model(spec, tiny_cache)
    assert not model.training and model.dtype == torch.float32
    assert type(model).__name__ == spec.architecture
    inputs = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    input_ids_1_T = inputs["input_ids"]
    generation_prompt = tokenizer.encode("<|im_start|>assistant\n")
    assert input_ids_1_T[0, -len(generation_prompt) :].tolist() == generation_prompt
    with torch.no_grad():
        logits_1_T_V = model(**inputs).logits
    assert logits_1_T_V.shape == (1, input_ids_1_T.shape[1], spec.source.config["vocab_size"])
    assert torch.isfinite(logits_1_T_V).all()
    # The cached folder is self-contained: a client needs nothing but the folder, offline.
    folder = pull_base_model(spec, tiny_cache)
    client_tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    assert client_tokenizer.chat_template == tokenizer.chat_template
    assert len(client_tokenizer) == 49152 and client_tokenizer.eos_token == "<|im_end|>"
    assert model.config.eos_token_id == client_tokenizer.eos_token_id


def _lora_wrapped(peft_model: Any) -> tuple[set[str], set[tuple[str, str]]]:
    """Names of LoRA-wrapped linear modules, and (container, parameter) pairs of wrapped parameters.

    peft nests one ParamWrapper per parameter (`mlp.experts` wraps `mlp.experts.base_layer`),
    so the `.base_layer` suffixes are folded back to the container's name.
    """
    from peft.tuners.lora import LoraLayer, ParamWrapper

    modules: set[str] = set()
    parameters: set[tuple[str, str]] = set()
    for full_name, module in peft_model.named_modules():
        if not isinstance(module, LoraLayer):
            continue
        name = full_name.removeprefix("base_model.model.")
        if isinstance(module, ParamWrapper):
            while name.endswith(".base_layer"):
                name = name.removesuffix(".base_layer")
            parameters.add((name, module.parameter_name))
        else:
            modules.add(name)
    return modules, parameters


@pytest.mark.torch
@pytest.mark.parametrize("name", TINY_MOE)
def test_lora_from_spec_wraps_attention_and_routed_experts_only(
    tiny_cache: Path, registry: dict[str, BaseModelSpec], name: str
) -> None:
    torch = pytest.importorskip("torch")
    from peft import LoraConfig, get_peft_model

    from mint.trainer.models import load_base_model

    spec = registry[name]
    model, tokenizer = load_base_model(spec, tiny_cache)
    inputs = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        base_logits = model(**inputs).logits
    config = LoraConfig(
        r=spec.lora.rank,
        lora_alpha=spec.lora.alpha,
        lora_dropout=spec.lora.dropout,
        target_modules=list(spec.lora.target_modules),
        target_parameters=list(spec.lora.target_parameters),
    )
    peft_model = get_peft_model(model, config)
    modules, parameters = _lora_wrapped(peft_model)

    layers = spec.source.config["num_hidden_layers"]
    assert modules == {f"model.layers.{i}.self_attn.{proj}" for i in range(layers) for proj in ATTENTION}
    # Layer 0 is dense: only layers 1.. have routed experts. The dense MLP, the shared
    # experts and the router are not wrapped.
    assert parameters == {
        (f"model.layers.{i}.mlp.experts", param) for i in range(1, layers) for param in ("gate_up_proj", "down_proj")
    }
    trainable = [n for n, p in peft_model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    # One rank-r adapter per expert: A stacks E adapters of rank r.
    experts = model.config.num_local_experts if name == "tiny-qwen3-moe" else model.config.n_routed_experts
    lora_a = dict(peft_model.named_parameters())[
        "base_model.model.model.layers.1.mlp.experts.base_layer.lora_A.default.weight"
    ]
    assert lora_a.shape[0] == spec.lora.rank * experts
    # LoRA B starts at zero: the wrapped model computes exactly the base model.
    with torch.no_grad():
        assert torch.equal(peft_model(**inputs).logits, base_logits)


@pytest.mark.torch
# peft warns that the rank/alpha doubling it adds for the fused gate_up_proj matched nothing.
@pytest.mark.filterwarnings("ignore:The following (rank|alpha)_pattern keys:RuntimeWarning")
def test_peft_moe_renaming_trap_is_still_there(tiny_cache: Path, registry: dict[str, BaseModelSpec]) -> None:
    """Why the MoE YAMLs leave gate/up/down_proj out (MEASURED.md): peft 0.21 rewrites them.

    If this fails, peft stopped rewriting: the dense and shared MLPs can then be targeted,
    and the comments in configs/models/tiny-*-moe.yaml should say so.
    """
    pytest.importorskip("torch")
    from peft import LoraConfig, get_peft_model

    from mint.trainer.models import load_base_model

    model, _ = load_base_model(registry["tiny-glm-moe"], tiny_cache)
    dense_mlp = ["model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj"]
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=dense_mlp))
    modules, parameters = _lora_wrapped(peft_model)
    assert not modules, "the dense first-layer MLP was wrapped as asked"
    assert ("model.layers.1.mlp.experts", "gate_up_proj") in parameters


# ---- SmolLM2 from its GGUF ---------------------------------------------------------------------


@pytest.mark.torch
@pytest.mark.slow
def test_smollm2_dequantized_cache_generates_like_the_gguf(tmp_path: Path, registry: dict[str, BaseModelSpec]) -> None:
    torch = pytest.importorskip("torch")
    from mint.trainer.models import (
        MARKER_FILE,
        build_base_model,
        load_base_model,
        pull_base_model,
        save_base_model,
        weights_fingerprint,
    )

    spec = registry["smollm2-135m-instruct"]

    def greedy_8(model: Any, tokenizer: Any) -> list[int]:
        inputs = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        with torch.no_grad():
            output_ids = model.generate(**inputs, max_new_tokens=8, do_sample=False)
        new_tokens: list[int] = output_ids[0, inputs["input_ids"].shape[1] :].tolist()
        return new_tokens

    # pull_base_model is build + save; split here to keep the first (dequantized) model in hand.
    gguf_model, gguf_tokenizer = build_base_model(spec)
    assert sum(p.numel() for p in gguf_model.parameters()) == 134_515_008
    expected = greedy_8(gguf_model, gguf_tokenizer)
    assert "Paris" in gguf_tokenizer.decode(expected)
    folder = save_base_model(spec, gguf_model, gguf_tokenizer, tmp_path)
    del gguf_model
    assert sorted(p.suffix for p in folder.glob("*.safetensors")) == [".safetensors"]
    assert not list(folder.glob("*.gguf")) and not list(folder.glob("*.bin"))
    assert pull_base_model(spec, tmp_path) == folder  # already there: returns at once

    model, tokenizer = load_base_model(spec, tmp_path)
    assert tokenizer.chat_template == gguf_tokenizer.chat_template
    assert greedy_8(model, tokenizer) == expected
    assert f'"weights_sha256": "{weights_fingerprint(model)}"' in (folder / MARKER_FILE).read_text()
    shutil.rmtree(folder)  # 517 MB; pytest keeps its last three runs' tmp folders

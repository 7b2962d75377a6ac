"""The fused decode step: the logits and KV of the model's own forward (peft's LoRA terms
included, several adapters and the base in one batch), on each architecture it covers; None
where it does not apply; and sampling through it gives what the model's forward gives."""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

from mint.trainer.fused_decoder import FusedDecoder
from mint.trainer.kv_cache import reserve
from mint.trainer.mixed_adapters import by_adapter, mixed_adapters
from mint.trainer.sampling import Decoding, StopRule, generate_batch
from mint.trainer.session import ResidentBase
from mint.trainer.types import AdamParams, Datum, LoraOptions, SampleRequest, SamplingParams

pytestmark = [pytest.mark.backend_free, pytest.mark.torch]

_SIZES = dict(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,  # grouped-query attention, as the real bases have
    max_position_embeddings=64,
)
ARCHITECTURES: dict[str, Callable[[], torch.nn.Module]] = {
    "llama": lambda: LlamaForCausalLM(LlamaConfig(**_SIZES, attn_implementation="sdpa")),
    "qwen2": lambda: Qwen2ForCausalLM(Qwen2Config(**_SIZES, attn_implementation="sdpa")),  # q/k/v biases
    "qwen3": lambda: Qwen3ForCausalLM(Qwen3Config(**_SIZES, head_dim=8, attn_implementation="sdpa")),  # q/k norms
}
ALL_LINEARS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# Rows' owners, by request: two adapters of different ranks and targets, and the base.
OWNERS = ["first", "second", None, "first"]
ROWS_PER_REQUEST = 2
PROMPTS = [[5, 9, 11], [7, 3, 2, 8, 1], [4], [12, 13, 14, 15]]


def adapted(architecture: str, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """A seeded tiny model of `architecture` in `dtype` with two adapters whose B are not zero
    (kept in float32, as peft keeps them on a bfloat16 base)."""
    torch.manual_seed(0)
    model = ARCHITECTURES[architecture]().to(dtype).eval()
    model.requires_grad_(False)
    first = LoraConfig(r=4, lora_alpha=8, target_modules=ALL_LINEARS, init_lora_weights=False)
    second = LoraConfig(
        r=2, lora_alpha=6, target_modules=["q_proj", "v_proj", "down_proj", "lm_head"], init_lora_weights=False
    )
    peft_model = get_peft_model(model, first, adapter_name="first")
    peft_model.add_adapter("second", second)
    return peft_model.eval()


def prefill(model: torch.nn.Module, peft_model: torch.nn.Module) -> tuple[object, torch.Tensor, torch.Tensor]:
    """Every request's prompt, left-padded, each row through its owner; its cache with room for
    more tokens, the attention mask and the last logits, `ROWS_PER_REQUEST` rows per request."""
    width = max(len(prompt) for prompt in PROMPTS)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in PROMPTS for _ in range(ROWS_PER_REQUEST)])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in PROMPTS for _ in range(ROWS_PER_REQUEST)])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    owners = [owner for owner in OWNERS for _ in range(ROWS_PER_REQUEST)]
    with mixed_adapters(peft_model, by_adapter(owners)):
        output = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
    reserve(output.cache, 8)
    return output.cache, mask, output.logits[:, -1]


# Closeness of the fused step to the model's forward: float32 rounding, or bfloat16's (8 bits of
# mantissa: one unit in the last place is 1.6e-2 at 2-4, as some keys are; LoRA terms are larger).
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
CASES = [(architecture, torch.float32) for architecture in sorted(ARCHITECTURES)] + [("llama", torch.bfloat16)]


@pytest.mark.parametrize(
    ("architecture", "dtype"), CASES, ids=[f"{a}-{str(d).removeprefix('torch.')}" for a, d in CASES]
)
@torch.no_grad()
def test_a_fused_step_computes_the_models_logits_and_keys(architecture: str, dtype: torch.dtype) -> None:
    peft_model = adapted(architecture, dtype)
    model = peft_model.get_base_model()
    cache, mask, logits = prefill(model, peft_model)
    fused_cache = copy.deepcopy(cache)
    fused = FusedDecoder.of(peft_model, OWNERS)
    assert fused is not None and fused.fits(fused_cache)
    request_of_row = [request for request in range(len(PROMPTS)) for _ in range(ROWS_PER_REQUEST)]
    lengths = torch.tensor([len(PROMPTS[request]) for request in request_of_row])
    for step in range(4):
        if step == 2:  # the second request is done: its rows leave both caches, as in `generate_batch`
            kept = torch.tensor([row for row, request in enumerate(request_of_row) if request != 1])
            for each in (cache, fused_cache):
                each.batch_select_indices(kept)
            logits, lengths, mask = logits[kept], lengths[kept], mask[kept]
            request_of_row = [request for request in request_of_row if request != 1]
        tokens = logits.argmax(-1)
        mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
        positions = lengths + step
        live = sorted(set(request_of_row))
        with mixed_adapters(peft_model, by_adapter(OWNERS[request] for request in request_of_row)):
            logits = model(
                input_ids=tokens[:, None],
                attention_mask=mask,
                position_ids=positions[:, None],
                cache=cache,
                use_cache=True,
            ).logits[:, -1]
        fused_logits = fused.step(
            [(request, ROWS_PER_REQUEST) for request in live], tokens, mask, positions, fused_cache
        )
        torch.testing.assert_close(fused_logits, logits, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])
    for layer, fused_layer in zip(cache.layers, fused_cache.layers, strict=True):
        torch.testing.assert_close(fused_layer.keys, layer.keys, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])
        torch.testing.assert_close(fused_layer.values, layer.values, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


def test_no_fused_decoder_where_the_models_own_forward_must_run(resident: ResidentBase) -> None:
    assert FusedDecoder.of(resident.model, [None]) is None  # a MoE base
    torch.manual_seed(0)
    dora = get_peft_model(
        ARCHITECTURES["llama"]().eval(), LoraConfig(r=2, target_modules=["q_proj"], use_dora=True), adapter_name="d"
    ).eval()
    assert FusedDecoder.of(dora, ["d"]) is None
    eager = LlamaForCausalLM(LlamaConfig(**_SIZES, attn_implementation="eager")).eval()
    assert FusedDecoder.of(eager, [None]) is None  # its attention takes an additive mask
    dropout = adapted("llama")
    assert FusedDecoder.of(dropout, OWNERS) is not None
    for module in dropout.modules():
        if hasattr(module, "lora_dropout") and "first" in module.lora_dropout:
            module.lora_dropout["first"] = torch.nn.Dropout(0.5)  # live, as in a training pass
    assert FusedDecoder.of(dropout, OWNERS) is None


def test_sampling_through_the_fused_step_gives_the_models_samples(smollm2: ResidentBase) -> None:
    """A trained adapter, the base and both at once on SmolLM2: `sample_batch` (fused) decodes the
    tokens the model's own forward decodes, with the same logprobs."""
    session = smollm2.create_session(LoraOptions(rank=8, seed=3))
    try:
        tokens = smollm2.tokenizer.encode("The capital of France is Paris, and of Italy, Rome.")
        data = [
            Datum(model_input=ids[:-1], loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)})
            for ids in (tokens, tokens[:8])
        ]
        session.forward_backward(data, "cross_entropy")
        session.optim_step(AdamParams(learning_rate=1e-3))
        # After a training pass of data end to end (which sets Mint's row attention) it still applies.
        assert FusedDecoder.of(smollm2.model, [session.session_id, None]) is not None
        params = SamplingParams(max_tokens=6, temperature=0.0, stop=[])
        requests = [SampleRequest(tokens[:5], params, 2), SampleRequest(tokens[:9], params, 1)]
        decode = functools.partial(smollm2.tokenizer.decode, skip_special_tokens=False)
        for owner in (session.session_id, None):
            fused = smollm2.sample_batch(owner, requests)
            with torch.no_grad(), smollm2._use(owner) as model:
                decodings = [Decoding(request, 6, StopRule(frozenset(), ())) for request in requests]
                plain = generate_batch(model, decodings, decode=decode)
            for got, expected in zip(fused, plain, strict=True):
                assert [s.tokens for s in got] == [s.tokens for s in expected]
                for sample, other in zip(got, expected, strict=True):
                    assert sample.logprobs == pytest.approx(other.logprobs, abs=1e-5)
    finally:
        smollm2.close(session.session_id)

"""The Engine contract, run against every implementation in `ENGINE_FACTORIES`.

The heart of it: one batch mixing requests on different adapters and on the base gives each
request exactly the tokens (and, within rounding, the logprobs) that peft gives with that one
adapter active. Around it: adapters in and out (slots really freed and reused), errors that
say what is wrong, stop strings and tokens, max_tokens, per-request seeds, streaming that
adds up to the same completion, and continuous batching past the engine's batch size.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch
from pydantic import ValidationError
from safetensors.torch import load_file

from mint.errors import Conflict, InvalidRequest, NotFound
from mint.serving.engine import AdapterTensors, Engine, GenerateRequest, GenerateResult, StreamEvent
from mint.trainer.types import AdamParams, Datum, LoraOptions, SamplingParams

if TYPE_CHECKING:
    from tests.serving.conftest import AdapterKit, EngineFactory

pytestmark = [pytest.mark.backend_free, pytest.mark.torch]

PROMPTS = [
    [17, 932, 4401, 88, 1203],
    [5, 19000, 23],
    [3001, 42, 9, 870, 12, 13, 14, 15, 16],
]
LOGPROB_TOLERANCE = 2e-4


def greedy(adapter_id: str | None, prompt: list[int], max_tokens: int = 8, **options: object) -> GenerateRequest:
    return GenerateRequest.model_validate(
        {
            "adapter_id": adapter_id,
            "prompt_tokens": prompt,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
            **options,
        }
    )


def load(engine: Engine, kit: AdapterKit, *names: str) -> dict[str, str]:
    """Load the kit's adapters by name; their ids by name."""
    for name in names:
        engine.add_adapter(kit[name].adapter_id, kit[name].folder)
    return {name: kit[name].adapter_id for name in names}


def assert_matches_reference(result: GenerateResult, kit: AdapterKit, name: str | None, prompt: list[int]) -> None:
    reference = kit.reference(name, prompt, len(result.tokens))
    assert result.tokens == reference.tokens, f"adapter {name}: tokens differ from peft's"
    assert result.logprobs == pytest.approx(reference.logprobs, abs=LOGPROB_TOLERANCE)


# ---- the heart: one mixed batch equals each adapter alone ---------------------------------------


def test_adapters_change_the_outputs(kit: AdapterKit) -> None:
    """Guards the tests below: each adapter's greedy output differs from the base's and the others'."""
    outputs = {name: tuple(kit.reference(name, PROMPTS[0], 8).tokens) for name in (None, "alpha", "beta", "gamma")}
    assert len(set(outputs.values())) == len(outputs)


def test_one_mixed_batch_matches_each_adapter_alone(
    engine: Engine, kit: AdapterKit, engine_factory: EngineFactory
) -> None:
    ids = load(engine, kit, "alpha", "beta")
    plan = [("alpha", PROMPTS[0]), ("beta", PROMPTS[1]), (None, PROMPTS[2])]
    assert len(plan) <= engine_factory.max_batch_size  # one running batch: every step is one forward for all three
    results = engine.generate([greedy(ids[name] if name else None, prompt) for name, prompt in plan])
    assert [r.index for r in results] == [0, 1, 2]
    for result, (name, prompt) in zip(results, plan, strict=True):
        assert result.adapter_id == (ids[name] if name else None)
        assert result.finish_reason == "length" and result.stop_match is None
        assert result.usage.prompt_tokens == len(prompt)
        assert result.usage.completion_tokens == len(result.tokens) == 8
        assert result.usage.total_tokens == len(prompt) + 8
        assert_matches_reference(result, kit, name, prompt)


def test_same_prompt_on_every_adapter_in_one_batch(engine: Engine, kit: AdapterKit) -> None:
    ids = load(engine, kit, "alpha", "gamma")
    names: list[str | None] = ["gamma", None, "alpha"]
    results = engine.generate([greedy(ids[n] if n else None, PROMPTS[2], 6) for n in names])
    for result, name in zip(results, names, strict=True):
        assert_matches_reference(result, kit, name, PROMPTS[2])


def test_an_adapter_trained_by_mint_serves_what_its_session_samples(
    engine: Engine, kit: AdapterKit, tmp_path: Path, adapter_id_of: Callable[[Path], str]
) -> None:
    session = kit.resident.create_session(LoraOptions(seed=9, train_mlp=False, train_experts=False))
    try:
        data = [Datum(model_input=PROMPTS[2][:-1], loss_fn_inputs={"target_tokens": PROMPTS[2][1:]})]
        for _ in range(2):
            session.forward_backward(data, "cross_entropy")
            session.optim_step(AdamParams(learning_rate=1e-2))
        folder = session.save_weights_for_sampler(tmp_path / "trained")
        engine.add_adapter(adapter_id_of(folder), folder)
        (result,) = engine.generate([greedy(adapter_id_of(folder), PROMPTS[0], 6)])
        expected = session.sample(PROMPTS[0], SamplingParams(max_tokens=6, temperature=0.0, stop=[]))[0]
        assert result.tokens == expected.tokens
        assert result.logprobs == pytest.approx(expected.logprobs, abs=LOGPROB_TOLERANCE)
    finally:
        kit.resident.close(session.session_id)


def test_adapter_from_tensors_in_memory_serves_like_its_folder(engine: Engine, kit: AdapterKit) -> None:
    folder = kit["beta"].folder
    tensors = AdapterTensors(
        config=json.loads((folder / "adapter_config.json").read_text()),
        tensors=load_file(folder / "adapter_model.safetensors"),
    )
    engine.add_adapter("beta-in-memory", tensors)
    (result,) = engine.generate([greedy("beta-in-memory", PROMPTS[1])])
    assert_matches_reference(result, kit, "beta", PROMPTS[1])


# ---- adapters in and out ----------------------------------------------------------------------


def test_adapters_lists_what_is_loaded_and_adding_twice_is_a_no_op(engine: Engine, kit: AdapterKit) -> None:
    assert engine.adapters() == []
    ids = load(engine, kit, "alpha", "beta")
    engine.add_adapter(ids["alpha"], kit["alpha"].folder)
    listed = engine.adapters()
    assert [info.adapter_id for info in listed] == [ids["alpha"], ids["beta"]]
    assert [info.rank for info in listed] == [16, 8]
    assert all(info.size_bytes > 0 for info in listed)


def test_remove_adapter_frees_its_slot_for_another(
    engine: Engine, kit: AdapterKit, engine_factory: EngineFactory
) -> None:
    assert engine.max_adapters == engine_factory.max_adapters == 3
    ids = load(engine, kit, "alpha", "beta", "gamma")
    with pytest.raises(Conflict):
        engine.add_adapter(kit["delta"].adapter_id, kit["delta"].folder)
    engine.remove_adapter(ids["beta"])
    assert ids["beta"] not in {info.adapter_id for info in engine.adapters()}
    with pytest.raises(NotFound):
        engine.generate([greedy(ids["beta"], PROMPTS[0])])
    with pytest.raises(NotFound):
        engine.remove_adapter(ids["beta"])
    # The freed slot takes another adapter, which serves its own weights, not beta's leftovers.
    engine.add_adapter(kit["delta"].adapter_id, kit["delta"].folder)
    results = engine.generate(
        [
            greedy(kit["delta"].adapter_id, PROMPTS[0]),
            greedy(ids["gamma"], PROMPTS[0]),
            greedy(ids["alpha"], PROMPTS[0]),
        ]
    )
    for result, name in zip(results, ["delta", "gamma", "alpha"], strict=True):
        assert_matches_reference(result, kit, name, PROMPTS[0])


def test_unknown_adapter_fails_the_whole_batch_before_any_work(engine: Engine, kit: AdapterKit) -> None:
    ids = load(engine, kit, "alpha")
    with pytest.raises(NotFound) as caught:
        engine.generate([greedy(ids["alpha"], PROMPTS[0]), greedy("not-loaded", PROMPTS[1])])
    assert "not-loaded" in str(caught.value)
    with pytest.raises(NotFound):
        engine.stream([greedy("not-loaded", PROMPTS[1])])
    engine.remove_adapter(ids["alpha"])  # nothing was left holding it


def test_bad_adapters_are_refused_with_the_reason(engine: Engine, kit: AdapterKit, tmp_path: Path) -> None:
    alpha = kit["alpha"].folder
    config = json.loads((alpha / "adapter_config.json").read_text())
    tensors = load_file(alpha / "adapter_model.safetensors")

    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "adapter_config.json").write_text(json.dumps(config))
    (pickled / "adapter_model.bin").write_bytes(b"not loaded, ever")
    with pytest.raises(InvalidRequest, match="safetensors"):
        engine.add_adapter("pickled", pickled)
    with pytest.raises(InvalidRequest):
        engine.add_adapter("missing", tmp_path / "no-such-folder")

    key = next(k for k in tensors if "q_proj.lora_A" in k)
    reshaped = {**tensors, key: tensors[key][:, :-1].contiguous()}  # as if trained on a narrower base
    with pytest.raises(InvalidRequest, match="another base"):
        engine.add_adapter("wrong-shape", AdapterTensors(config=config, tensors=reshaped))
    stray = {**tensors, "base_model.model.model.no_such_layer.lora_A.weight": tensors[key]}
    with pytest.raises(InvalidRequest):
        engine.add_adapter("stray-module", AdapterTensors(config=config, tensors=stray))
    with pytest.raises(InvalidRequest, match="use_dora"):
        engine.add_adapter("dora", AdapterTensors(config={**config, "use_dora": True}, tensors=tensors))
    with pytest.raises(InvalidRequest, match="rank"):
        engine.add_adapter("too-wide", AdapterTensors(config={**config, "r": 4096}, tensors=tensors))
    with pytest.raises(InvalidRequest):
        engine.add_adapter("../escape", alpha)
    assert engine.adapters() == []


def test_bad_requests_are_refused(engine: Engine, kit: AdapterKit) -> None:
    with pytest.raises(ValidationError):
        GenerateRequest(prompt_tokens=[])
    with pytest.raises(ValidationError):
        GenerateRequest(prompt_tokens=[1], prompt="both")
    with pytest.raises(ValidationError):
        GenerateRequest(prompt_tokens=[1], stop=[""])
    with pytest.raises(InvalidRequest, match="vocabulary"):
        engine.generate([greedy(None, [10**7])])
    with pytest.raises(InvalidRequest, match="at most"):
        engine.generate([greedy(None, [7] * 10**5)])
    assert engine.generate([]) == []


def test_removing_an_adapter_in_use_by_a_stream_waits_for_it(engine: Engine, kit: AdapterKit) -> None:
    ids = load(engine, kit, "alpha")
    events = engine.stream([greedy(ids["alpha"], PROMPTS[0], 6)])
    first = next(events)
    assert first.token_ids
    with pytest.raises(Conflict):
        engine.remove_adapter(ids["alpha"])
    events.close()  # the client went away: the adapter is free again
    engine.remove_adapter(ids["alpha"])


# ---- sampling and stopping ----------------------------------------------------------------------


def test_max_tokens_is_honoured(engine: Engine, kit: AdapterKit) -> None:
    ids = load(engine, kit, "gamma")
    results = engine.generate([greedy(ids["gamma"], PROMPTS[0], 1), greedy(None, PROMPTS[1], 3)])
    assert [len(r.tokens) for r in results] == [1, 3]
    assert {r.finish_reason for r in results} == {"length"}


def test_stop_token_ends_the_request_and_is_kept(engine: Engine, kit: AdapterKit) -> None:
    ids = load(engine, kit, "alpha")
    tokens = kit.reference("alpha", PROMPTS[1], 10).tokens
    stop_at = next(i for i in range(1, len(tokens)) if tokens[i] not in tokens[:i])
    (result,) = engine.generate([greedy(ids["alpha"], PROMPTS[1], 10, stop_token_ids=[tokens[stop_at]])])
    assert result.tokens == tokens[: stop_at + 1]
    assert (result.finish_reason, result.stop_match) == ("stop", tokens[stop_at])
    assert result.text == kit.resident.tokenizer.decode(tokens[:stop_at], skip_special_tokens=True)


def first_new_text(kit: AdapterKit, tokens: list[int]) -> tuple[int, str]:
    """(i, s): the first token i whose text adds a piece s not seen in the text before it."""
    tokenizer = kit.resident.tokenizer
    for i in range(1, len(tokens)):
        before = tokenizer.decode(tokens[:i], skip_special_tokens=True)
        after = tokenizer.decode(tokens[: i + 1], skip_special_tokens=True)
        new = after[len(before) :].strip() if after.startswith(before) else ""
        if new and new not in before:
            return i, new
    raise AssertionError(f"no usable stop string in {tokenizer.decode(tokens)!r}")


def test_stop_string_cuts_the_text_before_it(engine: Engine, kit: AdapterKit) -> None:
    ids = load(engine, kit, "beta")
    tokens = kit.reference("beta", PROMPTS[2], 10).tokens
    stop_at, stop = first_new_text(kit, tokens)
    (result,) = engine.generate([greedy(ids["beta"], PROMPTS[2], 10, stop=[stop])])
    full_text = kit.resident.tokenizer.decode(tokens[: stop_at + 1], skip_special_tokens=True)
    assert result.tokens == tokens[: stop_at + 1]
    assert (result.finish_reason, result.stop_match) == ("stop", stop)
    assert result.text == full_text[: full_text.index(stop)]
    assert stop not in result.text


def sampled(adapter_id: str | None, prompt: list[int], seed: int, **options: object) -> GenerateRequest:
    return GenerateRequest.model_validate(
        {
            "adapter_id": adapter_id,
            "prompt_tokens": prompt,
            "max_tokens": 8,
            "seed": seed,
            "ignore_eos": True,
            **options,
        }
    )


def test_seeds_reproduce_per_request_whatever_the_batch(engine: Engine, kit: AdapterKit) -> None:
    ids = load(engine, kit, "alpha", "beta")
    alone = engine.generate([sampled(ids["alpha"], PROMPTS[0], seed=7)])[0].tokens
    assert engine.generate([sampled(ids["alpha"], PROMPTS[0], seed=7)])[0].tokens == alone
    in_a_batch = engine.generate(
        [
            sampled(ids["beta"], PROMPTS[1], seed=1),
            sampled(ids["alpha"], PROMPTS[0], seed=7),
            greedy(None, PROMPTS[2]),
            sampled(ids["beta"], PROMPTS[0], seed=7),
        ]
    )
    assert in_a_batch[1].tokens == alone
    assert in_a_batch[3].tokens == engine.generate([sampled(ids["beta"], PROMPTS[0], seed=7)])[0].tokens
    assert engine.generate([sampled(ids["alpha"], PROMPTS[0], seed=8)])[0].tokens != alone


def test_a_tiny_top_p_samples_the_greedy_tokens(engine: Engine, kit: AdapterKit) -> None:
    ids = load(engine, kit, "gamma")
    (result,) = engine.generate([sampled(ids["gamma"], PROMPTS[1], seed=3, top_p=1e-6)])
    assert_matches_reference(result, kit, "gamma", PROMPTS[1])


def test_a_text_prompt_is_tokenized_by_the_engine(engine: Engine, kit: AdapterKit) -> None:
    ids = load(engine, kit, "beta")
    text = "The quick brown fox"
    prompt = kit.resident.tokenizer.encode(text)
    (by_text,) = engine.generate([GenerateRequest(adapter_id=ids["beta"], prompt=text, max_tokens=5, temperature=0)])
    assert by_text.usage.prompt_tokens == len(prompt)
    assert by_text.tokens == engine.generate([greedy(ids["beta"], prompt, 5)])[0].tokens[: len(by_text.tokens)]


# ---- top_logprobs ----------------------------------------------------------------------------------

# Against a full softmax over one forward pass of the whole sequence: the torch engine computes
# the same float32 numbers (in a KV-cached, batched decode); vLLM's kernels differ more.
TOP_LOGPROB_TOLERANCE = {"torch": 1e-4, "vllm": 1e-3}


@pytest.fixture(scope="module")
def base_logprobs(engine_factory: EngineFactory, serving_cache: Path) -> Callable[[list[int], list[int]], torch.Tensor]:
    """log_softmax of the factory's base (no adapter) at each completion token's step: (T, V)."""
    from mint.schemas.base_models import get_base_model_spec
    from mint.trainer.models import load_base_model
    from tests.serving.conftest import CONFIGS

    model, _ = load_base_model(get_base_model_spec(engine_factory.base, CONFIGS), serving_cache)

    def logprobs(prompt: list[int], tokens: list[int]) -> torch.Tensor:
        with torch.no_grad():
            logits_1_L_V = model(input_ids=torch.tensor([prompt + tokens])).logits.float()
        return torch.log_softmax(logits_1_L_V[0, len(prompt) - 1 : -1], dim=-1)

    return logprobs


def test_top_logprobs_list_the_most_likely_tokens_with_the_sampled_tokens_numbers(
    engine: Engine,
    kit: AdapterKit,
    engine_factory: EngineFactory,
    base_logprobs: Callable[[list[int], list[int]], torch.Tensor],
) -> None:
    ids = load(engine, kit, "alpha")
    requests = [
        greedy(None, PROMPTS[0], 6, top_logprobs=3),
        greedy(ids["alpha"], PROMPTS[1], 6, top_logprobs=3),
        greedy(None, PROMPTS[2], 4),  # asks for no list: gets none, batched with those that do
        sampled(None, PROMPTS[1], seed=5, top_logprobs=5),
    ]
    asked = [3, 3, 0, 5]
    results = engine.generate(requests)
    assert results[2].top_logprobs == []
    for result, k in zip(results, asked, strict=True):
        if not k:
            continue
        assert len(result.top_logprobs) == len(result.tokens)
        for token, logprob, top in zip(result.tokens, result.logprobs, result.top_logprobs, strict=True):
            values = [value for _, value in top]
            assert len(top) == k and values == sorted(values, reverse=True)
            listed = dict(top)
            if token in listed:
                assert listed[token] == pytest.approx(logprob, abs=1e-6)
            else:
                assert logprob <= values[-1] + 1e-6
    for greedy_result in results[:2]:  # at temperature 0 the sampled token is the most likely one
        assert [top[0][0] for top in greedy_result.top_logprobs] == greedy_result.tokens
    assert_matches_reference(results[1], kit, "alpha", PROMPTS[1])  # the adapter's own numbers, as peft's

    tolerance = TOP_LOGPROB_TOLERANCE[engine_factory.name]
    for result, prompt, k in ((results[0], PROMPTS[0], 3), (results[3], PROMPTS[1], 5)):
        reference_T_V = base_logprobs(prompt, result.tokens)
        for step, top in enumerate(result.top_logprobs):
            best = reference_T_V[step].topk(k).values.tolist()
            assert [value for _, value in top] == pytest.approx(best, abs=tolerance)
            for token, value in top:
                assert value == pytest.approx(float(reference_T_V[step, token]), abs=tolerance)

    grouped = by_index(list(engine.stream(requests)))
    for result in results:
        streamed = [top for event in grouped[result.index] for top in event.top_logprobs]
        assert [[token for token, _ in top] for top in streamed] == [[t for t, _ in top] for top in result.top_logprobs]
        for top, expected in zip(streamed, result.top_logprobs, strict=True):
            assert [value for _, value in top] == pytest.approx([value for _, value in expected], abs=LOGPROB_TOLERANCE)


# ---- streaming and continuous batching ----------------------------------------------------------


def by_index(events: list[StreamEvent]) -> dict[int, list[StreamEvent]]:
    grouped: dict[int, list[StreamEvent]] = {}
    for event in events:
        grouped.setdefault(event.index, []).append(event)
    return grouped


def test_streaming_adds_up_to_the_same_completions(engine: Engine, kit: AdapterKit) -> None:
    ids = load(engine, kit, "alpha", "beta")
    stop_at, stop = first_new_text(kit, kit.reference("beta", PROMPTS[2], 10).tokens)
    requests = [
        greedy(ids["alpha"], PROMPTS[0], 7),
        greedy(ids["beta"], PROMPTS[2], 10, stop=[stop]),
        greedy(None, PROMPTS[1], 5),
        sampled(ids["alpha"], PROMPTS[1], seed=11),
    ]
    results = engine.generate(requests)
    assert results[1].finish_reason == "stop" and len(results[1].tokens) == stop_at + 1
    grouped = by_index(list(engine.stream(requests)))
    assert sorted(grouped) == [0, 1, 2, 3]
    for result in results:
        events = grouped[result.index]
        assert [e.finished for e in events] == [False] * (len(events) - 1) + [True]
        assert [t for e in events for t in e.token_ids] == result.tokens
        assert "".join(e.text for e in events) == result.text
        assert [lp for e in events for lp in e.logprobs] == pytest.approx(result.logprobs, abs=LOGPROB_TOLERANCE)
        last = events[-1]
        assert (last.finish_reason, last.stop_match, last.usage) == (
            result.finish_reason,
            result.stop_match,
            result.usage,
        )


def test_continuous_batching_lets_waiting_requests_in_as_others_finish(
    engine: Engine, kit: AdapterKit, engine_factory: EngineFactory
) -> None:
    ids = load(engine, kit, "alpha", "beta", "gamma")
    plan: list[tuple[str | None, list[int], int]] = [
        ("alpha", PROMPTS[0], 12),
        ("beta", PROMPTS[1], 2),  # finishes early: its place goes to a waiting request
        (None, PROMPTS[2], 12),
        ("gamma", PROMPTS[2], 4),
        ("alpha", PROMPTS[1], 6),
        ("beta", PROMPTS[0], 3),
        (None, PROMPTS[0], 5),
    ]
    assert len(plan) > engine_factory.max_batch_size
    requests = [greedy(ids[name] if name else None, prompt, n) for name, prompt, n in plan]
    events = list(engine.stream(requests))
    first_event_of_3 = next(i for i, e in enumerate(events) if e.index == 3)
    last_event_of_0 = max(i for i, e in enumerate(events) if e.index == 0)
    assert first_event_of_3 < last_event_of_0  # request 3 joined while request 0 was still decoding
    for result, (name, prompt, n) in zip(engine.generate(requests), plan, strict=True):
        assert len(result.tokens) == n
        assert_matches_reference(result, kit, name, prompt)

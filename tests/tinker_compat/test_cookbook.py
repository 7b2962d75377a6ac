"""tinker-cookbook's simplest supervised and RL recipes, unmodified, against Mint, on data made here.

The recipes load the tokenizer by the base's name, as any client with no model hub does with
Mint: the test downloads it from `/api/v1/tokenizers/<base>` into a folder of that name in
the working directory, where `AutoTokenizer.from_pretrained(<name>)` finds it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import tinker
import torch
from tinker import types

from tests.conftest import LiveServer, Tenant
from tests.tinker_compat.conftest import BASE, TinkerWorker, api, download_tokenizer

# The cookbook's recipes are clients of the Tinker API: the embedded pass only;
# the routes and storage they use are tested on both backends by their own tests.
pytestmark = [pytest.mark.torch, pytest.mark.client_surface]


@pytest.fixture
def workdir(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    live_server: LiveServer,
    connect: Callable[[Tenant], tinker.ServiceClient],
    alice: Tenant,
    tinker_worker: TinkerWorker,
) -> Path:
    """A working directory holding the base's tokenizer, with the SDK's key in the environment."""
    # The worker saves the base's tokenizer when it first serves a model or sampler of it.
    sampler = connect(alice).create_sampling_client(base_model=BASE).result()
    sampler.sample(types.ModelInput.from_ints([1, 2, 3]), 1, types.SamplingParams(max_tokens=1)).result()
    download_tokenizer(live_server, alice, tmp_path / BASE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TINKER_API_KEY", alice.keys["developer"])
    return tmp_path


def metrics(log_path: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines()]


def assert_registered(live_server: LiveServer, tenant: Tenant, final: dict[str, str]) -> None:
    """The run's final sampler weights are an adapter version of Mint."""
    with api(live_server, tenant) as client:
        adapters = {a["name"] for a in client.get("/v1/adapters", params={"limit": 100}).json()["data"]}
    model_id = final["state_path"].removeprefix("tinker://").split("/")[0]
    assert f"tinker-{model_id.replace(':', '-')}" in adapters


def checkpoint_paths(log_path: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in (log_path / "checkpoints.jsonl").read_text().splitlines()]


def test_supervised_recipe_chat_sl(workdir: Path, live_server: LiveServer, alice: Tenant) -> None:
    from tinker_cookbook.recipes.chat_sl import train

    rows = [
        {"messages": [{"role": "user", "content": f"Ping {i}"}, {"role": "assistant", "content": "OK"}]}
        for i in range(12)
    ]
    dataset = workdir / "chat.jsonl"
    dataset.write_text("".join(json.dumps(row) + "\n" for row in rows))
    log_path = workdir / "sl-log"
    config = train.CLIConfig(
        log_path=str(log_path),
        model_name=BASE,
        dataset=str(dataset),
        renderer_name="role_colon",
        batch_size=4,
        lora_rank=4,
        learning_rate=5e-3,
        max_length=128,
        max_steps=3,
        save_every=2,
        eval_every=0,
        base_url=live_server.url,
        behavior_if_log_dir_exists="delete",
    )
    train.cli_main(config)

    steps = metrics(log_path)
    assert [row["step"] for row in steps] == [0, 1, 2]
    assert all(row["train_mean_nll"] > 0 for row in steps)
    final = checkpoint_paths(log_path)[-1]
    assert final["state_path"].endswith("/weights/final")
    assert final["sampler_path"].endswith("/sampler_weights/final")
    assert_registered(live_server, alice, final)


@pytest.mark.parametrize(
    ("loss_fn", "steps"),
    [
        (None, 2),  # the recipe's default, stable_reinforce: samples record stability info, data carry provenance
        ("importance_sampling", 1),
        ("ppo", 1),
        ("cispo", 1),
        ("dro", 1),
        ("gspo", 1),
    ],
)
def test_rl_recipe_math_rl_arithmetic(workdir: Path, live_server: LiveServer, loss_fn: str | None, steps: int) -> None:
    from tinker_cookbook.recipes.math_rl import train

    log_path = workdir / "rl-log"
    chosen = {"loss_fn": loss_fn} if loss_fn is not None else {}
    config = train.CLIConfig(
        log_path=str(log_path),
        model_name=BASE,
        env="arithmetic",
        renderer_name="role_colon",
        groups_per_batch=2,
        group_size=2,
        max_tokens=4,
        lora_rank=4,
        learning_rate=1e-3,
        max_steps=steps,
        save_every=1,
        eval_every=0,
        base_url=live_server.url,
        behavior_if_log_dir_exists="delete",
        **chosen,
    )
    asyncio.run(train.cli_main(config))

    rows = metrics(log_path)
    assert [row["step"] for row in rows if "env/all/reward/total" in row] == list(range(steps))
    assert all(row["env/all/ac_tokens_per_turn"] > 0 for row in rows if "env/all/reward/total" in row)
    assert checkpoint_paths(log_path)[-1]["sampler_path"].endswith("/sampler_weights/final")


def test_rl_recipe_multiplayer_guess_number(
    workdir: Path, live_server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A multi-turn game against an environment (the recipe's own guess-the-number player), one step."""
    from tinker_cookbook.recipes.multiplayer_rl.guess_number import train

    monkeypatch.setenv("TINKER_BASE_URL", live_server.url)  # the recipe takes no base_url: the SDK's variable
    log_path = workdir / "guess-log"
    config = train.build_config(
        train.CLIConfig(
            model_name=BASE,
            renderer_name="role_colon",
            group_size=2,
            batch_size=2,
            max_tokens=4,
            eval_every=0,
            save_every=0,
            log_path=str(log_path),
            behavior_if_log_dir_exists="delete",
            max_steps=1,
        )
    )
    asyncio.run(train.train.main(config))
    assert [row["step"] for row in metrics(log_path) if any(key.startswith("env/") for key in row)] == [0]


def test_rl_recipe_preference_shorter(workdir: Path, live_server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """RL from pairwise preferences (shorter answers win), with the post-update KL the recipe asks for."""
    from tinker_cookbook.recipes.preference.shorter import train

    monkeypatch.setenv("TINKER_BASE_URL", live_server.url)
    log_path = workdir / "shorter-log"
    train.cli_main(
        train.CLIConfig(
            model_name=BASE,
            renderer_name="role_colon",
            batch_size=2,
            group_size=2,
            max_tokens=4,
            eval_every=0,
            log_path=str(log_path),
            behavior_if_log_dir_exists="delete",
            max_steps=1,
        )
    )
    assert [row["step"] for row in metrics(log_path) if any(key.startswith("env/") for key in row)] == [0]


def test_off_policy_distillation_collects_teacher_top_k_and_trains_on_it(
    workdir: Path, connect: Callable[[Tenant], tinker.ServiceClient], alice: Tenant
) -> None:
    """The recipe's own step: the teacher (here the base) gives its top-k at every position of
    each SFT datum (`topk_prompt_logprobs`), and the student trains on (N, K) soft targets."""
    from tinker_cookbook.distillation import train_off_policy

    service = connect(alice)
    teacher = service.create_sampling_client(base_model=BASE).result()
    student = service.create_lora_training_client(base_model=BASE, rank=4, seed=2).result()
    tokenizer = student.get_tokenizer()
    data = []
    for text in ("Ping 1 -> OK 1", "Ping 22 -> OK 22"):
        ids = tokenizer.encode(text)
        data.append(
            types.Datum(
                model_input=types.ModelInput.from_ints(ids[:-1]),
                loss_fn_inputs={"target_tokens": ids[1:], "weights": [0.0] * 2 + [1.0] * (len(ids) - 3)},
            )
        )
    soft = asyncio.run(train_off_policy._collect_topk_batch([teacher, teacher], data, 4))
    for original, datum in zip(data, soft, strict=True):
        positions = original.model_input.length
        assert datum.loss_fn_inputs["target_tokens"].shape == [positions, 4]
        weights = datum.loss_fn_inputs["weights"].to_torch()
        assert weights[:2].abs().sum() == 0  # prompt positions stay unweighted
        assert torch.allclose(weights[2:].sum(dim=-1), torch.ones(positions - 2), atol=1e-5)
    # The loss is the soft cross-entropy: minus the teacher-weighted logprobs the student gives
    # the teacher's top-k tokens (its forward on the same (N, K) targets).
    scored = student.forward(soft, "cross_entropy").result().loss_fn_outputs
    expected = sum(
        -(datum.loss_fn_inputs["weights"].to_torch() * out["logprobs"].to_torch()).sum().item()
        for datum, out in zip(soft, scored, strict=True)
    )
    step = student.forward_backward(soft, "cross_entropy").result()
    assert step.metrics["loss:sum"] == pytest.approx(expected, rel=1e-4)
    assert student.optim_step(types.AdamParams(learning_rate=1e-2)).result().metrics["grad_norm:mean"] > 0


def test_decisions_score_every_choice_with_target_prompt_logprobs(
    workdir: Path, connect: Callable[[Tenant], tinker.ServiceClient], alice: Tenant
) -> None:
    """`decisions.sample_decision` asks for the logprob of each choice's token at the answer
    position (a sparse `target_prompt_logprobs`) and softmaxes them into probabilities."""
    from tinker_cookbook import renderers
    from tinker_cookbook.recipes.decisions import Decision, DecisionRenderer, sample_decision
    from tinker_cookbook.tokenizer_utils import get_tokenizer

    sampler = connect(alice).create_sampling_client(base_model=BASE).result()
    renderer = renderers.get_renderer("role_colon", get_tokenizer(BASE))
    rendering = DecisionRenderer(renderer).render(
        Decision("Which team answers billing questions?", [("billing", "Invoices"), ("sdk", "The Python package")])
    )
    probabilities = asyncio.run(sample_decision(sampler, rendering))
    assert list(probabilities) == ["billing", "sdk"]
    assert sum(probabilities.values()) == pytest.approx(1.0, abs=1e-5)
    assert all(0.0 < p < 1.0 for p in probabilities.values())

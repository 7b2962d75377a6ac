"""More of tinker-cookbook's recipes, unmodified, against Mint, on data made here: DPO from
comparisons in a local JSONL file, prompt distillation (a teacher's data, then SFT of a
student on it) and RL graded by a rubric, each for a step or two on the tiny base.

As in test_cookbook.py, the recipes load the tokenizer by the base's name from a folder of
that name in the working directory (the `workdir` fixture).
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest
import tinker
from tinker import types
from tinker_cookbook import renderers

from tests.conftest import LiveServer, Tenant
from tests.tinker_compat.conftest import BASE
from tests.tinker_compat.test_cookbook import assert_registered, checkpoint_paths, metrics, workdir

# The cookbook's recipes are clients of the Tinker API: the embedded pass only;
# the routes and storage they use are tested on both backends by their own tests.
pytestmark = [pytest.mark.torch, pytest.mark.client_surface]

__all__ = ["workdir"]  # the fixture, imported so that pytest finds it here


def test_dpo_recipe_from_local_jsonl_comparisons(
    workdir: Path, live_server: LiveServer, alice: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The DPO recipe's CLI with its dataset read by the cookbook's JSONL comparison builder
    (the recipe's `hhh` choice downloads Anthropic/hh-rlhf: it is pointed at a local file)."""
    from tinker_cookbook.preference.preference_datasets import ComparisonBuilderFromJsonl
    from tinker_cookbook.recipes.preference.dpo import train

    rows = [
        {
            "comparison": {
                "prompt_conversation": [{"role": "user", "content": f"Say hello to {name}."}],
                "completion_A": [{"role": "assistant", "content": f"Hello, {name}!"}],
                "completion_B": [{"role": "assistant", "content": "No."}],
            },
            "label": "A" if i % 2 == 0 else "B",
        }
        for i, name in enumerate(["Ann", "Bo", "Cy", "Di"])
    ]
    for row in rows[1::2]:  # label B: the polite answer is completion_B
        comparison = row["comparison"]
        comparison["completion_A"], comparison["completion_B"] = comparison["completion_B"], comparison["completion_A"]
    comparisons = workdir / "comparisons.jsonl"
    comparisons.write_text("".join(json.dumps(row) + "\n" for row in rows))
    monkeypatch.setattr(train, "HHHComparisonBuilder", lambda: ComparisonBuilderFromJsonl(train_path=str(comparisons)))

    log_path = workdir / "dpo-log"
    train.cli_main(
        train.CLIConfig(
            log_path=str(log_path),
            model_name=BASE,
            dataset="hhh",
            renderer_name="role_colon",
            learning_rate=1e-3,
            dpo_beta=0.1,
            max_length=128,
            batch_size=2,
            max_steps=2,
            base_url=live_server.url,
            behavior_if_log_dir_exists="delete",
        )
    )

    steps = metrics(log_path)
    assert [row["step"] for row in steps] == [0, 1]
    for row in steps:
        assert row["num_pairs"] == 2
        assert math.isfinite(row["dpo_loss"]) and row["dpo_loss"] > 0
        assert math.isfinite(row["margin"])
        assert row["margin"] == pytest.approx(row["chosen_reward"] - row["rejected_reward"], abs=1e-5)
        assert 0.0 <= row["accuracy"] <= 1.0
    # At step 0 the policy is the reference: the loss is log 2 and the margin 0.
    assert steps[0]["dpo_loss"] == pytest.approx(math.log(2), abs=1e-3)
    assert steps[0]["margin"] == pytest.approx(0.0, abs=1e-3)
    final = checkpoint_paths(log_path)[-1]
    assert final["state_path"].endswith("/weights/final")
    assert final["sampler_path"].endswith("/sampler_weights/final")
    assert_registered(live_server, alice, final)


SENTENCES = [
    "The cat is on the table and the dog is in the garden.",
    "Le chat est sur la table et le chien est dans le jardin.",
    "Der Hund ist nicht im Garten und die Katze ist hier.",
]
# The labels the recipe's classification prompt allows.
LABELS = {"ar", "de", "el", "en", "es", "fr", "hi", "ru", "tr", "ur", "vi", "zh", "ot"}


def format_teacher(service: tinker.ServiceClient, renderer: renderers.Renderer) -> tinker.SamplingClient:
    """The base with an adapter trained here to answer in the recipe's format, `Final Answer: xx`:
    the random-weight base never writes it, and the recipe keeps only the answers it can parse.
    Trained on the sentences alone (short, so cheap); it answers the same after the long prompt."""
    from tinker_cookbook.supervised.data import conversation_to_datum

    trainer = service.create_lora_training_client(base_model=BASE, rank=32, seed=0).result()
    data = [
        conversation_to_datum(
            [{"role": "user", "content": sentence}, {"role": "assistant", "content": "Final Answer: en"}],
            renderer,
            max_length=None,
        )
        for sentence in SENTENCES
    ]
    for _ in range(60):
        trainer.forward_backward(data, "cross_entropy").result()
        trainer.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    return trainer.save_weights_and_get_sampling_client().result()


def test_prompt_distillation_recipe_teacher_data_then_student_sft(
    workdir: Path,
    live_server: LiveServer,
    connect: Callable[[Tenant], tinker.ServiceClient],
    alice: Tenant,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The recipe's two steps: `create_data.main` samples the teacher on each sentence of
    tinker_cookbook/example_data/multilingual.txt (under the working directory) with the long
    classification prompt and writes the answers it parses as JSONL; `train.cli_main` then
    trains a student on those pairs, without the prompt. `setup_clients` names the recipe's
    hub model: it is replaced by one that returns the teacher on Mint."""
    from tinker_cookbook.recipes.prompt_distillation import create_data, train
    from tinker_cookbook.tokenizer_utils import get_tokenizer

    sentences = workdir / "tinker_cookbook" / "example_data" / "multilingual.txt"
    sentences.parent.mkdir(parents=True)
    sentences.write_text("".join(sentence + "\n" for sentence in SENTENCES))
    tokenizer = get_tokenizer(BASE)
    renderer = renderers.get_renderer("role_colon", tokenizer)
    teacher = format_teacher(connect(alice), renderer)
    monkeypatch.setattr(create_data, "setup_clients", lambda: (teacher, tokenizer, renderer))

    distilled = workdir / "distill" / "lang.jsonl"
    create_data.main(create_data.Config(output_file=str(distilled)))

    # Each sentence, without the prompt, with the label the teacher gave it under the prompt.
    rows = [json.loads(line)["messages"] for line in distilled.read_text().splitlines()]
    assert sorted(messages[0]["content"] for messages in rows) == sorted(SENTENCES)
    assert all([m["role"] for m in messages] == ["user", "assistant"] for messages in rows)
    assert all(messages[1]["content"] in LABELS for messages in rows)

    log_path = workdir / "distill-log"
    train.cli_main(
        train.CLIConfig(
            file_path=str(distilled),
            log_path=str(log_path),
            model_name=BASE,
            renderer_name="role_colon",
            learning_rate=5e-3,
            num_epochs=1,
            lora_rank=4,
            batch_size=1,
            max_length=128,
            max_steps=2,
            save_every=0,
            eval_every=0,
            base_url=live_server.url,
            behavior_if_log_dir_exists="delete",
        )
    )

    steps = metrics(log_path)
    assert [row["step"] for row in steps] == [0, 1]
    assert all(math.isfinite(row["train_mean_nll"]) and row["train_mean_nll"] > 0 for row in steps)
    final = checkpoint_paths(log_path)[-1]
    assert final["state_path"].endswith("/weights/final")
    assert final["sampler_path"].endswith("/sampler_weights/final")
    assert_registered(live_server, alice, final)


def test_rubric_recipe_rl_graded_by_the_base(
    workdir: Path, live_server: LiveServer, alice: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RL whose reward is a grader's score against a rubric, the grader being the base itself
    (`grader_llm_name`), on the recipe's own addition data (`generate_data.generate_dataset`)
    written under the working directory. One step: two rollouts, each graded by the base.

    The random-weight grader writes no `<score>` tag, so the recipe scores its text 0: the test
    checks each score is the one the rubric extracts from what the grader wrote, and that the
    reward is the recipe's (mean score, minus 0.1 for a badly terminated answer)."""
    from tinker_cookbook.recipes.rubric import data, generate_data, train

    monkeypatch.setenv("TINKER_BASE_URL", live_server.url)  # the grader's client takes no base_url
    graded: list[tuple[str, float]] = []
    extract_score = data.Rubric.extract_score

    def recorded(rubric: data.Rubric, response: str) -> float:
        score = extract_score(rubric, response)
        graded.append((response, score))
        return score

    monkeypatch.setattr(data.Rubric, "extract_score", recorded)
    data_dir = workdir / "tinker_cookbook" / "example_data"
    data_dir.mkdir(parents=True)
    train_path, test_path = generate_data.generate_dataset(num_train=2, num_test=1, seed=0, write_dir=str(data_dir))
    log_path = workdir / "rubric-log"
    asyncio.run(
        train.cli_main(
            train.CLIConfig(
                model_name=BASE,
                renderer_name="role_colon",
                lora_rank=4,
                train_group_size=2,
                groups_per_batch=1,
                max_tokens=4,
                learning_rate=1e-3,
                grader_llm_name=BASE,
                grader_renderer_name="role_colon",
                train_jsonl_path=train_path,
                test_jsonl_path=test_path,
                eval_every=0,
                save_every=0,
                log_path=str(log_path),
                base_url=live_server.url,
                behavior_if_log_dir_exists="delete",
                max_steps=1,
            )
        )
    )

    assert len(graded) == 2  # one rubric item, two rollouts
    assert all(response.strip() for response, _ in graded)  # the grader's text, sampled on Mint
    assert all(0.0 <= score <= 1.0 for _, score in graded)
    [step] = [row for row in metrics(log_path) if "env/all/reward/total" in row]
    assert step["step"] == 0
    assert step["env/all/rubric_score"] == pytest.approx(sum(score for _, score in graded) / len(graded))
    assert 0.0 <= step["env/all/format"] <= 1.0
    assert step["env/all/reward/total"] == pytest.approx(
        step["env/all/rubric_score"] - 0.1 * (1.0 - step["env/all/format"])
    )
    assert math.isfinite(step["optim/entropy"])
    final = checkpoint_paths(log_path)[-1]
    assert final["sampler_path"].endswith("/sampler_weights/final")
    assert_registered(live_server, alice, final)

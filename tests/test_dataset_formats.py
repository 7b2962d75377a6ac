"""TRL, verl and OpenRLHF dataset files read as they are: each format and variant detected (or
named) and converted to Mint's rows, parquet read in batches, refusals that name the row and the
field and store nothing, uploads over HTTP, benchmarks made of such files, and fine-tuning jobs
that accept the datasets at creation (no training runs here)."""

from __future__ import annotations

import io
import json
from typing import Any, get_args

import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]
import pytest
from fastapi.testclient import TestClient

from mint.chat.formats import SOURCE_FORMATS, FormatOptions, convert, detect
from mint.config import Settings
from mint.schemas.datasets import DatasetFormat
from mint.services.datasets import VALIDATORS
from mint.storage.objects import object_store_for
from tests.conftest import Tenant
from tests.jobs.conftest import jsonl

IDLE_BASE = "tiny-qwen3-moe"  # no worker of the suite consumes its queue: jobs stay queued
USER = {"role": "user", "content": "What is 2 + 3?"}
ANSWER = {"role": "assistant", "content": "5"}
WRONG = {"role": "assistant", "content": "6"}

# (row, format its keys show, kind, canonical row) for every variant.
CASES: list[tuple[str, dict[str, Any], str, str, dict[str, Any]]] = [
    (
        "trl conversational language modeling with a column",
        {"messages": [USER, ANSWER], "topic": "math"},
        "trl",
        "chat",
        {"messages": [USER, ANSWER], "metadata": {"source_format": "trl", "columns": {"topic": "math"}}},
    ),
    (
        "trl standard language modeling",
        {"text": "The sky is blue."},
        "trl",
        "chat",
        {
            "messages": [{"role": "user", "content": ""}, {"role": "assistant", "content": "The sky is blue."}],
            "metadata": {"source_format": "trl", "columns": {}},
        },
    ),
    (
        "trl standard prompt-completion",
        {"prompt": "What is 2 + 3?", "completion": "5"},
        "trl",
        "chat",
        {"messages": [USER, ANSWER], "metadata": {"source_format": "trl", "columns": {}}},
    ),
    (
        "trl conversational prompt-completion",
        {"prompt": [USER], "completion": [ANSWER]},
        "trl",
        "chat",
        {"messages": [USER, ANSWER], "metadata": {"source_format": "trl", "columns": {}}},
    ),
    (
        "trl prompt-only with a solution column",
        {"prompt": [USER], "solution": "5", "level": 2},
        "trl",
        "prompts",
        {
            "messages": [USER],
            "reference": "5",
            "metadata": {"source_format": "trl", "columns": {"level": 2}, "reference_column": "solution"},
        },
    ),
    (
        "trl standard prompt-only with an answer column",
        {"prompt": "What is 2 + 3?", "answer": "5"},
        "trl",
        "prompts",
        {
            "messages": [USER],
            "reference": "5",
            "metadata": {"source_format": "trl", "columns": {}, "reference_column": "answer"},
        },
    ),
    (
        "trl explicit preference",
        {"prompt": "What is 2 + 3?", "chosen": "5", "rejected": "6"},
        "trl",
        "preference",
        {
            "input": {"messages": [USER]},
            "preferred_output": [ANSWER],
            "non_preferred_output": [WRONG],
            "metadata": {"source_format": "trl", "columns": {}},
        },
    ),
    (
        "trl implicit preference",
        {"chosen": [USER, ANSWER], "rejected": [USER, WRONG], "score": 1.5},
        "trl",
        "preference",
        {
            "input": {"messages": [USER]},
            "preferred_output": [ANSWER],
            "non_preferred_output": [WRONG],
            "metadata": {"source_format": "trl", "columns": {"score": 1.5}},
        },
    ),
    (
        "trl unpaired preference, desirable",
        {"prompt": [USER], "completion": [ANSWER], "label": True},
        "trl",
        "chat",
        {"messages": [USER, ANSWER], "metadata": {"source_format": "trl", "columns": {}}},
    ),
    (
        "verl",
        {
            "data_source": "openai/gsm8k",
            "prompt": [USER],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": "5"},
            "extra_info": {"split": "train", "index": 0},
        },
        "verl",
        "prompts",
        {
            "messages": [USER],
            "reference": "5",
            "metadata": {
                "source_format": "verl",
                "columns": {"ability": "math"},
                "data_source": "openai/gsm8k",
                "extra_info": {"split": "train", "index": 0},
            },
        },
    ),
    (
        "openrlhf prompt",
        {"input": "What is 2 + 3?", "label": "5", "datasource": "gsm8k"},
        "openrlhf",
        "prompts",
        {
            "messages": [USER],
            "reference": "5",
            "metadata": {"source_format": "openrlhf", "columns": {"datasource": "gsm8k"}},
        },
    ),
    (
        "openrlhf sft",
        {"input": [USER], "output": "5"},
        "openrlhf",
        "chat",
        {"messages": [USER, ANSWER], "metadata": {"source_format": "openrlhf", "columns": {}}},
    ),
]


@pytest.mark.parametrize(("name", "row", "source", "kind", "canonical"), CASES, ids=[case[0] for case in CASES])
def test_each_variant_is_detected_and_converted(
    name: str, row: dict[str, Any], source: Any, kind: str, canonical: dict[str, Any]
) -> None:
    assert detect(row) == source
    converted = convert(row, source)
    assert converted.errors == [] and converted.kind == kind, converted
    assert converted.row == canonical
    assert VALIDATORS[kind](converted.row) == []


def test_openrlhf_preference_and_renamed_keys_and_kto_rejects() -> None:
    pair = convert({"prompt": "What is 2 + 3?", "chosen": "5", "rejected": "6"}, "openrlhf")
    assert pair.kind == "preference" and pair.row is not None and pair.row["preferred_output"] == [ANSWER]
    keys = FormatOptions(input_key="question", label_key="answer")
    row = {"question": "What is 2 + 3?", "answer": "5"}
    assert detect(row, keys) == "openrlhf"
    renamed = convert(row, "openrlhf", keys)
    assert renamed.row is not None and renamed.row["reference"] == "5" and renamed.row["messages"] == [USER]
    undesirable = convert({"prompt": "q", "completion": "bad", "label": False}, "trl")
    assert undesirable.row is None and undesirable.errors == []
    assert convert({"prompt": "q", "completion": "a", "label": "yes"}, "trl").errors == [
        "label: must be true (desirable) or false (undesirable)"
    ]


def test_the_wire_format_names_are_the_converters() -> None:
    assert get_args(DatasetFormat) == SOURCE_FORMATS


# ---- over HTTP ---------------------------------------------------------------------------------


def _post(client: TestClient, tenant: Tenant, name: str, body: bytes, **form: str) -> Any:
    return client.post(
        "/v1/datasets",
        headers=tenant.headers("developer"),
        files={"file": (name, body, "application/octet-stream")},
        data=form,
    )


def parquet_of(rows: list[dict[str, Any]], row_group_size: int = 2) -> bytes:
    sink = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), sink, row_group_size=row_group_size)
    return sink.getvalue()


def gsm8k_rows(n: int, split: str = "test") -> list[dict[str, Any]]:
    """Rows exactly as verl's examples/data_preprocess/gsm8k.py writes them."""
    instruction = 'Let\'s think step by step and output the final answer after "####".'
    rows = []
    for idx in range(n):
        question_raw = f"Tom has {idx} apples and buys 2 more. How many apples does he have?"
        answer_raw = f"{idx} + 2 = {idx + 2}\n#### {idx + 2}"
        rows.append(
            {
                "data_source": "openai/gsm8k",
                "prompt": [{"role": "user", "content": question_raw + " " + instruction}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(idx + 2)},
                "extra_info": {"split": split, "index": idx, "answer": answer_raw, "question": question_raw},
            }
        )
    return rows


def _stored(client: TestClient, tenant: Tenant, dataset_id: str) -> list[dict[str, Any]]:
    content = client.get(f"/v1/datasets/{dataset_id}/content", headers=tenant.headers("viewer")).content
    return [json.loads(line) for line in content.decode().splitlines()]


def test_a_verl_parquet_file_is_read_in_batches_and_stored_in_mints_shape(client: TestClient, tenant: Tenant) -> None:
    data = parquet_of(gsm8k_rows(5))
    response = _post(client, tenant, "test.parquet", data)
    assert response.status_code == 201, response.text
    dataset = response.json()
    assert (dataset["kind"], dataset["row_count"]) == ("prompts", 5)
    report = dataset["validation_report"]
    assert report["source_format"] == "verl" and report["source_file"]["type"] == "parquet"
    assert report["source_file"]["bytes"] == len(data)
    rows = _stored(client, tenant, dataset["id"])
    assert [row["reference"] for row in rows] == ["2", "3", "4", "5", "6"]
    assert rows[4]["metadata"]["data_source"] == "openai/gsm8k"
    assert rows[4]["metadata"]["extra_info"]["index"] == 4 and rows[4]["metadata"]["columns"] == {"ability": "math"}
    # The same file again (named otherwise; parquet by its magic bytes) is the same dataset.
    again = _post(client, tenant, "renamed.bin", data, format="verl")
    assert again.status_code == 201 and again.json()["id"] == dataset["id"]


def test_trl_and_openrlhf_jsonl_uploads_with_format_and_keys(client: TestClient, tenant: Tenant) -> None:
    trl = [{"prompt": [USER], "completion": [ANSWER], "id": f"r{i}"} for i in range(3)]
    detected = _post(client, tenant, "trl.jsonl", jsonl(trl)).json()
    named = _post(client, tenant, "trl.jsonl", jsonl(trl), format="trl").json()
    assert detected["id"] == named["id"] and detected["kind"] == "chat"
    assert _stored(client, tenant, detected["id"])[0]["metadata"]["columns"] == {"id": "r0"}
    kto = [{"prompt": "q", "completion": "good", "label": True}, {"prompt": "q", "completion": "bad", "label": False}]
    unpaired = _post(client, tenant, "kto.jsonl", jsonl(kto)).json()
    assert unpaired["row_count"] == 1 and unpaired["validation_report"]["skipped_rows"] == 1
    openrlhf = [{"question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(3)]
    keyed = _post(client, tenant, "o.jsonl", jsonl(openrlhf), input_key="question", label_key="answer")
    assert keyed.status_code == 201, keyed.text
    assert keyed.json()["kind"] == "prompts" and keyed.json()["validation_report"]["source_format"] == "openrlhf"
    # Mint's own JSONL is stored byte for byte, as before.
    mint_rows = [{"messages": [USER, ANSWER]}]
    mint = _post(client, tenant, "m.jsonl", jsonl(mint_rows)).json()
    assert client.get(f"/v1/datasets/{mint['id']}/content", headers=tenant.headers()).content == jsonl(mint_rows)
    assert mint["validation_report"]["source_format"] == "mint"


def _dataset_objects(settings: Settings) -> int:
    return sum(1 for _ in object_store_for(settings).list("datasets/"))


def test_a_row_that_fits_no_format_is_named_with_its_field_and_nothing_is_stored(
    client: TestClient, tenant: Tenant, prepared: Settings
) -> None:
    before = _dataset_objects(prepared)
    rows = gsm8k_rows(3)
    rows[1]["reward_model"] = None  # a column of structs holds nulls, not strings
    bad_parquet = _post(client, tenant, "bad.parquet", parquet_of(rows))
    assert bad_parquet.status_code == 400
    assert "row 2: reward_model: must be an object" in bad_parquet.json()["error"]["message"]
    stranger = _post(client, tenant, "x.jsonl", jsonl([{"prompt": "q", "solution": "a"}, {"question": "q"}]))
    message = stranger.json()["error"]["message"]
    assert stranger.status_code == 400 and "line 2: fits no known format: it has keys [question]" in message
    assert "format=" in message and "verl (prompt, reward_model.ground_truth)" in message
    named = _post(client, tenant, "x.jsonl", jsonl([{"question": "q"}]), format="openrlhf")
    assert "line 1: input: is required" in named.json()["error"]["message"]
    mixed = _post(
        client, tenant, "m.jsonl", jsonl([{"prompt": "q", "solution": "a"}, {"prompt": "q", "completion": "a"}])
    )
    assert "line 2: is a trl prompt-completion row, which makes a chat row" in mixed.json()["error"]["message"]
    not_parquet = _post(client, tenant, "x.parquet", b"PAR1 but not really")
    assert not_parquet.status_code == 400 and "not a readable parquet file" in not_parquet.json()["error"]["message"]
    bad_key = _post(client, tenant, "x.jsonl", jsonl([{"prompt": "q"}]), input_key="a b")
    assert bad_key.status_code == 422
    assert _dataset_objects(prepared) == before


# ---- benchmarks and jobs -----------------------------------------------------------------------


def test_benchmarks_from_a_verl_parquet_file_and_an_openrlhf_jsonl_file(client: TestClient, tenant: Tenant) -> None:
    dataset = _post(client, tenant, "gsm8k.parquet", parquet_of(gsm8k_rows(4))).json()
    response = client.post(
        "/v1/benchmarks",
        headers=tenant.headers("developer"),
        json={"name": "gsm8k-verl", "dataset_id": dataset["id"], "grader": {"type": "numeric"}},
    )
    assert response.status_code == 201, response.text
    assert response.json()["latest_version"]["task_count"] == 4
    openrlhf = [{"input": f"What is {i} + 1?", "label": str(i + 1)} for i in range(3)]
    created = client.post(
        "/v1/benchmarks",
        headers=tenant.headers("developer"),
        json={
            "name": "openrlhf",
            "format": "jsonl",
            "content": jsonl(openrlhf).decode(),
            "grader": {"type": "numeric"},
        },
    )
    assert created.status_code == 201, created.text
    assert created.json()["latest_version"]["task_count"] == 3
    chat = _post(client, tenant, "c.jsonl", jsonl([{"prompt": "q", "completion": "a"}])).json()
    refused = client.post(
        "/v1/benchmarks",
        headers=tenant.headers("developer"),
        json={"name": "chat", "dataset_id": chat["id"], "grader": {"type": "exact"}},
    )
    assert refused.status_code == 400 and "prompts rows" in refused.json()["error"]["message"]


def test_stored_tasks_keep_verl_fields_for_reward_code(client: TestClient, tenant: Tenant, prepared: Settings) -> None:
    from mint.services.benchmarks import load_tasks
    from mint.storage.db import session_scope
    from mint.storage.tables import BenchmarkVersion

    dataset = _post(client, tenant, "g.parquet", parquet_of(gsm8k_rows(2, split="train"))).json()
    created = client.post(
        "/v1/benchmarks",
        headers=tenant.headers("developer"),
        json={"name": "gsm8k-fields", "dataset_id": dataset["id"], "grader": {"type": "numeric"}},
    ).json()
    with session_scope(prepared.database) as session:
        version = session.get(BenchmarkVersion, created["latest_version"]["id"])
        assert version is not None
        tasks = load_tasks(object_store_for(prepared), version.object_key, version.sha256)
    assert [task.id for task in tasks] == ["row-1", "row-2"]
    assert tasks[1].metadata["data_source"] == "openai/gsm8k" and tasks[1].metadata["extra_info"]["split"] == "train"
    assert tasks[1].reference == "3"


def test_fine_tuning_jobs_accept_datasets_from_other_formats(client: TestClient, tenant: Tenant) -> None:
    sft = _post(client, tenant, "sft.jsonl", jsonl([{"prompt": "Say OK", "completion": "OK"}] * 2)).json()
    dpo = _post(client, tenant, "dpo.jsonl", jsonl([{"prompt": "Say OK", "chosen": "OK", "rejected": "no"}] * 2)).json()
    rl = _post(client, tenant, "rl.parquet", parquet_of(gsm8k_rows(2))).json()
    bodies = [
        {"training_file": sft["id"]},
        {"training_file": dpo["id"], "method": {"type": "dpo"}},
        {
            "training_file": rl["id"],
            "method": {"type": "reinforcement", "reinforcement": {"grader": {"type": "numeric"}}},
        },
    ]
    for body in bodies:
        response = client.post(
            "/v1/fine_tuning/jobs", headers=tenant.headers("developer"), json={"model": IDLE_BASE, "steps": 1, **body}
        )
        assert response.status_code == 200, response.text
        assert response.json()["status"] in ("validating_files", "queued")

"""Warm starts and stages through the SDK (`client.jobs.create(from_adapter=..., stages=...)`,
sync and async) and the CLI (`mint jobs create --from-adapter NAME@N --stages FILE`), against
the API on a real socket. Jobs are on `tiny-qwen3-moe`, which no worker here consumes."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mint.config import Settings
from mint.schemas.fine_tuning import JobStage, StageCreate
from mint.sdk import AsyncMint, BadRequestError, Mint, NotFoundError
from tests.conftest import LiveServer, Tenant, register_versions
from tests.jobs.conftest import chat_rows, jsonl, prompt_rows

IDLE_BASE = "tiny-qwen3-moe"
RL = {"type": "reinforcement", "reinforcement": {"grader": {"type": "exact"}}}


def test_the_sdk_creates_warm_started_and_chained_jobs(
    live_server: LiveServer, tenant: Tenant, prepared: Settings
) -> None:
    ref = register_versions(prepared, tenant, "sdk-warm", 1, IDLE_BASE)[0]
    with Mint(live_server.url, tenant.keys["developer"]) as client:
        chat = client.datasets.upload(jsonl(chat_rows(4)))
        prompts = client.datasets.upload(jsonl(prompt_rows(4)))
        job = client.jobs.create(
            IDLE_BASE,
            suffix="sdk-chain",
            from_adapter=ref,
            stages=[
                StageCreate.model_validate({"method": {"type": "supervised"}, "training_file": chat.id, "steps": 2}),
                {"method": RL, "training_file": prompts.id, "steps": 3},
            ],
        )
        assert job.from_adapter == ref and job.total_steps == 5 and job.stages is not None
        assert all(isinstance(stage, JobStage) for stage in job.stages)
        assert [(s.method["type"], s.status, s.training_file) for s in job.stages] == [
            ("supervised", "queued", chat.id),
            ("reinforcement", "pending", prompts.id),
        ]
        assert client.jobs.get(job.id).stages == job.stages
        with pytest.raises(BadRequestError) as too_many:  # refused before anything is sent
            client.jobs.create(IDLE_BASE, chat.id, stages=[{"method": {"type": "supervised"}}] * 5)
        assert too_many.value.param == "stages"
        with pytest.raises(NotFoundError, match="no adapter named 'nobody'"):
            client.jobs.create(IDLE_BASE, chat.id, from_adapter="nobody@1")

    async def twin() -> Any:
        async with AsyncMint(live_server.url, tenant.keys["developer"]) as client:
            return await client.jobs.create(IDLE_BASE, chat.id, from_adapter=ref, steps=1)

    assert asyncio.run(twin()).from_adapter == ref


def _mint(live_server: LiveServer, tenant: Tenant, *args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "MINT_BASE_URL": live_server.url, "MINT_API_KEY": tenant.keys["developer"]}
    done = subprocess.run(
        [sys.executable, "-m", "mint", *args], capture_output=True, text=True, env=environment | {"COLUMNS": "200"}
    )
    assert done.returncode == code, f"mint {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done


def test_the_cli_creates_a_job_from_an_adapter_with_stages_from_a_file(
    live_server: LiveServer, tenant: Tenant, prepared: Settings, tmp_path: Path
) -> None:
    ref = register_versions(prepared, tenant, "cli-warm", 1, IDLE_BASE)[0]
    with Mint(live_server.url, tenant.keys["developer"]) as client:
        chat = client.datasets.upload(jsonl(chat_rows(4)))
        prompts = client.datasets.upload(jsonl(prompt_rows(4)))
    stages = tmp_path / "stages.json"
    stages.write_text(
        json.dumps(
            [
                {"method": {"type": "supervised"}, "training_file": chat.id, "steps": 2},
                {"method": RL, "training_file": prompts.id, "steps": 4},
            ]
        )
    )
    created = _mint(
        live_server, tenant, "jobs", "create", "--model", IDLE_BASE, "--from-adapter", ref, "--stages", str(stages),
        "--suffix", "cli-chain", "--json",
    )  # fmt: skip
    job = json.loads(created.stdout)
    assert job["from_adapter"] == ref and job["total_steps"] == 6 and job["suffix"] == "cli-chain"
    assert [stage["method"]["type"] for stage in job["stages"]] == ["supervised", "reinforcement"]
    shown = _mint(live_server, tenant, "jobs", "get", job["id"]).stdout
    assert ref in shown and "supervised queued 0/2, reinforcement pending 0/4" in shown

    warm_only = json.loads(
        _mint(live_server, tenant, "jobs", "create", "--model", IDLE_BASE, "--file", chat.id, "--from-adapter", ref,
              "--steps", "1", "--json").stdout
    )  # fmt: skip
    assert warm_only["from_adapter"] == ref and warm_only["stages"] is None
    not_a_list = tmp_path / "stage.json"
    not_a_list.write_text(json.dumps({"method": {"type": "supervised"}}))
    refused = _mint(live_server, tenant, "jobs", "create", "--model", IDLE_BASE, "--stages", str(not_a_list), code=6)
    assert "expected a JSON list of stages" in refused.stderr
    both = _mint(
        live_server, tenant, "jobs", "create", "--model", IDLE_BASE, "--stages", str(stages), "--method", "dpo", code=6
    )
    assert "either `method`" in both.stderr

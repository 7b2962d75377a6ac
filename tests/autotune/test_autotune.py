"""Auto mode on real workers: a goal and a budget in, trials as ordinary jobs and eval runs, the
best version out with its held-out comparison, every decision with its reason."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from mint.config import Settings
from mint.services.autotune.search import choose_methods, next_params, why_params
from tests.conftest import OwnInstall, Tenant, Workers, make_tenant, wait_for

BASE = "tiny-glm-moe"
FAST_TICKS = {"MINT_AUTOTUNE_POLL_S": "0.2"}


def _benchmark(client: TestClient, tenant: Tenant, n: int = 12) -> dict[str, Any]:
    body = {"name": "format-auto", "builtin": "format", "n": n}
    response = client.post("/v1/benchmarks", headers=tenant.headers("developer"), json=body)
    assert response.status_code == 201, response.text
    return response.json()


def _auto(client: TestClient, tenant: Tenant, run_id: str) -> dict[str, Any]:
    return client.get(f"/v1/autotune/{run_id}", headers=tenant.headers("viewer")).json()


def _finished(client: TestClient, tenant: Tenant, run_id: str) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        run = _auto(client, tenant, run_id)
        return run if run["status"] not in ("queued", "running") else None

    return wait_for(done, f"auto run {run_id} to finish", timeout=900)


@pytest.mark.torch
@pytest.mark.long_run
def test_an_auto_run_out_of_trials_stops_with_the_best_version_and_its_held_out_comparison(
    client: TestClient, tenant: Tenant, workers: Workers
) -> None:
    """The tiny random base cannot reach a held-out pass rate of 1: the run evaluates the base,
    mines its failures, runs its two trials (ordinary jobs and dev eval runs), then evaluates
    the best version on held-out and stops, saying why."""
    workers.start("auto", env=FAST_TICKS)
    benchmark = _benchmark(client, tenant)
    body = {
        "model": BASE,
        "benchmark_id": benchmark["id"],
        "target": {"pass_rate": 1.0},
        "budget": {"usd": 100.0},
        "constraints": {"methods": ["sft", "rl"], "max_trials": 2, "max_steps": 2},
        "eval_max_tokens": 8,
    }
    created = client.post("/v1/autotune", headers=tenant.headers("developer"), json=body)
    assert created.status_code == 201, created.text
    run = _finished(client, tenant, created.json()["id"])
    assert run["status"] == "stopped", run
    decisions = [d["decision"] for d in run["decisions"]]
    # The version without a dev split got one, the base was evaluated, its failures mined.
    assert decisions[0].startswith("use benchmark 'format-auto' version 2"), decisions
    assert "evaluate the base" in decisions and "mine chat data" in decisions and "try SFT" in decisions
    assert "skip RL" in decisions or "try SFT then RL" in decisions  # the random base earns no reward
    assert [t["number"] for t in run["trials"]] == [1, 2]
    first = run["trials"][0]
    assert first["method"] == "sft" and first["params"]["learning_rate_multiplier"] == 1.0
    for trial in run["trials"]:
        job = client.get(f"/v1/fine_tuning/jobs/{trial['job_id']}", headers=tenant.headers("viewer")).json()
        assert job["status"] == "succeeded", (job["error"], trial)
        assert job["metadata"]["autotune_run"] == run["id"]
        assert trial["model"] == job["fine_tuned_model"] and trial["dev_pass_rate"] is not None
        dev = client.get(f"/v1/evals/{trial['eval_id']}", headers=tenant.headers("viewer")).json()
        assert dev["split"] == "dev" and dev["model"] == trial["model"]
    assert run["best"]["model"] in {t["model"] for t in run["trials"]}
    result = run["result"]
    assert result["stop_reason"] == "all 2 trials allowed have run"
    assert result["model"] == run["best"]["model"] and 0 <= result["heldout_pass_rate"] < 1.0
    assert result["against_base"]["tasks"] > 0 and len(result["against_base"]["interval"]) == 2
    assert decisions[-1] == "finish: stopped" and run["phase"] == "done"
    assert run["cost_usd"] > 0 and run["finished_at"] is not None


def test_a_goal_without_a_budget_or_with_two_targets_is_refused_naming_the_field(
    client: TestClient, tenant: Tenant
) -> None:
    benchmark = _benchmark(client, tenant, n=4)
    base = {"model": BASE, "benchmark_id": benchmark["id"], "target": {"pass_rate": 0.5}, "budget": {"usd": 1}}
    cases = [
        ({**base, "budget": {}}, "budget"),
        ({**base, "target": {"pass_rate": 0.5, "delta_over_production": 0.1}}, "target"),
        ({**base, "target": {"delta_over_production": 0.1}}, "deployment"),
        ({**base, "splits": {"train": "train", "dev": "train"}}, "splits"),
        ({**base, "constraints": {"methods": ["ppo"]}}, "methods"),
    ]
    for body, field in cases:
        response = client.post("/v1/autotune", headers=tenant.headers("developer"), json=body)
        assert response.status_code == 422 and field in response.text, (body, response.text)
    other = client.post("/v1/autotune", headers=tenant.headers("developer"), json={**base, "benchmark_id": "bench_x"})
    assert other.status_code == 404
    viewer = client.post("/v1/autotune", headers=tenant.headers("viewer"), json=base)
    assert viewer.status_code == 403
    assert client.get("/v1/autotune", headers=tenant.headers("viewer")).json()["data"] == []


@pytest.mark.torch
@pytest.mark.long_run
def test_a_budget_that_cannot_pay_for_a_trial_and_the_held_out_evaluation_stops_the_search(
    client: TestClient, tenant: Tenant, workers: Workers, prepared: Settings
) -> None:
    """The money the final held-out evaluation will cost (its tasks at the most a task of the
    base's evaluations cost) is held back from the search: a budget that cannot pay for the
    first trial (its job and its dev evaluation) on top of it stops the run before any trial
    starts, and says so."""
    from mint.services.billing import prices
    from mint.storage.db import session_scope
    from mint.storage.tables import AutotuneRun, EvalRun

    workers.start("auto-budget", env=FAST_TICKS)
    benchmark = _benchmark(client, tenant, n=8)
    body = {
        "model": BASE,
        "benchmark_id": benchmark["id"],
        "target": {"pass_rate": 1.0},
        "budget": {"usd": 1e-6},
        "constraints": {"methods": ["sft"], "max_trials": 2, "max_steps": 2},
        "eval_max_tokens": 8,
    }
    created = client.post("/v1/autotune", headers=tenant.headers("developer"), json=body)
    assert created.status_code == 201, created.text
    run = _finished(client, tenant, created.json()["id"])
    assert run["status"] == "stopped" and run["trials"] == [], run
    assert any(d["decision"].startswith("hold back $") for d in run["decisions"]), run["decisions"]
    with session_scope(prepared.database) as session:
        state = session.get(AutotuneRun, run["id"]).state
        base_runs = [session.get(EvalRun, run_id) for run_id in state["base_evals"].values()]
        per_task = max(prices.eval_cost(session, r) / r.metrics["tasks"] for r in base_runs)
        heldout_tasks = session.get(EvalRun, state["base_evals"]["heldout"]).metrics["tasks"]
        # The held-out tasks at the most a task of the base's evaluations cost.
        assert state["heldout_reserve"] == pytest.approx(per_task * heldout_tasks) and per_task > 0
    stop = next(d for d in run["decisions"] if d["decision"] == "stop the search")
    assert "is held back for the held-out evaluation" in stop["reason"], stop
    assert "no trial produced a version" in run["decisions"][-1]["reason"]


@pytest.mark.torch
@pytest.mark.long_run
def test_an_auto_run_considering_two_bases_tries_each_default_then_goes_on_from_the_better(
    own_install: OwnInstall, own_client: TestClient, workers: Workers
) -> None:
    """Bases to consider: each is evaluated on dev and held-out, its default trial runs (a job on
    that base, under an adapter of its own), the next trial moves the better default's learning
    rate, and the best version is compared on held-out with its own base. On an install of its
    own: the rest of the suite keeps tiny-qwen3-moe idle (no job of it ever finishes there)."""
    client, tenant = own_client, make_tenant(own_install.settings)
    for base in (BASE, "tiny-qwen3-moe"):
        workers.start(f"auto-{base}", env={**own_install.env, **FAST_TICKS}, base=base)
    benchmark = _benchmark(client, tenant, n=8)
    body = {
        "model": BASE,
        "benchmark_id": benchmark["id"],
        "target": {"pass_rate": 1.0},
        "budget": {"usd": 100.0},
        "constraints": {"methods": ["sft"], "max_trials": 3, "max_steps": 2, "bases": ["tiny-qwen3-moe"]},
        "eval_max_tokens": 8,
    }
    created = client.post("/v1/autotune", headers=tenant.headers("developer"), json=body)
    assert created.status_code == 201, created.text
    run = _finished(client, tenant, created.json()["id"])
    assert run["status"] == "stopped", run
    considered = next(d for d in run["decisions"] if d["decision"] == "consider 2 bases")
    order = [name for name in (BASE, "tiny-qwen3-moe") if name in considered["reason"]]
    assert sorted(order) == sorted([BASE, "tiny-qwen3-moe"])
    trials = run["trials"]
    assert [t["params"]["base"] for t in trials[:2]] == sorted([BASE, "tiny-qwen3-moe"], key=considered["reason"].index)
    for trial in trials:
        job = client.get(f"/v1/fine_tuning/jobs/{trial['job_id']}", headers=tenant.headers("viewer")).json()
        assert job["status"] == "succeeded" and job["model"] == trial["params"]["base"], job
    better = max(trials[:2], key=lambda t: (t["dev_pass_rate"], t["dev_mean_score"]))
    assert trials[2]["params"]["base"] == better["params"]["base"]
    assert trials[2]["params"]["learning_rate_multiplier"] == 2.0
    best = next(t for t in trials if t["model"] == run["best"]["model"])
    assert run["result"]["base_model"] == best["params"]["base"]


@pytest.mark.torch
@pytest.mark.long_run
def test_an_auto_run_allowed_full_parameters_trains_them_when_the_budget_affords_it_and_lora_when_not(
    client: TestClient, tenant: Tenant, workers: Workers, prepared: Settings
) -> None:
    """With LoRA and full-parameter training allowed, the LoRA default comes first, then the same
    default with every weight trained (a whole-model version, evaluated on dev like any other).
    When the GPU-hour price makes the full-parameter trial cost more than the budget has left,
    the run says so and goes on with LoRA."""
    from mint.services.billing import prices
    from mint.storage.db import session_scope
    from mint.storage.tables import AdapterVersion, Price

    workers.start("auto-full", env=FAST_TICKS)
    benchmark = _benchmark(client, tenant, n=8)
    body = {
        "model": BASE,
        "benchmark_id": benchmark["id"],
        "target": {"pass_rate": 1.0},
        "budget": {"usd": 100.0},
        "constraints": {"methods": ["sft"], "training_types": ["lora", "full"], "max_trials": 2, "max_steps": 2},
        "eval_max_tokens": 8,
    }

    def run_to_end() -> dict[str, Any]:
        created = client.post("/v1/autotune", headers=tenant.headers("developer"), json=body)
        assert created.status_code == 201, created.text
        return _finished(client, tenant, created.json()["id"])

    run = run_to_end()
    decisions = [d["decision"] for d in run["decisions"]]
    assert "consider full-parameter training" in decisions, decisions
    lora, full = run["trials"]
    assert lora["params"]["training_type"] == "lora" and full["params"]["training_type"] == "full"
    assert {k: v for k, v in full["params"].items() if k != "training_type"} == {
        k: v for k, v in lora["params"].items() if k != "training_type"
    }
    assert "start trial 2: sft (full-parameter)" in decisions
    job = client.get(f"/v1/fine_tuning/jobs/{full['job_id']}", headers=tenant.headers("viewer")).json()
    assert job["status"] == "succeeded" and job["training_type"] == "full", job
    with session_scope(prepared.database) as session:
        version = session.get(AdapterVersion, job["adapter_version_id"])
        assert version is not None and version.kind == "full"
    dev = client.get(f"/v1/evals/{full['eval_id']}", headers=tenant.headers("viewer")).json()
    assert dev["status"] == "succeeded" and dev["model"] == full["model"], dev
    assert run["result"]["model"] in (lora["model"], full["model"])

    # A GPU-hour price no budget of $100 pays for: the full-parameter default is skipped.
    with session_scope(prepared.database) as session:
        priced_before = session.get(Price, BASE) is not None
        previous = prices.prices_for(session, BASE)
        prices.set_prices(session, BASE, {"gpu_hour": prices.MAX_PRICE})
    try:
        starved = run_to_end()
    finally:
        with session_scope(prepared.database) as session:
            restore = {"gpu_hour": previous.gpu_hour} if priced_before else dict.fromkeys(prices.PRICE_FIELDS)
            prices.set_prices(session, BASE, restore)
    skip = next(d for d in starved["decisions"] if d["decision"] == "skip full-parameter training")
    assert "more than the budget has left" in skip["reason"] and "s of device time" in skip["reason"], skip
    assert [t["params"]["training_type"] for t in starved["trials"]] == ["lora", "lora"]
    assert starved["trials"][1]["params"]["learning_rate_multiplier"] == 2.0  # the search went on


@pytest.mark.backend_free
def test_with_lora_and_full_allowed_the_defaults_are_lora_then_full_parameter_sft() -> None:
    first = next_params([], ["sft", "dpo"], max_rank=16, max_steps=8, seed=0, choose_full=True)
    second = next_params([(first, 0.2)], ["sft", "dpo"], max_rank=16, max_steps=8, seed=0, choose_full=True)
    assert (first["training_type"], second["training_type"]) == ("lora", "full") and second["method"] == "sft"
    assert "every weight trained" in why_params([(first, 0.2)], (), choose_full=True)
    third = next_params(
        [(first, 0.2), (second, 0.5)], ["sft", "dpo"], max_rank=16, max_steps=8, seed=0, choose_full=True
    )
    assert third == {**second, "learning_rate_multiplier": 2.0}  # the better default, full-parameter
    history = [(first, 0.2), (second, 0.5), (third, 0.4), ({**second, "learning_rate_multiplier": 0.5}, 0.3)]
    for seed in range(6):  # TPE's picks: full-parameter training only with SFT
        params = next_params(history, ["sft", "dpo"], max_rank=16, max_steps=8, seed=seed, choose_full=True)
        assert params["training_type"] == "lora" or params["method"] == "sft", params
    # A run that dropped full-parameter training goes on from its LoRA trials alone.
    lora_only = next_params([(first, 0.2)], ["sft", "dpo"], max_rank=16, max_steps=8, seed=0)
    assert lora_only == {**first, "learning_rate_multiplier": 2.0}
    assert next_params(history, ["sft", "dpo"], max_rank=16, max_steps=8, seed=0)["method"] in ("sft", "dpo")


@pytest.mark.backend_free
def test_several_bases_each_get_the_default_first_then_the_best_default_moves() -> None:
    bases = ["glm", "qwen"]
    first = next_params([], ["sft"], max_rank=16, max_steps=8, seed=0, bases=bases)
    second = next_params([(first, 0.2)], ["sft"], max_rank=16, max_steps=8, seed=0, bases=bases)
    assert (first["base"], second["base"]) == ("glm", "qwen")
    assert {k: v for k, v in first.items() if k != "base"} == {k: v for k, v in second.items() if k != "base"}
    third = next_params([(first, 0.2), (second, 0.5)], ["sft"], max_rank=16, max_steps=8, seed=0, bases=bases)
    assert third == {**second, "learning_rate_multiplier": 2.0}
    assert why_params([(first, 0.2), (second, 0.5)], bases) == (
        "the default on base qwen, the best default with its learning rate doubled"
    )
    fourth = next_params(
        [(first, 0.2), (second, 0.5), (third, 0.4)], ["sft"], max_rank=16, max_steps=8, seed=0, bases=bases
    )
    assert fourth == {**second, "learning_rate_multiplier": 0.5}
    tpe = next_params(
        [(first, 0.2), (second, 0.5), (third, 0.4), (fourth, 0.3)],
        ["sft"],
        max_rank=16,
        max_steps=8,
        seed=0,
        bases=bases,
    )
    assert tpe["base"] in bases


def test_methods_follow_the_base_results_and_the_mined_data() -> None:
    mined = {"chat": "ds_1", "preference": "ds_2", "prompts": "ds_3"}
    never = choose_methods(["sft", "dpo", "rl"], {"accuracy": 0.0, "mean_score": 0.0}, mined)
    assert never.methods == ["sft", "sft_rl", "dpo"]  # no reward signal: RL only after SFT
    sometimes = choose_methods(["sft", "dpo", "rl"], {"accuracy": 0.3, "mean_score": 0.4}, mined)
    assert sometimes.methods == ["sft", "dpo", "rl"]
    only_rl = choose_methods(["rl"], {"accuracy": 0.0, "mean_score": 0.0}, mined)
    assert only_rl.methods == [] and only_rl.reasons[0][0] == "skip RL"
    no_data = choose_methods(["sft", "dpo"], {"accuracy": 0.0}, {"chat": None, "preference": None})
    assert no_data.methods == [] and [d for d, _ in no_data.reasons] == ["skip SFT", "skip DPO"]


def test_the_search_starts_from_the_default_then_explores_the_space_deterministically() -> None:
    first = next_params([], ["sft", "dpo"], max_rank=8, max_steps=16, seed=3)
    assert first == {"method": "sft", "learning_rate_multiplier": 1.0, "rank": 8, "steps": 16}
    history: list[tuple[dict[str, Any], float]] = [(first, 0.25)]
    chosen = []
    for score in (0.1, 0.5, 0.2, 0.3):
        params = next_params(history, ["sft", "dpo"], max_rank=8, max_steps=16, seed=3)
        assert params["method"] in ("sft", "dpo") and params["rank"] in (4, 8) and 4 <= params["steps"] <= 16
        assert 0.25 <= params["learning_rate_multiplier"] <= 4.0
        history.append((params, score))
        chosen.append(params)
    # The default's learning rate moves first: doubled; that did worse (0.1 < 0.25), so halved.
    assert [params["learning_rate_multiplier"] for params in chosen[:2]] == [2.0, 0.5]
    assert all({**params, "learning_rate_multiplier": 1.0} == first for params in chosen[:2])
    again = [next_params(history[: i + 1], ["sft", "dpo"], max_rank=8, max_steps=16, seed=3) for i in range(4)]
    assert again == chosen  # the database is the study's memory: the same trials, the same choice


def test_a_doubled_learning_rate_that_helps_is_doubled_again() -> None:
    first = next_params([], ["sft"], max_rank=16, max_steps=24, seed=0)
    doubled = next_params([(first, 0.4)], ["sft"], max_rank=16, max_steps=24, seed=0)
    again = next_params([(first, 0.4), (doubled, 0.6)], ["sft"], max_rank=16, max_steps=24, seed=0)
    assert (doubled["learning_rate_multiplier"], again["learning_rate_multiplier"]) == (2.0, 4.0)
    # The decision log says why each trial has its parameters.
    assert why_params([(first, 0.4), (doubled, 0.6)]).startswith("the default's learning rate doubled again")
    assert why_params([(first, 0.4), (doubled, 0.6), (again, 0.5)]) == "chosen by TPE from the trials so far"


def test_a_driver_that_keeps_failing_ends_the_run_with_its_error_instead_of_ticking_for_ever(
    client: TestClient, tenant: Tenant, prepared: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each tick that raises is retried by the next one, until MAX_TICK_ERRORS in a row: then the
    run fails with the error, and its webhook event is written like any other ending. (The error
    is injected: nothing here can make the driver fail for real on demand.)"""
    from mint.services.autotune import driver as autotune_driver
    from mint.services.autotune import runs as autotune
    from mint.storage.db import session_scope
    from mint.storage.tables import AutotuneRun

    benchmark = _benchmark(client, tenant, n=4)
    body = {"model": BASE, "benchmark_id": benchmark["id"], "target": {"pass_rate": 0.5}, "budget": {"usd": 1}}
    run_id = client.post("/v1/autotune", headers=tenant.headers("developer"), json=body).json()["id"]

    def broken(tick: Any) -> bool:
        raise RuntimeError("disk full")

    monkeypatch.setattr(autotune_driver, "advance", broken)
    sent: list[list[str]] = []
    for attempt in range(1, autotune.MAX_TICK_ERRORS + 1):
        with session_scope(prepared.database) as session:
            run = session.get(AutotuneRun, run_id)
            assert run is not None and run.status == "queued", (attempt, run and run.status)
            tick_id = run.tick_id
        assert tick_id is not None
        with pytest.raises(RuntimeError, match="disk full"):
            autotune.tick(prepared, run_id, tick_id, lambda task, **kw: sent.append(kw["args"]))
    failed = _auto(client, tenant, run_id)
    assert failed["status"] == "failed" and "RuntimeError: disk full" in failed["error"]["message"], failed
    assert len(sent) == autotune.MAX_TICK_ERRORS - 1  # no tick follows the last one
    assert failed["decisions"][-1]["decision"] == "finish: failed"


@pytest.mark.backend_free
def test_a_trial_without_a_training_type_of_its_own_trains_full_parameters_only_when_nothing_else_is_allowed() -> None:
    from mint.schemas.autotune import AutotuneCreate
    from mint.services.autotune.trial_jobs import training_type

    def request(types: list[str]) -> AutotuneCreate:
        return AutotuneCreate.model_validate(
            {
                "model": BASE,
                "benchmark_id": "bench_1",
                "target": {"pass_rate": 1.0},
                "budget": {"usd": 1.0},
                "constraints": {"methods": ["sft", "dpo"], "training_types": types},
            }
        )

    tpe_pick = {"method": "dpo", "learning_rate_multiplier": 1.0, "rank": 8, "steps": 8}  # no training_type
    assert training_type(request(["full", "lora"]), tpe_pick) == "lora"  # a run that dropped full parameters
    assert training_type(request(["lora"]), tpe_pick) == "lora"
    assert training_type(request(["full"]), {**tpe_pick, "method": "sft"}) == "full"
    assert training_type(request(["full", "lora"]), {**tpe_pick, "training_type": "full"}) == "full"


@pytest.mark.backend_free
def test_the_typed_state_reads_a_stored_row_and_writes_it_back_unchanged() -> None:
    """`AutotuneState` is the `state` column with types: reading a row and writing it back keeps
    every key as stored (nulls, nested records, and keys of an older Mint such as
    `base_heldout`), and a key is written only once it is set."""
    from mint.schemas.autotune_state import AutotuneState

    comparison = {"accuracy_delta": 0.25, "interval": [0.1, 0.4], "significant": True, "fixed": 3, "broken": 1}
    stored = {
        "phase": "done",
        "version": 2,
        "benchmark_version_id": "bv_1",
        "grader": None,
        "base_evals": {"train": "eval_1", "dev": "eval_2", "heldout": "eval_3"},
        "base_heldout": 0.5,
        "production": "ft:x@1",
        "production_evals": {"dev": "eval_4", "heldout": "eval_5"},
        "base_dev": {"accuracy": 0.25, "mean_score": 0.5},
        "dev_target": 0.75,
        "heldout_reserve": 0.0125,
        "datasets": {"chat": "ds_1", "preference": None},
        "methods": ["sft"],
        "choose_full": False,
        "best": {"trial": 2, "model": "ft:x@2", "dev_pass_rate": 0.75, "dev_mean_score": 0.8},
        "final_eval": "eval_6",
        "result": {
            "model": "ft:x@2",
            "heldout_pass_rate": 0.75,
            "base_heldout_pass_rate": 0.5,
            "against_base": {**comparison, "tasks": 8},
            "stop_reason": "all 2 trials allowed have run",
            "against_production": {**comparison, "tasks": 8},
            "production": "ft:x@1",
        },
        "stop_reason": "all 2 trials allowed have run",
        "waiting": "at the quota",
    }
    state = AutotuneState.model_validate(stored)
    assert state.stored() == stored
    assert state.best is not None and state.best.base is None and state.best.model == "ft:x@2"
    assert state.result is not None and state.result.against_base is not None
    assert state.result.against_base.interval == [0.1, 0.4]
    fresh = AutotuneState(phase="baseline")
    assert fresh.stored() == {"phase": "baseline"}
    fresh.tick_errors += 1
    fresh.phase = "search"
    assert fresh.stored() == {"phase": "search", "tick_errors": 1}
    assert AutotuneState.model_validate({}).stored() == {} and AutotuneState().heldout_reserve == 0.0

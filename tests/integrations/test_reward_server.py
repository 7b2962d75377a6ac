"""`mint reward-server` end to end: the real command in its own process, called over HTTP with
requests signed as Mint signs them, serves TRL's, verl's and OpenRLHF-shaped reward functions,
unmodified, and its rewards are the ones those functions give when called directly; requests
that are unsigned, malformed or too long are refused, a function that raises answers 500 with
its exception and leaves the server up, and a function that fits no style is refused at start."""

from __future__ import annotations

import base64
import importlib.util
import inspect
import json
import os
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from trl.rewards import accuracy_reward, think_format_reward

from mint.services.webhooks.delivery import signed_headers

pytestmark = pytest.mark.backend_free

SECRET = "whsec_" + base64.b64encode(b"reward-server-test-secret").decode()
OTHER_SECRET = "whsec_" + base64.b64encode(b"some-other-endpoint-secret").decode()
# verl is installed off sys.path, in .venv/verl (see the Makefile): `import verl` would fail anyway,
# for lack of Ray; its reward functions are plain files, loaded by path.
VERL_GSM8K = Path(sys.prefix) / "verl" / "verl" / "utils" / "reward_score" / "gsm8k.py"
TRL_FORMAT_REWARDS = Path(inspect.getfile(think_format_reward))  # trl/rewards/format_rewards.py

# OpenRLHF's documented shape (examples/python/reward_func.py): the batch's queries (prompt +
# response), prompts and labels in; a dict of tensors out, with per-item logs.
OPENRLHF_REWARDS = """
import torch


def reward_func(queries, prompts, labels, **kwargs):
    responses = [query[len(prompt):] for query, prompt in zip(queries, prompts)]
    rewards = torch.tensor([1.0 if label in response else 0.0 for response, label in zip(responses, labels)])
    return {
        "rewards": rewards,
        "scores": rewards,
        "extra_logs": {"response_chars": torch.tensor([float(len(response)) for response in responses])},
    }
"""

# A TRL-style function that needs a `level` column, raises on a completion that says "boom", and
# scores -1 off the main thread (where math_verify's signal.alarm timeouts would not work).
FLAKY_REWARDS = """
import threading


def flaky(completions, level, **kwargs):
    texts = [completion[0]["content"] for completion in completions]
    if any("boom" in text for text in texts):
        raise ZeroDivisionError("no rewards for a boom")
    on_main_thread = threading.current_thread() is threading.main_thread()
    return [float(level_) if on_main_thread else -1.0 for level_ in level]
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def mint_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "mint", "reward-server", *args]


@dataclass
class RewardServer:
    """A running `mint reward-server` and everything it has printed."""

    url: str
    process: subprocess.Popen[str]
    output: list[str] = field(default_factory=list)

    def post(self, body: bytes, headers: dict[str, str]) -> httpx.Response:
        return httpx.post(self.url, content=body, headers=headers, timeout=None)

    def rewards(self, items: list[dict[str, Any]], *, secret: str = SECRET) -> httpx.Response:
        body = json.dumps({"type": "reward.request", "items": items})
        return self.post(body.encode(), signed_headers(secret, f"msg_{uuid.uuid4().hex}", body))


def until_listening(command: list[str]) -> tuple[subprocess.Popen[str], list[str]]:
    """Start a `mint ...-server` command and return once it prints `listening on ...` (its socket
    accepts connections), with what it printed; it keeps being read, so that its pipe never fills."""
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    output: list[str] = []
    assert process.stdout is not None
    for line in process.stdout:
        output.append(line)
        if line.startswith("listening on "):
            break
    else:
        raise AssertionError(f"{' '.join(command[2:4])} exited with {process.wait()}:\n{''.join(output)}")
    threading.Thread(target=lambda: output.extend(process.stdout or []), daemon=True).start()
    return process, output


@pytest.fixture
def start_server() -> Iterator[Callable[..., RewardServer]]:
    servers: list[RewardServer] = []

    def start(function: str, *args: str, secret: str = SECRET, port: int | None = None) -> RewardServer:
        port = port or free_port()
        process, output = until_listening(mint_command(function, "--port", str(port), "--secret", secret, *args))
        server = RewardServer(f"http://127.0.0.1:{port}/", process, output)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.process.terminate()
        server.process.wait()


def chat_item(question: str, answer: str, reference: Any, **columns: Any) -> dict[str, Any]:
    return {
        "prompt": [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": question}],
        "completion": [{"role": "assistant", "content": answer}],
        "completion_text": answer,
        "reference": reference,
        "data_source": None,
        "extra_info": {},
        "columns": columns,
    }


def test_trl_accuracy_and_format_rewards_on_conversational_completions(
    start_server: Callable[..., RewardServer],
) -> None:
    items = [
        chat_item("What is 1/3 of 1?", r"The answer is \boxed{\frac{1}{3}}", r"$\frac{1}{3}$"),
        chat_item("What is half of 1?", r"<think>halving</think>It is \boxed{\frac{1}{3}}", r"$\frac{1}{2}$"),
        chat_item("What is 6*7?", r"<think>six sevens</think>\boxed{42}", "$42$"),
        # TRL's accuracy_reward skips a solution it cannot parse (None): scored 0.0 with a detail.
        chat_item("Say hello.", "hello", "no mathematics here"),
    ]
    completions = [item["completion"] for item in items]
    solutions = [item["reference"] for item in items]

    accuracy = start_server("trl.rewards:accuracy_reward")
    assert "trl style (it takes `completions`" in "".join(accuracy.output)
    answer = accuracy.rewards(items)
    assert answer.status_code == 200, answer.text
    direct = accuracy_reward(completions, solution=solutions)
    assert direct == [1.0, 0.0, 1.0, None]
    assert answer.json()["rewards"] == [1.0, 0.0, 1.0, 0.0]
    details = answer.json()["details"]
    assert "gold_parsed=" in details[0] and "answer_parsed=" in details[0]  # what it logged with log_extra
    assert "returned None" in details[3]

    # By file path, as verl's files are loaded.
    think = start_server(f"{TRL_FORMAT_REWARDS}:think_format_reward")
    answer = think.rewards(items)
    assert answer.status_code == 200, answer.text
    assert answer.json()["rewards"] == think_format_reward(completions) == [0.0, 1.0, 1.0, 0.0]
    assert answer.json()["details"] == [None] * 4


def test_verl_gsm8k_compute_score_loaded_by_path(start_server: Callable[..., RewardServer]) -> None:
    assert VERL_GSM8K.is_file(), f"no {VERL_GSM8K}: `make install` puts verl there"
    spec = importlib.util.spec_from_file_location("gsm8k_for_test", VERL_GSM8K)
    assert spec is not None and spec.loader is not None
    gsm8k = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gsm8k)
    answers = [
        ("Tom has 40 apples and buys 2 more.", "40 + 2 = 42\n#### 42", "42"),
        ("Ann has 10 pens and loses 3.", "10 - 3 = 6\n#### 6", "7"),
        ("What is 1,000 + 234?", "#### 1,234", "1234"),
        ("What is 5 - 9?", "The answer is -4.", "-4"),  # no `####`: strict extraction finds nothing
    ]
    items = [
        {**chat_item(question, answer, reference), "data_source": "openai/gsm8k", "extra_info": {"split": "test"}}
        for question, answer, reference in answers
    ]

    server = start_server(f"{VERL_GSM8K}:compute_score")
    assert "verl style (it takes `solution_str, ground_truth`" in "".join(server.output)
    answer = server.rewards(items)
    assert answer.status_code == 200, answer.text
    direct = [gsm8k.compute_score(answer, reference) for _, answer, reference in answers]
    assert direct == [1.0, 0.0, 1.0, 0]
    assert answer.json()["rewards"] == direct


def test_openrlhf_reward_func_in_its_documented_shape(
    start_server: Callable[..., RewardServer], tmp_path: Path
) -> None:
    rewards_file = tmp_path / "reward_func.py"
    rewards_file.write_text(OPENRLHF_REWARDS)
    items = [chat_item("Capital of France?", "Paris", "Paris"), chat_item("Capital of Italy?", "Milan", "Rome")]

    server = start_server(f"{rewards_file}:reward_func")
    assert "openrlhf style (it takes `queries`" in "".join(server.output)
    answer = server.rewards(items)
    assert answer.status_code == 200, answer.text

    spec = importlib.util.spec_from_file_location("openrlhf_for_test", rewards_file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # The prompt as text is each message's content on its own line; the query is it and the answer.
    prompts = ["".join(message["content"] + "\n" for message in item["prompt"]) for item in items]
    queries = [prompt + item["completion_text"] for prompt, item in zip(prompts, items, strict=True)]
    direct = module.reward_func(queries, prompts, [item["reference"] for item in items])
    assert answer.json()["rewards"] == direct["rewards"].tolist() == [1.0, 0.0]
    assert answer.json()["details"] == ["response_chars=5.0", "response_chars=5.0"]


def test_refusals_and_a_raising_function(start_server: Callable[..., RewardServer], tmp_path: Path) -> None:
    rewards_file = tmp_path / "flaky.py"
    rewards_file.write_text(FLAKY_REWARDS)
    server = start_server(f"{rewards_file}:flaky", "--max-request-bytes", "4096")
    good = [chat_item("Q?", "fine", None, level=0.5)]
    body = json.dumps({"type": "reward.request", "items": good})

    assert httpx.get(server.url + "health").json() == {"status": "ok", "style": "trl"}
    assert server.rewards(good).json() == {"rewards": [0.5], "details": [None]}

    # Signed with another endpoint's secret, or not signed: 401.
    assert server.rewards(good, secret=OTHER_SECRET).status_code == 401
    unsigned = server.post(body.encode(), {"content-type": "application/json"})
    assert unsigned.status_code == 401
    assert unsigned.json()["error"]["type"] == "authentication_error"
    # A body changed after signing: 401.
    headers = signed_headers(SECRET, "msg_tampered", body)
    assert server.post(body.replace("0.5", "0.9").encode(), headers).status_code == 401

    # Signed, but not the protocol: 400, naming the field.
    for bad, where in [
        ("not json", "body"),
        (json.dumps({"type": "webhook.event", "items": good}), "type"),
        (json.dumps({"type": "reward.request", "items": [{"prompt": []}]}), "items.0.completion_text"),
        (json.dumps({"type": "reward.request", "items": []}), "items"),
    ]:
        answer = server.post(bad.encode(), signed_headers(SECRET, f"msg_{uuid.uuid4().hex}", bad))
        assert answer.status_code == 400, (bad, answer.text)
        assert answer.json()["error"]["param"] == where, answer.text

    # Longer than --max-request-bytes: 413.
    long_items = [chat_item("Q?", "x" * 5000, None, level=1)]
    assert server.rewards(long_items).status_code == 413

    # The items lack a keyword the function needs: 422, which Mint does not retry.
    answer = server.rewards([chat_item("Q?", "fine", None)])
    assert answer.status_code == 422
    assert "level" in answer.json()["error"]["message"]

    # The function raises: 500 with its exception, and the server goes on serving.
    answer = server.rewards([chat_item("Q?", "boom", None, level=1)])
    assert answer.status_code == 500
    assert answer.json()["error"] == {
        "type": "reward_function_error",
        "message": "ZeroDivisionError: no rewards for a boom",
        "exception": "ZeroDivisionError",
    }
    assert server.rewards(good).json()["rewards"] == [0.5]
    assert server.process.poll() is None
    assert "ZeroDivisionError: no rewards for a boom" in "".join(server.output)  # its traceback, for the team


def test_a_function_that_fits_no_style_is_refused(tmp_path: Path) -> None:
    rewards_file = tmp_path / "odd.py"
    rewards_file.write_text("def score(text, answer):\n    return float(text == answer)\n")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(mint_command(*args), capture_output=True, text=True)

    refused = run(f"{rewards_file}:score", "--secret", SECRET)
    assert refused.returncode == 2
    assert "fits no reward style" in refused.stderr
    assert "`queries, prompts, labels`" in refused.stderr  # what would fit

    wrong_style = run(f"{rewards_file}:score", "--secret", SECRET, "--style", "openrlhf")
    assert wrong_style.returncode == 2
    assert "cannot be served as openrlhf" in wrong_style.stderr

    missing = run(f"{rewards_file}:nothing", "--secret", SECRET)
    assert missing.returncode == 2
    assert "has no 'nothing'; its functions: score" in missing.stderr

    no_secret = run(f"{rewards_file}:score", "--secret", "")
    assert no_secret.returncode == 2
    assert "MINT_REWARD_SECRET" in no_secret.stderr


def test_the_reward_server_imports_neither_torch_nor_trl() -> None:
    # A team's machine needs only Mint's core for it; a function of theirs brings what it uses.
    probe = (
        "import sys, mint.integrations.reward_server, mint.cli.reward_server; "
        "print(sorted({'torch', 'trl'} & set(sys.modules)))"
    )
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout == "[]\n"

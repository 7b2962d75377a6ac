"""`mint up` with two serving nodes of one base, as an operator runs it: it says when the base
can serve, its `/readyz` counts the nodes, and a node killed with SIGKILL fails no request
(the other answers) and is started again by the supervisor, taking its place at its address.
The CLI finds the platform on its non-default port with nothing else set, and a clean start
logs no traceback.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from mint.config import Settings
from mint.services.serving.nodes import live_nodes
from mint.storage.db import session_scope
from tests.conftest import free_port, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.torch, pytest.mark.client_surface]

BASE = "tiny-glm-moe"


def node_pids(settings: Settings) -> dict[str, int]:
    """URL -> pid of each live serving node of BASE that the installation's database lists."""
    with session_scope(settings.database) as session:
        return {node.url: node.pid for node in live_nodes(session, BASE)}


def test_up_runs_two_nodes_of_a_base_and_a_killed_one_fails_no_request(tmp_path: Path) -> None:
    port = free_port()
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MINT_")}
    env |= {"MINT_HOME": str(home), "MINT_API_PORT": str(port), "HF_HUB_OFFLINE": "1"}
    settings = Settings(home=home)
    api = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "up.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "mint", "up", "--serve", BASE, "--serve", BASE],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def logged(text: str) -> bool:
        assert process.poll() is None, log_path.read_text()[-5000:]
        return text in log_path.read_text()

    try:
        wait_for(lambda: logged("Mint is up"), "mint up to say it is up")
        output = log_path.read_text()
        assert output.index(f"{BASE} can serve") < output.index("Mint is up"), output[-3000:]
        ready = httpx.get(f"{api}/readyz", timeout=10)
        assert ready.status_code == 200 and ready.json()["loading"] == [], ready.text
        pids = wait_for(lambda: len(node_pids(settings)) == 2 and node_pids(settings), "both nodes to register")
        assert httpx.get(f"{api}/readyz", timeout=10).json()["serving"][BASE]["live_nodes"] == 2
        # Two nodes of one base on one machine: each has an adapter cache of its own.
        assert {folder.name for folder in (home / "adapter-cache").iterdir()} >= {BASE, f"{BASE}.1"}

        # The CLI in the same environment finds this API on its non-default port with nothing else
        # set (MINT_API_PORT), and a shell without even that finds it through what `mint up` wrote.
        for cli_env in (env, {k: v for k, v in env.items() if k != "MINT_API_PORT"}):
            listed = subprocess.run(
                [sys.executable, "-m", "mint", "jobs", "list", "--json"], env=cli_env, capture_output=True, text=True
            )
            assert listed.returncode == 0 and listed.stdout.strip().startswith("["), listed.stdout + listed.stderr

        key = (home / "admin.key").read_text().strip()
        headers = {"Authorization": f"Bearer {key}"}

        def complete(stream: bool) -> None:
            body = {"model": BASE, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "stream": stream}
            reply = httpx.post(f"{api}/v1/chat/completions", headers=headers, json=body, timeout=60)
            assert reply.status_code == 200, reply.text
            if stream:
                assert '"error"' not in reply.text and reply.text.endswith("data: [DONE]\n\n"), reply.text
            else:
                assert reply.json()["usage"]["completion_tokens"] >= 1, reply.text

        complete(stream=False)
        # A clean start logs no traceback: the expected answers while the nodes load (503s) are
        # one line each, and every line names its request. The API writes a request's line once
        # the answer is sent, so the client can read the answer before the line is in the log.
        wait_for(lambda: logged("/v1/chat/completions 200"), "the API to log the completion's request line")
        started = log_path.read_text()
        assert "Traceback" not in started, started[-5000:]
        assert "mint.api.requests [req_" in started, started[-3000:]
        killed_url, killed_pid = sorted(pids.items())[0]
        os.kill(killed_pid, signal.SIGKILL)
        for number in range(10):  # every one answered, by the node still up
            complete(stream=number % 2 == 1)

        # The supervisor starts the killed node again, at its address; its old row is gone.
        def restarted() -> bool:
            now = node_pids(settings)
            return len(now) == 2 and now.get(killed_url) not in (None, killed_pid)

        wait_for(restarted, "the killed node to be restarted and registered at its address")
        assert "serve tiny-glm-moe #" in log_path.read_text()  # the restart named the node
        for number in range(4):
            complete(stream=number % 2 == 1)
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:  # never leave a platform running for the tests after this one
            process.kill()
            process.wait()
            raise

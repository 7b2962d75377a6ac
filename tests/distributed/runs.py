"""The same training runs, made once by one process and once by a 2-rank worker group
(`group_script.py`), so that `test_group_training.py` can compare what they give."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from mint.config import PROJECT_ROOT
from mint.errors import NotFound
from mint.trainer.full import FullParameterTrainer
from mint.trainer.session import ResidentBase
from mint.trainer.types import AdamParams, Datum, LoraOptions, SamplingParams

BASE_NAME = "tiny-glm-moe"
STEPS = 3


def probe() -> list[Datum]:
    """Two sequences of different lengths, every target weighted."""
    data = []
    for start, length in ((100, 40), (900, 24)):
        tokens = list(range(start, start + length))
        data.append(
            Datum(
                model_input=tokens[:-1],
                loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (length - 1)},
            )
        )
    return data


def run_lora(base: ResidentBase, adapter_file: Path) -> dict[str, Any]:
    """Train a LoRA session for STEPS steps, then sample and score with it; its adapter goes to `adapter_file`."""
    session = base.create_session(LoraOptions(seed=3))
    losses = []
    for _ in range(STEPS):
        losses.append(session.forward_backward(probe(), "cross_entropy").metrics["loss:sum"])
        session.optim_step(AdamParams(learning_rate=1e-2))
    # A call on a closed session is refused, on a group as on one process, and the base goes on.
    closed = base.create_session(LoraOptions(seed=4))
    base.close(closed.session_id)
    try:
        closed.optim_step(AdamParams(learning_rate=1e-2))
        refused = False
    except NotFound:
        refused = True
    # Greedy: a seeded draw at temperature 1 can land within round-off of a token's boundary.
    samples = session.sample(list(range(100, 110)), SamplingParams(max_tokens=8, temperature=0.0), 2)
    logprobs = session.forward(probe()).logprobs
    save_file({name: p.detach().contiguous() for name, p in session.named_parameters().items()}, adapter_file)
    base.close(session.session_id)
    return {
        "losses": losses,
        "samples": [sample.tokens for sample in samples],
        "logprobs": [[float(value) for value in row] for row in logprobs],
        "closed_refused": refused,
    }


def run_full(trainer: FullParameterTrainer, state_folder: Path) -> list[float]:
    """Train every weight for STEPS steps, then save the resumable state into `state_folder`."""
    losses = []
    for _ in range(STEPS):
        losses.append(trainer.forward_backward(probe(), "cross_entropy").metrics["loss:sum"])
        trainer.optim_step(AdamParams(learning_rate=1e-3))
    trainer.save_state(state_folder)
    return losses


def run_two_ranks(script: str, *args: object) -> None:
    """Run `tests/distributed/<script>` on 2 gloo ranks under torchrun's standalone agent, with
    `args` on its command line; raises if any rank fails."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            str(PROJECT_ROOT / "tests" / "distributed" / script),
            *map(str, args),
        ],
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
        check=True,
        timeout=600,
    )


@contextmanager
def one_thread_as_the_ranks_run() -> Iterator[None]:
    """Run the one-process side on one torch thread, as torchrun gives each rank, so that its
    kernels sum in the ranks' order; the previous setting is put back after."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)

"""The steps `test_data_parallel.py` compares: made once by one process and once by a 2-rank
worker group (`split_script.py`), whose ranks each run their share of every batch's rows.

Every batch has an odd number of rows (or pairs), so the two ranks' shares are uneven, and one
batch has a single row, so that one rank has none and runs the stand-in. Each LoRA case starts
from the same nonzero adapter (both of its matrices), so that every gradient is nonzero. The
last LoRA case is a mixed pass of two sessions, each of whose rows all fall on one rank.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from mint.trainer.full import FullParameterTrainer
from mint.trainer.mixed_adapters import can_mix
from mint.trainer.scoring import ScoreRequest
from mint.trainer.session import ResidentBase
from mint.trainer.training_session import BackwardCall
from mint.trainer.types import AdamParams, Datum, LoraOptions

# (start token, length) of each row: lengths differ, so rows are padded or run end to end. The
# first is long: the rank that runs it runs two chunks of the output head, the other rank one.
ROWS = ((100, 150), (900, 21), (2000, 26), (3100, 17), (4200, 24))


def sft(rows: int = len(ROWS)) -> list[Datum]:
    """Sequences with weighted targets (a prompt of 5 tokens weighted 0)."""
    data = []
    for start, length in ROWS[:rows]:
        tokens = list(range(start, start + length + 1))
        weights = [0.0] * 5 + [1.0] * (length - 5)
        data.append(Datum(model_input=tokens[:-1], loss_fn_inputs={"target_tokens": tokens[1:], "weights": weights}))
    return data


def rl() -> list[Datum]:
    """Sampled sequences with their sampling logprobs (near the model's, so that PPO clips some
    tokens and not others) and advantages on the completion. The first three are samples of one
    prompt of 20 tokens: the rank that runs them alone would run that prompt once (a prefix pass
    and a suffix pass), the other rank's rows share nothing."""
    generator = torch.Generator().manual_seed(7)
    prompt = list(range(5000, 5020))
    data = []
    for row, (start, length) in enumerate(ROWS):
        completion = list(range(start + 7, start + 7 + min(length, 40) - 19))
        tokens = (prompt if row < 3 else list(range(start, start + 20))) + completion
        length = len(tokens) - 1
        sampled = (-10.8 + 0.3 * torch.randn(length, generator=generator)).tolist()
        advantage = 1.0 if row % 2 else -0.5
        data.append(
            Datum(
                model_input=tokens[:-1],
                loss_fn_inputs={
                    "target_tokens": tokens[1:],
                    "logprobs": sampled,
                    "advantages": [0.0] * 19 + [advantage] * (length - 19),
                },
            )
        )
    return data


def dpo() -> list[Datum]:
    """Three (chosen, rejected) pairs, the completion tokens weighted."""
    data = []
    for pair in range(3):
        prompt = list(range(300 + 50 * pair, 310 + 50 * pair))
        for offset in (1000, 2000):
            completion = list(range(offset + 10 * pair, offset + 10 * pair + 8 + pair))
            tokens = prompt + completion
            weights = [0.0] * (len(prompt) - 1) + [1.0] * len(completion)
            data.append(
                Datum(model_input=tokens[:-1], loss_fn_inputs={"target_tokens": tokens[1:], "weights": weights})
            )
    return data


# Each case: its name, then the forward_backward calls (data, loss) whose gradients add up
# before one optimizer step. SFT's second call has one row: on two ranks, one of them has none.
CASES: tuple[tuple[str, tuple[tuple[list[Datum], str], ...]], ...] = (
    ("sft", ((sft(), "cross_entropy"), (sft(1), "cross_entropy"))),
    ("ppo", ((rl(), "ppo"),)),
    ("dpo", ((dpo(), "dpo"),)),
)


def _start_weights(session: Any) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(11)
    return {
        name: 0.02 * torch.randn(parameter.shape, generator=generator)
        for name, parameter in sorted(session.named_parameters().items())
    }


def _record(
    case: str, sessions: list[Any], outputs: list[Any], results: dict[str, Any], tensors: dict[str, torch.Tensor]
) -> None:
    """The case's outputs; the sessions' gradients, then their adapters after one optimizer step."""
    norms = []
    for number, session in enumerate(sessions):
        for name, parameter in session.named_parameters().items():
            assert parameter.grad is not None, name
            tensors[f"{case}/grad/{number}/{name}"] = parameter.grad.detach().clone()
        norms.append(session.optim_step(AdamParams(learning_rate=1e-3))["grad_norm:mean"])
        for name, parameter in session.named_parameters().items():
            tensors[f"{case}/step/{number}/{name}"] = parameter.detach().clone()
    results[case] = {
        "outputs": [{"metrics": output.metrics, "logprobs": output.logprobs} for output in outputs],
        "grad_norms": norms,
    }


def run_lora(base: ResidentBase, tensors_file: Path) -> dict[str, Any]:
    """Each case on fresh sessions: its calls' outputs, then its gradients and the adapters after
    one optimizer step (into `tensors_file`, as `<case>/grad/...` and `<case>/step/...`). The base
    runs overlapping sessions' calls as one pass (`mix_backward`): the last case is two sessions'
    calls in one mixed pass, 3 rows and 2, so that on two ranks each rank runs one session's rows
    and none of the other's."""
    results: dict[str, Any] = {}
    tensors: dict[str, torch.Tensor] = {}
    for case, calls in CASES:
        session = base.create_session(LoraOptions(seed=3))
        session.load_adapter_weights(_start_weights(session))
        outputs = [session.forward_backward(data, loss) for data, loss in calls]
        _record(case, [session], outputs, results, tensors)
        base.close(session.session_id)
    # Linear LoRA layers only, which a mixed pass can run (`mixed_adapters.can_mix`).
    options = LoraOptions(seed=3, train_mlp=False, train_experts=False)
    sessions = [base.create_session(options), base.create_session(options.model_copy(update={"seed": 4}))]
    assert can_mix(base.model, [session.session_id for session in sessions])
    for session in sessions:
        session.load_adapter_weights(_start_weights(session))
    requests = [
        ScoreRequest.of(base.limits, sft(3), "cross_entropy", None),
        ScoreRequest.of(base.limits, rl()[3:], "ppo", None),
    ]
    outputs = base.forward_backward_many(
        [BackwardCall(session, request) for session, request in zip(sessions, requests, strict=True)]
    )
    _record("mixed", sessions, outputs, results, tensors)
    for session in sessions:
        base.close(session.session_id)
    save_file(tensors, tensors_file)
    return results


def run_full(trainer: FullParameterTrainer) -> dict[str, Any]:
    """One full-parameter SFT step on the odd batch: its loss, logprobs and gradient norm (a
    gradient averaged rather than summed over the ranks would show here), then the loss after it."""
    output = trainer.forward_backward(sft(), "cross_entropy")
    step = trainer.optim_step(AdamParams(learning_rate=1e-4))
    after = trainer.forward(sft(), "cross_entropy")
    return {
        "loss": output.metrics["loss:sum"],
        "logprobs": output.logprobs,
        "grad_norm": step["grad_norm:mean"],
        "loss_after": after.metrics["loss:sum"],
    }

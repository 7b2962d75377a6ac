"""What the three trainers share, on Mint: the connection, the training client, the tokenizer,
transformers' `TrainerState` and its log, the callbacks, and saving the weights."""

from __future__ import annotations

import math
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mint.integrations.trl.configs import Refusals, arg, refuse_unsupported
from mint.integrations.trl.connection import connect, create_training_client, download_tokenizer

if TYPE_CHECKING:
    import tinker


class OnMint:
    """What the three trainers share (composition of small helpers, not a training loop): the
    connection, the training client, the tokenizer, the TrainerState and its log, callbacks and
    saving. Each trainer's `train()` is its own loop."""

    def __init__(
        self,
        model: Any,
        args: Any,
        refused: Refusals,
        *,
        processing_class: Any,
        peft_config: Any,
        callbacks: list[Any] | None,
        base_url: str | None,
        api_key: str | None,
    ) -> None:
        from transformers import TrainerControl, TrainerState

        refuse_unsupported(args, refused)
        self.args = args
        self.service, self.base_url, self.api_key = connect(base_url, api_key)
        self.training = create_training_client(self.service, model, peft_config, int(arg(args, "seed", 42)))
        self.base_model = str(self.training.get_info().model_data.model_name)
        self.processing_class = processing_class or download_tokenizer(self.base_url, self.api_key, self.base_model)
        self.state = TrainerState()
        self.control = TrainerControl()
        self.callbacks = list(callbacks or [])
        self.state_path: str | None = None

    def event(self, name: str, **kwargs: Any) -> None:
        for callback in self.callbacks:
            handler = getattr(callback, name, None)
            if handler is not None:
                handler(self.args, self.state, self.control, **kwargs)

    def log(self, logs: dict[str, float], step_started: float) -> None:
        """One step's metrics into `state.log_history`, printed every `logging_steps` steps."""
        logs = {**logs, "step_time": time.monotonic() - step_started}
        entry = {**logs, "epoch": self.state.epoch, "step": self.state.global_step}
        self.state.log_history.append(entry)
        every = float(arg(self.args, "logging_steps", 10) or 1)
        every_steps = max(1, math.ceil(every * self.state.max_steps) if every < 1 else int(every))
        if self.state.global_step % every_steps == 0 or self.state.global_step == self.state.max_steps:
            print({key: round(value, 6) if isinstance(value, float) else value for key, value in entry.items()})
            self.event("on_log", logs=logs)

    def finish(self, losses: list[float], started: float) -> Any:
        from transformers.trainer_utils import TrainOutput

        runtime = time.monotonic() - started
        training_loss = sum(losses) / len(losses) if losses else 0.0
        metrics = {"train_runtime": runtime, "train_loss": training_loss, "epoch": self.state.epoch}
        self.state.log_history.append({**metrics, "step": self.state.global_step})
        self.event("on_train_end")
        return TrainOutput(self.state.global_step, training_loss, metrics)

    def save_model(self, output_dir: str | None = None) -> str:
        """Save the weights on Mint: sampler weights (an adapter version Mint can evaluate and
        deploy; the path returned) and the training state (`self.state_path`, to warm start a
        later trainer with `model=state_path`)."""
        name = Path(output_dir or arg(self.args, "output_dir", None) or "trl-model").name
        name = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.") or "trl-model"
        self.state_path = self.training.save_state(name).result().path
        return str(self.training.save_weights_for_sampler(name).result().path)


class TrainerOnMint:
    """What the three trainers answer alike: their Tinker training client, `save_model()`, and the
    training state that saving stored (`state_path`: pass it as `model=` to continue from it, e.g.
    GRPO after SFT). Each trainer's constructor calls `_connect` once its `args` are set."""

    args: Any

    _mint: OnMint

    def _connect(self, model: Any, refused: Refusals, **options: Any) -> None:
        """Reach Mint for `model` with `self.args` (refusing the `refused` fields set), and take
        its tokenizer and TrainerState as TRL's trainers hold them."""
        self._mint = OnMint(model, self.args, refused, **options)
        self.processing_class = self._mint.processing_class
        self.state = self._mint.state

    @property
    def training_client(self) -> tinker.TrainingClient:
        return self._mint.training

    @property
    def state_path(self) -> str | None:
        """The `tinker://<run>/weights/<name>` training state the last `save_model()` stored."""
        return self._mint.state_path

    def save_model(self, output_dir: str | None = None) -> str:
        """Save the trained weights on Mint; returns their tinker:// sampler path (an adapter version)."""
        return self._mint.save_model(output_dir)

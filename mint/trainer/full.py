"""Full-parameter training: the SFT recipe's other trainer, for when LoRA is not enough.

Unlike LoRA sessions, which share one resident base, a full-parameter trainer owns a private
copy of the base (every weight changes), so it costs the model's weights, gradients and two
Adam moments: about four times the base's size. It offers the same `forward`,
`forward_backward` and `optim_step` as a session (same packing, losses and AdamW), and saves
a whole transformers checkpoint (safetensors) instead of an adapter.

On a worker group (`group`), the copy, its gradients and its moments are sharded over the ranks
with FSDP2, so a base whose training state does not fit one device trains on several. Each rank
reads only its shards: of the base's (or a whole-model version's) safetensors when the trainer
is built (`sharded_loading`), and of its resumable state, written with
torch.distributed.checkpoint shard by shard, when it resumes (`load_state`).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

from mint.errors import InvalidRequest
from mint.schemas.base_models import BaseModelSpec
from mint.trainer.data_parallel import replicated_parameters, score_split, summing_sharded_gradients
from mint.trainer.group import Group
from mint.trainer.models import load_base_model
from mint.trainer.optimizer import AdapterOptimizer
from mint.trainer.scoring import ModelLimits, ScoreRequest, score
from mint.trainer.sharded_loading import load_sharded_base
from mint.trainer.types import AdamParams, Datum, ForwardOutput


class FullParameterTrainer:
    """Every weight of a private copy of the base trains; Adam state for all of them."""

    def __init__(
        self,
        spec: BaseModelSpec,
        cache_dir: Path,
        *,
        dtype: str | None = None,
        device: str = "cpu",
        group: Group | None = None,
    ) -> None:
        if group is None:
            self.model, self.tokenizer = load_base_model(spec, cache_dir, dtype=dtype, device=device)
        else:  # every rank reads only its shards of the weights (`sharded_loading`)
            self.model, self.tokenizer = load_sharded_base(spec, cache_dir, group, dtype=dtype)
        self.model.requires_grad_(True)
        self.limits = ModelLimits.of(self.model, spec.context_length)
        # On a worker group every rank runs the same calls (SPMD) on its shard of every weight,
        # gradient and moment, and its share of each batch's rows (`data_parallel`); FSDP2 sums
        # the ranks' gradients.
        self.group = group
        if group is not None:
            summing_sharded_gradients(self.model)
        self._replicated = replicated_parameters(self.model) if group is not None else []
        self.optimizer = AdapterOptimizer(dict(self.model.named_parameters()))
        self.step = 0
        self._lock = threading.Lock()

    def _score(
        self, data: Sequence[Datum], loss_fn: str | None, loss_fn_config: dict[str, float] | None, *, backward: bool
    ) -> ForwardOutput:
        request = ScoreRequest.of(self.limits, data, loss_fn, loss_fn_config)
        if request.loss is not None and request.loss.needs_reference:
            # The reference of a full-parameter run would be a second frozen copy of the base.
            raise InvalidRequest(
                f"loss {request.loss.name!r} needs a reference model, which full-parameter training does not keep; "
                "train it with LoRA instead",
                param="loss_fn",
            )
        with self._lock:
            if self.group is not None and self.group.world_size > 1:
                return score_split(
                    self.group,
                    self.model,
                    [request],
                    backward=backward,
                    reference=lambda _: [],
                    running=lambda _: nullcontext(),
                    share_prefixes=True,
                    replicated=self._replicated,
                )[0]
            return score(
                self.model, request.data, request.loss, request.config, backward=backward, reference=lambda _: []
            )

    def forward(
        self, data: Sequence[Datum], loss_fn: str | None = None, loss_fn_config: dict[str, float] | None = None
    ) -> ForwardOutput:
        return self._score(data, loss_fn, loss_fn_config, backward=False)

    def forward_backward(
        self, data: Sequence[Datum], loss_fn: str, loss_fn_config: dict[str, float] | None = None
    ) -> ForwardOutput:
        return self._score(data, loss_fn, loss_fn_config, backward=True)

    def optim_step(self, adam: AdamParams | None = None) -> dict[str, float]:
        with self._lock:
            metrics = self.optimizer.step(adam or AdamParams())
            self.step += 1
        return metrics

    def save_state(self, folder: Path) -> Path:
        """Weights, Adam moments and step into `folder` with torch.distributed.checkpoint, to resume
        exactly. On a worker group every rank calls it and writes its own shards; the state loads
        into any number of ranks, or into one process (`load_state` reshards). DCP's metadata file
        is a pickle: such states are read from Mint's own store only, never from an upload."""
        import torch.distributed.checkpoint as dcp

        with self._lock:
            dcp.save(self._state(), checkpoint_id=Path(folder), no_dist=self.group is None)
        return Path(folder)

    def load_state(self, folder: Path) -> None:
        """Resume from a state `save_state` wrote, on any number of ranks (every rank calls it). DCP
        loads into the sharded state dict in place: each rank reads only the parts of the files
        that overlap its own shards."""
        import torch.distributed.checkpoint as dcp

        with self._lock, torch.no_grad():
            state = self._state()
            dcp.load(state, checkpoint_id=Path(folder), no_dist=self.group is None)
            self.model.load_state_dict(state["model"])
            self.step = int(state["step"].item())

    def _state(self) -> dict[str, Any]:
        step = torch.tensor(self.step)
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.live_state(), "step": step}

    def save_weights(self, folder: Path) -> Path:
        """A transformers checkpoint (config, safetensors weights, tokenizer) of the trained model."""
        folder.mkdir(parents=True, exist_ok=True)
        with self._lock, torch.no_grad():
            self.model.save_pretrained(folder, safe_serialization=True)
            self.tokenizer.save_pretrained(folder)
        return folder

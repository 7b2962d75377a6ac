"""Full-parameter training: the SFT recipe's other trainer, for when LoRA is not enough.

Unlike LoRA sessions, which share one resident base, a full-parameter trainer owns a private
copy of the base (every weight changes), so it costs the model's weights, gradients and two
Adam moments: about four times the base's size. It offers the same `forward`,
`forward_backward` and `optim_step` as a session (same packing, losses and AdamW), and saves
a whole transformers checkpoint (safetensors) instead of an adapter.

On a worker group (`group`), the copy, its gradients and its moments are sharded over the ranks
with FSDP2, so a base whose training state does not fit one device trains on several; its
resumable state is written with torch.distributed.checkpoint, shard by shard.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from mint.errors import InvalidRequest
from mint.schemas.base_models import BaseModelSpec
from mint.trainer.group import Group
from mint.trainer.models import load_base_model
from mint.trainer.optimizer import AdapterOptimizer
from mint.trainer.scoring import ModelLimits, ScoreRequest, score
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
        self.model, self.tokenizer = load_base_model(spec, cache_dir, dtype=dtype, device=device)
        self.model.requires_grad_(True)
        self.limits = ModelLimits.of(self.model, spec.context_length)
        # On a worker group every rank runs the same calls (SPMD) on its shard of every weight,
        # gradient and moment; FSDP2 averages the gradients over the ranks.
        self.group = group
        if group is not None:
            group.shard(self.model)
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
        """Resume from a state `save_state` wrote, on any number of ranks (every rank calls it)."""
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

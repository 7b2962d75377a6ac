"""AdamW over one adapter's parameters, with hyperparameters given per step (Tinker's `optim_step`).

torch's AdamW does the arithmetic (decoupled weight decay: w <- w * (1 - lr * wd)); this class
sets each step's hyperparameters, clips the global gradient norm, frees the gradients after the
step, and exposes the moments by parameter name so that checkpoints survive a new adapter name.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from mint.errors import InvalidRequest
from mint.trainer.types import AdamParams

# Per-parameter AdamW state kept in checkpoints, as `<key>/<parameter name>` tensors.
_STATE_KEYS = ("step", "exp_avg", "exp_avg_sq")


class AdapterOptimizer:
    """AdamW for one adapter; the moments exist only after its first step."""

    def __init__(self, parameters: Mapping[str, nn.Parameter]) -> None:
        self._parameters = dict(parameters)
        defaults = AdamParams()
        self._adamw = torch.optim.AdamW(
            list(self._parameters.values()),
            lr=defaults.learning_rate,
            betas=(defaults.beta1, defaults.beta2),
            eps=defaults.eps,
            weight_decay=defaults.weight_decay,
        )

    def step(self, adam: AdamParams) -> dict[str, float]:
        """One AdamW step with `adam`'s hyperparameters, then drop the gradients.

        Returns the global gradient norm before clipping (`grad_norm:mean`) and the learning rate.
        """
        for group in self._adamw.param_groups:
            group.update(
                lr=adam.learning_rate, betas=(adam.beta1, adam.beta2), eps=adam.eps, weight_decay=adam.weight_decay
            )
        grads = [p.grad for p in self._parameters.values() if p.grad is not None]
        grad_norm = torch.nn.utils.get_total_norm(grads) if grads else torch.zeros(())
        if adam.grad_clip_norm > 0 and grads:
            torch.nn.utils.clip_grads_with_norm_(
                [p for p in self._parameters.values() if p.grad is not None], adam.grad_clip_norm, grad_norm
            )
        self._adamw.step()
        # set_to_none frees the gradient memory between steps: an idle session holds weights and moments only.
        self._adamw.zero_grad(set_to_none=True)
        return {"grad_norm:mean": float(grad_norm), "learning_rate:mean": adam.learning_rate}

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """The moments and step counts as `<key>/<parameter name>` tensors (empty before the first step)."""
        tensors: dict[str, torch.Tensor] = {}
        for name, parameter in self._parameters.items():
            state = self._adamw.state.get(parameter)
            for key in _STATE_KEYS if state else ():
                tensors[f"{key}/{name}"] = torch.as_tensor(state[key]).detach().to("cpu", torch.float32).clone()
        return tensors

    def load_state_tensors(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Restore what `state_tensors` returned; refuses moments for unknown parameters or of the wrong shape."""
        by_parameter: dict[str, dict[str, torch.Tensor]] = {}
        for key, tensor in tensors.items():
            kind, _, name = key.partition("/")
            if kind not in _STATE_KEYS or name not in self._parameters:
                raise InvalidRequest(f"optimizer state names an unknown parameter or kind: {key!r}", param="state")
            by_parameter.setdefault(name, {})[kind] = tensor
        restored: dict[nn.Parameter, dict[str, torch.Tensor]] = {}
        for name, state in by_parameter.items():
            parameter = self._parameters[name]
            if set(state) != set(_STATE_KEYS) or any(
                state[k].shape != parameter.shape for k in ("exp_avg", "exp_avg_sq")
            ):
                raise InvalidRequest(
                    f"optimizer state for {name!r} is incomplete or has the wrong shape", param="state"
                )
            restored[parameter] = {
                # torch keeps `step` as a float32 CPU scalar tensor when not capturable.
                "step": state["step"].to(torch.float32).reshape(()).clone(),
                "exp_avg": state["exp_avg"].to(parameter.device, parameter.dtype).clone(),
                "exp_avg_sq": state["exp_avg_sq"].to(parameter.device, parameter.dtype).clone(),
            }
        # Swapped in only once every tensor checked out: a bad checkpoint leaves the state as it was.
        self._adamw.state.clear()
        self._adamw.state.update(restored)

    def live_state(self) -> dict[str, dict[str, torch.Tensor]]:
        """The moments and step counts by parameter name, the optimizer's own tensors as they lie
        (a rank's shards on a worker group), for torch.distributed.checkpoint to save, or to load
        into in place. Moments not made yet are made now as AdamW makes them (zeros, step 0)."""
        state: dict[str, dict[str, torch.Tensor]] = {}
        for name, parameter in self._parameters.items():
            live = self._adamw.state.get(parameter)
            if not live:
                live = self._adamw.state[parameter] = {
                    "step": torch.zeros((), dtype=torch.float32),
                    "exp_avg": torch.zeros_like(parameter, memory_format=torch.preserve_format),
                    "exp_avg_sq": torch.zeros_like(parameter, memory_format=torch.preserve_format),
                }
            state[name] = live
        return state

    def memory_bytes(self) -> int:
        """Bytes held by the moments."""
        return sum(
            tensor.numel() * tensor.element_size()
            for state in self._adamw.state.values()
            for tensor in state.values()
            if isinstance(tensor, torch.Tensor) and tensor.ndim > 0
        )

"""A training session: one LoRA adapter on a resident base, with its AdamW state and step count.

Tinker's training client, in-process. The adapter's weights live in the base's one peft model
(`mint.trainer.session.ResidentBase`), beside every other session's; what is the session's own
is its parameters (by peft's saved key), their gradients while they accumulate, the optimizer's
two moments, the step and the weights' version. The primitives (`forward`, `forward_backward`,
`forward_backward_custom`, `optim_step`, `sample`, `sample_batch`) check their input here, so
that bad data fail this call alone, then run on the base: `forward_backward` and `sample_batch`
through the base's combiners, which run overlapping calls of several sessions as one pass
(`mint.trainer.backward_passes`, `mint.trainer.sampling_passes`). Checkpoints (`save_state`,
`load_state`, `save_weights_for_sampler`) are written and read here too.

The session reaches its base through `SessionBase`, the part of the base it uses, so that this
module need not import the base's, which creates sessions.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import torch
from torch import nn

from mint.errors import InvalidRequest, NotFound
from mint.schemas.base_models import BaseModelSpec
from mint.trainer import checkpoint, lora
from mint.trainer.combining import Combiner, Loops
from mint.trainer.group import Group, mirrored
from mint.trainer.models import tensors_fingerprint
from mint.trainer.optimizer import AdapterOptimizer
from mint.trainer.sampling import Decoding
from mint.trainer.sampling_passes import SampleCall
from mint.trainer.scoring import ModelLimits, ScoreRequest
from mint.trainer.types import (
    AdamParams,
    Datum,
    ForwardOutput,
    LoraOptions,
    SampledSequence,
    SampleRequest,
    SamplingParams,
    check_metric_name,
)

CustomLossFn = Callable[[list[Datum], list[torch.Tensor]], tuple[torch.Tensor, dict[str, float]]]


@dataclass(frozen=True)
class BackwardCall:
    """One session's forward_backward, its data already checked, waiting to run (perhaps in one
    pass with other sessions': `mint.trainer.backward_passes`)."""

    session: TrainingSession[Any]
    request: ScoreRequest


class SessionBase(Protocol):
    """What a session uses of the resident base it lives on (`mint.trainer.session.ResidentBase`)."""

    spec: BaseModelSpec
    model: nn.Module
    catalogue: lora.TargetCatalogue
    limits: ModelLimits
    group: Group | None
    loops: Loops
    backward_passes: Combiner[BackwardCall, ForwardOutput]
    sampling_passes: Combiner[SampleCall, list[list[SampledSequence]]]
    _lock: threading.RLock

    @property
    def peft_model(self) -> Any: ...

    def _use(self, adapter_name: str | None) -> AbstractContextManager[nn.Module]: ...

    def create_session(
        self, options: LoraOptions | None = None, *, session_id: str | None = None
    ) -> TrainingSession[Any]: ...

    def close(self, session_id: str) -> None: ...

    def evaluate(
        self,
        adapter_name: str | None,
        data: Sequence[Datum],
        loss_fn: str | None,
        loss_fn_config: dict[str, float] | None,
        *,
        backward: bool,
        train_mode: Callable[[], AbstractContextManager[Any]] = ...,
    ) -> ForwardOutput: ...

    def forward_backward_many(self, calls: Sequence[BackwardCall]) -> list[ForwardOutput]: ...

    def check_sample_request(self, request: SampleRequest) -> Decoding: ...

    def sample_with(
        self, adapter_name: str | None, prompt_tokens: Sequence[int], params: SamplingParams, num_samples: int
    ) -> list[SampledSequence]: ...


# The base a session lives on: `ResidentBase` in Mint, so that `session.base` has its full type.
BaseT = TypeVar("BaseT", bound=SessionBase)


def _tensor_bytes(tensors: Sequence[torch.Tensor]) -> int:
    return sum(tensor.numel() * tensor.element_size() for tensor in tensors)


class TrainingSession(Generic[BaseT]):
    """One LoRA adapter on a ResidentBase, with its optimizer state: Tinker's training client, in-process."""

    def __init__(
        self, base: BaseT, session_id: str, options: LoraOptions, seed: int, targets: lora.LoraTargets
    ) -> None:
        self.base = base
        self.session_id = session_id
        self.options = options
        self.seed = seed
        self.targets = targets
        self.step = 0
        self._version: str | None = None  # computed when first asked, forgotten at each weight change
        self._parameters = lora.adapter_parameters(base.peft_model, session_id)
        self._optimizer: AdapterOptimizer | None = AdapterOptimizer(self._parameters)
        self._dropouts = [
            module.lora_dropout[session_id]
            for module in base.model.modules()
            if hasattr(module, "lora_dropout") and session_id in module.lora_dropout
        ]

    def _group_and_lock(self) -> tuple[Group | None, threading.RLock]:
        return self.base.group, self.base._lock

    def _mirror_ref(self) -> tuple[str, ...]:
        return ("session", self.session_id)

    def __repr__(self) -> str:
        return f"TrainingSession({self.session_id!r}, base={self.base.spec.name!r}, step={self.step})"

    @property
    def version(self) -> str:
        """The version of this adapter's weights: a digest of their bytes, new after every
        `optim_step` or load. Stamped on every sample they generate (`adapter_version`)."""
        with self.base._lock:
            if self._version is None:
                self._version = tensors_fingerprint({n: p.detach() for n, p in self._parameters.items()})[:16]
            return self._version

    @property
    def closed(self) -> bool:
        return self._optimizer is None

    def _release(self) -> None:
        self._parameters = {}
        self._optimizer = None
        self._dropouts = []

    def _live_optimizer(self) -> AdapterOptimizer:
        if self._optimizer is None:
            raise NotFound(f"training session {self.session_id!r} is closed", param="session_id")
        return self._optimizer

    @contextmanager
    def _lora_dropout(self) -> Iterator[None]:
        # The base stays in eval mode; only this adapter's LoRA dropout behaves as in training.
        for dropout in self._dropouts:
            dropout.train()
        try:
            yield
        finally:
            for dropout in self._dropouts:
                dropout.eval()

    def named_parameters(self) -> dict[str, nn.Parameter]:
        """The adapter's parameters by portable name (peft's saved key)."""
        return dict(self._parameters)

    def memory_bytes(self) -> dict[str, int]:
        """What this session holds on top of the shared base: adapter, gradients and Adam moments."""
        parameters = list(self._parameters.values())
        return {
            "adapter": _tensor_bytes(parameters),
            "gradients": _tensor_bytes([p.grad for p in parameters if p.grad is not None]),
            "optimizer": self._optimizer.memory_bytes() if self._optimizer else 0,
        }

    # ---- primitives -------------------------------------------------------------------------

    def forward(
        self, data: Sequence[Datum], loss_fn: str | None = None, loss_fn_config: dict[str, float] | None = None
    ) -> ForwardOutput:
        """Logprobs of each datum's target tokens (float32, no gradient); with `loss_fn`, its value too."""
        return self.base.evaluate(self.session_id, data, loss_fn, loss_fn_config, backward=False)

    def forward_backward(
        self, data: Sequence[Datum], loss_fn: str, loss_fn_config: dict[str, float] | None = None
    ) -> ForwardOutput:
        """Add the gradient of a built-in loss to this adapter's accumulated gradients.

        Checked here, so that bad data fail this call alone; then run in one pass with the
        forward_backward calls of other sessions that overlap it (`ResidentBase.backward_passes`).
        """
        self._live_optimizer()
        request = ScoreRequest.of(self.base.limits, data, loss_fn, loss_fn_config)
        return self.base.backward_passes.submit(BackwardCall(self, request))

    def forward_backward_custom(self, data: Sequence[Datum], loss_fn: CustomLossFn) -> ForwardOutput:
        """Any differentiable loss of the logprobs, as Tinker runs it: forward, the loss on leaf
        tensors, then a linear `cross_entropy` pass whose weights are -d loss / d logprobs."""
        data = list(data)
        # One lock for all three steps, so no other request changes this adapter in between.
        with self.base._lock:
            forward = self.forward(data)
            leaves = [torch.tensor(lp, dtype=torch.float32, requires_grad=True) for lp in forward.logprobs]
            value, metrics = loss_fn(data, leaves)
            for name in metrics:
                try:
                    check_metric_name(name)
                except ValueError as exc:
                    raise InvalidRequest(str(exc), param="loss_fn") from exc
            value.backward()
            linear = [
                Datum(
                    model_input=datum.model_input,
                    loss_fn_inputs={
                        "target_tokens": datum.target_tokens,
                        # A logprob the loss does not use gets no gradient: weight 0.
                        "weights": (-leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)).tolist(),
                    },
                )
                for datum, leaf in zip(data, leaves, strict=True)
            ]
            # Run now, not through the combiner: this thread holds the base's lock.
            request = ScoreRequest.of(self.base.limits, linear, "cross_entropy", None)
            result = self.base.forward_backward_many([BackwardCall(self, request)])[0]
        custom = {name: float(number) for name, number in metrics.items()}
        return ForwardOutput(
            logprobs=result.logprobs, metrics={**result.metrics, **custom, "loss:sum": float(value.detach())}
        )

    @mirrored
    def optim_step(self, adam: AdamParams | None = None) -> dict[str, float]:
        """One AdamW step over this adapter with `adam`'s hyperparameters; clears its gradients."""
        with self.base._lock:
            metrics = self._live_optimizer().step(adam or AdamParams())
            self.step += 1
            self._version = None
        return metrics

    def sample(
        self, prompt_tokens: Sequence[int], params: SamplingParams, num_samples: int = 1
    ) -> list[SampledSequence]:
        """Sample continuations under this adapter; logprobs as `forward` computes them."""
        self._live_optimizer()
        return self.base.sample_with(self.session_id, prompt_tokens, params, num_samples)

    @contextmanager
    def looping(self) -> Iterator[None]:
        """Declare the calling thread a training loop (an RL run): while several sessions' loops run
        at once on this base, their sample and forward_backward calls wait briefly for each
        other and share passes (`mint.trainer.combining`)."""
        with self.base.loops.looping():
            yield

    def sample_batch(self, requests: Sequence[SampleRequest]) -> list[list[SampledSequence]]:
        """Sample every request under this adapter, decoded together; one list of samples per request.

        Checked here, so that a bad request fails this call alone; then decoded in one batch with
        the sample_batch calls of other sessions that overlap it (`ResidentBase.sampling_passes`).
        """
        self._live_optimizer()
        for request in requests:
            self.base.check_sample_request(request)
        return self.base.sampling_passes.submit(SampleCall(self.session_id, list(requests)))

    # ---- checkpoints ------------------------------------------------------------------------

    def save_state(self, folder: Path) -> Path:
        """Adapter weights, Adam moments and step into `folder` (safetensors + JSON), to resume exactly.

        Accumulated gradients are not saved: save after `optim_step`.
        """
        with self.base._lock:
            optimizer = self._live_optimizer()
            checkpoint.write_state(
                Path(folder),
                base_model=self.base.spec.name,
                step=self.step,
                options=self.options,
                seed=self.seed,
                adapter={name: p.detach() for name, p in self._parameters.items()},
                optimizer=optimizer.state_tensors(),
            )
        return Path(folder)

    def load_state(self, folder: Path) -> None:
        """Replace this session's weights, moments and step with a saved state of a compatible adapter."""
        state = checkpoint.read_state(Path(folder))
        if state.base_model != self.base.spec.name:
            raise InvalidRequest(
                f"the state in {folder} was trained on base {state.base_model!r}, not {self.base.spec.name!r}",
                param="path",
            )
        theirs = lora.build_lora_config(
            state.options, self.base.spec, lora.plan_targets(state.options, self.base.spec, self.base.catalogue)
        )
        ours = lora.build_lora_config(self.options, self.base.spec, self.targets)
        shapes = {name: tuple(p.shape) for name, p in self._parameters.items()}
        if (theirs.r, theirs.lora_alpha) != (ours.r, ours.lora_alpha) or shapes != {
            name: tuple(t.shape) for name, t in state.adapter.items()
        }:
            raise InvalidRequest(
                f"the state in {folder} is for another LoRA shape (rank, alpha or targets) than session "
                f"{self.session_id!r}; open it with ResidentBase.create_session_from_state",
                param="path",
            )
        self._set_state(state.adapter, state.optimizer, state.step)

    @mirrored
    def _set_state(self, adapter: dict[str, torch.Tensor], optimizer: dict[str, torch.Tensor], step: int) -> None:
        with self.base._lock, torch.no_grad():
            # The optimizer state first: it is checked before anything changes.
            self._live_optimizer().load_state_tensors(optimizer)
            for name, parameter in self._parameters.items():
                parameter.copy_(adapter[name])
                parameter.grad = None
            self.step = step
            self._version = None

    @mirrored
    def load_adapter_weights(self, weights: dict[str, torch.Tensor], *, source: str = "the adapter") -> None:
        """Replace this adapter's weights with `weights` (by peft's saved key); names and shapes must match."""
        shapes = {name: tuple(p.shape) for name, p in self._parameters.items()}
        theirs = {name: tuple(t.shape) for name, t in weights.items()}
        if shapes != theirs:
            missing = sorted(set(shapes) - set(theirs))[:3]
            unexpected = sorted(set(theirs) - set(shapes))[:3]
            resized = sorted(name for name in set(shapes) & set(theirs) if shapes[name] != theirs[name])[:3]
            raise InvalidRequest(
                f"{source} does not fit base {self.base.spec.name!r}: missing {missing}, unexpected {unexpected}, "
                f"other shapes {resized}; was it trained on another base model?",
                param="adapter",
            )
        with self.base._lock, torch.no_grad():
            for name, parameter in self._parameters.items():
                parameter.copy_(weights[name])
                parameter.grad = None
            self._version = None

    def copy_weights_to(self, copy: TrainingSession[Any]) -> None:
        """Make `copy`'s adapter weights this one's, in memory (no file): read and written under
        the base's lock, so never half way through one of this session's updates."""
        with self.base._lock:
            weights = {name: p.detach() for name, p in self._parameters.items()}
            copy.load_adapter_weights(weights, source=f"session {self.session_id!r}")

    @contextmanager
    def sampler_copy(self) -> Iterator[TrainingSession[Any]]:
        """A second adapter on this base, holding a copy of this one's weights, that samples while
        this one trains (RL with `max_steps_off_policy`); `copy_weights_to` brings it up to date.
        Closed when the block ends."""
        copy = self.base.create_session(self.options.model_copy(update={"seed": self.seed}))
        try:
            self.copy_weights_to(copy)
            yield copy
        finally:
            if not copy.closed:
                self.base.close(copy.session_id)

    def save_weights_for_sampler(self, folder: Path) -> Path:
        """The adapter in PEFT format (`adapter_config.json` + `adapter_model.safetensors`) in `folder`."""
        # Active while saving: peft's save_pretrained reads the active adapter's config, and the
        # active one may be a session closed since (peft keeps its name after deleting it).
        with self.base._use(self.session_id):
            self._live_optimizer()
            return checkpoint.write_sampler_weights(
                self.base.peft_model, self.session_id, Path(folder), base_model=self.base.spec.name
            )

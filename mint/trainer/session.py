"""The resident base: one base model in memory, frozen, carrying the LoRA adapters of many training sessions.

`ResidentBase` loads a base model once and wraps it as ONE peft model holding many named
adapters; a `TrainingSession` (`mint.trainer.training_session`) is one of those adapters with
its AdamW state and step count. Sessions share the frozen base weights, so each extra session
costs its adapter, its gradients while they accumulate, and its two Adam moments.

The primitives are Tinker's: `forward`, `forward_backward` (built-in losses by name),
`forward_backward_custom`, `optim_step`, `save_state` / `load_state`,
`save_weights_for_sampler` and `sample`. peft keeps one active adapter per model, so every
primitive takes the base's lock and activates its own adapter first: a process runs one
primitive at a time. The exceptions are `forward_backward` and `sample_batch`: calls of
several sessions that arrive together from concurrent threads (RL jobs, Tinker models on one
worker) run as ONE pass in which each session's tokens go through its own adapter
(`mixed_adapters`), each session receiving only its own gradients.

This module composes the parts: it opens and closes sessions, activates adapters under its
lock, scores data and prompts, and mirrors every call that runs the model on a worker group
(`mint.trainer.group`). Which sessions share a backward pass, and how, is
`mint.trainer.backward_passes`'s; decoding several adapters' samples together is
`mint.trainer.sampling_passes`'s.
"""

from __future__ import annotations

import functools
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn

from mint.errors import Conflict, InvalidRequest, NoCapacity, NotFound
from mint.schemas.base_models import BaseModelSpec
from mint.trainer import checkpoint, lora
from mint.trainer.backward_passes import MAX_SESSIONS_PER_PASS, mixed_running, pass_groups
from mint.trainer.batch_invariance import batch_invariant
from mint.trainer.combining import Combiner, Loops
from mint.trainer.compute_lane import ComputeLane
from mint.trainer.data_parallel import score_split
from mint.trainer.group import Group, mirrored
from mint.trainer.host_memory import share_one_arena
from mint.trainer.mixed_adapters import can_mix
from mint.trainer.models import load_base_model
from mint.trainer.packing import pack, packed_logprobs
from mint.trainer.prompt_cache import DEFAULT_MAX_BYTES as DEFAULT_PROMPT_CACHE_BYTES
from mint.trainer.prompt_cache import CachedPrompts, PromptCache
from mint.trainer.prompt_scores import PromptQuery, PromptScores, score_prompt
from mint.trainer.sampling import Decoding, end_of_sequence_ids
from mint.trainer.sampling_passes import (
    BASE_VERSION,
    CheckedCall,
    SampleCall,
    decode_alone,
    decode_mixed,
    per_call,
    stamped,
)
from mint.trainer.scoring import ModelLimits, RunningFn, ScoreRequest, score_parts
from mint.trainer.sharded_loading import load_sharded_base
from mint.trainer.training_session import BackwardCall, TrainingSession
from mint.trainer.types import Datum, ForwardOutput, LoraOptions, SampledSequence, SampleRequest, SamplingParams

LoopResult = TypeVar("LoopResult")

DEFAULT_MAX_SESSIONS = 64


class ResidentBase:
    """One base model in memory, frozen, carrying the LoRA adapters of many sessions."""

    _shared: dict[tuple[str, str, str, str], ResidentBase] = {}
    _shared_lock = threading.Lock()

    def __init__(
        self,
        spec: BaseModelSpec,
        cache_dir: Path,
        *,
        dtype: str | None = None,
        device: str = "cpu",
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        mix_backward: bool | None = None,
        batch_invariant: bool = False,
        prompt_cache_bytes: int = DEFAULT_PROMPT_CACHE_BYTES,
        group: Group | None = None,
    ) -> None:
        share_one_arena()  # before any session's thread allocates
        if group is None:
            model, tokenizer = load_base_model(spec, cache_dir, dtype=dtype, device=device)
        else:  # sharded over the group as it loads: each rank reads only its shards (`sharded_loading`)
            model, tokenizer = load_sharded_base(spec, cache_dir, group, dtype=dtype)
        model.requires_grad_(False)
        model.eval()
        self.spec = spec
        self.model: nn.Module = model
        self.tokenizer = tokenizer
        self.max_sessions = max_sessions
        # Whether overlapping forward_backward calls of several sessions run as one mixed pass
        # (None: where the device is not a CPU). A mixed pass pays where one session's batch
        # leaves the device idle; on a CPU every matmul is already at its peak, and the mixed
        # pass measured 8-25% slower than its sessions one after another (while decoding
        # several sessions' samples together is 1.2-1.6x faster there, and stays mixed).
        self.mix_backward = (torch.device(device).type != "cpu") if mix_backward is None else mix_backward
        # Whether a session's numbers in a pass are bit for bit those of its batch alone,
        # whatever else shares the pass (`batch_invariance`: tiled GEMMs, eager MoE experts).
        self.batch_invariant = batch_invariant
        if batch_invariant and hasattr(model, "set_experts_implementation"):
            model.set_experts_implementation("eager")
        # Read before any adapter wraps a layer, so names are the base's own.
        self.catalogue = lora.TargetCatalogue.from_model(model)
        self._peft: Any = None  # peft.PeftModel once the first session exists
        self._active: str | None = None  # the adapter this base last set active on every layer
        self._sessions: dict[str, TrainingSession[ResidentBase]] = {}
        self._lock = threading.RLock()
        self.device = model.get_input_embeddings().weight.device
        self.limits = ModelLimits.of(model, spec.context_length)
        self.eos_token_ids = end_of_sequence_ids(tokenizer, model)
        # forward_backward calls that overlap in time, from any sessions, run as one pass.
        # So do sessions' sample_batch calls: one decoding batch for all of them. Training loops
        # of several sessions (`TrainingSession.looping`) keep in step across the two.
        # While loops run at once (`run_at_once`), the thread that started them runs those passes.
        self.loops = Loops()
        self.lane = ComputeLane()
        self.backward_passes = Combiner(self.forward_backward_many, MAX_SESSIONS_PER_PASS, self.loops, lane=self.lane)
        self.sampling_passes = Combiner(self.sample_many, MAX_SESSIONS_PER_PASS, self.loops, lane=self.lane)
        # The worker group this base is sharded over (`group`, or `join_group`); None: the whole base is here.
        self.group: Group | None = group
        # Prompt prefixes' KV kept across sample calls, per adapter and weights version. Off on a
        # batch-invariant base: a prompt run in two parts is not bit for bit the prompt run whole.
        self.prompt_cache = None if batch_invariant or not prompt_cache_bytes else PromptCache(prompt_cache_bytes)

    @classmethod
    def shared(
        cls,
        spec: BaseModelSpec,
        cache_dir: Path,
        *,
        dtype: str | None = None,
        device: str = "cpu",
        **options: Any,
    ) -> ResidentBase:
        """The process's one ResidentBase for this base, cache folder, dtype and device (loaded
        on first use with `options`: `max_sessions`, `mix_backward`, `batch_invariant`,
        `prompt_cache_bytes`)."""
        key = (spec.name, str(Path(cache_dir).resolve()), dtype or spec.dtype, device)
        with cls._shared_lock:
            if key not in cls._shared:
                cls._shared[key] = cls(spec, cache_dir, dtype=dtype, device=device, **options)
            return cls._shared[key]

    def join_group(self, group: Group) -> None:
        """Shard this base, loaded whole, over `group` (FSDP2) and mirror every call that runs it on
        the group's ranks (`mint.trainer.group`). Before any session is opened. A worker group
        loads its base sharded instead (`ResidentBase(..., group=group)`): no rank holds it whole."""
        if self._sessions:
            raise RuntimeError("a base joins its worker group before any session is opened")
        group.shard(self.model)
        self.device = group.device  # where the shards went: inputs go there too
        self.group = group

    def follow(self) -> None:
        """A follower rank's life: run rank 0's calls on this base until the group stops."""
        assert self.group is not None and not self.group.leading
        self.group.follow(self._resolve_ref)

    def _group_and_lock(self) -> tuple[Group | None, threading.RLock]:
        return self.group, self._lock

    def _mirror_ref(self) -> tuple[str, ...]:
        return ("base",)

    def _resolve_ref(self, ref: tuple[str, ...]) -> Any:
        if ref == ("base",):
            return self
        session = self._sessions.get(ref[1])
        if session is None:  # closed: rank 0 raises NotFound for the same call
            raise NotFound(f"training session {ref[1]!r} is closed", param="session_id")
        return session

    @property
    def peft_model(self) -> Any:
        """The one peft model holding every session's adapter; None before the first session."""
        return self._peft

    # ---- sessions -------------------------------------------------------------------------

    @property
    def sessions(self) -> list[TrainingSession[ResidentBase]]:
        """Open sessions, oldest first."""
        with self._lock:
            return list(self._sessions.values())

    def get(self, session_id: str) -> TrainingSession[ResidentBase]:
        session = self._sessions.get(session_id)
        if session is None:
            raise NotFound(f"no open training session {session_id!r} on base {self.spec.name!r}", param="session_id")
        return session

    def create_session(
        self, options: LoraOptions | None = None, *, session_id: str | None = None
    ) -> TrainingSession[ResidentBase]:
        """Add a fresh adapter (B = 0, so it starts as the base) with its own optimizer."""
        options = options or LoraOptions()
        with self._lock:
            if len(self._sessions) >= self.max_sessions:
                raise NoCapacity(
                    f"base {self.spec.name!r} already holds {self.max_sessions} sessions; close one first",
                    param="session_id",
                )
            session_id = self._new_session_id(session_id)
            seed = options.seed if options.seed is not None else lora.new_seed()
            return self._add_session(options, session_id, seed)

    @mirrored
    def _add_session(self, options: LoraOptions, session_id: str, seed: int) -> TrainingSession[ResidentBase]:
        """Wrap the base's target layers with a new adapter named `session_id`, A drawn from `seed`."""
        with self._lock:
            targets = lora.plan_targets(options, self.spec, self.catalogue)
            config = lora.build_lora_config(options, self.spec, targets)
            lora.check_same_parameter_targets(targets, {sid: t.targets for sid, t in self._sessions.items()})
            with lora.seeded_init(seed):
                if self._peft is None:
                    from peft import get_peft_model

                    self._peft = get_peft_model(self.model, config, adapter_name=session_id)
                else:
                    self._peft.add_adapter(session_id, config)
                # Layers wrapped for the first time start with the new adapter active: set
                # one explicitly before the next use.
                self._active = None
            try:
                lora.check_wrapped(self._peft, session_id, targets)
            except Exception:
                self._peft.delete_adapter(session_id)
                raise
            session = TrainingSession(self, session_id, options, seed, targets)
            self._sessions[session_id] = session
            return session

    def create_session_from_state(
        self, folder: Path, *, session_id: str | None = None
    ) -> TrainingSession[ResidentBase]:
        """A new session with the saved options, weights, moments and step of `folder`."""
        state = checkpoint.read_state(folder)
        session = self.create_session(state.options.model_copy(update={"seed": state.seed}), session_id=session_id)
        try:
            session.load_state(folder)
        except Exception:
            self.close(session.session_id)
            raise
        return session

    def create_session_from_adapter(
        self, folder: Path, *, session_id: str | None = None
    ) -> TrainingSession[ResidentBase]:
        """A new session holding the PEFT-format adapter in `folder`, e.g. to sample with an adapter version.

        Reads `adapter_config.json` and `adapter_model.safetensors` as `save_weights_for_sampler`
        writes them: the session gets the same rank, alpha and targets, then the saved weights.
        Its optimizer starts empty (Adam's moments are made at the first step). Refuses, with
        InvalidRequest, an adapter this base cannot hold (another shape, or PEFT features Mint
        does not train: DoRA, rsLoRA, per-layer ranks, extra saved modules).
        """
        options, weights = checkpoint.read_sampler_weights(Path(folder))
        session = self.create_session(options, session_id=session_id)
        try:
            session.load_adapter_weights(weights, source=str(folder))
        except Exception:
            self.close(session.session_id)
            raise
        return session

    @mirrored
    def close(self, session_id: str) -> None:
        """Delete the session's adapter and optimizer state, freeing their memory."""
        with self._lock:
            session = self.get(session_id)
            del self._sessions[session_id]
            session._release()
            with warnings.catch_warnings():
                # peft warns when the active adapter goes; every primitive activates its own anyway.
                warnings.filterwarnings("ignore", message=r"Adapter .* was active which is now deleted")
                self._peft.delete_adapter(session_id)
            self._active = None  # peft switched layers to some other adapter: set one before the next use
            if self.prompt_cache is not None:
                self.prompt_cache.invalidate(session_id)

    def _new_session_id(self, requested: str | None) -> str:
        if requested is None:
            return lora.new_adapter_name()
        lora.check_adapter_name(requested, param="session_id")
        if requested in self._sessions:
            raise Conflict(f"session {requested!r} already exists", param="session_id")
        if any(requested in name.split(".") for name in self.catalogue.all_parameters):
            raise InvalidRequest(f"session id {requested!r} clashes with a module name of the base", param="session_id")
        return requested

    # ---- running the model ----------------------------------------------------------------

    @contextmanager
    def _use(self, adapter_name: str | None) -> Iterator[nn.Module]:
        """Hold the lock with `adapter_name` active (None: every adapter disabled, i.e. the base)."""
        with self._lock:
            if adapter_name is None:
                with self._adapters_disabled():
                    yield self.model
                return
            if adapter_name not in self._sessions:
                raise NotFound(f"training session {adapter_name!r} is closed", param="session_id")
            # Compared with what this base last activated, not with peft's `active_adapter`:
            # after `delete_adapter`, peft activates a replacement layer by layer, which can
            # differ from the name it reports, so a stale layer would run another session's LoRA.
            if self._active != adapter_name:
                self._peft.set_adapter(adapter_name)
                self._active = adapter_name
            yield self.model

    def _settle_active(self, adapter_name: str) -> None:
        """Make sure peft has a live active adapter (after a `close` it may name a deleted one),
        which its `disable_adapter` reads and restores around a mixed pass."""
        if self._active is None:
            self._peft.set_adapter(adapter_name)
            self._active = adapter_name

    def _adapters_disabled(self) -> AbstractContextManager[Any]:
        if self._peft is None or not self._peft.peft_config:
            return nullcontext()
        return self._peft.disable_adapter()

    def evaluate(
        self,
        adapter_name: str | None,
        data: Sequence[Datum],
        loss_fn: str | None,
        loss_fn_config: dict[str, float] | None,
        *,
        backward: bool,
        train_mode: Callable[[], AbstractContextManager[Any]] = nullcontext,
    ) -> ForwardOutput:
        """Score `data` under an adapter (None: the base); see `mint.trainer.scoring.score`."""
        request = ScoreRequest.of(self.limits, data, loss_fn, loss_fn_config)
        return self._score(adapter_name, request, backward=backward, train_mode=train_mode)

    @mirrored
    def _score(
        self,
        adapter_name: str | None,
        request: ScoreRequest,
        *,
        backward: bool,
        train_mode: Callable[[], AbstractContextManager[Any]] = nullcontext,
    ) -> ForwardOutput:
        with self._use(adapter_name) as model:
            trainable = self.get(adapter_name).named_parameters().values() if backward and adapter_name else ()
            return self._score_parts(
                model, [request], backward=backward, running=lambda _: train_mode(), trainable=list(trainable)
            )[0]

    @mirrored
    def forward_backward_many(self, calls: Sequence[BackwardCall]) -> list[ForwardOutput]:
        """The forward_backward of several sessions in ONE batched pass, each session's data a span
        of rows through its own adapter; one result per call, in order.

        Each session's loss depends on its own tokens only and its gradient reaches its own
        adapter only. Calls that cannot share a pass, or all of them where this base does not
        mix backward passes (`mix_backward`), run one after another, under one lock all the
        same; calls that would make a large pass run as several (`backward_passes.pass_groups`).
        """
        with self._lock:
            for call in calls:
                call.session._live_optimizer()
            groups = pass_groups(self.model, calls, mix=self.mix_backward)
            return [output for group in groups for output in self._mixed_pass(group)]

    def _mixed_pass(self, calls: Sequence[BackwardCall]) -> list[ForwardOutput]:
        """One forward and backward of several sessions' calls (the caller holds the lock and has
        checked that they can mix), each session's span of rows through its own adapter; one
        call runs through its own adapter, as peft runs it."""
        if len(calls) == 1:
            call = calls[0]
            return [
                self._score(call.session.session_id, call.request, backward=True, train_mode=call.session._lora_dropout)
            ]
        running = mixed_running(self._peft, calls, invariant=self.batch_invariant)
        self._settle_active(calls[0].session.session_id)
        trainable = [parameter for call in calls for parameter in call.session.named_parameters().values()]
        requests = [call.request for call in calls]
        return self._score_parts(self.model, requests, backward=True, running=running, trainable=trainable)

    def _score_parts(
        self,
        model: nn.Module,
        requests: list[ScoreRequest],
        *,
        backward: bool,
        running: RunningFn,
        trainable: Sequence[nn.Parameter] = (),
    ) -> list[ForwardOutput]:
        """`score_parts` as this base runs a pass: batch-invariant, without shared prefixes, where
        it is so; on a worker group, its rows split over the ranks (`data_parallel`), the
        gradients of `trainable` (the pass's adapters) summed over them."""
        with self._invariant():
            if self.group is not None and self.group.world_size > 1:
                return score_split(
                    self.group,
                    model,
                    requests,
                    backward=backward,
                    reference=self._reference,
                    running=running,
                    share_prefixes=not self.batch_invariant,
                    replicated=trainable,
                )
            return score_parts(
                model,
                requests,
                backward=backward,
                reference=self._reference,
                running=running,
                share_prefixes=not self.batch_invariant,
            )

    def _invariant(self) -> AbstractContextManager[None]:
        return batch_invariant() if self.batch_invariant else nullcontext()

    def _reference(self, data: list[Datum]) -> list[torch.Tensor]:
        # The reference model is the base itself: the same weights with every adapter disabled.
        with self._adapters_disabled(), torch.no_grad(), self._invariant():
            return packed_logprobs(self.model, pack(data, self.device, share_prefixes=not self.batch_invariant))

    def forward(
        self, data: Sequence[Datum], loss_fn: str | None = None, loss_fn_config: dict[str, float] | None = None
    ) -> ForwardOutput:
        """Logprobs of the target tokens under the base model (every adapter disabled)."""
        return self.evaluate(None, data, loss_fn, loss_fn_config, backward=False)

    def score_prompt(self, adapter_name: str | None, query: PromptQuery) -> PromptScores:
        """A prompt's logprobs, top-k tokens and target logprobs under an adapter (None: the base);
        see `mint.trainer.prompt_scores`."""
        query.check(self.limits.vocab_out)
        self.limits.check_tokens(query.prompt, vocab=self.limits.vocab_in, where="prompt")
        return self._score_prompt(adapter_name, query)

    @mirrored
    def _score_prompt(self, adapter_name: str | None, query: PromptQuery) -> PromptScores:
        with self._use(adapter_name) as model:
            return score_prompt(model, query)

    def check_sample_request(self, request: SampleRequest) -> Decoding:
        """The request as the decoder runs it, or InvalidRequest if this base cannot run it (`Decoding.of`)."""
        return Decoding.of(request, self.limits.check_prompt(request.prompt_tokens), self.eos_token_ids)

    def sample_batch(self, adapter_name: str | None, requests: Sequence[SampleRequest]) -> list[list[SampledSequence]]:
        """Sample every request under one adapter (None: the base), decoded together; one list
        of samples per request, in order. Every request is checked before anything runs."""
        return self.sample_many([SampleCall(adapter_name, list(requests))])[0]

    def run_at_once(self, loops: Sequence[Callable[[], LoopResult]]) -> list[LoopResult]:
        """Run training loops of this base's sessions at once (RL runs, each declared with
        `TrainingSession.looping`), each on a thread of its own, while the calling thread runs
        every pass they share (`mint.trainer.compute_lane`: on a CPU, one thread keeps the cores'
        OpenMP pool; each loop's own torch ops run on one core). Returns the loops' results in
        order once all have ended; raises the first one's error, if any, once all have ended."""
        # Each loop thread's own count: the lane's thread keeps its own.
        return self.lane.run_loops(loops, on_loop_thread=lambda: torch.set_num_threads(1))

    def sample_many(self, calls: Sequence[SampleCall]) -> list[list[list[SampledSequence]]]:
        """The sample_batch calls of several adapters decoded together, each request's rows through
        its own adapter (`mixed_adapters`); one result per call, in order. Every request is checked
        before anything runs. Adapters that cannot share a pass (parameter LoRA) decode one after
        another. Each sample is stamped with the version of the weights that generated it.
        """
        checked = [(call.adapter, [self.check_sample_request(request) for request in call.requests]) for call in calls]
        if self.group is not None:
            # Every rank decodes the same tokens: draw the seeds of unseeded requests here.
            checked = [(adapter, [decoding.seeded() for decoding in decodings]) for adapter, decodings in checked]
        return self._sample_checked(checked)

    @mirrored
    def _sample_checked(self, checked: list[CheckedCall]) -> list[list[list[SampledSequence]]]:
        """Decode checked requests, each call's under its adapter: `sample_many`'s part that runs the model."""
        adapters = sorted({adapter for adapter, _ in checked if adapter is not None})
        with self._lock, torch.no_grad():
            # Read under the lock that also guards every weight update: the weights that decode.
            stamps = {None: BASE_VERSION} | {name: self.get(name).version for name in adapters}
            if len({adapter for adapter, _ in checked}) > 1 and not can_mix(self.model, adapters):
                results = [
                    self._decode(decodings, [adapter] * len(decodings), stamps) for adapter, decodings in checked
                ]
            else:
                samples = self._decode(
                    [decoding for _, decodings in checked for decoding in decodings],
                    [adapter for adapter, decodings in checked for _ in decodings],
                    stamps,
                )
                results = per_call(samples, checked)
        return stamped(checked, results, stamps)

    def _decode(
        self, decodings: Sequence[Decoding], owners: Sequence[str | None], versions: dict[str | None, str]
    ) -> list[list[SampledSequence]]:
        """Decode each request through its owner's adapter: the plain one-adapter path when they
        all share one, else a mixed pass (the caller holds the lock and has checked that the
        owners can mix). Prompts start from their cached prefixes under the owner's weights
        `versions`."""
        decode = functools.partial(self.tokenizer.decode, skip_special_tokens=False)
        # Batch-invariant decoding keeps the model's own (tiled) forward, and a worker group's
        # FSDP2 shards are gathered by the hooks of the model's own modules.
        fuse = not self.batch_invariant and self.group is None
        prompts = None
        if self.prompt_cache is not None:
            prompts = CachedPrompts(self.prompt_cache, tuple((owner, versions[owner]) for owner in owners))
        if len(set(owners)) <= 1:
            adapter = next(iter(owners), None)
            with self._use(adapter) as model:
                return decode_alone(model, decodings, decode, prompts, adapter=adapter, fuse=fuse)
        self._settle_active(next(owner for owner in owners if owner is not None))
        return decode_mixed(self._peft, self.model, decodings, owners, decode, prompts, fuse=fuse)

    def sample_with(
        self, adapter_name: str | None, prompt_tokens: Sequence[int], params: SamplingParams, num_samples: int
    ) -> list[SampledSequence]:
        """Sample one prompt under an adapter (None: the base); see `mint.trainer.sampling`."""
        return self.sample_batch(adapter_name, [SampleRequest(prompt_tokens, params, num_samples)])[0]

    def sample(
        self, prompt_tokens: Sequence[int], params: SamplingParams, num_samples: int = 1
    ) -> list[SampledSequence]:
        """Sample from the base model itself (every adapter disabled)."""
        return self.sample_with(None, prompt_tokens, params, num_samples)

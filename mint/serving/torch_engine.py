"""The torch engine: many LoRA adapters on one resident base, served in mixed batches.

One forward pass serves a batch whose rows use different adapters (or none). The base's weights
are applied once for the whole batch; each row's LoRA delta comes from its adapter's *slot*
(`mint.serving.lora_slots`: the slot stacks beside every adaptable linear and the fused
routed experts of an MoE base, with no weight ever merged). The engine wraps the base's
layers once, fills a free slot when an adapter is added, and sets each row's slot in one
shared `SlotContext` around each forward.

Requests are scheduled by continuous batching: up to `max_batch_size` run together; between
decode steps finished requests leave and waiting ones join (prefilled together, then merged
into the running batch). The running batch keeps one transformers `DynamicCache`, left-padded:
each row's real tokens end at the last column, an attention mask hides the padding, and
position ids count each row's own tokens. When rows leave, the columns that are padding for
every remaining row are dropped. A joining row starts from the longest cached prefix of its
prompt under its adapter's weights (`mint.trainer.prompt_cache`: whole blocks, bounded by bytes,
an adapter's blocks dropped when it is removed or loaded again) and reports those tokens as
cached in its usage.

Each step's logits give every sampled token its logprob (logit - logsumexp in float32: the
model's own distribution, at temperature 1, whatever the request samples with), and, for
the rows whose request asked for `top_logprobs` k > 0, the k most likely tokens with the
same numbers (`mint.trainer.head_logprobs.top_logprobs`); rows that did not ask compute no top-k.

Adapters come in the PEFT format written by `peft` and by Mint's trainer
(`save_weights_for_sampler`): module LoRA (`target_modules`), parameter LoRA on a linear's
weight, and parameter LoRA on fused experts (`target_parameters`, one rank-r pair per expert).
Adding an adapter copies its tensors into a free slot (a copy, no allocation, once the slot
stacks have grown to that slot); removing it zeroes the slot, makes it reusable at once, and
keeps no reference to the adapter's tensors. As with vLLM's `max_loras`, the slot stacks are
memory the engine reserves, bounded by max_adapters x max_rank.

The base never trains here, so on a CPU each adaptable linear's weight is kept in oneDNN's
prepacked layout instead of its plain one (`mint.trainer.packed_linear`; `prepack_weights`):
the few-row products of decode steps and short prompts run faster from it, for no second copy.
A weight the base shares (a head tied to the embeddings) stays plain.

Where the engine computes matters on a CPU (`mint.trainer.compute_lane`): every thread that runs
torch's OpenMP kernels keeps a pool of workers, and once a process holds more pool threads than
cores each parallel op waits for its workers through the kernel. A serving node would run the
engine from its batcher threads and fill slots from its cache's threads; given a `ComputeLane`
served by a thread of its own (`mint.serving.engines.open_engine` makes one), the engine loads
its base and runs every step, slot fill and removal on that one thread. Without one it computes
on the caller's thread.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter, deque
from collections.abc import Generator, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from mint.chat.completion_text import completion_text, text_decoder
from mint.errors import ConfigurationError, Conflict, InvalidRequest, NotFound
from mint.schemas.base_models import BaseModelSpec
from mint.serving.engine import (
    AdapterInfo,
    AdapterSource,
    AdapterTensors,
    BatchEngine,
    FinishReason,
    GenerateRequest,
    GenerateResult,
    StreamEvent,
    TopLogprobs,
    Usage,
    check_adapter_id,
    result_of,
    usage_of,
)
from mint.serving.lora_slots import (
    AdapterFactors,
    LoraExperts,
    LoraLinear,
    SlotContext,
    SlotStack,
    experts_supported,
    parse_adapter,
    replace_module,
)
from mint.serving.peft_format import adapter_files, read_config
from mint.serving.streamed_text import StreamedText
from mint.trainer.compute_lane import ComputeLane
from mint.trainer.head_logprobs import last_position_only, token_logprobs, top_logprobs
from mint.trainer.lora import TargetCatalogue
from mint.trainer.models import load_base_model
from mint.trainer.packed_linear import PackedLinear
from mint.trainer.prompt_cache import DEFAULT_MAX_BYTES as DEFAULT_PROMPT_CACHE_BYTES
from mint.trainer.prompt_cache import CachedPrompts, PromptCache, Spliced
from mint.trainer.sampling import choose_tokens, end_of_sequence_ids
from mint.trainer.types import SamplingParams

DEFAULT_MAX_ADAPTERS = 8
DEFAULT_MAX_RANK = 16
DEFAULT_MAX_BATCH_SIZE = 16
EXPERT_PARAMETERS = ("gate_up_proj", "down_proj")


def _shared_weights(model: nn.Module) -> set[int]:
    """The ids of the parameters that more than one module of `model` holds (tied weights)."""
    seen: Counter[int] = Counter(id(parameter) for _, parameter in model.named_parameters(remove_duplicate=False))
    return {key for key, count in seen.items() if count > 1}


# ---- reading a PEFT adapter -------------------------------------------------------------------


def read_adapter_folder(folder: Path) -> AdapterTensors:
    """The adapter in a PEFT folder, in memory: its config and its safetensors weights (never pickle)."""
    config_file, weights_file = adapter_files(folder)
    config = read_config(config_file)
    try:
        tensors = load_file(weights_file)
    except (OSError, ValueError, SafetensorError) as exc:
        raise InvalidRequest(f"the adapter in {folder} cannot be read: {exc}", param="adapter") from exc
    return AdapterTensors(config=config, tensors=tensors)


# ---- requests while they run ------------------------------------------------------------------


@dataclass(eq=False)
class _Row:
    """One request from admission to its last token."""

    index: int
    adapter_id: str | None
    slot: int
    prompt: list[int]
    max_new_tokens: int
    params: SamplingParams
    stop_token_ids: frozenset[int]
    text: StreamedText
    generator: torch.Generator | None
    alternatives: int = 0  # the request's top_logprobs k: 0 computes no top-k list
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[TopLogprobs] = field(default_factory=list)
    final_text: str = ""
    finish_reason: FinishReason | None = None
    stop_match: str | int | None = None
    weights: tuple[str | None, int] = (None, 0)  # (adapter, its load): whose prompt-cache blocks it may read
    cached_tokens: int = 0  # prompt tokens read from the prompt cache

    @property
    def next_position(self) -> int:
        """The position of the newest token, the one the next decode step feeds."""
        return len(self.prompt) + len(self.tokens) - 1

    def usage(self) -> Usage:
        return usage_of(self)

    def result(self) -> GenerateResult:
        return result_of(self)


@dataclass
class _Batch:
    """Rows decoding together: one left-padded KV cache, its attention mask and each row's slot."""

    rows: list[_Row]
    cache: Any  # transformers DynamicCache, (B, heads, T, head_dim) per layer
    mask_B_T: torch.Tensor

    def layers(self) -> list[Any]:
        return list(self.cache.layers)

    def keep(self, keep: list[int]) -> _Batch | None:
        """The batch with only rows `keep`, minus the columns that are padding for all of them."""
        if not keep:
            return None
        if len(keep) < len(self.rows):
            index = torch.tensor(keep, dtype=torch.long, device=self.mask_B_T.device)
            for layer in self.layers():
                layer.keys, layer.values = layer.keys[index], layer.values[index]
            self.mask_B_T = self.mask_B_T[index]
            self.rows = [self.rows[i] for i in keep]
        lead = int(self.mask_B_T.any(dim=0).long().argmax())
        if lead:
            for layer in self.layers():
                layer.keys, layer.values = layer.keys[:, :, lead:], layer.values[:, :, lead:]
            self.mask_B_T = self.mask_B_T[:, lead:]
        return self

    def join(self, other: _Batch) -> _Batch:
        """This batch with `other`'s rows appended; the shorter cache is padded on the left."""
        length, other_length = self.mask_B_T.shape[1], other.mask_B_T.shape[1]
        width = max(length, other_length)
        for mine, theirs in zip(self.layers(), other.layers(), strict=True):
            mine.keys = torch.cat([_left_pad(mine.keys, width, 2), _left_pad(theirs.keys, width, 2)])
            mine.values = torch.cat([_left_pad(mine.values, width, 2), _left_pad(theirs.values, width, 2)])
        self.mask_B_T = torch.cat([_left_pad(self.mask_B_T, width, 1), _left_pad(other.mask_B_T, width, 1)])
        self.rows = self.rows + other.rows
        return self


def _left_pad(tensor: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    missing = width - tensor.shape[dim]
    if missing == 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


def _generator(seed: int | None, device: torch.device) -> torch.Generator:
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()  # fresh entropy: an unseeded request must not repeat another's sample
    else:
        generator.manual_seed(seed)
    return generator


# ---- the engine ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Loaded:
    slot: int
    info: AdapterInfo
    modules: tuple[str, ...]
    load: int  # which load of the engine this is: the version of its weights for the prompt cache


class TorchEngine(BatchEngine):
    """The `Engine` contract on a transformers base in this process: CPU or one GPU, dense or MoE.

    The engine takes the model over: it wraps the model's adaptable layers in place, so the
    model must be a plain transformers model (not a peft model) used by nothing else.
    Thread-safe: one forward pass runs at a time; concurrent streams interleave by step.
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        *,
        base_model: str,
        context_length: int | None = None,
        max_adapters: int = DEFAULT_MAX_ADAPTERS,
        max_rank: int = DEFAULT_MAX_RANK,
        max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
        prompt_cache_bytes: int = DEFAULT_PROMPT_CACHE_BYTES,
        lane: ComputeLane | None = None,
        stop_lane_on_close: bool = False,
        prepack_weights: bool = True,
    ) -> None:
        if max_adapters < 1 or max_rank < 1 or max_batch_size < 1:
            raise ConfigurationError("max_adapters, max_rank and max_batch_size must be at least 1")
        if hasattr(model, "peft_config"):
            raise ConfigurationError("the torch engine serves a plain transformers model, not a peft model")
        model.requires_grad_(False)
        model.eval()
        self._model = model
        self.tokenizer = tokenizer
        self._base_model = base_model
        self._max_adapters = max_adapters
        self.max_rank = max_rank
        self.max_batch_size = max_batch_size
        self.device = model.get_input_embeddings().weight.device
        self.vocab_size = int(model.get_input_embeddings().num_embeddings)
        self.context_length = int(context_length or model.config.max_position_embeddings)
        self.eos_token_ids = frozenset(end_of_sequence_ids(tokenizer, model))
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self._pad_token_id = int(pad or 0)
        weight = model.get_input_embeddings().weight
        self._context = SlotContext(max_adapters + 1, max_rank, weight.dtype, self.device)
        self._linears, self._experts = self._wrap(model, TargetCatalogue.from_model(model), prepack=prepack_weights)
        self._loaded: dict[str, _Loaded] = {}
        self._free_slots = list(range(1, max_adapters + 1))
        self._in_use: Counter[str] = Counter()
        self._lock = threading.RLock()
        self.prompt_cache = PromptCache(prompt_cache_bytes) if prompt_cache_bytes else None
        self._loads = itertools.count(1)
        self._lane = lane or ComputeLane()
        self._stop_lane_on_close = stop_lane_on_close  # a lane of its own (`from_spec(own_thread=True)`)

    @classmethod
    def from_spec(
        cls,
        spec: BaseModelSpec,
        cache_dir: Path,
        *,
        dtype: str | None = None,
        device: str = "cpu",
        max_adapters: int = DEFAULT_MAX_ADAPTERS,
        max_rank: int = DEFAULT_MAX_RANK,
        max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
        prompt_cache_bytes: int = DEFAULT_PROMPT_CACHE_BYTES,
        lane: ComputeLane | None = None,
        own_thread: bool = False,
        prepack_weights: bool = True,
    ) -> TorchEngine:
        """Load the base named by `spec` (pulled into `cache_dir` if needed) and serve it, both on
        `lane`'s thread where one serves it. With `own_thread` (and no `lane`), the engine's
        lane is served by a thread of its own, which `close` ends."""
        owned = lane is None and own_thread
        lane = lane or ComputeLane()
        if owned:
            lane.start("torch-engine")

        def load() -> TorchEngine:
            model, tokenizer = load_base_model(spec, cache_dir, dtype=dtype, device=device)
            return cls(
                model,
                tokenizer,
                base_model=spec.name,
                context_length=spec.context_length,
                max_adapters=max_adapters,
                max_rank=max_rank,
                max_batch_size=max_batch_size,
                prompt_cache_bytes=prompt_cache_bytes,
                lane=lane,
                stop_lane_on_close=owned,
                prepack_weights=prepack_weights,
            )

        try:
            engine = lane.run(load)
        except BaseException:
            if owned:  # no engine to end its thread later
                lane.stop()
            raise
        return engine

    def _wrap(
        self, model: nn.Module, catalogue: TargetCatalogue, *, prepack: bool
    ) -> tuple[dict[str, LoraLinear], dict[str, LoraExperts]]:
        """Wrap every adaptable linear and every supported fused-experts module, by the base's own
        names; with `prepack`, each linear's base weight in oneDNN's layout where that serves it
        (`mint.trainer.packed_linear`)."""
        slots = self._max_adapters + 1
        shared = _shared_weights(model)
        linears: dict[str, LoraLinear] = {}
        for name in (*catalogue.attention, *catalogue.mlp, *([catalogue.unembed] if catalogue.unembed else [])):
            base = model.get_submodule(name)
            if isinstance(base, nn.Linear):
                # The plain weight is dropped for its packed layout: a weight another module also
                # uses (a head tied to the embeddings) stays plain, or it would be kept twice.
                packed = base if not prepack or id(base.weight) in shared else PackedLinear.of(base)
                linears[name] = LoraLinear(packed, self._context, slots)
                replace_module(model, name, linears[name])
        experts: dict[str, LoraExperts] = {}
        for module_name in sorted({name.rpartition(".")[0] for name in catalogue.experts}):
            module = model.get_submodule(module_name)
            if experts_supported(module):
                experts[module_name] = LoraExperts(module, self._context, slots)
                replace_module(model, module_name, experts[module_name])
        return linears, experts

    # ---- the Engine contract: adapters ----------------------------------------------------------

    def add_adapter(self, adapter_id: str, source: AdapterSource) -> None:
        """Copy a PEFT adapter into a free slot; a no-op if `adapter_id` is already loaded."""
        check_adapter_id(adapter_id)
        self._lane.run(self._add, adapter_id, source)

    def _add(self, adapter_id: str, source: AdapterSource) -> None:
        with self._lock:
            if adapter_id in self._loaded:
                return
        tensors = read_adapter_folder(source) if isinstance(source, Path) else source
        if not isinstance(tensors, AdapterTensors):
            raise InvalidRequest("an adapter source is a PEFT folder (Path) or AdapterTensors", param="adapter")
        adapter = parse_adapter(
            tensors,
            linears={name: wrapper.base for name, wrapper in self._linears.items()},
            experts={name: wrapper.experts for name, wrapper in self._experts.items()},
            max_rank=self.max_rank,
            base_model=self._base_model,
        )
        with self._lock, torch.no_grad():
            if adapter_id in self._loaded:
                return
            if not self._free_slots:
                raise Conflict(
                    f"all {self._max_adapters} adapter slots of base {self._base_model!r} are taken; "
                    "remove an adapter first",
                    param="adapter_id",
                )
            slot = self._free_slots.pop(0)
            modules = self._fill_slot(slot, adapter)
            size_bytes = adapter.numel * self._context.dtype.itemsize  # in the engine's dtype
            info = AdapterInfo(adapter_id=adapter_id, rank=adapter.rank, size_bytes=size_bytes)
            self._loaded[adapter_id] = _Loaded(slot, info, modules, next(self._loads))

    def _fill_slot(self, slot: int, adapter: AdapterFactors) -> tuple[str, ...]:
        filled: list[SlotStack] = []
        try:
            for delta in adapter.linears:
                wrapped = self._linears[delta.module]
                wrapped.stack.load(slot, delta.a_r_in, delta.b_out_r, adapter.scale, like=wrapped.base.weight)
                filled.append(wrapped.stack)
            for expert_delta in adapter.experts:
                wrapper = self._experts[expert_delta.module]
                stack = wrapper.stacks[expert_delta.parameter]
                like = getattr(wrapper.experts, expert_delta.parameter)
                stack.load(slot, expert_delta.a_e_r_in, expert_delta.b_e_out_r, adapter.scale, like=like)
                filled.append(stack)
        except BaseException:
            for stack in filled:
                stack.clear(slot)
            self._free_slots.insert(0, slot)
            raise
        return tuple([d.module for d in adapter.linears] + [f"{d.module}.{d.parameter}" for d in adapter.experts])

    def _stacks_of(self, module: str) -> SlotStack:
        if module in self._linears:
            return self._linears[module].stack
        experts_module, _, parameter = module.rpartition(".")
        return self._experts[experts_module].stacks[parameter]

    def remove_adapter(self, adapter_id: str) -> None:
        """Zero the adapter's slot and make it reusable; refuses while a running stream uses the adapter."""
        self._lane.run(self._remove, adapter_id)

    def _remove(self, adapter_id: str) -> None:
        with self._lock, torch.no_grad():
            loaded = self._loaded.get(adapter_id)
            if loaded is None:
                raise NotFound(f"adapter {adapter_id!r} is not loaded on base {self._base_model!r}", param="adapter_id")
            if self._in_use[adapter_id]:
                raise Conflict(
                    f"adapter {adapter_id!r} still serves {self._in_use[adapter_id]} running request(s); "
                    "remove it when they finish",
                    param="adapter_id",
                )
            for module in loaded.modules:
                self._stacks_of(module).clear(loaded.slot)
            del self._loaded[adapter_id]
            if self.prompt_cache is not None:
                self.prompt_cache.invalidate(adapter_id)
            self._free_slots.append(loaded.slot)
            self._free_slots.sort()

    def adapters(self) -> list[AdapterInfo]:
        """The loaded adapters, oldest first."""
        with self._lock:
            return [loaded.info for loaded in self._loaded.values()]

    def close(self) -> None:
        """Unload every adapter not in use, and end the engine's own compute thread if it has one
        (its OpenMP pool goes with it); the base goes with this object (no process to stop)."""
        for info in self.adapters():
            with suppress(NotFound, Conflict):
                self.remove_adapter(info.adapter_id)
        if self._stop_lane_on_close:
            self._lane.stop()

    @property
    def compute_lane(self) -> ComputeLane:
        """The lane this engine computes on: its own thread's (`from_spec(own_thread=True)`), a
        lane it was given, or, served by no thread, the caller's thread."""
        return self._lane

    def slot_of(self, adapter_id: str) -> int:
        """The slot an adapter occupies (1..max_adapters)."""
        with self._lock:
            loaded = self._loaded.get(adapter_id)
            if loaded is None:
                raise NotFound(f"adapter {adapter_id!r} is not loaded on base {self._base_model!r}", param="adapter_id")
            return loaded.slot

    def memory_bytes(self) -> int:
        """Bytes the slot stacks reserve: zero before the first adapter, then growing with the highest
        slot in use (to at most max_adapters slots at max_rank), reused as adapters come and go."""
        with self._lock:
            stacks = [w.stack for w in self._linears.values()]
            stacks += [s for w in self._experts.values() for s in w.stacks.values()]
            return sum(stack.size_bytes for stack in stacks)

    # ---- the Engine contract: generation ---------------------------------------------------------

    def _resolve(self, requests: Sequence[GenerateRequest], *, streaming: bool) -> list[_Row]:
        """Turn requests into rows; the whole batch is checked before anything runs."""
        rows = []
        for index, request in enumerate(requests):
            if not isinstance(request, GenerateRequest):
                raise InvalidRequest(f"request {index} is not a GenerateRequest", param="requests")
            rows.append(self._row(index, request, streaming))
        return rows

    def _row(self, index: int, request: GenerateRequest, streaming: bool) -> _Row:
        loaded, prompt = self._checked(index, request)
        slot = 0 if loaded is None else loaded.slot
        params = SamplingParams(temperature=request.temperature, top_p=request.top_p, top_k=request.top_k)
        stop_ids = set(request.stop_token_ids) | (set() if request.ignore_eos else set(self.eos_token_ids))
        return _Row(
            index=index,
            adapter_id=request.adapter_id,
            slot=slot,
            prompt=prompt,
            max_new_tokens=min(request.max_tokens, self.context_length - len(prompt)),
            params=params,
            stop_token_ids=frozenset(stop_ids),
            text=StreamedText(self._detokenize, request.stop, streaming),
            generator=None if request.temperature == 0.0 else _generator(request.seed, self.device),
            alternatives=request.top_logprobs,
            weights=(None, 0) if loaded is None else (request.adapter_id, loaded.load),
        )

    def _admit(self, requests: Sequence[GenerateRequest], *, streaming: bool) -> list[_Row]:
        """Resolve the batch and mark its adapters in use, under the lock so no removal slips between."""
        with self._lock:
            rows = self._resolve(requests, streaming=streaming)
            self._in_use.update(row.adapter_id for row in rows if row.adapter_id is not None)
        return rows

    def _release(self, row: _Row) -> None:
        if row.adapter_id is not None:
            with self._lock:
                self._in_use[row.adapter_id] -= 1
                if self._in_use[row.adapter_id] <= 0:
                    del self._in_use[row.adapter_id]

    def _detokenize(self, tokens: list[int]) -> str:
        return text_decoder(self.tokenizer)(tokens)

    # ---- continuous batching ---------------------------------------------------------------------

    def _run(self, rows: list[_Row]) -> Generator[list[StreamEvent], None, None]:
        """Decode `rows` with continuous batching; yields each step's events. Each step runs on
        the engine's compute lane."""
        waiting = deque(rows)
        running: _Batch | None = None
        unfinished = set(range(len(rows)))
        try:
            while waiting or running is not None:
                running, stepped, events = self._lane.run(self._step, running, waiting)
                for row in (row for row in stepped if row.finish_reason is not None):
                    unfinished.discard(row.index)
                    self._release(row)
                yield events
        finally:
            for index in unfinished:  # a stream closed early: its rows no longer hold their adapters
                self._release(rows[index])

    def _step(
        self, running: _Batch | None, waiting: deque[_Row]
    ) -> tuple[_Batch | None, list[_Row], list[StreamEvent]]:
        """One step: the running rows' next tokens, and the prefill of as many waiting rows as there
        is room for; (the batch that goes on, the rows that stepped, their events)."""
        with self._lock, torch.no_grad():
            logits: list[tuple[_Row, torch.Tensor]] = []
            if running is not None:
                logits += zip(running.rows, self._decode_step(running), strict=True)
            room = self.max_batch_size - (len(running.rows) if running is not None else 0)
            joining = [waiting.popleft() for _ in range(min(room, len(waiting)))]
            joined: _Batch | None = None
            if joining:
                joined, first_logits = self._prefill(joining)
                logits += zip(joining, first_logits, strict=True)
            stepped = [row for row, _ in logits]
            events = self._sample(stepped, torch.stack([lg for _, lg in logits]))
            return self._regroup(running, joined), stepped, events

    def _regroup(self, running: _Batch | None, joined: _Batch | None) -> _Batch | None:
        """Drop finished rows from both batches and merge what is left into one."""
        batches = []
        for batch in (running, joined):
            if batch is not None:
                kept = batch.keep([i for i, row in enumerate(batch.rows) if row.finish_reason is None])
                if kept is not None:
                    batches.append(kept)
        if not batches:
            return None
        return batches[0] if len(batches) == 1 else batches[0].join(batches[1])

    def _forward(self, rows: list[_Row], **inputs: Any) -> Any:
        with self._context.serving([row.slot for row in rows]):
            return self._model(**inputs, use_cache=True, logits_to_keep=last_position_only(inputs["input_ids"]))

    def _prefill(self, rows: list[_Row]) -> tuple[_Batch, torch.Tensor]:
        """Run the prompts of joining rows, left-padded to one length, each from its cached prefix
        if the prompt cache holds one; (their batch, last logits (J, V))."""
        prompts = [row.prompt for row in rows]
        cached = None if self.prompt_cache is None else CachedPrompts(self.prompt_cache, tuple(r.weights for r in rows))
        hits = [None] * len(rows) if cached is None else cached.lookup(prompts)
        spliced = Spliced.of(prompts, hits, self._pad_token_id, self.device)
        for row, tokens in zip(rows, spliced.cached, strict=True):
            row.cached_tokens = tokens
        output = self._forward(
            rows,
            input_ids=spliced.input_ids,
            attention_mask=spliced.mask,
            position_ids=spliced.position_ids,
            cache=spliced.past_cache(),
        )
        cache = output.cache
        if any(type(layer).__name__ != "DynamicLayer" for layer in cache.layers):
            raise ConfigurationError(
                f"base {self._base_model!r} uses a KV cache with sliding or special layers; "
                "the torch engine batches plain full-attention caches only"
            )
        if cached is not None:
            cached.store(prompts, spliced, cache)
        return _Batch(rows, cache, spliced.mask), output.logits[:, -1]

    def _decode_step(self, batch: _Batch) -> torch.Tensor:
        """Feed every row's newest token; next-token logits (B, V)."""
        last_B_1 = torch.tensor([[row.tokens[-1]] for row in batch.rows], dtype=torch.long, device=self.device)
        positions_B_1 = torch.tensor([[row.next_position] for row in batch.rows], dtype=torch.long, device=self.device)
        batch.mask_B_T = torch.cat([batch.mask_B_T, batch.mask_B_T.new_ones((len(batch.rows), 1))], dim=1)
        output = self._forward(
            batch.rows, input_ids=last_B_1, attention_mask=batch.mask_B_T, position_ids=positions_B_1, cache=batch.cache
        )
        batch.cache = output.cache
        return output.logits[:, -1]

    def _sample(self, rows: list[_Row], logits_B_V: torch.Tensor) -> list[StreamEvent]:
        """Choose each row's next token with its own parameters and generator; record it; the events."""
        logits_B_V = logits_B_V.float()
        chosen_B = logits_B_V.argmax(dim=-1)
        for i, row in enumerate(rows):
            if row.generator is not None:
                chosen_B[i] = choose_tokens(logits_B_V[i : i + 1], row.params, row.generator)[0]
        logprobs_B = token_logprobs(logits_B_V, chosen_B)
        tops = self._top_logprobs(rows, logits_B_V)
        return [
            self._advance(row, token, logprob, tops.get(i))
            for i, (row, token, logprob) in enumerate(zip(rows, chosen_B.tolist(), logprobs_B.tolist(), strict=True))
        ]

    @staticmethod
    def _top_logprobs(rows: list[_Row], logits_B_V: torch.Tensor) -> dict[int, TopLogprobs]:
        """{row position: its k most likely tokens and their logprobs} for the rows that asked for
        top_logprobs; computed on those rows' logits only, so other rows pay nothing."""
        asking = [i for i, row in enumerate(rows) if row.alternatives > 0]
        if not asking:
            return {}
        index_A = torch.tensor(asking, dtype=torch.long, device=logits_B_V.device)
        ids_A_K, logprobs_A_K = top_logprobs(logits_B_V[index_A], max(rows[i].alternatives for i in asking))
        return {
            i: list(zip(ids[: rows[i].alternatives], values[: rows[i].alternatives], strict=True))
            for i, ids, values in zip(asking, ids_A_K.tolist(), logprobs_A_K.tolist(), strict=True)
        }

    def _advance(self, row: _Row, token: int, logprob: float, top: TopLogprobs | None) -> StreamEvent:
        """Append one token (and its top-k list, when the row asked for one) to a row and decide
        whether it is finished."""
        row.tokens.append(token)
        row.logprobs.append(logprob)
        if top is not None:
            row.top_logprobs.append(top)
        delta = ""
        if token in row.stop_token_ids:
            self._finish(row, "stop", token, completion_text(row.tokens, self._detokenize, stopped=True))
        else:
            delta, stopped = row.text.advance(row.tokens)
            if stopped is not None:
                text = completion_text(row.tokens, self._detokenize, stopped=True, stops=(stopped,))
                self._finish(row, "stop", stopped, text)
            elif len(row.tokens) >= row.max_new_tokens:
                self._finish(row, "length", None, completion_text(row.tokens, self._detokenize, stopped=False))
        if row.finish_reason is not None:
            delta += row.text.rest(row.final_text)
        return StreamEvent(
            index=row.index,
            token_ids=[token],
            text=delta,
            logprobs=[logprob],
            top_logprobs=[] if top is None else [top],
            finish_reason=row.finish_reason,
            stop_match=row.stop_match,
            usage=row.usage() if row.finish_reason is not None else None,
        )

    @staticmethod
    def _finish(row: _Row, reason: FinishReason, match: str | int | None, text: str) -> None:
        row.finish_reason, row.stop_match, row.final_text = reason, match, text

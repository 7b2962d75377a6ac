"""The vLLM engine as a serving node runs it: `VllmEngineProcess`, the `Engine` contract on a
`VllmEngine` (`mint.serving.vllm_process`) in a child process of the vLLM venv.

vLLM pins an older transformers than Mint's trainer uses, so it lives in a venv of its own
(`make vllm-venv`). `VllmEngineProcess` keeps the `Engine` contract in any venv by starting
`python -m mint.serving.vllm_process` with that venv's python, spoken to over two pipes, one
JSON message per line: a call `{"id", "op", ...}` is answered by `{"id", "ok"}` or `{"id",
"error"}`, a stream by `{"id", "accepted"}`, its events `{"id", "event"}` and a last `ok`;
`{"id", "op": "cancel"}` ends a stream early. Mint's errors cross the pipe as themselves.

The checks of a PEFT adapter against the base's linear layers are here too, shared by both
sides: the parent writes in-memory adapters as a folder for the child, and the child checks
every adapter before vLLM loads it. This module imports neither vllm nor torch (a torch
adapter is saved with safetensors' torch writer, imported when one is).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import queue
import struct
import subprocess
import tempfile
import threading
import time
import weakref
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from mint import errors
from mint.errors import ConfigurationError, InvalidRequest, MintError, ServiceUnavailable
from mint.serving.engine import (
    ADAPTER_FILES,
    AdapterInfo,
    AdapterSource,
    AdapterTensors,
    GenerateRequest,
    GenerateResult,
    StreamEvent,
    check_adapter_id,
)
from mint.serving.peft_format import UNSERVED_SETTINGS, adapter_files, factor_pairs, lora_settings, read_config

SERVED_BY = "the vLLM engine"  # in errors about what it cannot serve
DEFAULT_MAX_ADAPTERS = 8
DEFAULT_MAX_RANK = 16
DEFAULT_MAX_BATCH_SIZE = 16
# vLLM's LoRAConfig accepts these max_lora_rank values only.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# Besides plain LoRA's exclusions: LoRA on parameters (fused MoE experts), which vLLM cannot load.
_UNSERVED_SETTINGS = (*UNSERVED_SETTINGS, "target_parameters")
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


# ---- checking a PEFT adapter against the base ----------------------------------------------------


def _safetensors_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Tensor names and shapes from a safetensors file's header, without reading the tensors."""
    try:
        with path.open("rb") as file:
            (length,) = struct.unpack("<Q", file.read(8))
            if length > 100_000_000:
                raise ValueError("header too large")
            header = json.loads(file.read(length))
    except (OSError, ValueError, struct.error) as exc:
        raise InvalidRequest(f"{path} is not a readable safetensors file: {exc}", param="adapter") from exc
    if not isinstance(header, dict):
        raise InvalidRequest(f"{path} is not a safetensors file", param="adapter")
    return {name: tuple(entry["shape"]) for name, entry in header.items() if name != "__metadata__"}


def read_folder(folder: Path) -> tuple[dict[str, Any], dict[str, tuple[int, ...]]]:
    """(adapter_config.json's content, the weights' shapes) of a PEFT folder; safetensors only."""
    config_file, weights_file = adapter_files(folder)
    return read_config(config_file), _safetensors_shapes(weights_file)


def check_adapter(
    config: Mapping[str, Any],
    shapes: Mapping[str, tuple[int, ...]],
    *,
    linears: Mapping[str, tuple[int, int]],
    max_rank: int,
    base_model: str,
) -> tuple[int, int]:
    """(rank, number of weights) of an adapter that fits the base's linear layers `{name: (in, out)}`."""
    rank, _scale = lora_settings(config, max_rank, served_by=SERVED_BY, unserved=_UNSERVED_SETTINGS)
    numel = 0
    for (module, depth), pair in sorted(factor_pairs(shapes, served_by=SERVED_BY).items()):
        if depth or module not in linears:
            raise InvalidRequest(
                f"the adapter adapts {module!r}{'.base_layer' * depth}, which base {base_model!r} has not or "
                f"{SERVED_BY} does not serve (served: the linear layers of attention and MLPs, and the output head)",
                param="adapter",
            )
        in_features, out_features = linears[module]
        if pair["A"] != (rank, in_features) or pair["B"] != (out_features, rank):
            raise InvalidRequest(
                f"the adapter's factors for {module!r} have shapes {pair['A']} and {pair['B']}; base {base_model!r} "
                f"needs ({rank}, {in_features}) and ({out_features}, {rank}): it was trained on another base",
                param="adapter",
            )
        numel += math.prod(pair["A"]) + math.prod(pair["B"])
    return rank, numel


def save_tensors(tensors: Mapping[str, Any], path: Path) -> None:
    """Write in-memory adapter tensors (torch or numpy) as safetensors."""
    values = list(tensors.values())
    if values and all(type(value).__module__.startswith("numpy") for value in values):
        from safetensors.numpy import save_file as save_numpy

        save_numpy(dict(tensors), str(path))
        return
    from safetensors.torch import save_file as save_torch

    # safetensors refuses tensors that share memory (the same tensor under two names): copy repeats.
    seen: set[int] = set()
    unique = {}
    for name, tensor in tensors.items():
        tensor = tensor.detach().contiguous()
        if tensor.data_ptr() in seen:
            tensor = tensor.clone()
        seen.add(tensor.data_ptr())
        unique[name] = tensor
    save_torch(unique, str(path))


def tensor_shapes(tensors: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    shapes = {}
    for name, tensor in tensors.items():
        shape = getattr(tensor, "shape", None)
        if shape is None:
            raise InvalidRequest(f"adapter tensor {name!r} is not a tensor", param="adapter")
        shapes[name] = tuple(int(size) for size in shape)
    return shapes


# ---- the parent side of the pipe ----------------------------------------------------------------

_ERRORS: dict[str, type[MintError]] = {
    name: cls
    for name, cls in vars(errors).items()
    if isinstance(cls, type) and issubclass(cls, MintError) and cls.__module__ == errors.__name__
}


def _raise_error(error: Mapping[str, Any]) -> None:
    cls = _ERRORS.get(str(error.get("kind")), ServiceUnavailable)
    raise cls(str(error.get("message")), param=error.get("param"))


def _stop_process(process: subprocess.Popen[bytes], writer: IO[str] | None, timeout: float) -> None:
    """Ask the child to shut down (EOF on its pipe), then terminate, then kill it."""
    if writer is not None:
        with contextlib.suppress(OSError, ValueError):
            writer.close()
    for stop in (None, process.terminate, process.kill):
        if stop is not None and process.poll() is None:
            stop()
        try:
            process.wait(timeout=timeout)
            return
        except subprocess.TimeoutExpired:
            continue


class VllmEngineProcess:
    """The `Engine` contract on a `VllmEngine` running in a child process, e.g. in the vLLM venv.

    `python` is the interpreter of the venv where vLLM and Mint are installed. The child's
    output (vLLM's logs) goes to this process's stdout and stderr. `close` (or the end of this
    process) shuts the child down. In-memory adapters are written to a temporary PEFT folder
    that the child copies.
    """

    def __init__(
        self,
        model_dir: Path,
        *,
        base_model: str,
        python: str | Path,
        context_length: int | None = None,
        dtype: str = "auto",
        max_adapters: int = DEFAULT_MAX_ADAPTERS,
        max_rank: int = DEFAULT_MAX_RANK,
        max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
        kv_cache_bytes: int | None = None,
        env: Mapping[str, str] | None = None,
        startup_timeout: float = 900.0,
        **engine_args: Any,
    ) -> None:
        self.model_dir = Path(model_dir)
        self._base_model = base_model
        self._max_adapters = max_adapters
        self.max_rank = max_rank
        self.max_batch_size = max_batch_size
        self._tokenizer: Any = None
        config = {
            "model_dir": str(self.model_dir),
            "base_model": base_model,
            "context_length": context_length,
            "dtype": dtype,
            "max_adapters": max_adapters,
            "max_rank": max_rank,
            "max_batch_size": max_batch_size,
            "kv_cache_bytes": kv_cache_bytes,
            **engine_args,
        }
        to_child_read, to_child_write = os.pipe()
        from_child_read, from_child_write = os.pipe()
        try:
            self._process = subprocess.Popen(
                [
                    str(python),
                    "-m",
                    "mint.serving.vllm_process",
                    "--config",
                    json.dumps(config),
                    "--fds",
                    f"{to_child_read},{from_child_write}",
                ],
                pass_fds=(to_child_read, from_child_write),
                env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})},
                stdin=subprocess.DEVNULL,
            )
        except OSError as exc:
            for fd in (to_child_read, to_child_write, from_child_read, from_child_write):
                os.close(fd)
            raise ConfigurationError(f"cannot start the vLLM engine with {python}: {exc}") from exc
        os.close(to_child_read)
        os.close(from_child_write)
        self._writer: IO[str] = os.fdopen(to_child_write, "w", encoding="utf-8")
        self._reader: IO[str] = os.fdopen(from_child_read, "r", encoding="utf-8")
        self._finalizer = weakref.finalize(self, _stop_process, self._process, self._writer, 30.0)
        self._write_lock = threading.Lock()
        self._calls: dict[int, queue.Queue[dict[str, Any] | None]] = {0: queue.Queue()}
        self._calls_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._dead: str | None = None
        threading.Thread(target=self._read, name="vllm-engine-reader", daemon=True).start()
        try:
            ready = self._receive(0, self._calls[0], timeout=startup_timeout)
        except BaseException:
            self._finalizer()
            raise
        self.context_length = int(ready["ok"]["context_length"])
        self.vocab_size = int(ready["ok"]["vocab_size"])
        self.dtype = str(ready["ok"]["dtype"])

    # ---- the pipe ---------------------------------------------------------------------------------

    def _read(self) -> None:
        try:
            for line in self._reader:
                message = json.loads(line)
                with self._calls_lock:
                    mailbox = self._calls.get(message.get("id"))
                if mailbox is not None:
                    mailbox.put(message)
        except (OSError, ValueError):
            pass
        code = self._process.wait()
        self._dead = f"the vLLM engine process exited with code {code}"
        with self._calls_lock:
            for mailbox in self._calls.values():
                mailbox.put(None)

    def _open(self) -> tuple[int, queue.Queue[dict[str, Any] | None]]:
        call_id = next(self._ids)
        mailbox: queue.Queue[dict[str, Any] | None] = queue.Queue()
        with self._calls_lock:
            self._calls[call_id] = mailbox
        return call_id, mailbox

    def _forget(self, call_id: int) -> None:
        with self._calls_lock:
            self._calls.pop(call_id, None)

    def _send(self, message: dict[str, Any]) -> None:
        if self._dead:
            raise ServiceUnavailable(self._dead)
        try:
            with self._write_lock:
                self._writer.write(json.dumps(message) + "\n")
                self._writer.flush()
        except (OSError, ValueError) as exc:
            raise ServiceUnavailable(f"the vLLM engine process does not listen: {exc}") from exc

    def _receive(
        self, call_id: int, mailbox: queue.Queue[dict[str, Any] | None], timeout: float | None = None
    ) -> dict[str, Any]:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._dead and mailbox.empty():
                raise ServiceUnavailable(self._dead)
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                message = mailbox.get(timeout=wait)
            except queue.Empty:
                raise ServiceUnavailable(f"the vLLM engine process did not answer in {timeout:.0f} s") from None
            if message is None:
                raise ServiceUnavailable(self._dead or "the vLLM engine process went away")
            if "error" in message:
                _raise_error(message["error"])
            return message

    def _call(self, op: str, **arguments: Any) -> Any:
        call_id, mailbox = self._open()
        try:
            self._send({"id": call_id, "op": op, **arguments})
            return self._receive(call_id, mailbox)["ok"]
        finally:
            self._forget(call_id)

    @classmethod
    def from_spec(cls, spec: Any, cache_dir: Path, *, python: str | Path, **options: Any) -> VllmEngineProcess:
        """Serve the base named by `spec` (a `BaseModelSpec`) with the vLLM venv of `python`,
        the base pulled into `cache_dir` here if needed (the child only reads it)."""
        from mint.trainer.models import pull_base_model

        options.setdefault("dtype", spec.dtype)
        options.setdefault("context_length", spec.context_length)
        return cls(pull_base_model(spec, cache_dir), base_model=spec.name, python=python, **options)

    def close(self) -> None:
        """Shut the child process (and vLLM's own processes) down."""
        if self._process.poll() is None and not self._dead:
            with contextlib.suppress(MintError):
                self._call("shutdown")
        self._finalizer()

    def __enter__(self) -> VllmEngineProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ---- the Engine contract ------------------------------------------------------------------------

    @property
    def base_model(self) -> str:
        return self._base_model

    @property
    def max_adapters(self) -> int:
        return self._max_adapters

    @property
    def compute_lane(self) -> None:
        """None: vLLM computes in its own processes."""
        return None

    @property
    def tokenizer(self) -> Any:
        """The base's tokenizer, loaded here with transformers from the checkpoint folder."""
        if self._tokenizer is None:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.model_dir, local_files_only=True)
        return self._tokenizer

    def add_adapter(self, adapter_id: str, source: AdapterSource) -> None:
        check_adapter_id(adapter_id)
        if isinstance(source, AdapterTensors):
            with tempfile.TemporaryDirectory(prefix="mint-adapter-") as folder:
                (Path(folder) / ADAPTER_FILES[0]).write_text(json.dumps(dict(source.config)), encoding="utf-8")
                tensor_shapes(source.tensors)
                save_tensors(source.tensors, Path(folder) / ADAPTER_FILES[1])
                self._call("add_adapter", adapter_id=adapter_id, path=folder)
            return
        if not isinstance(source, str | Path):
            raise InvalidRequest("an adapter source is a PEFT folder (Path) or AdapterTensors", param="adapter")
        self._call("add_adapter", adapter_id=adapter_id, path=str(Path(source).absolute()))

    def remove_adapter(self, adapter_id: str) -> None:
        self._call("remove_adapter", adapter_id=adapter_id)

    def adapters(self) -> list[AdapterInfo]:
        return [AdapterInfo.model_validate(item) for item in self._call("adapters")]

    def vllm_lora_ids(self) -> set[int]:
        return set(self._call("vllm_lora_ids"))

    @staticmethod
    def _payload(requests: Sequence[GenerateRequest]) -> list[dict[str, Any]]:
        for index, request in enumerate(requests):
            if not isinstance(request, GenerateRequest):
                raise InvalidRequest(f"request {index} is not a GenerateRequest", param="requests")
        return [request.model_dump(mode="json") for request in requests]

    def generate(self, requests: Sequence[GenerateRequest]) -> list[GenerateResult]:
        results = self._call("generate", requests=self._payload(requests))
        return [GenerateResult.model_validate(item) for item in results]

    def stream(self, requests: Sequence[GenerateRequest]) -> Iterator[StreamEvent]:
        payload = self._payload(requests)
        call_id, mailbox = self._open()
        try:
            self._send({"id": call_id, "op": "stream", "requests": payload})
            self._receive(call_id, mailbox)  # "accepted", or the batch's error raised here
        except BaseException:
            self._forget(call_id)
            raise
        return self._events(call_id, mailbox)

    def _events(self, call_id: int, mailbox: queue.Queue[dict[str, Any] | None]) -> Iterator[StreamEvent]:
        done = False
        try:
            while True:
                try:
                    message = self._receive(call_id, mailbox)
                except MintError:
                    done = True  # the child ended the call with this error: nothing left to cancel
                    raise
                if "event" in message:
                    yield StreamEvent.model_validate(message["event"])
                elif "ok" in message:
                    done = True
                    return
        finally:
            if not done and not self._dead:
                # Closed early: the child aborts the rest and frees the adapters before it answers.
                with contextlib.suppress(MintError):
                    self._send({"id": call_id, "op": "cancel"})
                    while "ok" not in self._receive(call_id, mailbox, timeout=120.0):
                        pass
            self._forget(call_id)

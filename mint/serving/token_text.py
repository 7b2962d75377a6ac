"""Each token's own text and bytes, as OpenAI's logprobs name tokens.

OpenAI gives every token of a logprobs list as `token` (its text) and `bytes` (the exact
UTF-8 bytes it stands for). One token can be part of a character: byte-level BPE splits
multi-byte characters across tokens, so decoding such a token alone gives U+FFFD. `bytes`
must then carry the real bytes, and `token` is their lossy decoding.

For byte-level BPE tokenizers (GPT-2's scheme, which every base of the registry uses: SmolLM2
and the tiny bases on its tokenizer, Qwen3, GLM, DeepSeek, MiniMax, Kimi's converted one) a
token's vocabulary string maps character by character back to bytes through GPT-2's
byte-to-unicode table. Added tokens (`<|im_end|>`, ...) are their own text. Any other
tokenizer falls back to decoding the token alone, which is exact for whole characters.
"""

from __future__ import annotations

import functools
import json
from typing import Any

__all__ = ["TokenText", "byte_decoder"]


@functools.cache
def byte_decoder() -> dict[str, int]:
    """GPT-2's table from the printable character that stands for a byte back to the byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    characters = list(printable)
    shifted = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            characters.append(256 + shifted)
            shifted += 1
    return {chr(character): byte for byte, character in zip(printable, characters, strict=True)}


def _is_byte_level(tokenizer: Any) -> bool:
    """Whether the tokenizer's decoder is ByteLevel (alone, or within a Sequence of decoders)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decoder = getattr(backend, "decoder", None)
    if decoder is None:
        return False
    try:
        state = json.loads(decoder.__getstate__())
    except (AttributeError, TypeError, ValueError):
        return False
    parts = (state.get("decoders") or [state]) if isinstance(state, dict) else []
    return any(isinstance(part, dict) and part.get("type") == "ByteLevel" for part in parts)


class TokenText:
    """A tokenizer's tokens one by one: `bytes_of(id)` exactly, `text_of(id)` as OpenAI's lossy string."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._byte_level = _is_byte_level(tokenizer)
        added = getattr(tokenizer, "added_tokens_decoder", None) or {}
        self._added = {int(token_id): str(token) for token_id, token in added.items()}
        self._bytes: dict[int, bytes] = {}  # at most the vocabulary, filled as tokens are served

    def bytes_of(self, token_id: int) -> bytes:
        """The bytes token `token_id` stands for in a text (special tokens: their own text)."""
        known = self._bytes.get(token_id)
        if known is None:
            known = self._bytes[token_id] = self._bytes_of(token_id)
        return known

    def _bytes_of(self, token_id: int) -> bytes:
        if token_id in self._added:
            return self._added[token_id].encode()
        if self._byte_level:
            piece = self._tokenizer.convert_ids_to_tokens(token_id)
            table = byte_decoder()
            if isinstance(piece, str) and all(character in table for character in piece):
                return bytes(table[character] for character in piece)
        return str(self._tokenizer.decode([token_id])).encode()

    def text_of(self, token_id: int) -> str:
        """The token's text; U+FFFD for bytes that are part of a character, as OpenAI gives it."""
        return self.bytes_of(token_id).decode("utf-8", errors="replace")

    def entry(self, token_id: int, logprob: float) -> dict[str, Any]:
        """OpenAI's `{"token", "logprob", "bytes"}` of one token."""
        return {"token": self.text_of(token_id), "logprob": logprob, "bytes": list(self.bytes_of(token_id))}

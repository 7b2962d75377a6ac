"""Sampling with a KV cache: many requests, each with its own prompt, parameters and number
of samples, decoded together as one batch.

Prompts of different lengths are left-padded to one width and run in one prefill; an attention
mask hides the padding and position ids count each row's own tokens, so a row sees exactly
what it would see alone. Each request's prompt is run once and its cache row repeated for each
of its samples. Every live row then decodes in lockstep, one token per step. A request whose
rows are all done (or that reached its own token limit) leaves the batch, its rows dropped from
the cache; a finished row of a request still decoding keeps decoding (its tokens are dropped),
so a request draws from its own generator exactly as it would alone: a request's samples do
not depend on what else is in the batch, up to float rounding.

Each chosen token's logprob is taken from the model's own distribution at temperature 1 with
`head_logprobs.token_logprobs`, the function `forward` uses, so sampled logprobs equal the logprobs
a later `forward` computes for the same tokens (up to float32 rounding). Each token's logprob
under the distribution it was actually drawn from (temperature, top-k, top-p applied) is kept
too, as `sampler_logprobs`: the stability info `stable_reinforce` weighs against. A request that
asks for `top_logprobs` k also gets, at each position, the k most likely tokens under the same
temperature-1 distribution (`head_logprobs.top_logprobs`), computed for its rows only.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import nn

from mint.errors import InvalidRequest
from mint.trainer.fused_decoder import FusedDecoder
from mint.trainer.head_logprobs import last_position_only, token_logprobs, top_logprobs
from mint.trainer.kv_cache import reserve
from mint.trainer.prompt_cache import CachedPrompts, Spliced
from mint.trainer.types import SampledSequence, SampleRequest, SamplingParams

MAX_SAMPLES_PER_REQUEST = 256
# The most (token, logprob) entries one request's top-k sample logprobs may hold (k x samples x
# tokens): they are built as Python lists and stored with the result.
MAX_TOP_LOGPROB_CELLS = 2_000_000
# Extra tokens decoded before a stop string's span, so that a multi-byte character cut at the
# tail's start cannot hide a match.
_TAIL_MARGIN_TOKENS = 8
# Any id will do under the padding: the attention mask hides it from every real token.
_PAD_TOKEN_ID = 0


@dataclasses.dataclass(frozen=True)
class StopRule:
    """When a row is done: on one of `token_ids`, or when its decoded text contains one of `strings`."""

    token_ids: frozenset[int]
    strings: tuple[str, ...]

    @classmethod
    def from_params(cls, stop: Sequence[int] | Sequence[str] | None, eos_token_ids: Sequence[int]) -> StopRule:
        if stop is None:
            return cls(frozenset(eos_token_ids), ())
        return cls(
            frozenset(item for item in stop if isinstance(item, int)),
            tuple(item for item in stop if isinstance(item, str)),
        )

    def matches_text(self, tokens: list[int], decode: Callable[[list[int]], str]) -> bool:
        """Whether the text of `tokens` now contains a stop string.

        Checked after every token, so a new match ends at the newest token: decoding a tail a
        few tokens longer than the longest stop string (a token is at least one character)
        is enough, and keeps the check linear in the sequence length.
        """
        if not self.strings:
            return False
        tail = tokens[-(max(len(s) for s in self.strings) + _TAIL_MARGIN_TOKENS) :]
        text = decode(tail)
        return any(s in text for s in self.strings)


def end_of_sequence_ids(tokenizer: Any, model: nn.Module) -> tuple[int, ...]:
    """The tokens that end a sequence by default: the tokenizer's EOS and the generation config's."""
    ids: set[int] = set()
    generation_config = getattr(model, "generation_config", None)
    for value in (tokenizer.eos_token_id, getattr(generation_config, "eos_token_id", None)):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list | tuple):
            ids.update(int(item) for item in value)
    return tuple(sorted(ids))


def _generator(seed: int | None, device: torch.device) -> torch.Generator:
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()  # a fresh non-deterministic seed; a fixed default would repeat samples
    else:
        generator.manual_seed(seed)
    return generator


def draw(
    logits_B_V: torch.Tensor, params: SamplingParams, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row under temperature, top-k and top-p (nucleus); greedy at
    temperature 0. Returns the tokens and each one's logprob under the distribution it was
    drawn from (0 when greedy): what `record_stability_info` records for `stable_reinforce`."""
    logits_B_V = logits_B_V.float()
    if params.temperature == 0.0:
        return logits_B_V.argmax(dim=-1), logits_B_V.new_zeros(logits_B_V.shape[0])
    scaled_B_V = logits_B_V / params.temperature if params.temperature != 1.0 else logits_B_V
    if params.top_k != -1 and params.top_k < scaled_B_V.shape[-1]:
        kth_B_1 = scaled_B_V.topk(params.top_k, dim=-1).values[:, -1:]
        scaled_B_V = scaled_B_V.masked_fill(scaled_B_V < kth_B_1, float("-inf"))
    if params.top_p < 1.0:
        sorted_B_V, order_B_V = scaled_B_V.sort(dim=-1, descending=True)
        cumulative_B_V = sorted_B_V.softmax(dim=-1).cumsum(dim=-1)
        # Drop a token when the tokens before it already reach top_p; the first always stays.
        drop_sorted_B_V = (cumulative_B_V - sorted_B_V.softmax(dim=-1)) >= params.top_p
        drop_B_V = torch.zeros_like(drop_sorted_B_V).scatter(-1, order_B_V, drop_sorted_B_V)
        scaled_B_V = scaled_B_V.masked_fill(drop_B_V, float("-inf"))
    chosen_B = _inverse_cdf(scaled_B_V.softmax(dim=-1), generator)
    return chosen_B, scaled_B_V.log_softmax(dim=-1).gather(-1, chosen_B.unsqueeze(-1)).squeeze(-1)


def _inverse_cdf(probs_B_V: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One token per row, drawn from `probs_B_V` by one uniform number per row: the first token
    whose cumulative probability exceeds it. The same distribution as `torch.multinomial`, about
    fifty times faster on a CPU at a vocabulary of 49k (0.07 ms against 3.3 ms for 4 rows, a
    tenth of an RL step's decoding). A token of probability 0 is never drawn: its cumulative
    probability equals its predecessor's. Rounding may put the number at the very top, past every
    cumulative value; the row's last token of positive probability is then the one drawn."""
    cdf_B_V = probs_B_V.cumsum(dim=-1)
    uniform_B_1 = torch.rand((probs_B_V.shape[0], 1), generator=generator, device=probs_B_V.device)
    chosen_B = torch.searchsorted(cdf_B_V, uniform_B_1 * cdf_B_V[:, -1:], right=True).squeeze(-1)
    # Below the top, the first cumulative value past the number rises there: a token of positive
    # probability. Only a number at the top (past the end) needs the last positive token.
    vocab = probs_B_V.shape[-1]
    if bool((chosen_B >= vocab).any()):
        last_positive_B = vocab - 1 - (probs_B_V > 0).flip(-1).int().argmax(dim=-1)
        chosen_B = torch.minimum(chosen_B, last_positive_B)
    return chosen_B


def choose_tokens(logits_B_V: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> torch.Tensor:
    """Draw one token per row under temperature, top-k and top-p (nucleus); greedy at temperature 0."""
    return draw(logits_B_V, params, generator)[0]


@dataclasses.dataclass(frozen=True)
class Decoding:
    """A request as the decoder runs it: how many tokens each of its rows may add, and when a row is done."""

    request: SampleRequest
    max_new_tokens: int
    stop: StopRule

    @classmethod
    def of(cls, request: SampleRequest, room: int, eos_token_ids: Sequence[int]) -> Decoding:
        """The request as the decoder runs it, with `room` tokens left in the context after its
        prompt: InvalidRequest if its number of samples or its top-k logprobs are out of bounds."""
        if not 1 <= request.num_samples <= MAX_SAMPLES_PER_REQUEST:
            raise InvalidRequest(f"num_samples must be 1 to {MAX_SAMPLES_PER_REQUEST}", param="num_samples")
        params = request.params
        max_new_tokens = min(params.max_tokens or room, room)
        cells = request.top_logprobs * request.num_samples * max_new_tokens
        if request.top_logprobs < 0 or cells > MAX_TOP_LOGPROB_CELLS:
            raise InvalidRequest(
                f"top-k sample logprobs of k={request.top_logprobs} for {request.num_samples} samples of up to "
                f"{max_new_tokens} tokens are {cells} entries, more than {MAX_TOP_LOGPROB_CELLS}; lower k, "
                "max_tokens or num_samples",
                param="topk_sample_logprobs",
            )
        return cls(request, max_new_tokens=max_new_tokens, stop=StopRule.from_params(params.stop, eos_token_ids))

    def seeded(self) -> Decoding:
        """This decoding with a seed drawn now if it had none: the same draws wherever it runs
        (every rank of a worker group decodes the same tokens)."""
        if self.request.params.seed is not None:
            return self
        params = self.request.params.model_copy(update={"seed": secrets.randbits(63)})
        return dataclasses.replace(self, request=dataclasses.replace(self.request, params=params))


def decoding_chunks(decodings: Sequence[Decoding], max_rows: int) -> Iterator[list[Decoding]]:
    """Consecutive requests in groups of at most `max_rows` samples (a larger request alone)."""
    chunk: list[Decoding] = []
    rows = 0
    for decoding in decodings:
        if chunk and rows + decoding.request.num_samples > max_rows:
            yield chunk
            chunk, rows = [], 0
        chunk.append(decoding)
        rows += decoding.request.num_samples
    if chunk:
        yield chunk


class _Request:
    """The rows of one request while they decode: its generator and each row's tokens so far."""

    def __init__(self, decoding: Decoding, device: torch.device) -> None:
        self.decoding = decoding
        self.params = decoding.request.params
        self.prompt = decoding.request.prompt_tokens
        self.num_rows = decoding.request.num_samples
        self.generator = _generator(self.params.seed, device)
        self.tokens: list[list[int]] = [[] for _ in range(self.num_rows)]
        self.logprobs: list[list[float]] = [[] for _ in range(self.num_rows)]
        self.sampler_logprobs: list[list[float]] = [[] for _ in range(self.num_rows)]
        self.top_k = decoding.request.top_logprobs
        self.top: list[list[list[tuple[int, float]]]] = [[] for _ in range(self.num_rows)]
        self.done = [False] * self.num_rows
        self.stopped = [False] * self.num_rows
        self.cached_tokens = 0  # prompt tokens read from the prompt cache

    def add(
        self,
        tokens: list[int],
        logprobs: list[float],
        drawn: list[float],
        decode: Callable[[list[int]], str],
        top: list[list[tuple[int, float]]] | None = None,
    ) -> None:
        """Append one step's token (and, if asked, its position's top tokens) to each row that is
        not done yet."""
        stop = self.decoding.stop
        for row, (token, logprob, drawn_logprob) in enumerate(zip(tokens, logprobs, drawn, strict=True)):
            if self.done[row]:
                continue
            self.tokens[row].append(token)
            self.logprobs[row].append(logprob)
            self.sampler_logprobs[row].append(drawn_logprob)
            if top is not None:
                self.top[row].append(top[row])
            if token in stop.token_ids or stop.matches_text(self.tokens[row], decode):
                self.done[row] = self.stopped[row] = True

    def finished(self, step: int) -> bool:
        """Whether the request is over after 0-based `step`: every row done, or its token limit reached."""
        return all(self.done) or step + 1 >= self.decoding.max_new_tokens

    def sequences(self) -> list[SampledSequence]:
        return [
            SampledSequence(
                tokens=tokens,
                logprobs=logprobs,
                sampler_logprobs=drawn,
                top_logprobs=top if self.top_k else None,
                stop_reason="stop" if stopped else "length",
                prompt_cache_hit_tokens=self.cached_tokens,
            )
            for tokens, logprobs, drawn, top, stopped in zip(
                self.tokens, self.logprobs, self.sampler_logprobs, self.top, self.stopped, strict=True
            )
        ]

    def top_of(self, logits_R_V: torch.Tensor) -> list[list[tuple[int, float]]] | None:
        """Each of this request's rows' top tokens at this step, if it asked for them."""
        if not self.top_k:
            return None
        ids_R_K, logprobs_R_K = top_logprobs(logits_R_V, self.top_k)
        return [
            list(zip(ids, lps, strict=True)) for ids, lps in zip(ids_R_K.tolist(), logprobs_R_K.tolist(), strict=True)
        ]


# Given the live requests (their indices in the batch) and how many rows each has in the next
# forward, the context that forward runs in: e.g. each request's rows through its own adapter.
RowsContext = Callable[[list[tuple[int, int]]], AbstractContextManager[Any]]


def _no_context(rows: list[tuple[int, int]]) -> AbstractContextManager[Any]:
    return nullcontext()


def _prefill(
    model: nn.Module,
    requests: Sequence[_Request],
    device: torch.device,
    rows_context: RowsContext,
    prompts: CachedPrompts | None,
) -> tuple[Any, torch.Tensor, torch.Tensor]:
    """Run every prompt once, left-padded to one width, each from its cached prefix if
    `prompts` holds one (`prompt_cache.Spliced`); returns the cache, attention mask and last
    logits, each repeated so that every sample of a request has its own row (B rows). Each
    prompt's new whole blocks go into the prompt cache."""
    hits = [None] * len(requests) if prompts is None else prompts.lookup([request.prompt for request in requests])
    spliced = Spliced.of([request.prompt for request in requests], hits, _PAD_TOKEN_ID, device)
    for request, cached in zip(requests, spliced.cached, strict=True):
        request.cached_tokens = cached
    # Only the last position's logits are needed (every prompt ends there).
    with rows_context([(index, 1) for index in range(len(requests))]):
        output = model(
            input_ids=spliced.input_ids,
            attention_mask=spliced.mask,
            position_ids=spliced.position_ids,
            cache=spliced.past_cache(),
            use_cache=True,
            logits_to_keep=last_position_only(spliced.input_ids),
        )
    cache = output.cache
    if prompts is not None:
        prompts.store([request.prompt for request in requests], spliced, cache)
    request_of_row_B = torch.repeat_interleave(
        torch.arange(len(requests), device=device),
        torch.tensor([request.num_rows for request in requests], device=device),
    )
    cache.batch_select_indices(request_of_row_B)
    return cache, spliced.mask[request_of_row_B], output.logits[:, -1][request_of_row_B]


def generate_batch(
    model: nn.Module,
    decodings: Sequence[Decoding],
    *,
    decode: Callable[[list[int]], str],
    rows_context: RowsContext = _no_context,
    prompts: CachedPrompts | None = None,
    fused: FusedDecoder | None = None,
) -> list[list[SampledSequence]]:
    """Sample every request's `num_samples` continuations in one batch; one list per request, in
    order. Each forward runs in `rows_context(live requests and their rows)`: how requests of
    several adapters decode together (`ResidentBase.sample_many`). With `prompts`, each prompt
    starts from its longest cached prefix under its request's weights, and its samples report
    how many tokens that was (`prompt_cache_hit_tokens`). With `fused` (built for the same
    requests' owners), the decode steps after the prefill run through it instead of the model's
    forward."""
    if not decodings:
        return []
    device = model.get_input_embeddings().weight.device
    requests = [_Request(decoding, device) for decoding in decodings]
    order = {id(request): index for index, request in enumerate(requests)}
    cache, prompt_mask_B_T, logits_B_V = _prefill(model, requests, device, rows_context, prompts)
    steps = max(decoding.max_new_tokens for decoding in decodings)
    # Room for every step's keys and values, and the whole decode's mask, made once: a step
    # writes into the cache and reads the first columns of the mask.
    reserve(cache, steps)
    if fused is not None and not fused.fits(cache):
        fused = None
    prompt_width = prompt_mask_B_T.shape[1]
    mask_B_W = torch.cat([prompt_mask_B_T, prompt_mask_B_T.new_ones((prompt_mask_B_T.shape[0], steps))], dim=1)
    prompt_lengths_B = torch.tensor(
        [len(request.prompt) for request in requests for _ in range(request.num_rows)], dtype=torch.long, device=device
    )
    live = list(requests)  # the requests still decoding; their rows lie in this order, contiguous
    for step in range(steps):
        chosen, drawn = [], []
        start = 0
        for request in live:
            rows = slice(start, start + request.num_rows)
            # Each request draws from its own generator, so its samples do not depend on its neighbours.
            chosen_n, drawn_n = draw(logits_B_V[rows], request.params, request.generator)
            chosen.append(chosen_n)
            drawn.append(drawn_n)
            start += request.num_rows
        next_B = torch.cat(chosen)
        next_logprobs_B = token_logprobs(logits_B_V, next_B)
        tokens, logprobs, drawn_logprobs = next_B.tolist(), next_logprobs_B.tolist(), torch.cat(drawn).tolist()
        start, kept_rows, kept = 0, [], []
        for request in live:
            rows = slice(start, start + request.num_rows)
            request.add(tokens[rows], logprobs[rows], drawn_logprobs[rows], decode, request.top_of(logits_B_V[rows]))
            if not request.finished(step):
                kept.append(request)
                kept_rows += range(rows.start, rows.stop)
            start += request.num_rows
        if not kept:
            break
        if len(kept) < len(live):
            # Finished requests leave: their rows go from the cache, the mask and the next input.
            index_B = torch.tensor(kept_rows, dtype=torch.long, device=device)
            cache.batch_select_indices(index_B)
            mask_B_W, prompt_lengths_B, next_B = mask_B_W[index_B], prompt_lengths_B[index_B], next_B[index_B]
            live = kept
        rows = [(order[id(request)], request.num_rows) for request in live]
        step_mask_B_W = mask_B_W[:, : prompt_width + step + 1]
        if fused is not None:
            logits_B_V = fused.step(rows, next_B, step_mask_B_W, prompt_lengths_B + step, cache)
            continue
        with rows_context(rows):
            output = model(
                input_ids=next_B.unsqueeze(-1),
                attention_mask=step_mask_B_W,
                position_ids=(prompt_lengths_B + step).unsqueeze(-1),
                cache=cache,
                use_cache=True,
            )
        cache = output.cache
        logits_B_V = output.logits[:, -1]
    return [request.sequences() for request in requests]


def generate(
    model: nn.Module,
    prompt_tokens: Sequence[int],
    params: SamplingParams,
    num_samples: int,
    *,
    max_new_tokens: int,
    stop: StopRule,
    decode: Callable[[list[int]], str],
) -> list[SampledSequence]:
    """Sample `num_samples` continuations of `prompt_tokens` (at most `max_new_tokens` each):
    `generate_batch` with one request."""
    decoding = Decoding(SampleRequest(prompt_tokens, params, num_samples), max_new_tokens, stop)
    return generate_batch(model, [decoding], decode=decode)[0]

"""Protocol Buffers codec of the Tinker-compatible routes (package `tinker_public`): the
forward/backward request and the results of forward, forward_backward and sample.

These few messages are read and written directly in the protobuf wire format, so the API needs
neither the SDK nor the `protobuf` package. Field numbers are the protocol's. Every length and
count is checked against `BatchLimits` before anything is allocated for it.

No torch, no SQLAlchemy: the API process imports this module.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

from mint.config import Settings
from mint.errors import InvalidRequest, PayloadTooLarge
from mint.schemas.tinker import SDK_MAX_CHUNK_BYTES, SDK_MAX_CHUNK_DATA, csr_problem, csr_rows

# ---- protobuf wire format ---------------------------------------------------------------------
# Wire types: 0 varint, 1 fixed 64-bit, 2 length-delimited, 5 fixed 32-bit.
_VARINT, _FIXED64, _LEN, _FIXED32 = 0, 1, 2, 5
DTYPE_FLOAT32, DTYPE_INT64, DTYPE_INT32, DTYPE_BFLOAT16 = 1, 2, 3, 4
STOP_REASONS = {"stop": 0, "length": 1}
PROTOBUF_MEDIA_TYPE = "application/x-protobuf"


# What one datum or request may hold beyond the limits that are settings: Mint's losses read
# two or three 1-D inputs, and loss_fn_config holds a few numbers.
MAX_LOSS_INPUTS = 32
MAX_LOSS_CONFIG_ENTRIES = 64
MAX_TENSOR_DIMS = 8


def _bad(message: str) -> InvalidRequest:
    return InvalidRequest(f"malformed protobuf body: {message}", param="body")


def _text(value: memoryview, field_name: str) -> str:
    """A protobuf `string` field: UTF-8, as the protobuf spec requires."""
    try:
        return str(value, "utf-8")
    except UnicodeDecodeError:
        raise InvalidRequest(
            f"malformed protobuf body: {field_name} is not valid UTF-8; protobuf strings must be UTF-8 text",
            param=field_name,
        ) from None


def _read_varint(buffer: memoryview, position: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if position >= len(buffer):
            raise _bad("truncated varint")
        byte = buffer[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, position
        shift += 7
        if shift > 63:
            raise _bad("varint longer than 10 bytes")


def _fields(buffer: memoryview) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value) for each field of one message: ints for varint fields,
    views of the buffer (never copies) for fixed and length-delimited ones."""
    position = 0
    while position < len(buffer):
        key, position = _read_varint(buffer, position)
        number, wire = key >> 3, key & 7
        value: int | memoryview
        if wire == _VARINT:
            value, position = _read_varint(buffer, position)
        elif wire == _FIXED64:
            value, position = buffer[position : position + 8], position + 8
        elif wire == _FIXED32:
            value, position = buffer[position : position + 4], position + 4
        elif wire == _LEN:
            size, position = _read_varint(buffer, position)
            value, position = buffer[position : position + size], position + size
        else:
            raise _bad(f"unsupported wire type {wire}")
        if position > len(buffer):
            raise _bad("truncated field")
        yield number, wire, value


def _signed64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int64s are ten-byte two's complement, as protobuf writes them
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _tag(number: int, wire: int) -> bytes:
    return _varint(number << 3 | wire)


def _len_field(number: int, payload: bytes) -> bytes:
    return _tag(number, _LEN) + _varint(len(payload)) + payload


def _varint_field(number: int, value: int) -> bytes:
    return _tag(number, _VARINT) + _varint(value) if value else b""


def _string_field(number: int, value: str) -> bytes:
    return _len_field(number, value.encode()) if value else b""


def _packed(fmt: str, values: Sequence[float] | Sequence[int]) -> bytes:
    return struct.pack(f"<{len(values)}{fmt}", *values)


def _count(fmt: str, data: memoryview) -> int:
    """How many values of `fmt` a packed array holds, read from its length alone."""
    size = struct.calcsize(fmt)
    if len(data) % size:
        raise _bad(f"a tensor of {len(data)} bytes is not a whole number of {size}-byte values")
    return len(data) // size


class Chunking(TypedDict):
    """How the SDK splits a forward_backward batch into requests (ClientConfigResponse's fields)."""

    fwdbwd_max_chunk_len: int
    fwdbwd_max_chunk_bytes_count: int


@dataclass(frozen=True)
class BatchLimits:
    """What one forward_backward request may hold (settings `tinker_max_*`).

    Decoding turns each packed 4-byte value into a Python int or float of about 36 bytes, and
    each datum into a few objects, so these are checked against the lengths the body declares
    before anything is unpacked: a refused request costs its body and nothing more.
    """

    max_data: int
    max_numbers: int
    max_datum_tokens: int

    @classmethod
    def from_settings(cls, settings: Settings) -> BatchLimits:
        return cls(settings.tinker_max_batch_data, settings.tinker_max_batch_numbers, settings.tinker_max_datum_tokens)

    def chunking(self) -> Chunking:
        """The split the SDK should use so that its requests stay within these limits: its
        estimate counts at least 4 bytes per value, so chunks of `4 * max_numbers` estimated
        bytes hold at most `max_numbers` values (a datum over the estimate travels alone)."""
        return {
            "fwdbwd_max_chunk_len": min(SDK_MAX_CHUNK_DATA, self.max_data),
            "fwdbwd_max_chunk_bytes_count": min(SDK_MAX_CHUNK_BYTES, 4 * self.max_numbers),
        }


class _Budget:
    """Counts what a request's decoding produces, refusing it (413) past its limits. A dry
    budget unpacks nothing: the first pass over a body measures it from its declared lengths."""

    def __init__(self, limits: BatchLimits, *, dry: bool) -> None:
        self.limits = limits
        self.dry = dry
        self.data = 0
        self.numbers = 0

    def unpack(self, fmt: str, data: memoryview) -> list[Any]:
        """The values of a packed array, counted first; none on a dry run."""
        count = _count(fmt, data)
        self.add_numbers(count)
        return [] if self.dry else list(struct.unpack(f"<{count}{fmt}", data))

    def add_datum(self) -> int:
        """The new datum's index."""
        if self.data >= self.limits.max_data:
            raise _too_large(
                f"more than {self.limits.max_data} data",
                "MINT_TINKER_MAX_BATCH_DATA",
                "send fewer sequences per request",
            )
        self.data += 1
        return self.data - 1

    def add_numbers(self, count: int) -> None:
        self.numbers += count
        if self.numbers > self.limits.max_numbers:
            raise _too_large(
                f"more than {self.limits.max_numbers} tokens and loss-input values in all",
                "MINT_TINKER_MAX_BATCH_NUMBERS",
                "send the batch in smaller requests",
            )

    def check_datum_tokens(self, index: int, tokens: int) -> None:
        if tokens > self.limits.max_datum_tokens:
            raise _too_large(
                f"data[{index}] with {tokens} tokens, over {self.limits.max_datum_tokens} per datum",
                "MINT_TINKER_MAX_DATUM_TOKENS",
                "shorten the sequence",
            )


def _too_large(what: str, setting: str, fix: str) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"the forward_backward request holds {what} (the server's limit, {setting}); {fix}. The tinker "
        "SDK splits batches by the sizes that /api/v1/client/config announces",
        param="data",
    )


@dataclass(frozen=True)
class WireTensor:
    """A decoded `Tensor`: its dtype code, shape and flat values (dense only)."""

    dtype: int
    shape: tuple[int, ...]
    values: list[float] | list[int]


@dataclass(frozen=True)
class WireSpan:
    """A decoded provenance run: `length` positions that are positions [offset, offset+length)
    of the named sampled sequence's prompt (`kind` "prompt") or of its sampled tokens ("sampled")."""

    kind: Literal["prompt", "sampled"]
    sequence_id: str
    offset: int
    length: int


@dataclass(frozen=True)
class WireDatum:
    """A decoded `Datum`: its input tokens, loss inputs by name, and provenance (the runs tiling
    `model_input` and `target_tokens`; None when the datum has none)."""

    tokens: list[int]
    loss_fn_inputs: dict[str, WireTensor]
    input_spans: list[WireSpan] | None = None
    target_spans: list[WireSpan] | None = None


@dataclass(frozen=True)
class ForwardBackwardProto:
    """A decoded `ForwardBackwardRequest`."""

    model_id: str
    seq_id: int
    loss_fn: str
    loss_fn_config: dict[str, float | str]
    forward_only: bool
    data: list[WireDatum] = field(default_factory=list)


def _decode_tensor(buffer: memoryview, name: str, budget: _Budget) -> WireTensor:
    dtype, shape, dense, csr = 0, [], memoryview(b""), None
    for number, wire, value in _fields(buffer):
        if number == 1 and wire == _LEN:
            dense = value
        elif number == 2 and wire == _LEN:
            csr = value
        elif number == 3 and wire == _VARINT:
            dtype = value
        elif number == 4:
            if wire == _LEN:  # packed repeated int64
                position = 0
                while position < len(value):
                    item, position = _read_varint(value, position)
                    shape.append(_signed64(item))
            else:
                shape.append(_signed64(value))
            if len(shape) > MAX_TENSOR_DIMS:
                raise InvalidRequest(
                    f"loss_fn_inputs[{name!r}] has more than {MAX_TENSOR_DIMS} dimensions; Mint's losses take "
                    "one value per position (1-D)",
                    param="loss_fn_inputs",
                )
    formats = {DTYPE_FLOAT32: "f", DTYPE_INT64: "q", DTYPE_INT32: "i"}
    if dtype not in formats:
        raise InvalidRequest(
            f"loss_fn_inputs[{name!r}] has dtype code {dtype}; send float32 or int64", param="loss_fn_inputs"
        )
    if csr is not None:
        return _decode_csr(csr, name, dtype, formats[dtype], shape, budget)
    count = _count(formats[dtype], dense)
    if shape and (min(shape) < 0 or math.prod(shape) != count):
        raise InvalidRequest(
            f"loss_fn_inputs[{name!r}] has shape {shape[:8]} but {count} values; the shape's dimensions "
            "must be non-negative and multiply to the number of values",
            param="loss_fn_inputs",
        )
    values = budget.unpack(formats[dtype], dense)
    return WireTensor(dtype=dtype, shape=tuple(shape) or (count,), values=values)


def _decode_csr(buffer: memoryview, name: str, dtype: int, fmt: str, shape: list[int], budget: _Budget) -> WireTensor:
    """A sparse CSR `Tensor`, densified with 0 at every entry it leaves out: what the SDK sends
    for a 2-D `target_tokens` or `weights` that is mostly zeros (the (N, K) gradient weights of
    `forward_backward_custom`, say). Counted at its dense size, the table it becomes."""
    values, crow_bytes, col_bytes = memoryview(b""), memoryview(b""), memoryview(b"")
    for number, wire, value in _fields(buffer):
        if wire == _LEN and number == 1:
            values = value
        elif wire == _LEN and number == 2:
            crow_bytes = value
        elif wire == _LEN and number == 3:
            col_bytes = value

    def bad(why: str) -> InvalidRequest:
        return InvalidRequest(f"loss_fn_inputs[{name!r}] is a sparse CSR tensor {why}", param="loss_fn_inputs")

    if len(shape) != 2 or min(shape) < 0:
        raise bad(f"of shape {shape[:8]}; a sparse tensor must be 2-D")
    rows, cols = shape
    count = _count(fmt, values)
    if _count("q", crow_bytes) != rows + 1 or _count("q", col_bytes) != count:
        raise bad(f"with {count} values; it needs {rows + 1} row pointers and one column index per value")
    budget.add_numbers(rows * cols)
    if budget.dry:
        return WireTensor(dtype=dtype, shape=(rows, cols), values=[])
    crow = struct.unpack(f"<{rows + 1}q", crow_bytes)
    col = struct.unpack(f"<{count}q", col_bytes)
    problem = csr_problem(rows, cols, count, crow, col)
    if problem is not None:
        raise bad(f"whose layout is wrong: {problem}")
    listed = struct.unpack(f"<{count}{fmt}", values)
    flat = [value for row in csr_rows(rows, cols, listed, crow, col, fill=0.0 if fmt == "f" else 0) for value in row]
    return WireTensor(dtype=dtype, shape=(rows, cols), values=flat)


def _decode_span(buffer: memoryview) -> WireSpan:
    for number, wire, value in _fields(buffer):
        if number in (1, 2) and wire == _LEN:  # oneof: prompt_tokens | sampled_tokens
            sequence_id, offset, length = "", 0, 0
            for span_number, span_wire, span_value in _fields(value):
                if span_number == 1 and span_wire == _LEN:
                    sequence_id = _text(span_value, "provenance sequence_id")
                elif span_number == 2 and span_wire == _VARINT:
                    offset = _signed64(span_value)
                elif span_number == 3 and span_wire == _VARINT:
                    length = _signed64(span_value)
            if not sequence_id or offset < 0 or length < 0:
                raise _bad("a provenance span needs a sequence_id, offset >= 0 and length >= 0")
            return WireSpan("prompt" if number == 1 else "sampled", sequence_id, offset, length)
    raise _bad("a provenance span is neither a prompt nor a sampled run")


def _decode_datum(buffer: memoryview, budget: _Budget) -> WireDatum:
    index = budget.add_datum()
    tokens: list[int] = []
    token_count = 0
    inputs: dict[str, WireTensor] = {}
    spans: dict[int, list[WireSpan]] = {}
    for number, wire, value in _fields(buffer):
        if number == 1 and wire == _LEN:  # Chunk
            for chunk_number, chunk_wire, chunk in _fields(value):
                if chunk_number == 1 and chunk_wire == _LEN:  # EncodedTextChunk
                    for token_number, token_wire, packed in _fields(chunk):
                        if token_number == 1 and token_wire == _LEN:
                            token_count += _count("i", packed)
                            budget.check_datum_tokens(index, token_count)
                            tokens.extend(budget.unpack("i", packed))
                else:
                    raise InvalidRequest(
                        "model_input holds image or audio chunks: Mint's bases take text tokens only",
                        param="model_input",
                    )
        elif number == 2 and wire == _LEN:  # map<string, Tensor> entry
            key, tensor = "", memoryview(b"")
            for entry_number, _, entry_value in _fields(value):
                if entry_number == 1:
                    key = _text(entry_value, "data.loss_fn_inputs")
                elif entry_number == 2:
                    tensor = entry_value
            if key not in inputs and len(inputs) >= MAX_LOSS_INPUTS:
                raise InvalidRequest(
                    f"data[{index}] has more than {MAX_LOSS_INPUTS} loss_fn_inputs; Mint's losses read a few",
                    param="loss_fn_inputs",
                )
            inputs[key] = _decode_tensor(tensor, key, budget)
        elif number in (3, 4) and wire == _LEN:  # provenance: model_input_spans, loss_fn_input_spans
            spans.setdefault(number, []).append(_decode_span(value))
    return WireDatum(tokens=tokens, loss_fn_inputs=inputs, input_spans=spans.get(3), target_spans=spans.get(4))


def decode_forward_backward_request(body: bytes, limits: BatchLimits) -> ForwardBackwardProto:
    """Read a `tinker_public.ForwardBackwardRequest`; raises InvalidRequest on a malformed body
    and PayloadTooLarge on one that holds more than `limits` allow.

    The body is read twice: a dry pass checks the limits from the lengths the body declares,
    so a refused request costs no decoding, then the real pass unpacks the values.
    """
    _decode_forward_backward(memoryview(body), _Budget(limits, dry=True))
    return _decode_forward_backward(memoryview(body), _Budget(limits, dry=False))


def _decode_forward_backward(body: memoryview, budget: _Budget) -> ForwardBackwardProto:
    model_id, seq_id, loss_fn, forward_only = "", 0, "", False
    config: dict[str, float | str] = {}
    config_v2: dict[str, float | str] = {}
    data: list[WireDatum] = []
    for number, wire, value in _fields(body):
        if number == 1 and wire == _LEN:
            model_id = _text(value, "model_id")
        elif number == 2 and wire == _VARINT:
            seq_id = _signed64(value)
        elif number == 3 and wire == _LEN:
            data.append(_decode_datum(value, budget))
        elif number == 4 and wire == _LEN:
            loss_fn = _text(value, "loss_fn")
        elif number == 5 and wire == _LEN:  # map<string, double>
            key, number_value = "", 0.0
            for entry_number, entry_wire, entry_value in _fields(value):
                if entry_number == 1:
                    key = _text(entry_value, "loss_fn_config")
                elif entry_number == 2 and entry_wire == _FIXED64:
                    number_value = struct.unpack("<d", entry_value)[0]
            config[key] = number_value
            _check_config_size(config)
        elif number == 6 and wire == _VARINT:
            forward_only = bool(value)
        elif number == 7 and wire == _LEN:  # map<string, LossConfigValue>
            key, item = "", memoryview(b"")
            for entry_number, _, entry_value in _fields(value):
                if entry_number == 1:
                    key = _text(entry_value, "loss_fn_config_v2")
                elif entry_number == 2:
                    item = entry_value
            for item_number, item_wire, item_value in _fields(item):
                if item_number == 1 and item_wire == _FIXED64:
                    config_v2[key] = struct.unpack("<d", item_value)[0]
                elif item_number == 2 and item_wire == _LEN:
                    config_v2[key] = _text(item_value, "loss_fn_config_v2")
            _check_config_size(config_v2)
    if not model_id:
        raise _bad("model_id is missing")
    if not 1 <= seq_id < 2**31:  # int32 on the wire; the model's creation took 0
        raise InvalidRequest(f"seq_id must be 1 to {2**31 - 1}, got {seq_id}", param="seq_id")
    # Newer clients write both maps; v2 wins where it is set, as the protocol says.
    return ForwardBackwardProto(
        model_id=model_id,
        seq_id=seq_id,
        loss_fn=loss_fn,
        loss_fn_config={**config, **config_v2},
        forward_only=forward_only,
        data=data,
    )


def _check_config_size(config: dict[str, float | str]) -> None:
    if len(config) > MAX_LOSS_CONFIG_ENTRIES:
        raise InvalidRequest(
            f"loss_fn_config has more than {MAX_LOSS_CONFIG_ENTRIES} entries; Mint's losses read a few",
            param="loss_fn_config",
        )


def encode_forward_backward_output(logprobs: Sequence[Sequence[Any]], metrics: dict[str, float]) -> bytes:
    """A `ForwardBackwardOutput` holding each datum's `logprobs` (float32): one `ArrayRecord` per
    run of consecutive data of the same trailing shape, () for (N,) logprobs and (K,) for data
    scored against (N, K) targets, as the SDK reassembles ragged outputs."""
    out = b""
    runs: list[tuple[tuple[int, ...], list[Sequence[Any]]]] = []
    for row in logprobs:
        trailing: tuple[int, ...] = (len(row[0]),) if row and isinstance(row[0], list | tuple) else ()
        if not runs or runs[-1][0] != trailing:
            runs.append((trailing, []))
        runs[-1][1].append(row)
    for trailing, rows in runs or [((), [])]:
        flat = [value for row in rows for value in _flat(row)]
        offsets = [0]
        for row in rows:
            offsets.append(offsets[-1] + 4 * len(_flat(row)))
        batched = (
            _len_field(1, _packed("f", flat))
            + _len_field(2, _packed("q", offsets))
            + _varint_field(3, DTYPE_FLOAT32)
            + (_len_field(4, _varints(trailing)) if trailing else b"")
        )
        entry = _string_field(1, "logprobs") + _len_field(2, batched)
        record = _string_field(1, "ArrayRecord") + _len_field(2, entry) + _varint_field(3, len(rows))
        out = out or _string_field(1, "ArrayRecord")
        out += _len_field(2, record)
    for name, value in metrics.items():
        metric = _string_field(1, name) + _tag(2, _FIXED64) + struct.pack("<d", float(value))
        out += _len_field(3, metric)
    return out


def _varints(values: Sequence[int]) -> bytes:
    """A packed repeated varint field's payload (a `repeated int64` such as a shape)."""
    return b"".join(_varint(value) for value in values)


def _flat(row: Sequence[Any]) -> list[float]:
    return [value for cells in row for value in cells] if row and isinstance(row[0], list | tuple) else list(row)


# Tinker's filler for an empty cell of a top-k table (`tinker.types.topk_logprobs.MASK_LOGPROB`).
TOPK_MASK_ID, TOPK_MASK_LOGPROB = 0, -99999.0


def _topk_table(rows: Sequence[Sequence[Sequence[Any]] | None]) -> bytes:
    """A `TopkLogprobs`: (length, k) int32 ids and float32 logprobs, row-major; a position with
    no list (None) or a shorter one is filled with the mask entry."""
    k = max((len(row) for row in rows if row), default=0)
    ids: list[int] = []
    values: list[float] = []
    for row in rows:
        entries = list(row or [])
        ids += [int(entry[0]) for entry in entries] + [TOPK_MASK_ID] * (k - len(entries))
        values += [float(entry[1]) for entry in entries] + [TOPK_MASK_LOGPROB] * (k - len(entries))
    return (
        _len_field(1, _packed("i", ids))
        + _len_field(2, _packed("f", values))
        + _varint_field(3, k)
        + _varint_field(4, len(rows))
    )


def _target_tensor(targets: dict[str, Any]) -> bytes:
    """A float32 `Tensor` of target logprobs, in the layout the request's ids came in: dense
    [rows, K], or sparse CSR with the same crow and col indices."""
    rows: list[list[float]] = targets["rows"]
    width = len(rows[0]) if rows else 0
    shape = _len_field(4, _varints([len(rows), width]))
    if "crow_indices" in targets:
        crow, col = targets["crow_indices"], targets["col_indices"]
        values = [rows[row][col[at]] for row in range(len(rows)) for at in range(crow[row], crow[row + 1])]
        csr = _len_field(1, _packed("f", values)) + _len_field(2, _packed("q", crow)) + _len_field(3, _packed("q", col))
        return _len_field(2, csr) + _varint_field(3, DTYPE_FLOAT32) + shape
    return (
        _len_field(1, _packed("f", [value for row in rows for value in row])) + _varint_field(3, DTYPE_FLOAT32) + shape
    )


def encode_sample_response(result: dict[str, Any]) -> bytes:
    """A `SampleResponse` from a stored sample result: each sequence's tokens (int32), logprobs
    (float32), stop reason and top-k table; the prompt's logprobs (NaN where there is none, as at
    position 0), top-k table and target logprobs, each where the request asked for it; and how
    many prompt tokens came from the prompt cache."""
    out = b""
    for sequence in result["sequences"]:
        message = (
            _varint_field(1, STOP_REASONS[sequence["stop_reason"]])
            + _len_field(2, _packed("i", sequence["tokens"]))
            + _len_field(3, _packed("f", sequence["logprobs"]))
        )
        if sequence.get("top_logprobs") is not None:
            message += _len_field(4, _topk_table(sequence["top_logprobs"]))
        out += _len_field(1, message)
    if result.get("prompt_logprobs") is not None:
        values = [math.nan if value is None else value for value in result["prompt_logprobs"]]
        out += _len_field(2, _packed("f", values))
    if result.get("topk_prompt_logprobs") is not None:
        out += _len_field(3, _topk_table(result["topk_prompt_logprobs"]))
    if result.get("prompt_cache_hit_tokens"):
        out += _varint_field(4, result["prompt_cache_hit_tokens"])
    if result.get("target_prompt_logprobs") is not None:
        out += _len_field(5, _target_tensor(result["target_prompt_logprobs"]))
    return out

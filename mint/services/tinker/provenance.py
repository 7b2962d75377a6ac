"""Tinker provenance: turning a datum's provenance spans into the stability info that the
sampler recorded, for `stable_reinforce`.

A sampler asked to `record_stability_info` keeps, in its sample result, each sampled token's
logprob under the distribution it was drawn from (`mint.trainer.sampling.draw`). A training
datum names the sampled sequence behind each of its positions with provenance spans (Tinker's
`Datum.with_provenance`): a prompt run is positions of the sequence's prompt, a sampled run
positions of its sampled tokens. Here, on the API side, each run is checked against what was
recorded (same organization, same Tinker session, same tokens) and the datum gains the
per-position `sampler_logprobs` input the loss reads (0 on prompt positions, which must carry
no advantage). The client never sends those numbers, so it cannot make them up.

A sequence id is `<sample future id>:<index>` (`mint.services.tinker.sampling.submit_sample`); its
record is that future's stored request (the prompt) and result (the sequences). Records live
as long as the future does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from mint.errors import InvalidRequest
from mint.schemas import tinker_proto as proto
from mint.storage.tables import Future, TrainingSession

LoadPayload = Callable[[dict[str, Any] | None, str | None], dict[str, Any]]


@dataclass(frozen=True)
class SampledRecord:
    """What the sampler recorded for one sequence: its prompt, tokens and their sampler logprobs."""

    prompt: list[int]
    tokens: list[int]
    sampler_logprobs: list[float]


class Records:
    """The recorded sequences one training request may name: those sampled, with
    `record_stability_info`, in the same organization and Tinker session as the model."""

    def __init__(self, session: Session, load: LoadPayload, model: TrainingSession) -> None:
        self._session, self._load, self._model = session, load, model
        self._cache: dict[str, SampledRecord] = {}

    def get(self, sequence_id: str, where: str) -> SampledRecord:
        if sequence_id not in self._cache:
            self._cache[sequence_id] = self._fetch(sequence_id, where)
        return self._cache[sequence_id]

    def _fetch(self, sequence_id: str, where: str) -> SampledRecord:
        future_id, _, index_text = sequence_id.rpartition(":")
        future = self._session.get(Future, future_id) if future_id and index_text.isdigit() else None
        sampler = self._session.get(TrainingSession, future.session_id) if future is not None else None
        if (
            future is None
            or sampler is None
            or future.operation != "sample"
            or future.organization_id != self._model.organization_id
            or sampler.tinker_session_id is None
            or sampler.tinker_session_id != self._model.tinker_session_id
        ):
            raise InvalidRequest(
                f"{where} names sequence {sequence_id!r}, which no sampler of this model's session produced; "
                "provenance works only within one session: sample and train in the same ServiceClient session",
                param="data",
            )
        if future.status != "succeeded":
            raise InvalidRequest(
                f"{where} names sequence {sequence_id!r}, whose sample request is {future.status}; "
                "train on a sequence once its sample has finished",
                param="data",
            )
        request = self._load(future.request, future.request_object_key)
        sequences = self._load(future.result, future.result_object_key)["sequences"]
        index = int(index_text)
        if index >= len(sequences):
            raise InvalidRequest(f"{where} names sequence {sequence_id!r}, which does not exist", param="data")
        sequence = sequences[index]
        if not request.get("record_stability_info") or sequence.get("sampler_logprobs") is None:
            raise InvalidRequest(
                f"{where} names sequence {sequence_id!r}, which was sampled without stability info; create the "
                "sampling client with record_stability_info=True to train on it with stable_reinforce",
                param="data",
            )
        return SampledRecord(
            prompt=list(request["prompt"]),
            tokens=list(sequence["tokens"]),
            sampler_logprobs=sequence["sampler_logprobs"],
        )


def _walk(
    records: Records, spans: Sequence[proto.WireSpan], tokens: Sequence[int], where: str
) -> list[tuple[proto.WireSpan, SampledRecord]]:
    """Check that `spans` tile `tokens` and that every run repeats the recorded tokens it names."""
    if sum(span.length for span in spans) != len(tokens):
        raise InvalidRequest(
            f"{where} provenance spans cover {sum(span.length for span in spans)} positions but the field has "
            f"{len(tokens)}; the runs must tile it exactly",
            param="data",
        )
    walked, position = [], 0
    for span in spans:
        record = records.get(span.sequence_id, where)
        source = record.prompt if span.kind == "prompt" else record.tokens
        claimed = source[span.offset : span.offset + span.length]
        if span.offset + span.length > len(source) or list(tokens[position : position + span.length]) != claimed:
            raise InvalidRequest(
                f"{where} positions {position}..{position + span.length - 1} claim to be {span.kind} tokens "
                f"{span.offset}..{span.offset + span.length - 1} of sequence {span.sequence_id!r}, but the tokens "
                "differ from what was sampled",
                param="data",
            )
        walked.append((span, record))
        position += span.length
    return walked


def attach_stability_info(
    session: Session, load: LoadPayload, model: TrainingSession, wire_data: Sequence[proto.WireDatum], data: list[dict]
) -> list[dict]:
    """`data` (validated datums, as dicts) with each one's `sampler_logprobs` from the records its
    provenance names; a datum without provenance, or whose provenance does not hold, is refused."""
    records = Records(session, load, model)
    for index, (source, datum) in enumerate(zip(wire_data, data, strict=True)):
        where = f"data[{index}]"
        if source.target_spans is None or source.input_spans is None:
            raise InvalidRequest(
                f"{where} has no provenance; stable_reinforce reads what the sampler recorded: sample with "
                "record_stability_info=True and name each datum's sequence with Datum.with_provenance "
                "(tinker-cookbook's RL loop does both when loss_fn='stable_reinforce')",
                param="data",
            )
        inputs = datum["loss_fn_inputs"]
        _walk(records, source.input_spans, datum["model_input"], f"{where}.model_input")
        advantages = inputs.get("advantages") or [0.0] * len(inputs["target_tokens"])
        sampler_logprobs: list[float] = []
        position = 0
        for span, record in _walk(records, source.target_spans, inputs["target_tokens"], f"{where}.target_tokens"):
            if span.kind == "prompt":
                if any(advantages[position : position + span.length]):
                    raise InvalidRequest(
                        f"{where} has a nonzero advantage on a prompt position; stable_reinforce trains sampled "
                        "tokens only",
                        param="data",
                    )
                sampler_logprobs += [0.0] * span.length
            else:
                sampler_logprobs += record.sampler_logprobs[span.offset : span.offset + span.length]
            position += span.length
        inputs["sampler_logprobs"] = sampler_logprobs
    return data

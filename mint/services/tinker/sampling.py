"""Tinker sampling, the API half: samplers and sample requests, checked and sent to the base's workers.

A sampler (a `SamplingClient`, id `<session>:sample:<n>`) is a `training_sessions` row of its Tinker
session (`mint.services.tinker.sessions`), of a base or of sampler weights
(`tinker://<model>/sampler_weights/<name>`); unlike a model it is held by no one worker: each
sample request is a future (`mint.services.tinker.future_rows`) sent to the base's queue
(`train.<base>`, SAMPLE_TASK), and any worker of the base serves it.

A sample request may ask, besides its samples (always with their tokens' logprobs), for its
prompt's logprobs (`prompt_logprobs`, optionally only the last `prompt_logprobs_last_n`), the k
most likely tokens at each prompt position (`topk_prompt_logprobs`) or at each sampled position
(`topk_sample_logprobs`), and the logprobs of token ids the client names at each prompt position
(`target_prompt_logprobs`, an int64 `[len(prompt) - 1, K]` tensor, dense or sparse CSR, -1 for
a cell that asks for nothing). Everything is checked here, before the request is recorded, so a
request the server cannot answer fails at once with a 400 that names the field; the worker half
is `mint.services.tinker.sample_batches.run_sample`. This module never imports torch.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from sqlalchemy.orm import Session

from mint.config import Settings
from mint.errors import InvalidRequest, NotFound
from mint.schemas import tinker as wire
from mint.services.catalog import readable_checkpoint
from mint.services.dispatch import Dispatch
from mint.services.tinker.future_rows import new_future, send_quietly, set_request
from mint.services.tinker.sessions import active_session, enabled_base, raise_if_expired
from mint.storage.objects import object_store_for
from mint.storage.queries import get_owned
from mint.storage.tables import Future, TinkerSession, TrainingSession
from mint.trainer.types import SamplingParams

SAMPLE_TASK = "mint.tinker.sample"
# The most cells a `target_prompt_logprobs` tensor or a `topk_prompt_logprobs` table may hold
# (rows x K): each is a Python number on the worker and in the stored result.
MAX_PROMPT_CELLS = 2_000_000


def sampler_id_of(session_id: str, seq: int) -> str:
    return f"{session_id}:sample:{seq}"


def create_sampling_session(
    session: Session, organization_id: str, body: wire.CreateSamplingSessionRequest
) -> TrainingSession:
    """A sampler of a base, or of sampler weights (`tinker://<model>/sampler_weights/<name>`)."""
    tinker_session = active_session(session, organization_id, body.session_id)
    sampler_id = sampler_id_of(tinker_session.id, body.sampling_session_seq_id)
    existing = session.get(TrainingSession, sampler_id)
    if existing is not None:
        return existing
    key: str | None = None
    model_path: str | None = None
    if body.model_path is not None:
        path = wire.TinkerPath.parse(body.model_path)
        if path.kind != "sampler":
            raise InvalidRequest(
                f"{path} is not sampler weights; sample from sampler weights (save_weights_for_sampler), "
                "or from a training client with save_weights_and_get_sampling_client",
                param="model_path",
            )
        checkpoint = readable_checkpoint(session, organization_id, path)
        source = session.get(TrainingSession, checkpoint.model_id)
        assert source is not None
        base_model, key, model_path = source.base_model, checkpoint.object_key, str(path)
        if body.base_model is not None and body.base_model != base_model:
            raise InvalidRequest(
                f"{path} was trained on base {base_model!r}, not {body.base_model!r}", param="base_model"
            )
    elif body.base_model is not None:
        base_model = enabled_base(session, body.base_model).name
    else:
        raise InvalidRequest("send a base_model or a model_path to sample from", param="base_model")
    row = TrainingSession(
        id=sampler_id,
        organization_id=organization_id,
        base_model=base_model,
        kind="sampling",
        lora={},
        tags={},
        tinker_session_id=tinker_session.id,
        model_path=model_path,
        adapter_object_key=key,
    )
    session.add(row)
    session.flush()
    return row


def get_sampler(session: Session, organization_id: str, sampler_id: str) -> wire.GetSamplerResponse:
    row = get_owned(session, TrainingSession, sampler_id, organization_id=organization_id, noun="sampler")
    if row.kind != "sampling":
        raise NotFound(f"No sampler with id {sampler_id!r} in this organization.", param="sampler_id")
    return wire.GetSamplerResponse(sampler_id=row.id, base_model=row.base_model, model_path=row.model_path)


def submit_sample(
    session: Session, settings: Settings, organization_id: str, body: wire.SampleRequest, send: Dispatch
) -> tuple[Future, list[str]]:
    """Record a sample request and send it to the base's workers; returns its future and the
    ids of the sequences it will hold."""
    if body.sampling_session_id is None:
        raise InvalidRequest("send a sampling_session_id (create_sampling_session)", param="sampling_session_id")
    sampler = get_owned(
        session, TrainingSession, body.sampling_session_id, organization_id=organization_id, noun="sampler"
    )
    if sampler.kind != "sampling":
        raise NotFound(
            f"No sampler with id {body.sampling_session_id!r} in this organization.", param="sampling_session_id"
        )
    if sampler.status != "active":
        raise_if_expired(session.get(TinkerSession, sampler.tinker_session_id) if sampler.tinker_session_id else None)
        raise InvalidRequest(f"sampler {sampler.id} is closed (its session finished)", param="sampling_session_id")
    if body.prompt_alt_tokens_k:
        raise InvalidRequest(
            "prompt_alt_tokens_k is not available on this server; leave it unset", param="prompt_alt_tokens_k"
        )
    prompt = body.prompt.tokens()
    if not prompt:
        raise InvalidRequest("the prompt is empty", param="prompt")
    last_n = body.prompt_logprobs_last_n
    if last_n is not None and not 1 <= last_n <= len(prompt) - 1:
        raise InvalidRequest(
            f"prompt_logprobs_last_n must be 1 to len(prompt) - 1 = {len(prompt) - 1}", param="prompt_logprobs_last_n"
        )
    if body.topk_prompt_logprobs * (len(prompt) - 1) > MAX_PROMPT_CELLS:
        raise InvalidRequest(
            f"topk_prompt_logprobs={body.topk_prompt_logprobs} over {len(prompt) - 1} prompt positions is more than "
            f"{MAX_PROMPT_CELLS} entries; lower k, or score only the last tokens with prompt_logprobs_last_n",
            param="topk_prompt_logprobs",
        )
    targets = (
        target_cells(body.target_prompt_logprobs, len(prompt)) if body.target_prompt_logprobs is not None else None
    )
    sp = body.sampling_params
    try:
        params = SamplingParams(
            max_tokens=sp.max_tokens,
            temperature=sp.temperature,
            top_p=sp.top_p,
            top_k=sp.top_k,
            stop=[sp.stop] if isinstance(sp.stop, str) else sp.stop,
            seed=sp.seed,
        )
    except ValidationError as exc:
        raise InvalidRequest(f"sampling_params: {exc.errors()[0]['msg']}", param="sampling_params") from None
    future = new_future(sampler, "sample", None)
    set_request(
        object_store_for(settings),
        future,
        {
            "prompt": prompt,
            "params": params.model_dump(mode="json"),
            "num_samples": body.num_samples,
            "prompt_logprobs": bool(body.prompt_logprobs),
            "prompt_logprobs_last_n": last_n,
            "topk_prompt_logprobs": body.topk_prompt_logprobs,
            "topk_sample_logprobs": body.topk_sample_logprobs,
            "target_prompt_logprobs": targets,
            "record_stability_info": bool(body.record_stability_info),
        },
    )
    session.add(future)
    session.commit()
    send_quietly(send, SAMPLE_TASK, [future.id], base_model=sampler.base_model)
    return future, [f"{future.id}:{index}" for index in range(body.num_samples)]


def target_cells(tensor: Any, prompt_length: int) -> dict[str, Any]:
    """A `target_prompt_logprobs` tensor (the SDK's TensorData as JSON) as the worker reads it:
    `rows`, the dense `[len(prompt) - 1, K]` ids with -1 where nothing is asked, and the layout
    the answer must keep (`crow_indices`/`col_indices` when it came as sparse CSR)."""
    param = "target_prompt_logprobs"
    if not isinstance(tensor, dict):
        raise InvalidRequest("target_prompt_logprobs must be a TensorData object", param=param)
    if tensor.get("dtype") != "int64":
        raise InvalidRequest(
            f"target_prompt_logprobs must be int64 token ids, not {tensor.get('dtype')!r}", param=param
        )
    shape, data = tensor.get("shape"), tensor.get("data")
    if not (isinstance(shape, list) and len(shape) == 2 and all(_is_int(n) and n >= 0 for n in shape)):
        raise InvalidRequest(
            f"target_prompt_logprobs must be 2-D, [len(prompt) - 1, K]; its shape is {shape}", param=param
        )
    rows, width = shape
    if rows != prompt_length - 1:
        raise InvalidRequest(
            f"target_prompt_logprobs has {rows} rows; the prompt has {prompt_length} tokens, so it needs "
            f"len(prompt) - 1 = {prompt_length - 1} (row i scores prompt position i + 1)",
            param=param,
        )
    if rows * width > MAX_PROMPT_CELLS:
        raise InvalidRequest(
            f"target_prompt_logprobs has {rows * width} cells, more than {MAX_PROMPT_CELLS}", param=param
        )
    if not (isinstance(data, list) and all(_is_int(value) and value >= -1 for value in data)):
        raise InvalidRequest("target_prompt_logprobs must hold token ids (or -1 for no target)", param=param)
    crow, col = tensor.get("sparse_crow_indices"), tensor.get("sparse_col_indices")
    if crow is None and col is None:
        if len(data) != rows * width:
            raise InvalidRequest(f"target_prompt_logprobs has shape {shape} but {len(data)} values", param=param)
        return {"rows": [data[i * width : (i + 1) * width] for i in range(rows)]}
    if not (isinstance(crow, list) and isinstance(col, list) and all(_is_int(i) for i in crow + col)):
        raise InvalidRequest("a sparse target_prompt_logprobs needs integer crow and col indices", param=param)
    if wire.csr_problem(rows, width, len(data), crow, col) is not None:
        raise InvalidRequest(
            "target_prompt_logprobs is not valid CSR: crow_indices must rise from 0 to the number of values "
            f"({rows + 1} of them), and each col index must be below K = {width}",
            param=param,
        )
    dense = wire.csr_rows(rows, width, data, crow, col, fill=-1)
    return {"rows": dense, "crow_indices": crow, "col_indices": col}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)

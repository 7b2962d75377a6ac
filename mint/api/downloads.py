"""Objects sent to clients straight from the object store, a chunk at a time.

An adapter archive can be 8 GiB, a dataset 512 MiB: a download route opens the object as an
`ObjectStream` (so a missing object is still a 404 before anything is sent) and answers a
`StreamingResponse` of its chunks with the exact `Content-Length`, so the API process holds
one chunk per download, never the object. The route's database session is committed before
the first byte goes out (`SessionDep`), so a slow client holds no connection either.
"""

from __future__ import annotations

from typing import Any

from fastapi.responses import StreamingResponse

from mint.storage.objects import ObjectStream

TAR_MEDIA_TYPE = "application/x-tar"
JSONL_MEDIA_TYPE = "application/jsonl"


def binary_response(media_type: str, description: str) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI entry of a download route's 200 answer."""
    schema = {"type": "string", "format": "binary"}
    return {200: {"description": description, "content": {media_type: {"schema": schema}}}}


def stream_object(
    stream: ObjectStream, *, media_type: str, filename: str | None = None, headers: dict[str, str] | None = None
) -> StreamingResponse:
    """A response that streams `stream`'s bytes, with their length and sha256 in the headers."""
    sent = {"Content-Length": str(stream.info.size_bytes), "X-Mint-SHA256": stream.info.sha256, **(headers or {})}
    if filename is not None:
        sent["Content-Disposition"] = f'attachment; filename="{filename}"'
    # A sync iterator: Starlette reads each chunk on its thread pool, off the event loop.
    return StreamingResponse(iter(stream), media_type=media_type, headers=sent)

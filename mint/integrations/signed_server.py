"""What Mint's servers on a team's machine share (`mint reward-server`, `mint env-server`):
the secret they check, reading a bounded request body, checking its signature, the error
answer Mint quotes, and running the app.

Mint signs every request to an endpoint a team registered as it signs webhooks (the Standard
Webhooks scheme, with the endpoint's `whsec_...` secret); a server answers a request whose
signature does not verify, or that is older than five minutes, with a 401.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable

from standardwebhooks.webhooks import Webhook, WebhookVerificationError
from starlette.requests import Request
from starlette.responses import JSONResponse

from mint import errors

SECRET_PREFIX = "whsec_"
# The largest request body read (`--max-request-bytes`); a longer one is answered 413 unread.
MAX_REQUEST_BYTES = 32 * 1024 * 1024


def check_secret(secret: str | None, variable: str) -> str:
    """The secret if it is one Mint gives (`whsec_` and base64), else InvalidRequest (none given,
    or not such a secret); `variable` is the environment variable a user may set it in."""
    if not secret:
        raise errors.InvalidRequest(
            f"give the endpoint's secret (--secret whsec_... or {variable}): requests are always signed and checked",
            param="secret",
        )
    try:
        key = base64.b64decode(secret.removeprefix(SECRET_PREFIX), validate=True)
    except (binascii.Error, ValueError):
        key = b""
    if not secret.startswith(SECRET_PREFIX) or not key:
        raise errors.InvalidRequest(
            "the secret must be the `whsec_...` secret Mint gave when the endpoint was registered "
            f"(--secret or {variable})",
            param="secret",
        )
    return secret


def error_answer(status: int, kind: str, message: str, **more: str) -> JSONResponse:
    """An error as Mint's API writes one; the message first, since Mint quotes an answer's start."""
    return JSONResponse({"error": {"message": message, "type": kind, **more}}, status_code=status)


async def read_body(request: Request, limit: int) -> bytes | None:
    """The body, or None once it is longer than `limit` bytes (what is past that is not read)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        return None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


async def signed_body(request: Request, signer: Webhook, limit: int) -> bytes | JSONResponse:
    """The request's body if it is within `limit` and signed with the server's secret; else the 413
    or 401 to answer."""
    body = await read_body(request, limit)
    if body is None:
        return error_answer(413, "request_too_large", f"the body is longer than {limit} bytes (--max-request-bytes)")
    try:
        signer.verify(body, dict(request.headers), json_parse=False)
    except WebhookVerificationError as exc:
        return error_answer(
            401,
            "authentication_error",
            f"the request's signature does not verify ({exc}): it must be signed, within 5 minutes, with the "
            "endpoint's secret that this server was given",
        )
    return body


def serve(app: object, *, host: str, port: int, on_listening: Callable[[str], None], log_level: str = "info") -> None:
    """Run `app` until interrupted. `on_listening` gets the URL once the socket accepts connections
    (with port 0, the port the system chose)."""
    import uvicorn

    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="off")  # type: ignore[arg-type]
    sock = config.bind_socket()
    # Listening before uvicorn starts: a client that connects as soon as it is told waits in the backlog.
    sock.listen(config.backlog)
    bound_host, bound_port = sock.getsockname()[:2]
    on_listening(f"http://{f'[{bound_host}]' if ':' in bound_host else bound_host}:{bound_port}")
    uvicorn.Server(config).run(sockets=[sock])

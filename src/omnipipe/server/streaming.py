"""Streaming responses whose generator is always closed, so a client that goes away aborts its request, and
whose failure mid-stream looks like a failure to the client.

Starlette stops sending when the client disconnects, but a body generator suspended at ``yield`` would only be
closed by the garbage collector. ``ClosingStreamingResponse`` closes it as soon as the response ends, however it
ends; the generator's ``finally`` then leaves ``AsyncOmni.generate`` early, which aborts the request everywhere.

A body that cannot say "failed" in its own format (raw audio: pcm, wav, ...) raises ``StreamCut`` instead: the
response then ends without its terminating chunk, the server drops the connection, and every HTTP client
raises (an incomplete body), rather than taking the part it got for the whole.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from omnipipe.api.outputs import OmniRequestOutput
from omnipipe.server.disconnect import ClientGone, while_connected
from omnipipe.server.errors import from_engine_error

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class StreamCut(Exception):
    """Raised by a response body that failed after the response started: end it as cut, not as complete."""


def _is_cut(exc: BaseException) -> bool:
    if isinstance(exc, StreamCut):
        return True
    return isinstance(exc, BaseExceptionGroup) and any(_is_cut(e) for e in exc.exceptions)


class ClosingStreamingResponse(StreamingResponse):
    def __init__(self, content: AsyncIterator[Any], *, media_type: str,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(content, media_type=media_type, headers=dict(headers or {}))
        self._source = content

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        except BaseException as exc:
            if not _is_cut(exc):
                raise
            # returning without the final body message: the server closes the connection mid-body
        finally:
            aclose = getattr(self._source, "aclose", None)
            if aclose is not None:
                await aclose()


def sse(payload: BaseModel | dict[str, Any] | str) -> bytes:
    """One server-sent event: ``data: <json>\\n\\n`` (or ``data: [DONE]``)."""
    if isinstance(payload, BaseModel):
        text = payload.model_dump_json(exclude_none=True)
    elif isinstance(payload, dict):
        text = json.dumps(payload, separators=(",", ":"))
    else:
        text = payload
    return f"data: {text}\n\n".encode()


async def first_output(request: Request, outputs: AsyncIterator[OmniRequestOutput], field_map: Mapping[str, str],
                       audio_param: str | None = None) -> OmniRequestOutput | None:
    """Pull the first output while the client is connected, so that argument errors surface before the response
    starts (as a 4xx, not mid-stream). If the client leaves (``ClientGone``) or the request fails, the stream is
    closed (aborting the request) and that is raised, a failure as the API error to answer (``field_map`` and
    ``audio_param`` as ``from_engine_error`` takes them)."""

    async def pull() -> OmniRequestOutput | None:
        try:
            return await outputs.__anext__()
        except StopAsyncIteration:
            return None

    try:
        return await while_connected(request, pull())
    except ClientGone:
        await outputs.aclose()  # type: ignore[attr-defined]
        raise
    except Exception as exc:  # noqa: BLE001 - mapped to an API error
        await outputs.aclose()  # type: ignore[attr-defined]
        raise from_engine_error(exc, field_map, audio_param) from None


async def with_first(first: OmniRequestOutput | None,
                     outputs: AsyncIterator[OmniRequestOutput]) -> AsyncIterator[OmniRequestOutput]:
    """The stream again, starting with the output ``first_output`` already took off it."""
    if first is not None:
        yield first
    if first is None or not first.finished:
        async for out in outputs:
            yield out

"""A client that leaves before the response starts aborts its request.

A streamed response notices a departed client when a send fails (``streaming.ClosingStreamingResponse``). Until
the response starts — a whole (non-streamed) answer being computed, a request waiting for its first output — the
handler sends nothing, so nothing would notice: the request would run to its end in every stage for nobody.
``while_connected`` runs that part of a handler beside a watch on the ASGI ``receive`` channel (which yields
``http.disconnect`` once the client closes) and cancels the work when the client goes; cancelling leaves
``AsyncOmni.generate`` early, which aborts the request in every stage.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from starlette.requests import Request

T = TypeVar("T")
CLIENT_CLOSED_REQUEST = 499  # the status logged for a request whose client left (nobody receives it)


class ClientGone(Exception):
    """The client disconnected before its response started; the work for it was cancelled."""


async def _disconnected(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def while_connected(request: Request, work: Awaitable[T]) -> T:
    """``await work``, unless the client disconnects first: then cancel it and raise ``ClientGone``."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watch.cancel()
    if task.done():
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    raise ClientGone()

"""A tentative answer under server VAD: started when the user's speech pauses, held until the turn ends.

The VAD reports a pause (``pause_started``: ``PAUSE_MS`` of quiet) well before it ends the turn
(``silence_duration_ms`` of quiet). At the pause the turn controller (``turn.py``) starts one: the speech so far is
transcribed, the answer the turn would get were it committed now is planned, and it starts in the engine; its
first output is awaited and everything after it waits in the engine's queue. Nothing is sent to the client and
nothing joins the conversation. When the silence window closes, the turn is committed with the transcript already
made and the response takes the answer as it is, plan and stream (the answer is planned once): the controller
drops a tentative answer whenever anything its plan was made from changes (the user goes on speaking, the session
or the conversation changes, a response starts), so one still held when the turn ends answers that very turn. A
dropped answer is aborted and forgotten: the engine frees it, and the client never hears of it.

A tentative answer holds no session: it is given the three steps it runs (transcribe, plan, generate) and the way
to abort its engine request.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING

from omnipipe.api.outputs import OmniRequestOutput

if TYPE_CHECKING:
    from omnipipe.server.routes.realtime.frames import Frame
    from omnipipe.server.routes.realtime.response import AnswerPlan

logger = logging.getLogger(__name__)

# quiet after speech before the answer starts tentatively: shorter starts sooner but more often for a breath
# between words; measured with ``omnipipe bench voice`` (docs/benchmarks.md)
PAUSE_MS = 128


class TentativeAnswer:
    """One answer started ahead: its transcript (``transcript``), plan and engine stream (first output awaited in
    ``task``). ``frames``: the camera frames of the turn, sampled from those kept at the pause
    (``frames_until_ms``: the newest of them)."""

    def __init__(self, transcribe: Callable[[], Awaitable[str]], plan: Callable[[str], AnswerPlan],
                 generate: Callable[[str, AnswerPlan], AsyncIterator[OmniRequestOutput]],
                 abort: Callable[[str], Awaitable[None]], frames: list[Frame], frames_until_ms: float) -> None:
        self.response_id = f"resp_{uuid.uuid4().hex[:24]}"
        self.transcript: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.plan: AnswerPlan | None = None
        self.frames = frames
        self.frames_until_ms = frames_until_ms
        self._abort = abort
        self._dropped = False
        self._outputs: AsyncIterator[OmniRequestOutput] | None = None
        self.task = asyncio.create_task(self._start(transcribe, plan, generate),
                                        name=f"omnipipe-tentative-{self.response_id}")

    async def _start(self, transcribe: Callable[[], Awaitable[str]], plan: Callable[[str], AnswerPlan],
                     generate: Callable[[str, AnswerPlan], AsyncIterator[OmniRequestOutput]],
                     ) -> OmniRequestOutput | None:
        """Transcribe, plan and start the answer; its first output (None: it ended with none)."""
        try:
            words = await transcribe()
        except asyncio.CancelledError:
            self.transcript.cancel()
            raise
        except Exception as exc:
            self.transcript.set_exception(exc)
            raise
        self.transcript.set_result(words)
        self.plan = plan(words)
        self._outputs = generate(self.response_id, self.plan)
        return await anext(self._outputs, None)

    async def adopt(self) -> tuple[AnswerPlan, AsyncIterator[OmniRequestOutput]] | None:
        """The answer's plan and stream, for the response of the turn it was started for (None, and the answer
        dropped, when it failed to start)."""
        try:
            first = await self.task
        except Exception:  # noqa: BLE001 - the response starts afresh and meets the failure itself
            logger.debug("a tentative answer failed to start", exc_info=True)
            await self.drop()
            return None
        assert self.plan is not None
        return self.plan, self._replay(first)

    async def _replay(self, first: OmniRequestOutput | None) -> AsyncIterator[OmniRequestOutput]:
        assert self._outputs is not None
        try:
            if first is not None:
                yield first
            async for out in self._outputs:
                yield out
        finally:
            await self._outputs.aclose()  # type: ignore[attr-defined]

    async def drop(self) -> bool:
        """Abort the answer and forget it (its engine request ends; nothing reached the client); whether it was
        still held (a second drop does nothing)."""
        if self._dropped:
            return False
        self._dropped = True
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        if self.transcript.done() and not self.transcript.cancelled():
            self.transcript.exception()  # retrieved: a failed transcription of a dropped answer is no one's
        if self._outputs is not None:
            await self._outputs.aclose()  # type: ignore[attr-defined]
        await self._abort(self.response_id)
        return True

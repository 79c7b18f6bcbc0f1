"""A tentative answer under server VAD: started when the user's speech pauses, held until the turn ends.

The VAD reports a pause (``pause_started``: ``PAUSE_MS`` of quiet) well before it ends the turn
(``silence_duration_ms`` of quiet). At the pause the session transcribes the speech so far, plans the answer the
turn would get were it committed now (``Conversation.peek_turn``) and starts it in the engine; its first output is
awaited and everything after it waits in the engine's queue. Nothing is sent to the client and nothing joins the
conversation. When the silence window closes, the turn is committed with the transcript already made and the
response adopts the answer if it asks the same (it usually does: what followed the pause was silence), so its
first audio goes out at once. When the user goes on speaking (``pause_ended``, or anything else that changes the
turn) the answer is aborted and forgotten: the engine frees it, and the client never hears of it.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Protocol

import numpy as np

from omnipipe.api.outputs import OmniRequestOutput
from omnipipe.server.routes.realtime.conversation import ConversationItem
from omnipipe.server.routes.realtime.core import SessionCore

if TYPE_CHECKING:
    from omnipipe.server.routes.realtime.conversation import Conversation
    from omnipipe.server.routes.realtime.frames import CameraFrames
    from omnipipe.server.routes.realtime.live_transcript import LiveTranscript
    from omnipipe.server.routes.realtime.pause import SessionPause
    from omnipipe.server.routes.realtime.response import AnswerPlan, Responses

logger = logging.getLogger(__name__)

# quiet after speech before the answer starts tentatively: shorter starts sooner but more often for a breath
# between words; measured with ``omnipipe bench voice`` (docs/benchmarks.md)
PAUSE_MS = 128


class SpeculationSession(SessionCore, Protocol):
    """What a tentative answer uses of its session: the camera frames, the conversation and the responses (to plan
    and start the answer the turn would get), and the pause (a paused session starts none)."""

    frames: CameraFrames
    conversation: Conversation
    responses: Responses
    pause: SessionPause


class TentativeAnswer:
    """One answer started ahead: its transcript (``live``'s final pass), plan and engine stream (first output
    awaited in ``task``)."""

    def __init__(self, session: SpeculationSession, live: LiveTranscript, speech: np.ndarray) -> None:
        self.session = session
        self.live = live
        self.response_id = f"resp_{uuid.uuid4().hex[:24]}"
        self.transcript: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.plan: AnswerPlan | None = None
        self.frames_until_ms = session.frames.newest_ms()  # the camera frames of the turn: those kept at the pause
        self._outputs: AsyncIterator[OmniRequestOutput] | None = None
        self.task = asyncio.create_task(self._start(speech), name=f"omnipipe-tentative-{self.response_id}")

    async def _start(self, speech: np.ndarray) -> OmniRequestOutput | None:
        """Transcribe, plan and start the answer; its first output (None: it ended with none)."""
        session = self.session
        try:
            words = await self.live.final(speech)
        except asyncio.CancelledError:
            self.transcript.cancel()
            raise
        except Exception as exc:
            self.transcript.set_exception(exc)
            raise
        self.transcript.set_result(words)
        heard = ConversationItem("tentative", "user", words=words, audio=speech, spoken=True, pending=True,
                                 transcribed=True)
        heard.take_frames(session.frames.peek(until_ms=self.frames_until_ms))
        self.plan = session.responses.plan(None, *session.conversation.peek_turn(heard))
        self._outputs = session.responses.generate(self.response_id, self.plan)
        return await anext(self._outputs, None)

    async def adopt(self, plan: AnswerPlan) -> AsyncIterator[OmniRequestOutput] | None:
        """The answer's stream for the response that ``plan``s the same turn (None, and the answer dropped, when
        it plans something else or failed to start)."""
        try:
            first = await self.task
        except Exception:  # noqa: BLE001 - the response starts afresh and meets the failure itself
            logger.debug("a tentative answer failed to start", exc_info=True)
            first, self.plan = None, None
        if self.plan is None or not _same(self.plan, plan):
            await self.drop()
            self.session.metrics.count_speculative_start("dropped")
            return None
        self.session.metrics.count_speculative_start("released")
        return self._replay(first)

    async def _replay(self, first: OmniRequestOutput | None) -> AsyncIterator[OmniRequestOutput]:
        assert self._outputs is not None
        try:
            if first is not None:
                yield first
            async for out in self._outputs:
                yield out
        finally:
            await self._outputs.aclose()  # type: ignore[attr-defined]

    async def drop(self) -> None:
        """Abort the answer and forget it (its engine request ends; nothing reached the client)."""
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        if self.transcript.done() and not self.transcript.cancelled():
            self.transcript.exception()  # retrieved: a failed transcription of a dropped answer is no one's
        if self._outputs is not None:
            await self._outputs.aclose()  # type: ignore[attr-defined]
        await self.session.engine.abort(self.response_id)


def _same(planned: AnswerPlan, asked: AnswerPlan) -> bool:
    """Whether two plans ask the engine the same (a turn whose audio goes along is never adopted: its audio is not
    compared). The prompt holds the session's tools and the whole history (function calls and their outputs as
    turns), the sampling the tool choice: an answer planned before a tool, a choice or an output changed is
    dropped."""
    def audio(plan: AnswerPlan) -> object:
        return plan.prompt.get("multi_modal_data", {}).get("audio")

    return (audio(planned) is None and audio(asked) is None and planned.prompt == asked.prompt
            and planned.modalities == asked.modalities and planned.sampling == asked.sampling
            and planned.max_output_tokens == asked.max_output_tokens and planned.calls == asked.calls)


class SpeculativeStart:
    """The session's tentative answer, at most one: ``begin`` at a pause, ``take`` when the turn ends, ``drop``
    when the user goes on; ``live``: the input audio buffer's live transcript, which transcribes the turn."""

    def __init__(self, session: SpeculationSession, live: LiveTranscript) -> None:
        self.session = session
        self.live = live
        self.answer: TentativeAnswer | None = None

    def wanted(self) -> bool:
        """Whether a pause now should start an answer: server VAD that answers by itself with speculation on, a
        turn transcribed live, no response running, not paused."""
        session = self.session
        detection = session.settings.turn_detection
        return (detection is not None and detection.get("speculative_start", True)
                and detection.get("create_response", True) and self.live.enabled()
                and not session.responses.running and not session.pause.paused)

    def begin(self, speech: np.ndarray) -> None:
        if self.answer is None and self.wanted():
            self.answer = TentativeAnswer(self.session, self.live, speech)

    def take(self) -> TentativeAnswer | None:
        """The tentative answer, now the turn's to adopt (or drop)."""
        answer, self.answer = self.answer, None
        return answer

    async def drop(self) -> None:
        answer, self.answer = self.answer, None
        if answer is not None:
            await answer.drop()
            self.session.metrics.count_speculative_start("dropped")

"""The transcription of a realtime session's spoken user items, beside the response: the server's transcription
pipeline (started on first use) gives the words that join the conversation, and sends the client
``conversation.item.input_audio_transcription.completed`` (or ``.failed``) when the session asked for it. An item
heard live (``live_transcript.py``) already has its words: they are announced, never transcribed again."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

import numpy as np

from omnipipe.api.sampling_params import SamplingParams
from omnipipe.protocol.audio import PCM16_RATE_HZ
from omnipipe.protocol.realtime import ServerEvent
from omnipipe.server.errors import from_engine_error

if TYPE_CHECKING:
    from omnipipe.config.pipeline_spec import PipelineSpec
    from omnipipe.server.engines import EnginePool
    from omnipipe.server.prometheus import ServerMetrics
    from omnipipe.server.realtime_settings import Settings
    from omnipipe.server.routes.realtime.conversation import ConversationItem
    from omnipipe.server.routes.realtime.events import Send


async def transcribe(pool: EnginePool, audio: np.ndarray, extra: dict[str, Any] | None = None, *,
                     rate_hz: int = PCM16_RATE_HZ, language: str | None = None) -> str:
    """What the server's transcription pipeline (``pool``'s, started on first use) hears in ``audio`` (at
    ``rate_hz``: a spoken item's 24 kHz, or the input's 16 kHz stream, which whisper takes as it is); ``extra``: its
    ``SamplingParams.extra`` (a session's ``fitted_window`` and ``prefix``); ``language``: the session's, told to a
    pipeline that takes one (``ServingTraits.language_param``: Voxtral's). Raises what the pipeline raised."""
    engine, pipeline = await pool.engine_for("transcription")
    extras = pipeline.transcription_extras(extra or {}, language)
    final = None
    async for out in engine.generate({"prompt": "", "multi_modal_data": {"audio": (audio, rate_hz)}},
                                     request_id=f"rt-transcribe-{uuid.uuid4().hex}",
                                     sampling_params={stage: SamplingParams(extra=values)
                                                      for stage, values in extras.items()} or None,
                                     output_modalities=["text"]):
        final = out
    return final.text.strip() if final is not None else ""


class Transcriptions:
    """The session's transcriptions in flight; cancelled when the session ends. ``settings``: the session's (whether
    the client asked for transcripts), changed in place by ``session.update``; ``pipeline``: the session's (whether
    it takes the history); ``pool``: the server's engines (the transcription pipeline); ``metrics``: the server's;
    ``send``: the session's events."""

    def __init__(self, settings: Settings, pipeline: PipelineSpec, pool: EnginePool, metrics: ServerMetrics,
                 send: Send) -> None:
        self.settings = settings
        self.pipeline = pipeline
        self.pool = pool
        self.metrics = metrics
        self.send = send
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self, item: ConversationItem) -> None:
        """Transcribe a spoken user item if the client asked for its transcript or the history needs its words
        (an item heard live has them: they are only announced)."""
        announce = self.settings.transcription is not None
        if item.transcribed:
            if announce:
                self._spawn(self._announce(item, item.words), item)
            return
        remember = self.pipeline.takes_history and self.pool.endpoint_pipelines.get("transcription") is not None
        if announce or remember:
            self._spawn(self._transcribe(item, announce), item)

    def _spawn(self, work: Coroutine[Any, Any, None], item: ConversationItem) -> None:
        task = asyncio.create_task(work, name=f"omnipipe-transcribe-{item.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def cancel(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _transcribe(self, item: ConversationItem, announce: bool) -> None:
        """Transcribe a spoken user item (the transcription pipeline, beside the response): its words join the
        conversation, and the client is sent them if it asked for transcription."""
        assert item.audio is not None
        try:
            language = (self.settings.transcription or {}).get("language")
            transcript = await transcribe(self.pool, item.audio, language=language)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported to the client, the session goes on
            if announce:
                error = from_engine_error(exc, {}).body()["error"]
                await self.send(ServerEvent.INPUT_AUDIO_TRANSCRIPTION_FAILED, **_spoken_part(item), error=error)
            return
        item.words = transcript
        self.metrics.count_turn_transcription()
        if announce:
            await self._announce(item, transcript)

    async def _announce(self, item: ConversationItem, transcript: str) -> None:
        """``conversation.item.input_audio_transcription.completed`` for a spoken user item."""
        assert item.audio is not None
        await self.send(ServerEvent.INPUT_AUDIO_TRANSCRIPTION_COMPLETED, **_spoken_part(item), transcript=transcript,
                        usage={"type": "duration", "seconds": round(len(item.audio) / PCM16_RATE_HZ, 3)})


def _spoken_part(item: ConversationItem) -> dict[str, Any]:
    """The fields naming a user item's audio part in the transcription events (it follows a typed part)."""
    return {"item_id": item.id, "content_index": 1 if item.text_part else 0}

"""A transcription session (GA ``session.type`` ``transcription``): the realtime session of a server whose main
pipeline transcribes live (``ServingTraits.live_transcriber``: Voxtral Realtime). Such a server has no chat, so
every ``/v1/realtime`` connection to it is one; ``session.created`` says so, and a ``session.update`` must give
``type: transcription`` (``realtime`` is refused naming ``session.type``).

A turn starts with the first ``input_audio_buffer.append`` after a commit (or the session's start): its item id is
given then, and its audio streams into one request of the pipeline as it comes (24 kHz pcm16 resampled to the
engine's 16 kHz, ``AsyncOmni.append_audio``); the text the model writes comes back while the user speaks as
``conversation.item.input_audio_transcription.delta`` events naming that item, so they may come before the item is
committed. ``input_audio_buffer.commit`` ends the turn: the resampler's tail is appended, the client is sent
``input_audio_buffer.committed`` and ``conversation.item.added``, and the stream is dropped; the request then ends
as the whole clip's transcription does, and ``...completed`` carries its transcript (the deltas joined, stripped),
followed by ``conversation.item.done``. The next append starts the next turn (a new request) while the last one
finishes. ``input_audio_buffer.clear`` drops the turn: its request is aborted and nothing more is said of it.

The client commits: a turn detection is refused naming ``session.audio.input.turn_detection``. Responses,
conversation items, camera frames and a pause have no place here and are refused naming ``type``. The beta dialect's
transcription sessions (``transcription_session.update``) are not offered (``route.py`` refuses the connection)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from omnipipe.api.async_omni import AsyncOmni
from omnipipe.api.sampling_params import SamplingParams
from omnipipe.config.pipeline_spec import PipelineSpec
from omnipipe.protocol.audio import PCM16_RATE_HZ
from omnipipe.protocol.realtime import COMMIT_EMPTY, ServerEvent, TranscriptionSessionConfig
from omnipipe.server.errors import APIError, from_engine_error
from omnipipe.server.realtime_settings import TranscriptionSettings, transcription_session_object
from omnipipe.server.routes.realtime.checks import decode_pcm16
from omnipipe.server.routes.realtime.events import EventError, Send, new_item_id
from omnipipe.server.routes.realtime.idle import IdleWatch
from omnipipe.server.routes.transcription import language_code

ENGINE_RATE_HZ = 16000  # what AsyncOmni.append_audio takes
# the engine's fields a turn's request can be refused for -> the client's
_FIELDS = {"prompt.multi_modal_data.audio": "audio", "prompt.multi_modal_data": "audio", "prompt": "audio"}
_TRANSCRIPTION = "session.audio.input.transcription"


@dataclass(eq=False)  # each turn is itself (kept in a set)
class _Turn:
    """One turn's request: its item, its audio stream and what it has said so far."""

    item_id: str
    stream_id: str
    request_id: str
    resampler: Any  # soxr.ResampleStream, 24 kHz -> 16 kHz
    samples: int = 0  # the client's samples (24 kHz)
    text: str = ""
    cleared: bool = False
    previous_item_id: str | None = None  # the item before it (set by the commit)
    committed: asyncio.Event = field(default_factory=asyncio.Event)  # set by the commit (or clear, or the end)
    reader: asyncio.Task[None] | None = None


class TranscriptionSession:
    """The session's turns. ``pipeline``, ``engine`` and ``session_id``: the session's; ``model``: the server's model
    name (the transcription model shown until the client names one); ``idle``: the idle watch (audio is activity);
    ``send``: the session's events."""

    def __init__(self, pipeline: PipelineSpec, engine: AsyncOmni, session_id: str, model: str, *, idle: IdleWatch,
                 send: Send) -> None:
        self.pipeline = pipeline
        self.engine = engine
        self.session_id = session_id
        self.settings = TranscriptionSettings(model=model)
        self.idle = idle
        self.send = send
        self.turn: _Turn | None = None  # the turn being spoken (None until the next append)
        self.last_item_id: str | None = None
        self._turns: set[_Turn] = set()  # turns whose request runs

    def session_object(self) -> dict[str, Any]:
        return transcription_session_object(self.settings, self.session_id)

    # ------------------------------------------------------------------ client events
    async def on_update(self, event: Any) -> None:
        """``session.update`` (``type: transcription``): the transcription's model, language, noise reduction and
        include; a turn detection or a null transcription refused naming the field. Applies to the next turn."""
        config: TranscriptionSessionConfig = event.session
        audio_in = config.audio.input if "audio" in config.model_fields_set and \
            "input" in config.audio.model_fields_set else None
        new: dict[str, Any] = {}
        if audio_in is not None:
            given = audio_in.model_fields_set
            if "turn_detection" in given and audio_in.turn_detection is not None:
                param = "session.audio.input.turn_detection"
                raise EventError(f"{param}: a transcription session on pipeline {self.pipeline.name!r} ends each turn "
                                 "when the client commits it (input_audio_buffer.commit): only null", param,
                                 code="unsupported_feature")
            if "transcription" in given:
                new.update(self._transcription(audio_in.transcription))
            if "noise_reduction" in given:
                reduction = audio_in.noise_reduction
                new["noise_reduction"] = None if reduction is None else reduction.model_dump()
        if "include" in config.model_fields_set:
            new["include"] = config.include
        for key, value in new.items():
            setattr(self.settings, key, value)
        await self.send(ServerEvent.SESSION_UPDATED, session=self.session_object())

    def _transcription(self, value: Any) -> dict[str, Any]:
        if value is None:
            raise EventError(f"{_TRANSCRIPTION}: a transcription session always transcribes (null is not taken)",
                             _TRANSCRIPTION, code="unsupported_feature")
        try:  # one the pipeline takes, as its code (the model hears it; a pipeline that takes one is told)
            language = language_code(value.language, self.pipeline)
        except APIError as exc:
            raise EventError(f"{_TRANSCRIPTION}.{exc.message}", f"{_TRANSCRIPTION}.language") from None
        return {"model": value.model, "language": language}

    async def append(self, event: Any) -> None:
        """``input_audio_buffer.append``: the audio streamed into the turn's request at once (the first of a turn
        starts it)."""
        samples = decode_pcm16(event.audio, "audio")
        self.idle.touch()
        if samples.size == 0:
            return
        turn = self.turn or self._start()
        turn.samples += samples.size
        heard = np.asarray(turn.resampler.resample_chunk(samples), dtype=np.float32)
        if heard.size:
            await self.engine.append_audio(turn.stream_id, heard, session_id=self.session_id)

    async def commit(self, event: Any) -> None:
        """``input_audio_buffer.commit``: the turn's item committed and added, its stream dropped (its request then
        ends with the whole clip's transcript)."""
        turn, self.turn = self.turn, None
        if turn is None:
            raise EventError("the input audio buffer is empty", None, code=COMMIT_EMPTY)
        self.idle.touch()
        try:
            tail = np.asarray(turn.resampler.resample_chunk(np.zeros(0, np.float32), last=True), dtype=np.float32)
            if tail.size:
                await self.engine.append_audio(turn.stream_id, tail, session_id=self.session_id)
            previous = turn.previous_item_id = self.last_item_id
            self.last_item_id = turn.item_id
            await self.send(ServerEvent.INPUT_AUDIO_BUFFER_COMMITTED, previous_item_id=previous, item_id=turn.item_id)
            await self.send(ServerEvent.CONVERSATION_ITEM_ADDED, previous_item_id=previous,
                            item=_item(turn.item_id, None))
        finally:
            await self.engine.drop_audio_stream(turn.stream_id)
            turn.committed.set()

    async def clear(self, event: Any) -> None:
        """``input_audio_buffer.clear``: the turn being spoken dropped, its request aborted."""
        turn, self.turn = self.turn, None
        if turn is not None:
            await self._drop(turn)
        await self.send(ServerEvent.INPUT_AUDIO_BUFFER_CLEARED)

    def refuse(self, kind: str) -> None:
        """An event a transcription session has no place for: an EventError naming its type."""
        raise EventError(f"type: {kind} has no place in a transcription session (pipeline {self.pipeline.name!r} "
                         "only transcribes: send session.update, input_audio_buffer.append, .commit and .clear)",
                         "type", code="unsupported_event")

    async def close(self) -> None:
        """The session ended: every turn's request is aborted and its stream dropped (the client is gone)."""
        if self.turn is not None:
            self.turn = None
        for turn in list(self._turns):
            await self._drop(turn)
        readers = [turn.reader for turn in self._turns if turn.reader is not None]
        for reader in readers:
            reader.cancel()
        await asyncio.gather(*readers, return_exceptions=True)

    # ------------------------------------------------------------------ a turn's request
    def _start(self) -> _Turn:
        import soxr

        item_id = new_item_id()
        turn = _Turn(item_id=item_id, stream_id=f"{self.session_id}-{item_id}",
                     request_id=f"rt-transcription-{uuid.uuid4().hex}",
                     resampler=soxr.ResampleStream(PCM16_RATE_HZ, ENGINE_RATE_HZ, 1, dtype="float32"))
        extras = self.pipeline.transcription_extras({}, self.settings.language)
        sampling = {stage: SamplingParams(extra=values) for stage, values in extras.items()} or None
        turn.reader = asyncio.create_task(self._read(turn, sampling), name=f"omnipipe-transcription-{item_id}")
        self.turn = turn
        self._turns.add(turn)
        return turn

    async def _read(self, turn: _Turn, sampling: dict[str, SamplingParams] | None) -> None:
        """The turn's request: its text deltas sent as they come; once it ended and the turn is committed, its
        transcript (or ``...failed``, at once, when the request failed)."""
        prompt = {"prompt": "", "multi_modal_data": {"audio": [{"stream": turn.stream_id}]}}
        try:
            async for out in self.engine.generate(prompt, request_id=turn.request_id, sampling_params=sampling,
                                                  output_modalities=["text"], session_id=self.session_id):
                if out.text_delta and not turn.cleared:
                    turn.text += out.text_delta
                    await self.send(ServerEvent.INPUT_AUDIO_TRANSCRIPTION_DELTA, item_id=turn.item_id,
                                    content_index=0, delta=out.text_delta)
            await turn.committed.wait()
            if not turn.cleared:
                await self._completed(turn)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported to the client, the session goes on
            if not turn.cleared:
                error = from_engine_error(exc, _FIELDS, "audio").body()["error"]
                await self.send(ServerEvent.INPUT_AUDIO_TRANSCRIPTION_FAILED, item_id=turn.item_id, content_index=0,
                                error=error)
        finally:
            self._turns.discard(turn)

    async def _completed(self, turn: _Turn) -> None:
        transcript = turn.text.strip()
        seconds = round(turn.samples / PCM16_RATE_HZ, 3)
        await self.send(ServerEvent.INPUT_AUDIO_TRANSCRIPTION_COMPLETED, item_id=turn.item_id, content_index=0,
                        transcript=transcript, usage={"type": "duration", "seconds": seconds})
        await self.send(ServerEvent.CONVERSATION_ITEM_DONE, previous_item_id=turn.previous_item_id,
                        item=_item(turn.item_id, transcript))

    async def _drop(self, turn: _Turn) -> None:
        """A turn no transcript will be sent for: its request aborted, its stream dropped."""
        turn.cleared = True
        turn.committed.set()
        with contextlib.suppress(Exception):  # the engine may be gone with the session
            await self.engine.abort(turn.request_id)
            await self.engine.drop_audio_stream(turn.stream_id)


def _item(item_id: str, transcript: str | None) -> dict[str, Any]:
    """A turn's user item: its audio part, with its transcript once made."""
    return {"id": item_id, "object": "realtime.item", "type": "message", "status": "completed", "role": "user",
            "content": [{"type": "input_audio", "transcript": transcript}]}

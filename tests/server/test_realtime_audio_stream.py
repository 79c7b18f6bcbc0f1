"""A realtime session's input audio streamed into the pipeline while the user speaks (``turn.AudioStream``): the
buffer's 16 kHz stream from its first sample, under one id a buffer, its resampler tail at the commit, dropped when
the buffer is cleared; a pipeline that takes no streams, or an append refused, leaves the turn its whole clip. The
engine here records what it is sent (the real engine's side is ``tests/models/test_streamed_audio_engine.py``; a
turn through a Qwen-Omni server is ``tests/models/test_qwen2_5_omni.py``)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import numpy as np

from omnipipe.engine.async_omni_engine import AudioStreamsNotTakenError
from omnipipe.protocol.realtime import ConversationItemDelete
from omnipipe.server.routes.realtime.audio_buffer import InputAudioBuffer
from omnipipe.server.routes.realtime.conversation import Conversation, ConversationItem
from omnipipe.server.routes.realtime.turn import AudioStream
from omnipipe.util.field_error import FieldError

RATE = 24_000


class Engine:
    """Records appends and drops; ``refuse``: the error every append raises."""

    def __init__(self, refuse: Exception | None = None) -> None:
        self.appended: dict[str, list[np.ndarray]] = {}
        self.dropped: list[str] = []
        self.refuse = refuse

    async def append_audio(self, stream_id: str, pcm16k: np.ndarray, *, session_id: str | None = None) -> None:
        assert session_id == "sess_1"
        if self.refuse is not None:
            raise self.refuse
        self.appended.setdefault(stream_id, []).append(pcm16k)

    async def drop_audio_stream(self, stream_id: str) -> None:
        self.dropped.append(stream_id)


def audio_stream(engine: Engine, modalities: tuple[str, ...] = ("text", "audio"),
                 transcribes: bool = False) -> AudioStream:
    """The stream of session ``sess_1`` on ``engine``, whose pipeline takes ``modalities`` (``transcribes``: its
    spoken turns are transcribed by the session)."""
    pipeline: Any = SimpleNamespace(input_modalities=modalities,
                                    serving=SimpleNamespace(live_transcription=transcribes))
    settings: Any = SimpleNamespace(live_transcription=True)
    return AudioStream(pipeline, settings, engine, "sess_1")  # type: ignore[arg-type]


def speak(stream: AudioStream, buffer: InputAudioBuffer, seconds: float) -> None:
    audio = (0.3 * np.sin(np.arange(int(seconds * RATE)) / RATE * 2 * np.pi * 220)).astype(np.float32)
    for start in range(0, audio.size, 960):
        first = not buffer.chunks
        asyncio.run(stream.feed(buffer.append(audio[start:start + 960], arrived=0.0), first))


def test_the_buffers_16k_stream_goes_in_as_it_comes_and_the_commit_takes_it_with_its_tail() -> None:
    engine, buffer = Engine(), InputAudioBuffer(max_bytes=10 * RATE * 2)
    stream = audio_stream(engine)
    speak(stream, buffer, 1.0)
    stream_id = asyncio.run(stream.take(buffer))
    assert stream_id == "sess_1-audio-1" and list(engine.appended) == [stream_id]
    sent = np.concatenate(engine.appended[stream_id])
    np.testing.assert_array_equal(sent, buffer.speech())  # every sample of the buffer at 16 kHz, the tail too
    assert sent.size == 16_000
    buffer.reset()
    speak(stream, buffer, 0.5)  # the next buffer: a stream of its own
    assert asyncio.run(stream.take(buffer)) == "sess_1-audio-2" and not engine.dropped


def test_a_cleared_buffers_stream_is_dropped() -> None:
    engine, buffer = Engine(), InputAudioBuffer(max_bytes=10 * RATE * 2)
    stream = audio_stream(engine)
    speak(stream, buffer, 0.5)
    asyncio.run(stream.drop())
    assert engine.dropped == ["sess_1-audio-1"] and stream.id is None


def test_a_pipeline_that_hears_no_audio_stream_or_transcribes_itself_streams_nothing() -> None:
    for stream in (audio_stream(Engine(), modalities=("text",)), audio_stream(Engine(), transcribes=True)):
        buffer = InputAudioBuffer(max_bytes=10 * RATE * 2)
        speak(stream, buffer, 0.5)
        assert asyncio.run(stream.take(buffer)) is None and not stream.engine.appended


def test_a_stage_that_takes_no_streams_or_a_refused_append_leaves_the_clip_whole() -> None:
    engine, buffer = Engine(AudioStreamsNotTakenError("no streams")), InputAudioBuffer(max_bytes=10 * RATE * 2)
    stream = audio_stream(engine)
    speak(stream, buffer, 0.3)
    assert asyncio.run(stream.take(buffer)) is None and not stream.taken  # not asked again this session
    engine, buffer = Engine(FieldError("stream_id", "too many open streams")), InputAudioBuffer(10 * RATE * 2)
    stream = audio_stream(engine)
    speak(stream, buffer, 0.3)
    assert asyncio.run(stream.take(buffer)) is None and engine.dropped == ["sess_1-audio-1"]
    buffer.reset()
    engine.refuse = None
    speak(stream, buffer, 0.3)  # the next buffer streams again
    assert asyncio.run(stream.take(buffer)) == "sess_1-audio-2"


def conversation(engine: Engine, sent: list[str]) -> Conversation:
    async def send(type_: str, **fields: Any) -> None:
        sent.append(type_)

    settings: Any = SimpleNamespace(instructions="")
    return Conversation(settings, None, "ga", idle=None, frames=None, transcribe=lambda item: None,  # type: ignore[arg-type]
                        answering=lambda item: False, drop_stream=engine.drop_audio_stream, send=send)


def spoken_item(item_id: str, stream: str) -> ConversationItem:
    return ConversationItem(item_id, "user", audio=np.zeros(2400, np.float32), audio_stream=stream, spoken=True,
                            pending=True)


def test_a_streamed_item_no_turn_will_take_has_its_stream_dropped() -> None:
    """A spoken item's stream is the turn's prompt's when the turn takes it; a deleted item's, and those of a turn
    of two clips (which go whole), are dropped in the pipeline at once rather than kept until the session ends."""
    engine, sent = Engine(), []
    talk = conversation(engine, sent)
    talk.items.append(spoken_item("one", "s-1"))
    turn, _ = asyncio.run(talk.take_turn())
    assert turn.audio_stream == "s-1" and engine.dropped == []  # the prompt names it
    talk.items.append(spoken_item("deleted", "s-2"))
    asyncio.run(talk.delete(ConversationItemDelete(type="conversation.item.delete", item_id="deleted")))
    assert engine.dropped == ["s-2"] and sent == ["conversation.item.deleted"]
    talk.items += [spoken_item("a", "s-3"), spoken_item("b", "s-4")]
    turn, _ = asyncio.run(talk.take_turn())
    assert turn.audio_stream is None and turn.audio is not None and turn.audio.size == 4800  # both clips whole
    assert engine.dropped == ["s-2", "s-3", "s-4"]
    assert all(item.audio_stream is None for item in talk.items)

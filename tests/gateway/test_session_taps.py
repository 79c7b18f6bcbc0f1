"""Taps: chat (streamed and whole), speech and transcription traffic become recordings; odd input never raises."""

from __future__ import annotations

import base64
import json
import logging
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from omnipipe.gateway.recording.recorder import SessionRecorder
from omnipipe.gateway.recording.replay import encode_wav, read_wav
from omnipipe.gateway.recording.store import SessionStore
from omnipipe.gateway.recording.taps import (
    ChatTap,
    RealtimeTap,
    SpeechTap,
    TranscriptionTap,
    TurnTranscriptTap,
    transcript_text,
)
from omnipipe.gateway.recording.writer import RecordingWriter
from omnipipe.server.audio_stream import streaming_wav_header
from omnipipe.server.routes.transcription import subtitles
from tests.models import media_files

RATE = 24_000
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 32



class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def at(self, seconds: float) -> None:
        self.now = 1000.0 + seconds


def tone(seconds: float, rate: int = RATE, freq: float = 440.0) -> np.ndarray:
    return (0.5 * np.sin(2 * np.pi * freq * np.arange(round(seconds * rate)) / rate)).astype(np.float32)


def pcm16(samples: np.ndarray) -> bytes:
    return np.round(samples * 32767).astype("<i2").tobytes()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.fixture
def writer() -> Iterator[RecordingWriter]:
    writer = RecordingWriter()
    yield writer
    writer.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(tmp_path: Path) -> SessionStore:
    return SessionStore(tmp_path / "data")


def recorder_for(store: SessionStore, writer: RecordingWriter, clock: FakeClock, kind: str) -> SessionRecorder:
    return SessionRecorder(store, f"20260101-000000_{kind}_0123456789", kind, writer=writer, clock=clock)


def finished(recorder: SessionRecorder, writer: RecordingWriter) -> tuple[Path, dict[str, Any]]:
    """Finish the recording; return its directory and recording.json."""
    recorder.finish()
    assert writer.flush(timeout=10)
    return recorder.directory, json.loads((recorder.directory / "recording.json").read_text())


def duration(path: Path) -> float:
    samples, rate = read_wav(path)
    return samples.size / rate


def png(width: int, height: int, shade: int = 0) -> bytes:
    """A valid grayscale PNG of ``width`` x ``height`` pixels, all ``shade``."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    rows = b"".join(b"\x00" + bytes([shade]) * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def image_part(data: bytes, step: int | None = None, steps: int | None = None, mime: str = "image/png",
               **fields: Any) -> dict[str, Any]:
    """One entry of ``message.images`` / ``delta.images``: a preview with ``step`` and ``steps``, else finished."""
    part: dict[str, Any] = {"type": "image_url", "image_url": {"url": f"data:{mime};base64,{b64(data)}"}, **fields}
    if step is not None:
        part.update(step=step, steps=steps)
    return part


def sse_chunk(delta: dict[str, Any], finish_reason: str | None = None) -> str:
    return json.dumps({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                       "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]})


def chat_request(**extra: Any) -> dict[str, Any]:
    return {"model": "default", "modalities": ["text", "audio"], "messages": [
        {"role": "user", "content": "an older question"},
        {"role": "assistant", "content": "an older answer"},
        {"role": "user", "content": [
            {"type": "text", "text": "What is"},
            {"type": "input_audio", "input_audio": {"data": b64(encode_wav(tone(0.75, 16_000), 16_000)),
                                                    "format": "wav"}},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64(PNG)}"}},
            {"type": "text", "text": " this? "},
        ]}], **extra}


def test_chat_stream(store: SessionStore, writer: RecordingWriter, clock: FakeClock) -> None:
    recorder = recorder_for(store, writer, clock, "chat")
    tap = ChatTap(recorder)
    clock.at(1.0)
    tap.on_request(chat_request(stream=True, audio={"voice": "default", "format": "pcm16"},
                                stream_options={"include_usage": True}))
    clock.at(1.25)
    tap.on_sse_data(sse_chunk({"role": "assistant", "content": ""}))
    tap.on_sse_data(sse_chunk({"content": "A ", "audio": {"id": "audio_1", "transcript": "A "}}))
    clock.at(1.5)
    for piece in np.array_split(tone(1.2), 4):
        tap.on_sse_data(sse_chunk({"audio": {"id": "audio_1", "data": b64(pcm16(piece))}}))
    tap.on_sse_data(sse_chunk({"content": "tone.", "audio": {"id": "audio_1", "transcript": "tone."}}))
    tap.on_sse_data(sse_chunk({"audio": {"id": "audio_1", "expires_at": 99}}, finish_reason="stop"))
    tap.on_sse_data(json.dumps({"id": "chatcmpl-1", "choices": [], "usage": {"completion_tokens": 3}}))
    tap.on_sse_data("[DONE]")
    tap.end("completed")
    tap.end("failed")  # a second end changes nothing
    directory, recording = finished(recorder, writer)

    (turn,) = recording["turns"]
    assert turn["status"] == "completed" and turn["started_at"] == 1.0
    assert turn["user_text"] == "What is this?"
    assert turn["assistant_text"] == "A tone."
    assert turn["metrics"] == {"ttft_ms": 250.0, "ttfp_ms": 500.0, "finish_reason": "stop",
                               "usage": {"completion_tokens": 3}}
    assert turn["user_audio"] == {"path": "user_audio/turn001.wav", "t_start": 1.0, "duration_s": 0.75,
                                  "sample_rate": 16_000}
    assert duration(directory / "user_audio/turn001.wav") == pytest.approx(0.75)
    assert turn["user_images"][0]["path"] == "user_images/turn001_1.png"
    assert (directory / "user_images/turn001_1.png").read_bytes() == PNG
    assert turn["ai_audio"] == [{"path": "ai_audio/turn001.wav", "t_start": 1.5, "duration_s": 1.2,
                                 "sample_rate": RATE}]
    assert np.allclose(read_wav(directory / "ai_audio/turn001.wav")[0], tone(1.2), atol=1e-3)
    request_event = next(e for e in recording["events"] if e["kind"] == "chat.request")
    assert request_event["stream"] is True and request_event["audio"]["format"] == "pcm16"
    assert (directory / "merged_replay.wav").is_file()


MP4 = media_files.mp4(np.zeros((3, 16, 16, 3), dtype=np.uint8), fps=3)


def test_chat_audio_url_and_video_url_parts(store: SessionStore, writer: RecordingWriter, clock: FakeClock) -> None:
    recorder = recorder_for(store, writer, clock, "chat")
    tap = ChatTap(recorder)
    clock.at(1.0)
    wav = b64(encode_wav(tone(0.5, 16_000), 16_000))
    tap.on_request({"model": "qwen", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is heard and seen?"},
        {"type": "audio_url", "audio_url": {"url": f"data:audio/wav;base64,{wav}"}},
        {"type": "video_url", "video_url": {"url": f"data:video/mp4;base64,{b64(MP4)}"}},
        {"type": "video_url", "video_url": {"url": f"data:video/mp4;base64,{b64(b'0123456789')}"}},
        {"type": "video_url", "video_url": {"url": "https://example.com/v.mp4"}},
    ]}]})
    tap.on_json_response({"id": "chatcmpl-1", "object": "chat.completion", "choices": [{
        "index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "A tone."}}]})
    tap.end("completed")
    directory, recording = finished(recorder, writer)
    (turn,) = recording["turns"]
    assert turn["user_text"] == "What is heard and seen?"
    assert turn["user_audio"]["path"] == "user_audio/turn001.wav" and turn["user_audio"]["duration_s"] == 0.5
    assert duration(directory / "user_audio/turn001.wav") == pytest.approx(0.5)
    # a real MP4 is kept as sent; bytes that are no MP4 and a remote URL are events
    assert turn["user_videos"] == [{"path": "user_videos/turn001_1.mp4", "mime": "video/mp4",
                                    "size_bytes": len(MP4), "t": 1.0}]
    assert (directory / "user_videos/turn001_1.mp4").read_bytes() == MP4
    videos = [e for e in recording["events"] if e["kind"] == "video_url"]
    assert [(v.get("mime"), v.get("size_bytes"), v.get("url")) for v in videos] == [
        ("video/mp4", 10, None), (None, None, "https://example.com/v.mp4")]
    assert "not a video/mp4 video" in videos[0]["not_kept"]


@pytest.mark.parametrize("audio_format", ["wav", "pcm16", "flac"])
def test_chat_json_response(store: SessionStore, writer: RecordingWriter, clock: FakeClock,
                            audio_format: str) -> None:
    recorder = recorder_for(store, writer, clock, "chat")
    tap = ChatTap(recorder)
    tap.on_request({"model": "default", "modalities": ["text", "audio"], "audio": {"format": audio_format},
                    "messages": [{"role": "user", "content": "Say hi"}]})
    clock.at(2.0)
    answer = tone(0.5, 22_050)
    if audio_format == "pcm16":
        data = pcm16(tone(0.5))
    elif audio_format == "wav":
        data = encode_wav(answer, 22_050)
    else:
        import soundfile

        path = Path(recorder.directory.parent.parent / "answer.flac")
        soundfile.write(path, answer, 22_050, format="FLAC")
        data = path.read_bytes()
    tap.on_json_response({"id": "chatcmpl-1", "object": "chat.completion", "choices": [{
        "index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "Hi!", "audio": {
            "id": "audio_1", "data": b64(data), "transcript": "Hi!", "expires_at": 1}}}],
        "usage": {"completion_tokens": 2}})
    tap.end("completed")
    directory, recording = finished(recorder, writer)
    (turn,) = recording["turns"]
    assert (turn["user_text"], turn["assistant_text"], turn["status"]) == ("Say hi", "Hi!", "completed")
    assert turn["metrics"]["ttft_ms"] == 2000.0 and turn["metrics"]["ttfp_ms"] == 2000.0
    (clip,) = turn["ai_audio"]
    assert clip["path"] == "ai_audio/turn001.wav" and clip["t_start"] == 2.0 and clip["duration_s"] == 0.5
    assert clip["sample_rate"] == (RATE if audio_format == "pcm16" else 22_050)
    assert duration(directory / "ai_audio/turn001.wav") == pytest.approx(0.5)


def test_chat_turns_errors_and_undecodable_audio(store: SessionStore, writer: RecordingWriter,
                                                 clock: FakeClock) -> None:
    recorder = recorder_for(store, writer, clock, "chat")
    tap = ChatTap(recorder)
    tap.on_request({"messages": [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": b64(b"not audio at all"), "format": "mp3"}},
        {"type": "input_audio", "input_audio": {"data": "%%% not base64", "format": "wav"}},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
        {"type": "image_url", "image_url": {"url": f"data:image/svg+xml;base64,{b64(b'<svg/>')}"}},
        {"type": "text", "text": "still recorded"}]}]})
    tap.on_error(500, "the engine failed")
    tap.end("completed")
    tap2 = ChatTap(recorder)
    tap2.on_request({"stream": True, "messages": [{"role": "user", "content": "second"}]})
    tap2.on_sse_data(sse_chunk({"content": "par"}))
    tap2.on_sse_data(json.dumps({"error": {"type": "server_error", "code": "engine_error", "message": "died"}}))
    tap2.end("completed")
    directory, recording = finished(recorder, writer)
    first, second = recording["turns"]
    assert first["status"] == "failed" and first["error"] == "HTTP 500: the engine failed"
    assert first["user_text"] == "still recorded" and first["user_images"] == []
    assert first["user_audio"]["path"] == "user_audio/turn001.mp3" and "decode_error" in first["user_audio"]
    assert (directory / "user_audio/turn001.mp3").read_bytes() == b"not audio at all"
    assert any(e["kind"] == "image_url" and e["url"] == "https://example.com/cat.png" for e in recording["events"])
    assert second["index"] == 2 and second["status"] == "failed" and second["error"] == "died"
    assert second["assistant_text"] == "par"


def test_a_streamed_drawing_records_the_finished_image_not_the_previews(store: SessionStore, writer: RecordingWriter,
                                                                         clock: FakeClock) -> None:
    recorder = recorder_for(store, writer, clock, "chat")
    tap = ChatTap(recorder)
    clock.at(1.0)
    tap.on_request({"model": "think-and-draw", "stream": True, "modalities": ["text", "image"],
                    "omnipipe": {"sampling_params": {"diffusion": {"extra": {"preview_every": 10}}}},
                    "messages": [{"role": "user", "content": "Draw the number of legs a spider has."}]})
    clock.at(1.5)
    tap.on_sse_data(sse_chunk({"role": "assistant", "content": ""}))
    tap.on_sse_data(sse_chunk({"content": "A spider has "}))
    tap.on_sse_data(sse_chunk({"content": "eight legs."}))
    clock.at(2.0)
    for step in (10, 20, 30, 40):
        tap.on_sse_data(sse_chunk({"images": [image_part(png(8, 8, step), step, 50)]}))
    clock.at(2.5)
    finished_image = png(8, 8, 255)
    tap.on_sse_data(sse_chunk({"images": [image_part(finished_image)]}))
    tap.on_sse_data(sse_chunk({}, finish_reason="stop"))
    tap.on_sse_data("[DONE]")
    tap.end("completed")
    directory, recording = finished(recorder, writer)

    (turn,) = recording["turns"]
    assert turn["status"] == "completed" and turn["assistant_text"] == "A spider has eight legs."
    assert turn["ai_images"] == [{"path": "ai_images/turn001.png", "mime": "image/png",
                                  "size_bytes": len(finished_image), "width": 8, "height": 8, "t": 2.5}]
    assert (directory / "ai_images/turn001.png").read_bytes() == finished_image
    assert sorted(p.name for p in (directory / "ai_images").iterdir()) == ["turn001.png"]  # no preview
    assert turn["metrics"]["ttft_ms"] == 500.0 and "ttfp_ms" not in turn["metrics"]
    assert not (directory / "merged_replay.wav").exists()  # an image is no audio to replay
    request_event = next(e for e in recording["events"] if e["kind"] == "chat.request")
    assert request_event["modalities"] == ["text", "image"]


def test_a_whole_drawing_records_its_image(store: SessionStore, writer: RecordingWriter, clock: FakeClock) -> None:
    recorder = recorder_for(store, writer, clock, "chat")
    for question, image in (("Draw a one.", png(8, 8, 10)), ("Draw a two.", png(16, 8, 20))):
        tap = ChatTap(recorder)
        tap.on_request({"model": "image", "modalities": ["text", "image"],
                        "messages": [{"role": "user", "content": question}]})
        # the whole answer's finished image: omnipipe writes step and steps as null
        tap.on_json_response({"id": "chatcmpl-1", "object": "chat.completion", "choices": [{
            "index": 0, "finish_reason": "stop", "message": {
                "role": "assistant", "content": "Done.", "audio": None,
                "images": [{**image_part(image), "step": None, "steps": None}]}}]})
        tap.end("completed")
    directory, recording = finished(recorder, writer)
    first, second = recording["turns"]
    assert first["ai_images"][0]["path"] == "ai_images/turn001.png"
    assert second["ai_images"][0]["path"] == "ai_images/turn002.png"
    assert (second["ai_images"][0]["width"], second["ai_images"][0]["height"]) == (16, 8)
    assert (directory / "ai_images/turn002.png").read_bytes() == png(16, 8, 20)
    assert first["assistant_text"] == second["assistant_text"] == "Done."


@pytest.mark.parametrize("bad", [
    {"type": "image_url", "image_url": {"url": "data:image/png;base64,%%% not base64"}},
    {"type": "image_url", "image_url": {"url": "data:image/png,rawbytes"}},  # not base64
    {"type": "image_url", "image_url": {"url": "https://example.com/eight.png"}},
    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64(b'GIF89a not a png')}"}},
    {"type": "image_url", "image_url": {"url": f"data:image/svg+xml;base64,{b64(b'<svg/>')}"}},
    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64(b'')}"}},
    {"type": "image_url", "image_url": {"url": 8}},
    {"type": "image_url", "image_url": "data:image/png;base64,AAAA"},
    "data:image/png;base64,AAAA",
], ids=["bad-base64", "not-base64", "http-url", "not-png-bytes", "svg", "empty", "url-not-a-string",
        "image-url-not-an-object", "not-an-object"])
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
def test_a_malformed_image_is_skipped_with_a_warning(store: SessionStore, writer: RecordingWriter, clock: FakeClock,
                                                     caplog: pytest.LogCaptureFixture, bad: Any,
                                                     stream: bool) -> None:
    recorder = recorder_for(store, writer, clock, "chat")
    tap = ChatTap(recorder)
    tap.on_request({"stream": stream, "modalities": ["text", "image"],
                    "messages": [{"role": "user", "content": "Draw an eight."}]})
    good = png(8, 8, 200)
    with caplog.at_level(logging.WARNING, logger="omnipipe.gateway.recording.taps"):
        if stream:
            tap.on_sse_data(sse_chunk({"content": "Eight."}))
            tap.on_sse_data(sse_chunk({"images": [bad, image_part(good)]}))  # the good one after it is kept
            tap.on_sse_data(sse_chunk({}, finish_reason="stop"))
        else:
            tap.on_json_response({"choices": [{"index": 0, "finish_reason": "stop", "message": {
                "role": "assistant", "content": "Eight.", "images": [bad, image_part(good)]}}]})
    tap.end("completed")
    directory, recording = finished(recorder, writer)
    (turn,) = recording["turns"]
    assert turn["status"] == "completed" and turn["assistant_text"] == "Eight."
    assert [image["path"] for image in turn["ai_images"]] == ["ai_images/turn001.png"]
    assert (directory / "ai_images/turn001.png").read_bytes() == good
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "_answer_image" in r.getMessage()]
    assert len(warnings) == 1, caplog.text
    assert writer.errors == 0


def test_an_oversized_drawing_is_not_recorded(store: SessionStore, writer: RecordingWriter, clock: FakeClock,
                                              caplog: pytest.LogCaptureFixture) -> None:
    recorder = recorder_for(store, writer, clock, "chat")
    tap = ChatTap(recorder)
    tap.on_request({"stream": True, "messages": [{"role": "user", "content": "Draw something huge."}]})
    huge = png(8, 8) + b"\x00" * (4 * 1024 * 1024)  # past MAX_AI_IMAGE_BYTES
    with caplog.at_level(logging.WARNING, logger="omnipipe.gateway.recording.taps"):
        tap.on_sse_data(sse_chunk({"images": [image_part(huge)]}))
    tap.end("completed")
    directory, recording = finished(recorder, writer)
    (turn,) = recording["turns"]
    assert turn["ai_images"] == [] and not (directory / "ai_images").exists()
    assert "more than the limit" in caplog.text


@pytest.mark.parametrize(("content_type", "make_body", "expected"), [
    ("audio/pcm", lambda: pcm16(tone(0.8)), ("ai_audio/turn001.wav", RATE)),
    ("audio/wav", lambda: streaming_wav_header(22_050) + pcm16(tone(0.8, 22_050)), ("ai_audio/turn001.wav", 22_050)),
    ("audio/mpeg", lambda: b"ID3 pretend mp3 bytes" * 100, ("ai_audio/turn001.mp3", None)),
])
def test_speech(store: SessionStore, writer: RecordingWriter, clock: FakeClock, content_type: str,
                make_body: Any, expected: tuple[str, int | None]) -> None:
    recorder = recorder_for(store, writer, clock, "speech")
    tap = SpeechTap(recorder)
    tap.on_request({"model": "default", "input": "Read this aloud.", "voice": "default",
                    "response_format": {"audio/pcm": "pcm", "audio/wav": "wav"}.get(content_type, "mp3")})
    clock.at(0.5)
    body = make_body()
    for start in range(0, len(body), 1000):
        tap.on_audio_bytes(body[start:start + 1000], content_type)
    tap.end("completed")
    directory, recording = finished(recorder, writer)
    (turn,) = recording["turns"]
    assert turn["user_text"] == "Read this aloud." and turn["status"] == "completed"
    assert turn["metrics"] == {"ttfp_ms": 500.0}
    (clip,) = turn["ai_audio"]
    relpath, rate = expected
    assert clip["path"] == relpath and clip["t_start"] == 0.5
    if rate is None:
        assert (directory / relpath).read_bytes() == body and clip["size_bytes"] == len(body)
    else:
        assert clip["sample_rate"] == rate and clip["duration_s"] == 0.8
        assert duration(directory / relpath) == pytest.approx(0.8)
    event = next(e for e in recording["events"] if e["kind"] == "speech.request")
    assert event["voice"] == "default"


def test_speech_sse(store: SessionStore, writer: RecordingWriter, clock: FakeClock) -> None:
    recorder = recorder_for(store, writer, clock, "speech")
    tap = SpeechTap(recorder)
    tap.on_request({"input": "Hi", "response_format": "pcm", "stream_format": "sse"})
    audio = pcm16(tone(0.6))
    stream = "".join(f"data: {json.dumps({'type': 'speech.audio.delta', 'audio': b64(audio[i:i + 4800])})}\n\n"
                     for i in range(0, len(audio), 4800))
    stream += 'data: {"type": "speech.audio.done"}\n\n'
    encoded = stream.encode()
    for start in range(0, len(encoded), 777):  # pieces that split events
        tap.on_audio_bytes(encoded[start:start + 777], "text/event-stream; charset=utf-8")
    tap.end("completed")
    directory, recording = finished(recorder, writer)
    assert recording["turns"][0]["ai_audio"][0]["duration_s"] == 0.6
    assert duration(directory / "ai_audio/turn001.wav") == pytest.approx(0.6)


def test_transcription(store: SessionStore, writer: RecordingWriter, clock: FakeClock) -> None:
    recorder = recorder_for(store, writer, clock, "transcription")
    tap = TranscriptionTap(recorder)
    tap.on_request(encode_wav(tone(1.5, 16_000), 16_000), "question.wav")
    clock.at(0.3)
    tap.on_response_text("hello world")
    tap.end("completed")
    other = TranscriptionTap(recorder)
    other.on_request(b"\x00\x01 not audio", "../../etc/voice memo.m4a")
    other.on_response_text("")
    other.end("completed")
    hostile = TranscriptionTap(recorder)
    hostile.on_request(b"<script>alert(1)</script>", "page.html")  # never served back as HTML
    hostile.end("completed")
    directory, recording = finished(recorder, writer)
    first, second, _ = recording["turns"]
    assert first["assistant_text"] == "hello world" and first["metrics"]["ttft_ms"] == 300.0
    assert first["user_audio"]["duration_s"] == 1.5
    assert duration(directory / "user_audio/turn001.wav") == pytest.approx(1.5)
    assert second["user_audio"]["path"] == "user_audio/turn002.m4a"
    assert (directory / "user_audio/turn002.m4a").read_bytes() == b"\x00\x01 not audio"
    assert recording["turns"][2]["user_audio"]["path"] == "user_audio/turn003.bin"
    assert sorted(p.name for p in (directory / "user_audio").iterdir()) == ["turn001.wav", "turn002.m4a",
                                                                            "turn003.bin"]


SEGMENTS = [{"id": 0, "start": 0.0, "end": 1.42, "text": " What is the capital"},
            {"id": 1, "start": 1.42, "end": 2.9, "text": " of France?"}]
TRANSCRIPT = "What is the capital of France?"


def worker_answers() -> dict[str, bytes]:
    """A transcription answer in each whole format, as the worker's route builds it."""
    body = {"text": TRANSCRIPT, "usage": {"type": "duration", "seconds": 3}}
    verbose = {"task": "transcribe", "language": "english", "duration": 2.9, "text": TRANSCRIPT,
               "segments": SEGMENTS, "words": [{"word": "What", "start": 0.0, "end": 0.3}]}
    return {"json": json.dumps(body).encode(), "text": TRANSCRIPT.encode(),
            "verbose_json": json.dumps(verbose).encode(),
            "srt": subtitles(SEGMENTS, "srt").encode(), "vtt": subtitles(SEGMENTS, "vtt").encode()}


def stream_events(done: bool = True) -> list[str]:
    """The SSE ``data:`` payloads of a streamed transcription (``stream=true``)."""
    events = [json.dumps({"type": "transcript.text.delta", "delta": segment["text"]}) for segment in SEGMENTS]
    if done:
        events.append(json.dumps({"type": "transcript.text.done", "text": TRANSCRIPT,
                                  "usage": {"type": "tokens", "input_tokens": 0, "output_tokens": 9}}))
    return events


@pytest.mark.parametrize("response_format", ["json", "text", "verbose_json", "srt", "vtt"])
def test_a_transcription_in_each_whole_format_records_its_text(store: SessionStore, writer: RecordingWriter,
                                                               clock: FakeClock, response_format: str) -> None:
    answer = worker_answers()[response_format]
    assert answer.decode() != TRANSCRIPT or response_format == "text"  # the others carry more than the words
    recorder = recorder_for(store, writer, clock, "transcription")
    tap = TranscriptionTap(recorder)
    tap.on_request(encode_wav(tone(0.5, 16_000), 16_000), "question.wav", response_format)
    clock.at(0.4)
    tap.on_response_body(answer)
    tap.end("completed")
    unnamed = TranscriptionTap(recorder)  # the form could not be read: the format is told by the body
    unnamed.on_request(b"RIFF", "question.wav", None)
    unnamed.on_response_body(answer)
    unnamed.end("completed")
    _, recording = finished(recorder, writer)
    named, told = recording["turns"]
    assert (named["assistant_text"], named["status"]) == (TRANSCRIPT, "completed")
    assert named["metrics"]["ttft_ms"] == 400.0
    assert told["assistant_text"] == TRANSCRIPT


def test_a_streamed_transcription_records_the_done_text_and_the_first_delta_time(
        store: SessionStore, writer: RecordingWriter, clock: FakeClock) -> None:
    recorder = recorder_for(store, writer, clock, "transcription")
    tap = TranscriptionTap(recorder)
    tap.on_request(encode_wav(tone(0.5, 16_000), 16_000), "question.wav", "json")
    for at, data in zip((0.25, 0.5, 0.75), stream_events(), strict=True):
        clock.at(at)
        tap.on_sse_data(data)
    tap.end("completed")
    cut = TranscriptionTap(recorder)  # a stream cut before its done event keeps the deltas that came
    cut.on_request(b"RIFF", "question.wav", "text")
    for data in stream_events(done=False)[:1]:
        cut.on_sse_data(data)
    cut.on_sse_data(json.dumps({"error": {"message": "stage 'encoder' died", "code": "stage_unavailable"}}))
    cut.end("completed")
    _, recording = finished(recorder, writer)
    whole, partial = recording["turns"]
    assert whole["assistant_text"] == TRANSCRIPT and whole["metrics"]["ttft_ms"] == 250.0
    assert (partial["assistant_text"], partial["status"]) == ("What is the capital", "failed")
    assert "stage 'encoder' died" in partial["error"]


@pytest.mark.parametrize("response_format", ["json", "text", "verbose_json", "srt", "vtt", "stream"])
def test_a_spoken_chat_questions_transcript_in_each_format_joins_its_turn(
        store: SessionStore, writer: RecordingWriter, clock: FakeClock, response_format: str) -> None:
    recorder = recorder_for(store, writer, clock, "chat")
    chat = ChatTap(recorder)
    chat.on_request(chat_request(modalities=["text"]))
    transcript = TurnTranscriptTap(recorder)
    transcript.on_request(b"RIFF....", "question.wav", "json" if response_format == "stream" else response_format)
    if response_format == "stream":
        for data in stream_events():
            transcript.on_sse_data(data)
    else:
        transcript.on_response_body(worker_answers()[response_format])
    transcript.end("completed")
    chat.on_sse_data(sse_chunk({"content": "Paris"}, "stop"))
    chat.end("completed")
    _, recording = finished(recorder, writer)
    (turn,) = recording["turns"]
    assert (turn["user_transcript"], turn["assistant_text"]) == (TRANSCRIPT, "Paris")


def test_subtitles_keep_only_the_words() -> None:
    vtt = ("WEBVTT\n\nNOTE made by hand\n\nintro\n00:00:00.000 --> 00:00:01.000\nHello\nthere\n\n"
           "00:00:01.000 --> 00:00:02.000\n\n00:00:02.000 --> 00:00:03.000\nagain\n")
    assert transcript_text(vtt.encode(), "vtt") == "Hello there again"
    srt = "1\r\n00:00:00,000 --> 00:00:01,000\r\n42 apples\r\n\r\n2\r\n00:00:01,000 --> 00:00:02,000\r\nand 7\r\n"
    assert transcript_text(srt.encode(), "srt") == "42 apples and 7"
    assert transcript_text(b"WEBVTT is a format", "text") == "WEBVTT is a format"  # the format asked decides
    assert transcript_text(b"not json", "json") == "" and transcript_text(b"[1]", "verbose_json") == ""


def test_the_transcript_of_a_spoken_chat_question_joins_its_turn(store: SessionStore, writer: RecordingWriter,
                                                                 clock: FakeClock) -> None:
    """The chat page transcribes a spoken question beside its answer: the transcript lands in that chat turn,
    whether it comes while the answer streams or after it ended, and adds no turn or audio of its own."""
    recorder = recorder_for(store, writer, clock, "chat")
    chat = ChatTap(recorder)
    chat.on_request(chat_request(modalities=["text"]))
    during = TurnTranscriptTap(recorder)  # asked while the first answer streams
    during.on_request(b"RIFF....", "question.wav")
    chat.on_sse_data(sse_chunk({"content": "Paris"}, "stop"))
    chat.end("completed")
    during.on_response_text(" What is the capital of France? ")
    during.end("completed")
    second = ChatTap(recorder)
    second.on_request({"model": "default", "messages": [{"role": "user", "content": "and Germany?"}]})
    second.end("completed")
    after = TurnTranscriptTap(recorder)  # the second answer was quicker than its transcript
    after.on_error(404, "no transcription pipeline")
    after.on_response_text("and Germany")
    directory, recording = finished(recorder, writer)
    first, last = recording["turns"]
    assert first["user_transcript"] == "What is the capital of France?" and first["assistant_text"] == "Paris"
    assert first["status"] == "completed" and first["user_audio_extra"] == []
    assert last["user_transcript"] == "and Germany"
    assert sorted(p.name for p in (directory / "user_audio").iterdir()) == ["turn001.wav"]
    assert [e["kind"] for e in recording["events"]].count("transcript.error") == 1


def test_a_discarded_recording_leaves_nothing(store: SessionStore, writer: RecordingWriter, clock: FakeClock) -> None:
    recorder = recorder_for(store, writer, clock, "chat")
    tap = ChatTap(recorder)
    tap.on_request(chat_request())
    tap.on_error(404, "model: 'nope' does not exist")
    tap.end("completed")
    recorder.discard()
    recorder.user_text("late")  # nothing is written after a discard
    assert writer.flush(timeout=10)
    assert not recorder.directory.exists() and store.list_sessions() == []


def test_taps_never_raise_on_odd_input(store: SessionStore, writer: RecordingWriter, clock: FakeClock) -> None:
    recorder = recorder_for(store, writer, clock, "voice")
    realtime = RealtimeTap(recorder)
    for frame in ["{", "[1, 2]", "null", '{"type": 5}', '{"type": "input_audio_buffer.append", "audio": "@@"}',
                  '{"type": "input_audio_buffer.append"}', '{"type": "conversation.item.create", "item": "x"}',
                  '{"type": "conversation.item.create", "item": {"content": [1, {"type": "input_text"}]}}']:
        realtime.on_client_event(frame)
    for frame in ["", '{"type": "response.audio.delta", "delta": 12}', '{"type": "response.done", "response": 3}',
                  '{"type": "response.text.delta", "delta": null}', '{"type": "error", "error": "plain"}']:
        realtime.on_server_event(frame)
    realtime.close("no such status")
    realtime.on_server_event('{"type": "response.created"}')  # after close: ignored
    chat = ChatTap(recorder_for(store, writer, clock, "chat"))
    chat.on_request({"messages": 5})
    chat.on_request({"messages": [{"role": "user", "content": [None, {"type": "input_audio"}]}]})
    for data in ["not json", '{"choices": "x"}', '{"choices": [{"delta": {"audio": {"data": 5}}}]}', "[]"]:
        chat.on_sse_data(data)
    chat.on_json_response({"choices": [{"message": {"audio": {"data": "!!"}}}]})
    chat.end("weird")
    speech = SpeechTap(recorder_for(store, writer, clock, "speech"))
    speech.on_audio_bytes(b"before any request", "audio/pcm")
    speech.on_request({"input": 3})
    speech.on_audio_bytes(b"data: {oops\n\n", "text/event-stream")
    speech.end()
    transcription = TranscriptionTap(recorder_for(store, writer, clock, "transcription"))
    transcription.on_request(None, None)  # type: ignore[arg-type]
    transcription.on_response_text(None)  # type: ignore[arg-type]
    assert writer.flush(timeout=10)
    assert writer.errors == 0
    assert recorder.finished and json.loads((recorder.directory / "meta.json").read_text())["status"] == "failed"


def test_realtime_transcripts_go_to_the_turn_of_their_audio_item(tmp_path) -> None:
    import base64 as b64
    import json as js

    import numpy as np

    from omnipipe.gateway.recording.recorder import SessionRecorder
    from omnipipe.gateway.recording.store import SessionStore
    from omnipipe.gateway.recording.taps import RealtimeTap
    from omnipipe.gateway.recording.writer import RecordingWriter

    store = SessionStore(tmp_path)
    writer = RecordingWriter()
    recorder = SessionRecorder(store, "rt_transcripts", "voice", writer=writer)
    tap = RealtimeTap(recorder)
    audio = b64.b64encode((np.ones(2400) * 1000).astype("<i2").tobytes()).decode()

    def server(type_: str, **fields: object) -> None:
        tap.on_server_event(js.dumps({"type": type_, **fields}))

    for turn, item in ((1, "item_a"), (2, "item_b")):
        tap.on_client_event(js.dumps({"type": "input_audio_buffer.append", "audio": audio}))
        server("input_audio_buffer.speech_started")
        server("input_audio_buffer.committed", item_id=item)
        server("response.created", response={"id": f"resp_{turn}"})
        server("response.audio_transcript.delta", delta=f"answer {turn}")
        if turn == 2:  # the first transcript arrives late, after its turn ended and the next one began
            server("conversation.item.input_audio_transcription.completed", item_id="item_a", transcript="first")
        server("response.done", response={"id": f"resp_{turn}", "status": "completed"})
    server("conversation.item.input_audio_transcription.completed", item_id="item_b", transcript="second")
    server("conversation.item.input_audio_transcription.completed", item_id="unknown", transcript="ignored")
    tap.close()
    writer.flush(10)
    turns = store.read_session("rt_transcripts")["recording"]["turns"]
    assert [(t["user_transcript"], t["assistant_text"]) for t in turns] == [("first", "answer 1"),
                                                                            ("second", "answer 2")]
    writer.close()


def test_a_realtime_function_call_and_its_output_are_kept_in_the_turn(tmp_path: Path) -> None:
    """The model's completed call is kept in its turn with the client's output beside it (an unfinished call and
    an output for no recorded call are not); the spoken answer that follows is the next turn."""
    store = SessionStore(tmp_path)
    writer = RecordingWriter()
    recorder = SessionRecorder(store, "rt_tools", "voice", writer=writer)
    tap = RealtimeTap(recorder)

    def server(type_: str, **fields: Any) -> None:
        tap.on_server_event(json.dumps({"type": type_, **fields}))

    def client(type_: str, **fields: Any) -> None:
        tap.on_client_event(json.dumps({"type": type_, **fields}))

    call = {"type": "function_call", "id": "item_c", "call_id": "call_1", "name": "get_weather",
            "arguments": '{"city": "Paris"}', "status": "completed"}
    client("conversation.item.create", item={"type": "message", "role": "user",
                                             "content": [{"type": "input_text", "text": "Weather in Paris?"}]})
    server("response.created", response={"id": "resp_1"})
    server("response.output_item.done", item={**call, "call_id": "call_0", "status": "incomplete"})
    server("response.output_item.done", item=call)
    server("response.done", response={"id": "resp_1", "status": "completed"})
    client("conversation.item.create", item={"type": "function_call_output", "call_id": "call_1",
                                             "output": "It is 18 degrees and sunny in Paris"})
    client("conversation.item.create", item={"type": "function_call_output", "call_id": "call_9", "output": "x"})
    server("response.created", response={"id": "resp_2"})
    server("response.output_audio_transcript.delta", delta="It is 18 degrees.")
    server("response.done", response={"id": "resp_2", "status": "completed"})
    tap.close()
    writer.flush(10)
    recording = store.read_session("rt_tools")["recording"]
    first, second = recording["turns"]
    assert first["user_text"] == "Weather in Paris?" and first["assistant_text"] == ""
    assert first["tool_calls"] == [{"call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}',
                                    "output": "It is 18 degrees and sunny in Paris"}]
    assert second["assistant_text"] == "It is 18 degrees." and "tool_calls" not in second
    kinds = [event["kind"] for event in recording["events"]]
    assert kinds.count("function_call") == 1 and kinds.count("function_call_output") == 2
    writer.close()

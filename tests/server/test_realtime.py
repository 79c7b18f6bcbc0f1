"""``WS /v1/realtime`` through the ``websockets`` client and the ``openai`` client: sessions in both dialects (GA by
default, beta on request), text and spoken turns with their item and content-part lifecycle, conversation items,
bad events, cancel and barge-in. Every server event is validated with the ``openai`` package's own types, so a
shape drift fails here. The Silero VAD is checked on its own first, on real speech."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import numpy as np
import pytest
from openai.types.beta.realtime import RealtimeServerEvent as BetaServerEvent
from openai.types.realtime import RealtimeServerEvent
from pydantic import TypeAdapter
from websockets.exceptions import InvalidStatus
from websockets.sync.client import ClientConnection, connect

from omnipipe.server.vad import MODEL_RATE_HZ, SileroVAD
from omnipipe.util.audio import resample
from tests.server.conftest import ServerProcess, engines_idle, spoken

RECV_TIMEOUT_S = 120
RATE = 24_000
# the toy thinker copies its prompt one character per 2 ms step: about 1000 characters last seconds
LONG_TEXT = " ".join(f"word{i}" for i in range(150))
SENTENCE = "Please tell me what the weather will be like tomorrow afternoon."
GA_EVENT = TypeAdapter(RealtimeServerEvent)
BETA_EVENT = TypeAdapter(BetaServerEvent)
EXTENSIONS = {"session.paused", "session.resumed", "session.idle_warning"}
BETA_HEADERS = {"OpenAI-Beta": "realtime=v1"}


# ---------------------------------------------------------------------------------------------- helpers
def ws_url(server: ServerProcess) -> str:
    return server.url.replace("http://", "ws://") + "/v1/realtime"


class Conn:
    """A realtime connection that checks every server event against the openai package's types."""

    def __init__(self, ws: ClientConnection, beta: bool) -> None:
        self.ws, self.beta = ws, beta

    def send(self, type_: str, **fields: Any) -> None:
        self.ws.send(json.dumps({"type": type_, **fields}))

    def recv(self) -> dict[str, Any]:
        event = json.loads(self.ws.recv(timeout=RECV_TIMEOUT_S))
        assert isinstance(event.get("event_id"), str) and event["event_id"], event
        if event["type"] not in EXTENSIONS:
            checked = event
            if self.beta and isinstance(event.get("session"), dict):
                # the beta schema lists OpenAI's model names as the only valid ones (the client does not check)
                checked = {**event, "session": {**event["session"], "model": "gpt-4o-realtime-preview"}}
            (BETA_EVENT if self.beta else GA_EVENT).validate_python(checked)  # raises on a shape openai would reject
        return event

    def until(self, *types: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Read events until one of ``types``; return the ones before it and it."""
        seen = []
        while True:
            event = self.recv()
            if event["type"] in types:
                return seen, event
            seen.append(event)

    def update(self, **session: Any) -> dict[str, Any]:
        """A session.update in this connection's dialect (GA: ``type`` added); the session.updated or error."""
        self.send("session.update", session=session if self.beta else {"type": "realtime", **session})
        _, answer = self.until("session.updated", "error")
        return answer

    def no_vad(self, **session: Any) -> dict[str, Any]:
        if self.beta:
            updated = self.update(turn_detection=None, **session)
        else:
            audio = session.pop("audio", {})
            audio = {**audio, "input": {**audio.get("input", {}), "turn_detection": None}}
            updated = self.update(audio=audio, **session)
        assert updated["type"] == "session.updated", updated
        return updated

    def user_text(self, text: str) -> dict[str, Any]:
        self.send("conversation.item.create",
                  item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})
        _, added = self.until("conversation.item.created" if self.beta else "conversation.item.added", "error")
        return added

    def append(self, audio: np.ndarray, step: int = RATE // 10) -> None:
        for start in range(0, len(audio), step):  # 100 ms appends, as a microphone would send
            self.send("input_audio_buffer.append", audio=pcm16_b64(audio[start:start + step]))


@contextmanager
def session(server: ServerProcess, headers: dict[str, str] | None = None, beta: bool = False,
            subprotocols: list[str] | None = None) -> Iterator[Conn]:
    headers = {**(server.headers if headers is None else headers), **(BETA_HEADERS if beta else {})}
    with connect(ws_url(server), additional_headers=headers, max_size=None, open_timeout=60,
                 subprotocols=subprotocols) as ws:  # type: ignore[arg-type]
        conn = Conn(ws, beta or bool(subprotocols and "openai-beta.realtime-v1" in subprotocols))
        created = conn.recv()
        assert created["type"] == "session.created", created
        yield conn


def of(events: list[dict[str, Any]], type_: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == type_]


def pcm16_b64(samples: np.ndarray) -> str:
    return base64.b64encode((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()).decode()


def tone(seconds: float, amplitude: float = 0.5) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    return (amplitude * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * RATE), dtype=np.float32)


# ---------------------------------------------------------------------------------------------- the VAD alone
def test_silero_vad_hears_speech_and_not_tones_noise_or_silence() -> None:
    """The VAD is fed the session's 16 kHz stream (the input's 24 kHz resampled once)."""
    speech = resample(spoken(SENTENCE), RATE, MODEL_RATE_HZ)
    vad = SileroVAD(threshold=0.5, silence_duration_ms=500, prefix_padding_ms=0)
    noise = (0.1 * np.random.default_rng(0).standard_normal(MODEL_RATE_HZ)).astype(np.float32)
    quiet = resample(np.concatenate([silence(1), tone(1), silence(0.5)]), RATE, MODEL_RATE_HZ)
    assert vad.feed(np.concatenate([quiet, noise, np.zeros(MODEL_RATE_HZ, np.float32)])) == []
    vad.reset()
    audio = np.concatenate([np.zeros(MODEL_RATE_HZ, np.float32), speech, np.zeros(MODEL_RATE_HZ, np.float32)])
    events = vad.feed(audio)
    assert [e.kind for e in events] == ["speech_started", "speech_stopped"]
    speech_ms = len(speech) * 1000 / MODEL_RATE_HZ
    assert abs(events[0].audio_ms - 1000) < 300, events  # where the speech starts (its first word)
    assert abs(events[1].audio_ms - (1000 + speech_ms)) < 400, events
    # the same audio in small appends gives the same events; prefix padding moves the start earlier
    padded = SileroVAD(threshold=0.5, silence_duration_ms=500, prefix_padding_ms=300)
    pieces = [e for start in range(0, len(audio), 320) for e in padded.feed(audio[start:start + 320])]
    assert [e.kind for e in pieces] == ["speech_started", "speech_stopped"]
    assert pieces[0].audio_ms == max(0, events[0].audio_ms - 300)
    # OpenAI's threshold meaning: a probability; 1.0 hears nothing of ordinary speech
    assert SileroVAD(threshold=1.0).feed(audio) == []


# ---------------------------------------------------------------------------------------------- toy server, GA
def test_ga_session_is_openai_shaped_and_every_field_is_validated(toy_server: ServerProcess) -> None:
    with session(toy_server) as conn:
        updated = conn.no_vad(output_modalities=["text"], instructions="",
                              audio={"output": {"voice": {"id": "alloy"}}, "input": {"turn_detection": None}})
        assert updated["session"]["type"] == "realtime"
        assert updated["session"]["output_modalities"] == ["text"]
        assert updated["session"]["audio"]["input"]["turn_detection"] is None
        assert updated["session"]["audio"]["output"]["voice"] == "alloy"
        assert updated["session"]["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
        vad = {"type": "server_vad", "threshold": 0.7, "silence_duration_ms": 300}
        updated = conn.update(audio={"input": {"turn_detection": vad}})
        detection = updated["session"]["audio"]["input"]["turn_detection"]
        assert (detection["threshold"], detection["silence_duration_ms"], detection["prefix_padding_ms"]) == \
            (0.7, 300, 300)
        assert updated["session"]["output_modalities"] == ["text"]  # fields not given keep their values
        for bad, param in (
                ({"instructions": "be brief"}, "session.instructions"),  # the toy family takes no instructions
                ({"audio": {"input": {"format": {"type": "audio/pcmu"}}}}, "session.audio.input.format.type"),
                ({"audio": {"output": {"format": {"type": "audio/pcm", "rate": 16000}}}},
                 "session.audio.output.format.rate"),
                ({"output_modalities": ["video"]}, "session.output_modalities[0]"),
                ({"output_modalities": ["text", "audio"]}, "session.output_modalities"),
                ({"audio": {"output": {"voice": "nobody"}}}, "session.audio.output.voice"),
                ({"audio": {"output": {"speed": 3}}}, "session.audio.output.speed"),
                ({"audio": {"input": {"turn_detection": {"type": "near_vad"}}}},
                 "session.audio.input.turn_detection.type"),
                ({"audio": {"input": {"turn_detection": {"type": "server_vad", "threshold": 2}}}},
                 "session.audio.input.turn_detection.threshold"),
                ({"audio": {"input": {"turn_detection": {"type": "server_vad", "idle_timeout_ms": 10}}}},
                 "session.audio.input.turn_detection.idle_timeout_ms"),
                ({"audio": {"input": {"turn_detection": {"type": "semantic_vad", "idle_timeout_ms": 5000}}}},
                 "session.audio.input.turn_detection"),
                ({"audio": {"input": {"noise_reduction": {"type": "studio"}}}},
                 "session.audio.input.noise_reduction.type"),
                ({"prompt": {"id": "pmpt_1"}}, "session.prompt"),  # no stored prompts
                ({"max_output_tokens": 0}, "session.max_output_tokens"),
                ({"tools": [{"type": "function", "name": "f"}]}, "session.tools"),
                ({"temperature": 0.5}, "session.temperature"),  # a beta field: GA has none
                ({"modalities": ["text"]}, "session.modalities"),
                ({"model": "gpt-4o-realtime-preview"}, "model"),
                # the toy pipeline has no transcription pipeline to transcribe with
                ({"audio": {"input": {"transcription": {"model": "whisper-1"}}}},
                 "session.audio.input.transcription")):
            conn.send("session.update", session={"type": "realtime", **bad}, event_id="client-1")
            _, error = conn.until("error", "session.updated")
            assert error["type"] == "error", (bad, error)
            assert error["error"]["param"] == param and error["error"]["event_id"] == "client-1", (bad, error)
        conn.send("session.update", session={"output_modalities": ["text"]})  # GA needs the session's type
        _, error = conn.until("error", "session.updated")
        assert error["error"]["param"] == "session.type", error


def lifecycle(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events if not e["type"].endswith(".delta")]


def test_ga_text_turn_has_openai_events_in_order(toy_server: ServerProcess) -> None:
    with session(toy_server) as conn:
        conn.no_vad()
        added = conn.user_text("hello realtime")
        assert added["item"]["role"] == "user" and added["item"]["content"][0]["text"] == "hello realtime"
        _, done = conn.until("conversation.item.done")
        assert done["item"]["id"] == added["item"]["id"]
        conn.send("response.create")
        events, done = conn.until("response.done")
        assert done["response"]["status"] == "completed", done
        assert done["response"]["usage"]["output_tokens"] > 0 and done["response"]["usage"]["input_tokens"] > 0
        assert lifecycle(events) == [
            "response.created", "response.output_item.added", "conversation.item.added",
            "response.content_part.added", "response.output_audio.done", "response.output_audio_transcript.done",
            "response.content_part.done", "response.output_item.done", "conversation.item.done"]
        deltas = of(events, "response.output_audio_transcript.delta")
        assert "".join(d["delta"] for d in deltas) == "HELLO REALTIME"
        assert of(events, "response.output_audio_transcript.done")[0]["transcript"] == "HELLO REALTIME"
        audio = b"".join(base64.b64decode(d["delta"]) for d in of(events, "response.output_audio.delta"))
        assert len(audio) > 0 and len(audio) % 2 == 0
        item = done["response"]["output"][0]
        assert item["role"] == "assistant" and item["status"] == "completed"
        assert item["content"] == [{"type": "output_audio", "transcript": "HELLO REALTIME"}]
        assert done["response"]["output_modalities"] == ["audio"]
        # a second turn on the same connection, text only
        conn.user_text("again")
        conn.send("response.create", response={"output_modalities": ["text"]})
        events, done = conn.until("response.done")
        assert done["response"]["status"] == "completed"
        assert "".join(d["delta"] for d in of(events, "response.output_text.delta")) == "AGAIN"
        assert not of(events, "response.output_audio.delta")
        assert of(events, "response.output_text.done")[0]["text"] == "AGAIN"
        assert done["response"]["output"][0]["content"] == [{"type": "output_text", "text": "AGAIN"}]


def test_beta_dialect_by_header_and_by_subprotocol(toy_server: ServerProcess) -> None:
    for kwargs in ({"beta": True}, {"subprotocols": ["openai-beta.realtime-v1"]}):
        with session(toy_server, **kwargs) as conn:  # type: ignore[arg-type]
            updated = conn.no_vad(modalities=["text", "audio"], voice="default")
            assert updated["session"]["modalities"] == ["text", "audio"]
            assert updated["session"]["turn_detection"] is None
            conn.send("session.update", session={"type": "realtime"})  # a GA field is unknown in beta
            _, error = conn.until("error", "session.updated")
            assert error["error"]["param"] == "session.type", error
            added = conn.user_text("hello beta")
            assert added["type"] == "conversation.item.created"
            conn.send("response.create")
            events, done = conn.until("response.done")
            assert done["response"]["status"] == "completed", done
            assert "".join(d["delta"] for d in of(events, "response.audio_transcript.delta")) == "HELLO BETA"
            assert of(events, "response.audio.delta") and of(events, "response.audio.done")
            assert not [e for e in events if "output_audio" in e["type"] or e["type"] == "conversation.item.done"]
            assert done["response"]["output"][0]["content"] == [{"type": "audio", "transcript": "HELLO BETA"}]
            assert done["response"]["modalities"] == ["text", "audio"]


def test_a_browser_offering_the_realtime_subprotocol_gets_ga(toy_server: ServerProcess) -> None:
    with session(toy_server, subprotocols=["realtime"]) as conn:
        assert conn.ws.subprotocol == "realtime"
        assert conn.no_vad()["session"]["type"] == "realtime"


def test_malformed_events_get_errors_and_the_session_keeps_working(toy_server: ServerProcess) -> None:
    cases: list[tuple[str, str | None]] = [
        ("not json", "invalid_json"),
        ("[" * 100_000 + "]" * 100_000, "invalid_json"),  # json.loads raised RecursionError: the socket died
        ("[1, 2]", "invalid_event"),
        (json.dumps({"no": "type"}), "missing_field"),
        (json.dumps({"type": "no.such.event"}), "invalid_event_type"),
        (json.dumps({"type": "input_audio_buffer.append"}), "missing_field"),
        (json.dumps({"type": "input_audio_buffer.append", "audio": "***not base64***"}), "invalid_base64"),
        (json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(b"abc").decode()}),
         "invalid_audio"),
        (json.dumps({"type": "input_audio_buffer.append", "audio": "", "extra": 1}), "unknown_parameter"),
        (json.dumps({"type": "input_audio_buffer.commit"}), "input_audio_buffer_commit_empty"),
        (json.dumps({"type": "conversation.item.create"}), "missing_field"),
        (json.dumps({"type": "conversation.item.create", "item": {"type": "message", "role": "assistant",
                                                                  "content": [{"type": "output_text",
                                                                               "text": "hi"}]}}),
         "unsupported_item"),  # the toy family answers one question at a time
        (json.dumps({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                                                                  "content": [{"type": "input_text"}]}}),
         "invalid_value"),
        (json.dumps({"type": "conversation.item.create", "previous_item_id": "item_nowhere",
                     "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "x"}]}}),
         "unsupported_parameter"),
        (json.dumps({"type": "conversation.item.truncate", "item_id": "item_nowhere", "content_index": 0,
                     "audio_end_ms": 10}), "item_not_found"),
        (json.dumps({"type": "response.create"}), "no_input"),
        (json.dumps({"type": "response.create", "response": {"tools": []}}), "unknown_parameter"),
        (json.dumps({"type": "response.cancel"}), "response_cancel_not_active"),
        (json.dumps({"type": "session.update", "session": "nope"}), "invalid_value"),
    ]
    with session(toy_server) as conn:
        conn.no_vad()
        for text, code in cases:
            conn.ws.send(text)
            event = conn.recv()
            assert event["type"] == "error", (text, event)
            assert event["error"]["code"] == code, (text, event)
            assert event["error"]["type"] == "invalid_request_error" and event["error"]["message"]
        conn.ws.send(b"\x00binary")
        assert conn.recv()["type"] == "error"
        # committed audio on a text-only pipeline is refused, and clearing the buffer works
        conn.send("input_audio_buffer.append", audio=pcm16_b64(tone(0.1)))
        conn.send("input_audio_buffer.commit")
        assert conn.recv()["error"]["code"] == "unsupported_modality"
        conn.send("input_audio_buffer.clear")
        assert conn.recv()["type"] == "input_audio_buffer.cleared"
        # still a working session
        conn.user_text("still fine")
        conn.send("response.create")
        events, done = conn.until("response.done")
        assert done["response"]["status"] == "completed"
        assert "".join(d["delta"] for d in of(events, "response.output_audio_transcript.delta")) == "STILL FINE"


def test_items_can_be_retrieved_and_deleted(toy_server: ServerProcess) -> None:
    with session(toy_server) as conn:
        conn.no_vad()
        first = conn.user_text("first")["item"]["id"]
        second = conn.user_text("second")["item"]["id"]
        conn.send("conversation.item.retrieve", item_id=first)
        _, retrieved = conn.until("conversation.item.retrieved")
        assert retrieved["item"]["content"] == [{"type": "input_text", "text": "first"}]
        conn.send("conversation.item.delete", item_id=first)
        _, deleted = conn.until("conversation.item.deleted")
        assert deleted["item_id"] == first
        conn.send("response.create")  # only what is left is answered
        events, done = conn.until("response.done")
        assert "".join(d["delta"] for d in of(events, "response.output_audio_transcript.delta")) == "SECOND"
        conn.send("conversation.item.retrieve", item_id=first)
        assert conn.until("error")[1]["error"]["code"] == "item_not_found"
        conn.send("conversation.item.retrieve", item_id=second)
        assert conn.until("conversation.item.retrieved")[1]["item"]["id"] == second


def test_response_cancel_mid_stream_ends_cancelled_and_leaves_nothing(toy_server: ServerProcess) -> None:
    with session(toy_server) as conn:
        conn.no_vad()
        conn.user_text(LONG_TEXT)
        conn.send("response.create")
        _, first = conn.until("response.output_audio_transcript.delta", "response.output_audio.delta")
        conn.send("response.cancel")
        events, done = conn.until("response.done")
        assert done["response"]["status"] == "cancelled", done
        assert done["response"]["status_details"]["reason"] == "client_cancelled", done
        assert done["response"]["id"] == first["response_id"]
        assert done["response"]["output"][0]["status"] == "incomplete"
        assert of(events, "response.output_item.done") and of(events, "response.content_part.done")
        assert not of(events, "error")
        transcript = "".join(d["delta"] for d in of(events, "response.output_audio_transcript.delta"))
        assert len(transcript) < len(LONG_TEXT)
        state = toy_server.wait_idle(timeout_s=30)
        assert engines_idle(state), state
        # the next response on the same session runs normally
        conn.user_text("after cancel")
        conn.send("response.create")
        _, done = conn.until("response.done")
        assert done["response"]["status"] == "completed"


def vad_on(conn: Conn, **knobs: Any) -> None:
    detection = {"type": "server_vad", "silence_duration_ms": 500, **knobs}
    answer = conn.update(turn_detection=detection) if conn.beta else \
        conn.update(audio={"input": {"turn_detection": detection}})
    assert answer["type"] == "session.updated", answer


@pytest.mark.parametrize("beta", [False, True], ids=["ga", "beta"])
def test_barge_in_on_speech_cancels_the_running_response(toy_server: ServerProcess, beta: bool) -> None:
    speech = spoken(SENTENCE)
    with session(toy_server, beta=beta) as conn:
        vad_on(conn)
        conn.user_text(LONG_TEXT)
        conn.send("response.create")
        conn.until("response.audio_transcript.delta" if beta else "response.output_audio_transcript.delta")
        # a loud tone and noise are not speech; speech is (no trailing silence, so no commit)
        conn.append(np.concatenate([silence(0.3), tone(0.5), silence(0.3), speech]))
        events, done = conn.until("response.done")
        assert done["response"]["status"] == "cancelled", done
        assert done["response"]["status_details"]["reason"] == "turn_detected", done
        started = of(events, "input_audio_buffer.speech_started")
        assert len(started) == 1 and started[0]["audio_start_ms"] >= 1100 - 300 - 200, started
        assert engines_idle(toy_server.wait_idle(timeout_s=30))
        conn.send("input_audio_buffer.clear")
        _, cleared = conn.until("input_audio_buffer.cleared")
        assert cleared["type"] == "input_audio_buffer.cleared"


def test_speech_does_not_interrupt_when_interrupt_response_is_off(toy_server: ServerProcess) -> None:
    with session(toy_server) as conn:
        vad_on(conn, interrupt_response=False, create_response=False)
        conn.user_text(" ".join(f"word{i}" for i in range(60)))
        conn.send("response.create")
        conn.until("response.output_audio_transcript.delta")
        conn.append(spoken(SENTENCE))
        events, done = conn.until("response.done")
        assert done["response"]["status"] == "completed", done
        assert of(events, "input_audio_buffer.speech_started")


@pytest.mark.models
def test_idle_timeout_commits_the_silence_after_the_answer_played_and_answers_it(
        default_server: ServerProcess) -> None:
    """Server VAD's idle_timeout_ms counts the audio appended from where the answer's audio will have played out
    (here the silence comes faster than real time, so the count starts past the audio still playing)."""
    with session(default_server) as conn:
        vad_on(conn, idle_timeout_ms=1000)
        assert conn.update(max_output_tokens=12)["type"] == "session.updated"
        shown = conn.update(audio={"input": {"turn_detection": {"type": "server_vad"}}})
        assert shown["session"]["audio"]["input"]["turn_detection"]["idle_timeout_ms"] == 1000  # kept
        conn.user_text("hello there")
        conn.send("response.create")
        _, first = conn.until("response.done")
        assert first["response"]["status"] == "completed", first
        for _ in range(60):  # 6 s of silence, 100 ms at a time
            conn.append(silence(0.1))
        events, done = conn.until("response.done")
        triggered = of(events, "input_audio_buffer.timeout_triggered")
        assert len(triggered) == 1, [e["type"] for e in events]
        waited_ms = triggered[0]["audio_end_ms"] - triggered[0]["audio_start_ms"]
        assert 1000 <= waited_ms < 1000 + 150, triggered  # not sooner, and at the first chunk past it
        kinds = [e["type"] for e in events]
        assert kinds.index("input_audio_buffer.timeout_triggered") < kinds.index("input_audio_buffer.committed") \
            < kinds.index("response.created"), kinds
        committed = of(events, "input_audio_buffer.committed")[0]
        assert committed["item_id"] == triggered[0]["item_id"]
        assert done["response"]["status"] == "completed", done
        nudge = "".join(d["delta"] for d in of(events, "response.output_audio_transcript.delta"))
        print(f"the answer to the silence: {nudge!r}")
        assert nudge.strip()  # the model spoke up
        assert not of(events, "input_audio_buffer.speech_started")
        off = conn.update(audio={"input": {"turn_detection": {"type": "server_vad", "idle_timeout_ms": None}}})
        assert off["session"]["audio"]["input"]["turn_detection"]["idle_timeout_ms"] is None
    assert engines_idle(default_server.wait_idle(timeout_s=60))


def test_disconnect_mid_response_aborts_it(toy_server: ServerProcess) -> None:
    with session(toy_server) as conn:
        conn.no_vad()
        conn.user_text(LONG_TEXT)
        conn.send("response.create")
        conn.until("response.output_audio_transcript.delta", "response.output_audio.delta")
    state = toy_server.wait_idle(timeout_s=30)
    assert engines_idle(state), state


def test_api_key_is_required_in_the_header(toy_server: ServerProcess) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        with pytest.raises(InvalidStatus) as info, connect(ws_url(toy_server), additional_headers=headers,
                                                           open_timeout=30):
            pass
        assert info.value.response.status_code == 403
    with session(toy_server) as conn:
        conn.no_vad()


def test_the_openai_client_ga_and_beta_get_typed_events(toy_server: ServerProcess) -> None:
    import openai
    from openai.types.realtime import ResponseAudioTranscriptDeltaEvent, ResponseDoneEvent

    client = openai.OpenAI(base_url=f"{toy_server.url}/v1", api_key="test-key",
                           websocket_base_url=toy_server.url.replace("http://", "ws://") + "/v1")
    with client.realtime.connect(model="toy") as conn:
        assert conn.recv().type == "session.created"
        conn.session.update(session={"type": "realtime", "output_modalities": ["audio"],
                                     "audio": {"input": {"turn_detection": None}}})
        conn.conversation.item.create(item={"type": "message", "role": "user",
                                            "content": [{"type": "input_text", "text": "typed events"}]})
        conn.response.create()
        words, done = [], None
        for event in conn:
            if isinstance(event, ResponseAudioTranscriptDeltaEvent):
                words.append(event.delta)
            elif isinstance(event, ResponseDoneEvent):
                done = event
                break
        assert "".join(words) == "TYPED EVENTS"
        assert done is not None and done.response.status == "completed"
    with client.beta.realtime.connect(model="toy") as beta:
        from openai.types.beta.realtime import ResponseAudioTranscriptDeltaEvent as BetaDelta
        from openai.types.beta.realtime import ResponseDoneEvent as BetaDone

        assert beta.recv().type == "session.created"
        beta.session.update(session={"turn_detection": None})  # type: ignore[typeddict-item]
        beta.conversation.item.create(item={"type": "message", "role": "user",
                                            "content": [{"type": "input_text", "text": "beta events"}]})
        beta.response.create()
        words = []
        for event in beta:
            if isinstance(event, BetaDelta):
                words.append(event.delta)
            elif isinstance(event, BetaDone):
                assert event.response.status == "completed"
                break
        assert "".join(words) == "BETA EVENTS"


# ---------------------------------------------------------------------------------------------- default server
QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def spoken_question(default_server: ServerProcess) -> np.ndarray:
    """QUESTION read aloud by the server's own speech endpoint as 24 kHz pcm16."""
    response = httpx.post(f"{default_server.url}/v1/audio/speech", headers=default_server.headers, timeout=300,
                          json={"model": "tts", "input": QUESTION, "voice": "default", "response_format": "pcm"})
    assert response.status_code == 200, response.text
    return np.frombuffer(response.content, dtype="<i2").astype(np.float32) / 32768.0


@pytest.mark.models
@pytest.mark.parametrize("beta", [False, True], ids=["ga", "beta"])
def test_spoken_turn_with_server_vad_on_the_default_pipeline(default_server: ServerProcess,
                                                             spoken_question: np.ndarray, beta: bool) -> None:
    with session(default_server, beta=beta) as conn:
        vad_on(conn)
        transcription = {"model": "whisper-1"}
        answer = conn.update(input_audio_transcription=transcription, max_response_output_tokens=30) if beta else \
            conn.update(audio={"input": {"transcription": transcription}}, max_output_tokens=30)
        assert answer["type"] == "session.updated", answer
        conn.append(np.concatenate([silence(0.5), spoken_question, silence(1.0)]))
        events, done = conn.until("response.done")
        assert done["response"]["status"] == "completed", (done, of(events, "error"))
        kinds = [e["type"] for e in events]
        for expected in ("input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
                         "input_audio_buffer.committed", "response.created"):
            assert expected in kinds, kinds
        prefix = "response.audio" if beta else "response.output_audio"
        transcript = "".join(d["delta"] for d in of(events, f"{prefix}_transcript.delta"))
        assert transcript.strip()
        audio = b"".join(base64.b64decode(d["delta"]) for d in of(events, f"{prefix}.delta"))
        assert len(audio) > 0.3 * RATE * 2  # more than 0.3 s of 24 kHz speech
        heard = of(events, "conversation.item.input_audio_transcription.completed")
        if not heard:
            _, heard_event = conn.until("conversation.item.input_audio_transcription.completed")
            heard = [heard_event]
        assert "capital" in heard[0]["transcript"].lower() and "france" in heard[0]["transcript"].lower(), heard
    assert engines_idle(default_server.wait_idle(timeout_s=60))


@pytest.mark.models
def test_barge_in_then_truncate_keeps_only_what_was_heard(default_server: ServerProcess,
                                                          spoken_question: np.ndarray) -> None:
    with session(default_server) as conn:
        vad_on(conn, silence_duration_ms=60_000)
        conn.user_text("Tell me a long story about a dragon who lived in a castle.")
        conn.send("response.create")
        _, first = conn.until("response.output_audio.delta", "response.done")
        assert first["type"] != "response.done", first
        conn.append(spoken_question)
        events, done = conn.until("response.done")
        assert of(events, "input_audio_buffer.speech_started")
        assert done["response"]["status"] == "cancelled", done
        item = done["response"]["output"][0]
        said = item["content"][0]["transcript"]
        assert said.strip(), done
        conn.send("conversation.item.truncate", item_id=item["id"], content_index=0, audio_end_ms=0)
        _, truncated = conn.until("conversation.item.truncated", "error")
        assert truncated["type"] == "conversation.item.truncated", truncated
        conn.send("conversation.item.retrieve", item_id=item["id"])
        _, retrieved = conn.until("conversation.item.retrieved")
        assert retrieved["item"]["content"][0]["transcript"] == ""  # nothing was heard
        conn.send("conversation.item.truncate", item_id=item["id"], content_index=0, audio_end_ms=10_000_000)
        assert conn.until("error")[1]["error"]["param"] == "audio_end_ms"
    assert engines_idle(default_server.wait_idle(timeout_s=60))


@pytest.mark.models
@pytest.mark.parametrize("beta", [False, True], ids=["ga", "beta"])
def test_the_openai_client_drives_a_spoken_turn(default_server: ServerProcess, spoken_question: np.ndarray,
                                                beta: bool) -> None:
    """``client.realtime.connect`` (GA) and ``client.beta.realtime.connect``: a spoken question in, typed audio
    and transcript events out."""
    import openai
    from openai.types import realtime as ga
    from openai.types.beta import realtime as old

    types = old if beta else ga
    client = openai.OpenAI(base_url=f"{default_server.url}/v1", api_key="test-key",
                           websocket_base_url=default_server.url.replace("http://", "ws://") + "/v1")
    connect_to = client.beta.realtime.connect if beta else client.realtime.connect
    with connect_to(model="default") as conn:
        assert conn.recv().type == "session.created"
        if beta:
            conn.session.update(session={"turn_detection": None, "max_response_output_tokens": 30})  # type: ignore[typeddict-item]
        else:
            conn.session.update(session={"type": "realtime", "max_output_tokens": 30,
                                         "audio": {"input": {"turn_detection": None}}})
        pcm = (np.clip(spoken_question, -1, 1) * 32767).astype("<i2").tobytes()
        conn.input_audio_buffer.append(audio=base64.b64encode(pcm).decode())
        conn.input_audio_buffer.commit()
        conn.response.create()
        words, audio, done = [], b"", None
        for event in conn:
            if isinstance(event, types.ResponseAudioTranscriptDeltaEvent):
                words.append(event.delta)
            elif isinstance(event, types.ResponseAudioDeltaEvent):
                audio += base64.b64decode(event.delta)
            elif isinstance(event, types.ResponseDoneEvent):
                done = event
                break
            else:
                assert event.type != "error", event
        assert done is not None and done.response.status == "completed", done
        assert "".join(words).strip() and len(audio) > 0.3 * RATE * 2

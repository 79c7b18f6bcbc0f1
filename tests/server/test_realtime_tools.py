"""Function calls in ``WS /v1/realtime`` on the default pipeline: the session's tools and tool choice, the model's
call as a ``function_call`` output item (its arguments streamed, never spoken), the client's
``function_call_output`` and the spoken answer that uses it; the OpenAI Agents SDK's ``RealtimeAgent`` with a
function tool and its default settings; bad tools, choices and outputs refused by name while the session goes on.

The Agents SDK names its own default model in ``session.update``; the server here serves that name as an alias
(``--served-model-name``), as a deployment for the SDK would."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import numpy as np
import pytest
from agents import function_tool
from agents.realtime import RealtimeAgent, RealtimeRunner
from agents.realtime.openai_realtime import DEFAULT_REALTIME_MODEL

from omnipipe.models.default.modeling.whisper import WhisperASR
from tests.server.conftest import DEFAULT_DEPLOY, ServerProcess, running_server
from tests.server.test_realtime import RATE, of, session, silence, ws_url
from tests.server.test_realtime_voice_turn import clip, stream

pytestmark = pytest.mark.models

QUESTION = "What is the weather in Paris?"
WEATHER = "It is 18 degrees and sunny in Paris"
TOOL = {"type": "function", "name": "get_weather", "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                       "additionalProperties": False}}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with running_server("default", DEFAULT_DEPLOY, tmp_path_factory.mktemp("realtime-tools"), 600,
                        extra_args=("--served-model-name", "default", DEFAULT_REALTIME_MODEL)) as server:
        yield server


@pytest.fixture(scope="module")
def asr() -> WhisperASR:
    return WhisperASR(num_threads=2)


def names(beta: bool) -> dict[str, str]:
    if beta:
        return {"added": "conversation.item.created", "audio": "response.audio.delta",
                "transcript": "response.audio_transcript.delta"}
    return {"added": "conversation.item.added", "audio": "response.output_audio.delta",
            "transcript": "response.output_audio_transcript.delta"}


def mentions_the_weather(text: str) -> bool:
    text = text.lower()
    return "18" in text or "eighteen" in text or "sunny" in text


@pytest.mark.parametrize("beta", [False, True], ids=["ga", "beta"])
def test_a_required_call_then_its_output_gives_a_spoken_answer(server: ServerProcess, beta: bool) -> None:
    event = names(beta)
    with session(server, beta=beta) as conn:
        updated = conn.no_vad(tools=[TOOL], tool_choice="required")["session"]
        assert updated["tools"] == [TOOL] and updated["tool_choice"] == "required"
        conn.user_text(QUESTION)
        conn.send("response.create", response={"modalities": ["text", "audio"]} if beta
                  else {"output_modalities": ["audio"]})
        events, done = conn.until("response.done")
        assert done["response"]["status"] == "completed", done
        [call] = done["response"]["output"]
        assert call["type"] == "function_call" and call["status"] == "completed" and call["name"] == "get_weather"
        arguments = json.loads(call["arguments"])
        jsonschema.validate(arguments, TOOL["parameters"])
        assert "paris" in arguments["city"].lower(), arguments
        # streamed as OpenAI streams it, and never spoken
        assert "".join(e["delta"] for e in of(events, "response.function_call_arguments.delta")) == \
            call["arguments"]
        [args_done] = of(events, "response.function_call_arguments.done")
        assert (args_done["call_id"], args_done["item_id"], args_done["arguments"]) == \
            (call["call_id"], call["id"], call["arguments"])
        assert [e["item"]["type"] for e in of(events, "response.output_item.added")] == ["function_call"]
        assert [e["item"]["status"] for e in of(events, "response.output_item.done")] == ["completed"]
        assert not of(events, event["audio"]) and not of(events, event["transcript"])
        assert not of(events, "response.content_part.added")

        conn.update(tool_choice="auto")  # "required" would make the model call again
        conn.send("conversation.item.create",
                  item={"type": "function_call_output", "call_id": call["call_id"], "output": WEATHER})
        _, added = conn.until(event["added"])
        assert added["item"]["type"] == "function_call_output" and added["item"]["call_id"] == call["call_id"]
        assert added["previous_item_id"] == call["id"]
        conn.send("response.create")
        events, done = conn.until("response.done")
        assert done["response"]["status"] == "completed", done
        [message] = done["response"]["output"]
        assert message["type"] == "message" and message["role"] == "assistant"
        transcript = "".join(e["delta"] for e in of(events, event["transcript"]))
        assert of(events, event["audio"]) and mentions_the_weather(transcript), transcript


def test_bad_tools_choices_and_outputs_are_refused_by_name(server: ServerProcess) -> None:
    with session(server) as conn:
        conn.no_vad()
        for bad, param in (
                ({"tools": [{"type": "function", "description": "no name"}]}, "session.tools[0].name"),
                ({"tools": [TOOL, TOOL]}, "session.tools[1].name"),
                ({"tools": [{**TOOL, "name": "get weather"}]}, "session.tools[0].name"),
                ({"tools": [{**TOOL, "parameters": {"type": "array"}}]}, "session.tools[0].parameters"),
                ({"tools": [{"type": "mcp", "name": "x"}]}, "session.tools[0].type"),
                ({"tools": [TOOL], "tool_choice": {"type": "function", "name": "get_time"}},
                 "session.tool_choice.name"),
                ({"tool_choice": "required"}, "session.tool_choice"),  # no tools yet
                ({"prompt": {"id": "pmpt_123"}}, "session.prompt")):
            conn.send("session.update", session={"type": "realtime", **bad}, event_id="bad")
            _, error = conn.until("error", "session.updated")
            assert error["type"] == "error" and error["error"]["param"] == param, (bad, error)
        # what the Agents SDK and other clients send by default is taken
        updated = conn.update(
            type="realtime", tools=[TOOL], tool_choice={"type": "function", "name": "get_weather"}, tracing="auto",
            include=["item.input_audio_transcription.logprobs"], truncation="auto", max_output_tokens="inf",
            audio={"input": {"noise_reduction": {"type": "near_field"},
                             "transcription": {"model": "gpt-4o-mini-transcribe"},
                             "turn_detection": {"type": "semantic_vad", "interrupt_response": True}},
                   "output": {"voice": "ash"}})
        assert updated["type"] == "session.updated", updated
        shown = updated["session"]
        assert shown["tool_choice"] == {"type": "function", "name": "get_weather"} and shown["tracing"] == "auto"
        assert shown["audio"]["input"]["turn_detection"]["type"] == "semantic_vad"
        assert shown["audio"]["input"]["noise_reduction"] == {"type": "near_field"}
        traced = conn.update(type="realtime", tracing={"workflow_name": "weather", "metadata": {"k": "v"}})
        assert traced["session"]["tracing"] == {"workflow_name": "weather", "metadata": {"k": "v"}}, traced
        for item, param in (
                ({"type": "function_call_output", "call_id": "call_nowhere", "output": "x"}, "item.call_id"),
                ({"type": "function_call_output", "call_id": "call_nowhere"}, "item.output"),
                ({"type": "function_call_output", "role": "user", "call_id": "c", "output": "x"}, "item.role"),
                ({"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "[1]"},
                 "item.arguments")):
            conn.send("conversation.item.create", item=item)
            _, error = conn.until("error", "conversation.item.added")
            assert error["type"] == "error" and error["error"]["param"] == param, (item, error)
        # the session goes on: the named function is called
        conn.user_text(QUESTION)
        conn.send("response.create", response={"output_modalities": ["text"]})
        _, done = conn.until("response.done")
        assert done["response"]["status"] == "completed", done
        assert [o["type"] for o in done["response"]["output"]] == ["function_call"]
        assert done["response"]["output"][0]["name"] == "get_weather"


def test_the_agents_sdk_calls_a_function_tool_and_speaks_its_value(server: ServerProcess, asr: WhisperASR) -> None:
    """A ``RealtimeAgent`` with a function tool and the SDK's default settings (semantic VAD, its default model
    and voice, ``tracing: "auto"``), a typed question: with ``tool_choice`` left at auto the model calls the tool
    with the city, the SDK runs it and sends its output, and the spoken answer carries the tool's value."""
    calls: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        calls.append(city)
        return WEATHER

    async def run() -> tuple[list[Any], list[dict[str, Any]]]:
        agent = RealtimeAgent(name="assistant", instructions="You are a helpful voice assistant.",
                              tools=[get_weather])
        runner = RealtimeRunner(agent)
        events: list[Any] = []
        raw: list[dict[str, Any]] = []
        live = await runner.run(model_config={"url": ws_url(server), "api_key": server.api_key})
        async with live:
            await live.send_message(QUESTION)
            answered = 0
            async for ev in live:
                events.append(ev)
                if ev.type == "raw_model_event" and ev.data.type == "raw_server_event":
                    raw.append(ev.data.data)
                if ev.type == "error":
                    raise AssertionError(f"the session sent an error: {ev.error}")
                if ev.type == "agent_end":  # a response done: the call's, then the answer's
                    answered += 1
                    called = any(e["type"] == "response.output_item.done" and e["item"]["type"] == "function_call"
                                 for e in raw)
                    if answered == 2 or not called:
                        break
        return events, raw

    events, raw = asyncio.run(asyncio.wait_for(run(), 600))
    assert calls and "paris" in calls[0].lower(), calls
    [tool_end] = [e for e in events if e.type == "tool_end"]
    assert tool_end.output == WEATHER
    [call_done] = [e for e in raw if e["type"] == "response.output_item.done"
                   and e["item"]["type"] == "function_call"]
    audio = [e for e in events if e.type == "audio"]
    assert audio, "no spoken answer"
    assert not [e for e in audio if e.audio.response_id == call_done["response_id"]]  # the call is never spoken
    assert not [e for e in raw if e["type"] == "response.output_audio.delta"
                and e["response_id"] == call_done["response_id"]]
    pcm = b"".join(e.audio.data for e in audio)
    samples = np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0
    heard = asr.transcribe(samples, RATE)
    assert mentions_the_weather(heard), heard
    assert not [e for e in raw if e["type"] == "error"]


def test_a_spoken_question_under_server_vad_gets_a_call_and_a_barge_in_cancels_the_answer(
        server: ServerProcess) -> None:
    """Under server VAD with the speculative start on, a spoken question gets the call (the answer started
    ahead was planned with the session's tools); the call's output answers it, and speech over that answer
    cancels it."""
    with session(server) as conn:
        updated = conn.update(type="realtime", tools=[TOOL], tool_choice="required")
        detection = updated["session"]["audio"]["input"]["turn_detection"]
        assert detection["type"] == "server_vad" and detection["speculative_start"], updated
        stream(conn, np.concatenate([clip(QUESTION), silence(1.5)]))
        events, done = conn.until("response.done")
        assert done["response"]["status"] == "completed", done
        [call] = done["response"]["output"]
        assert call["type"] == "function_call" and "paris" in json.loads(call["arguments"])["city"].lower(), call
        assert not of(events, "response.output_audio.delta")
        conn.update(type="realtime", tool_choice="auto")
        conn.send("conversation.item.create",
                  item={"type": "function_call_output", "call_id": call["call_id"], "output": WEATHER})
        conn.send("response.create")
        stream(conn, np.concatenate([clip("Stop, thank you."), silence(1.0)]))  # over the answer as it starts
        _, done = conn.until("response.done")
        assert done["response"]["status"] == "cancelled", done
        assert done["response"]["status_details"]["reason"] == "turn_detected"

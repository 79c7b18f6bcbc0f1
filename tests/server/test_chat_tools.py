"""Tool calls, structured output and logprobs in chat completions, on the real default thinker behind the server,
through the official ``openai`` client and the OpenAI Agents SDK (over chat completions and over its default, the
Responses API).

What the model decides with ``tool_choice: "auto"`` is its own (the packaged thinker calls a tool whenever one is
offered); these tests hold whatever it decides, and use ``required`` or a named function where they need a call.
The arguments of every call validate against their schema: the grammar makes them."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pytest

from tests.server.conftest import API_KEY, ServerProcess

pytestmark = pytest.mark.models

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city"],
}
TIME = {"type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"],
        "additionalProperties": False}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The current weather in a city",
                                      "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "description": "The current time in a timezone",
                                      "parameters": TIME}},
]
SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"colour": {"type": "string", "enum": ["red", "green", "blue"]},
                                      "sure": {"type": "boolean"}},
     "required": ["colour", "sure"], "additionalProperties": False},
    {"type": "object", "properties": {"planets": {"type": "array", "items": {"type": "string"}, "minItems": 2,
                                                  "maxItems": 4}},
     "required": ["planets"], "additionalProperties": False},
    {"type": "object", "properties": {"city": {"type": "object", "properties": {
        "name": {"type": "string"}, "country": {"type": "string"},
        "population": {"type": "integer", "minimum": 0}}, "required": ["name", "country", "population"],
        "additionalProperties": False}}, "required": ["city"], "additionalProperties": False},
]


@pytest.fixture(scope="module")
def client(default_server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{default_server.url}/v1", api_key=API_KEY, max_retries=0, timeout=300)


def _ask(client: openai.OpenAI, question: str, **kwargs: Any) -> Any:
    kwargs = {"temperature": 0, "max_tokens": 60, **kwargs}
    return client.chat.completions.create(model="default", messages=[{"role": "user", "content": question}],
                                          **kwargs)


def test_a_required_call_has_arguments_that_validate(client: openai.OpenAI) -> None:
    for question, choice in [("What's the weather like in Berlin?", "required"),
                             ("Tell me something.", {"type": "function", "function": {"name": "get_time"}})]:
        choice_: Any = choice
        completion = _ask(client, question, tools=TOOLS, tool_choice=choice_)
        choice_out = completion.choices[0]
        assert choice_out.finish_reason == "tool_calls"
        assert choice_out.message.content is None
        calls = choice_out.message.tool_calls
        assert calls and all(call.id.startswith("call_") for call in calls)
        for call in calls:
            schema = WEATHER if call.function.name == "get_weather" else TIME
            jsonschema.validate(json.loads(call.function.arguments), schema)
        if isinstance(choice, dict):
            assert [call.function.name for call in calls] == ["get_time"]
        else:
            assert calls[0].function.name == "get_weather"
            assert "berlin" in json.loads(calls[0].function.arguments)["city"].lower()


def test_streamed_tool_call_deltas_reassemble_into_the_whole_call(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = {"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False}
    whole = _ask(client, "What's the weather in Oslo?", **kwargs).choices[0].message.tool_calls
    assert whole is not None and len(whole) == 1
    calls: dict[int, dict[str, str]] = {}
    finish = None
    pieces = 0
    for chunk in _ask(client, "What's the weather in Oslo?", stream=True, **kwargs):
        if not chunk.choices:
            continue
        finish = chunk.choices[0].finish_reason or finish
        for delta in chunk.choices[0].delta.tool_calls or []:
            pieces += 1
            call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
            if delta.id:
                assert not call["id"], "a call's id comes once, with its first piece"
                call["id"] = delta.id
                assert delta.function is not None and delta.function.name
            if delta.function is not None:
                call["name"] += delta.function.name or ""
                call["arguments"] += delta.function.arguments or ""
    assert finish == "tool_calls"
    assert pieces > 2, "the arguments stream in pieces"
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == \
        [(whole[0].function.name, json.loads(whole[0].function.arguments))]


def test_the_answer_after_a_tool_result_uses_it_and_is_not_another_call(client: openai.OpenAI) -> None:
    question = {"role": "user", "content": "What's the weather in Paris?"}
    first = client.chat.completions.create(model="default", messages=[question], tools=TOOLS, tool_choice="required",
                                           temperature=0, max_tokens=60).choices[0].message
    assert first.tool_calls
    call = first.tool_calls[0]
    messages: list[Any] = [question, first.model_dump(exclude_none=True),
                           {"role": "tool", "tool_call_id": call.id, "content": "It is 18 degrees and sunny."}]
    answer = client.chat.completions.create(model="default", messages=messages, tools=TOOLS, temperature=0,
                                            max_tokens=60).choices[0]
    assert answer.finish_reason == "stop"
    assert answer.message.tool_calls is None
    assert "18" in (answer.message.content or "")


def test_a_call_turn_is_not_spoken_and_the_answer_after_it_is(client: openai.OpenAI) -> None:
    question = {"role": "user", "content": "What's the weather in Rome?"}
    call_turn = client.chat.completions.create(model="default", messages=[question], tools=TOOLS,
                                               tool_choice="required", modalities=["text", "audio"],
                                               audio={"voice": "default", "format": "wav"}, temperature=0,
                                               max_tokens=60).choices[0]
    assert call_turn.finish_reason == "tool_calls" and call_turn.message.tool_calls
    assert call_turn.message.audio is None, "a turn of calls has no audio"
    call = call_turn.message.tool_calls[0]
    answer = client.chat.completions.create(
        model="default", messages=[question, call_turn.message.model_dump(exclude_none=True),
                                   {"role": "tool", "tool_call_id": call.id, "content": "21 degrees, clear sky"}],
        tools=TOOLS, modalities=["text", "audio"], audio={"voice": "default", "format": "wav"}, temperature=0,
        max_tokens=60).choices[0]
    assert answer.message.audio is not None and answer.message.audio.data
    assert "21" in answer.message.audio.transcript


@pytest.mark.parametrize("schema", SCHEMAS, ids=["person", "enum", "array", "nested"])
def test_json_schema_output_validates(client: openai.OpenAI, schema: dict[str, Any]) -> None:
    completion = _ask(client, "Answer in JSON about something you know.", max_tokens=120,
                      response_format={"type": "json_schema",
                                       "json_schema": {"name": "answer", "schema": schema, "strict": True}})
    assert completion.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(completion.choices[0].message.content or ""), schema)


def test_json_object_output_is_an_object(client: openai.OpenAI) -> None:
    completion = _ask(client, "Describe Paris in JSON.", max_tokens=120, response_format={"type": "json_object"})
    assert isinstance(json.loads(completion.choices[0].message.content or ""), dict)


def test_logprobs_are_those_of_the_chosen_tokens(client: openai.OpenAI) -> None:
    completion = _ask(client, "What is the capital of France?", logprobs=True, top_logprobs=3)
    choice = completion.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content
    entries = choice.logprobs.content
    assert "".join(entry.token for entry in entries).strip() == (choice.message.content or "").strip()
    for entry in entries:  # greedy: the chosen token is the likeliest, and the top list is sorted
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].token == entry.token
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob)
        values = [top.logprob for top in entry.top_logprobs]
        assert values == sorted(values, reverse=True) and all(v <= 0 for v in values)
        assert bytes(entry.bytes or []).decode("utf-8", "replace") == entry.token
    streamed = [entry for chunk in _ask(client, "What is the capital of France?", logprobs=True, stream=True)
                if chunk.choices and chunk.choices[0].logprobs for entry in chunk.choices[0].logprobs.content or []]
    assert [e.token for e in streamed] == [e.token for e in entries]


def test_a_constrained_stream_cut_short_leaves_nothing_behind(client: openai.OpenAI,
                                                              default_server: ServerProcess) -> None:
    """A client that leaves mid-call aborts the request: the stage frees its grammar state and cache, and the next
    constrained request is whole and valid."""
    from tests.server.conftest import engines_idle

    stream = _ask(client, "What's the weather in Madrid?", tools=TOOLS, tool_choice="required", stream=True)
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.tool_calls and chunk.choices[0].delta.tool_calls[0].id is None:
            break  # the first argument piece
    stream.close()
    assert engines_idle(default_server.wait_idle()), default_server.debug_state()
    calls = _ask(client, "What's the weather in Madrid?", tools=TOOLS, tool_choice="required").choices[0]
    assert calls.message.tool_calls
    jsonschema.validate(json.loads(calls.message.tool_calls[0].function.arguments), WEATHER)


BAD = [
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools[0].function.name"),
    ({"tools": [TOOLS[0], TOOLS[0]]}, "tools[1].function.name"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_stock_price"}}},
     "tool_choice.function.name"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"type": "nope"}}}}}}, "response_format.json_schema.schema"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"$ref": "#/nope"}}}]},
     "tools[0].function.parameters"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
]


@pytest.mark.parametrize(("extra", "param"), BAD, ids=[param for _, param in BAD])
def test_bad_tools_and_formats_are_refused_by_name(client: openai.OpenAI, default_server: ServerProcess,
                                                   extra: dict[str, Any], param: str) -> None:
    response = default_server.client().post("/v1/chat/completions", json={
        "model": "default", "messages": [{"role": "user", "content": "Hi"}], **extra})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param, response.text
    assert _ask(client, "What is the capital of France?").choices[0].message.content


def test_a_tool_result_for_an_unknown_call_is_refused_by_name(default_server: ServerProcess) -> None:
    messages = [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                {"role": "tool", "tool_call_id": "call_2", "content": "sunny"}]
    response = default_server.client().post("/v1/chat/completions", json={
        "model": "default", "messages": messages, "tools": TOOLS})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "messages[2].tool_call_id"


def test_the_agents_sdk_runs_a_function_tool_over_chat_completions(default_server: ServerProcess) -> None:
    from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)  # nothing leaves this machine
    asked: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        asked.append(city)
        return f"It is 18 degrees and sunny in {city}."

    model = OpenAIChatCompletionsModel(model="default", openai_client=openai.AsyncOpenAI(
        base_url=f"{default_server.url}/v1", api_key=API_KEY, max_retries=0, timeout=300))
    agent = Agent(name="weather", instructions="You answer questions about the weather.", tools=[get_weather],
                  model=model)
    result = Runner.run_sync(agent, "What's the weather in Paris?", max_turns=4)
    assert [city.lower() for city in asked] == ["paris"]
    assert "18" in str(result.final_output)


def test_the_agents_sdk_runs_a_function_tool_over_the_responses_api(default_server: ServerProcess) -> None:
    """The SDK's default model class (the Responses API), changed in nothing but its client's base URL."""
    from agents import Agent, Runner, function_tool, set_default_openai_client, set_tracing_disabled

    set_tracing_disabled(True)
    set_default_openai_client(openai.AsyncOpenAI(base_url=f"{default_server.url}/v1", api_key=API_KEY,
                                                 max_retries=0, timeout=300), use_for_tracing=False)
    asked: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        asked.append(city)
        return f"It is 18 degrees and sunny in {city}."

    agent = Agent(name="weather", instructions="You answer questions about the weather.", tools=[get_weather],
                  model="default")
    result = Runner.run_sync(agent, "What's the weather in Paris?", max_turns=4)
    assert [city.lower() for city in asked] == ["paris"]
    assert "18" in str(result.final_output)

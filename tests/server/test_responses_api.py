"""OpenAI's Responses API (``POST /v1/responses``, ``GET`` / ``DELETE /v1/responses/{id}``) on a real ``omnipipe
serve`` of the default pipeline, through the ``openai`` package: a plain answer, function calls (whole and
streamed), a call's result sent back with ``previous_response_id``, structured output, the store, and bad input
refused by name with the server answering on."""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from tests.server.conftest import API_KEY, ServerProcess

pytestmark = pytest.mark.models

QUESTION = "What is the capital of France?"
WEATHER = {"type": "function", "name": "get_weather", "description": "The current weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                           "unit": {"type": "string", "enum": ["c", "f"]}},
                          "required": ["city"], "additionalProperties": False}}


@pytest.fixture(scope="module")
def client(default_server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{default_server.url}/v1", api_key=API_KEY, max_retries=0, timeout=300)


def _answers(client: openai.OpenAI) -> None:
    """The server still answers a plain question."""
    response = client.responses.create(model="default", input="Say hello.", max_output_tokens=8)
    assert response.status in ("completed", "incomplete")


def _calls(response: Any) -> list[Any]:
    return [item for item in response.output if item.type == "function_call"]


def test_a_plain_question_gets_a_message_answer(client: openai.OpenAI) -> None:
    response = client.responses.create(model="default", input=QUESTION, max_output_tokens=32, temperature=0)
    assert response.id.startswith("resp_")
    assert response.object == "response" and response.status == "completed"
    assert [item.type for item in response.output] == ["message"]
    message = response.output[0]
    assert message.role == "assistant" and message.status == "completed"
    assert message.content[0].type == "output_text"
    assert "paris" in response.output_text.lower(), response.output_text
    usage = response.usage
    assert usage is not None and usage.input_tokens > 0 and usage.output_tokens > 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    # the prefix cache holds at least the shared preamble, and never the prompt's last token
    assert 0 < usage.input_tokens_details.cached_tokens < usage.input_tokens
    assert usage.output_tokens_details.reasoning_tokens == 0
    assert response.max_output_tokens == 32 and response.temperature == 0 and response.store is True


def test_a_short_limit_makes_an_incomplete_response(client: openai.OpenAI) -> None:
    response = client.responses.create(model="default", input="Count from one to fifty in words.",
                                       max_output_tokens=3)
    assert response.status == "incomplete"
    assert response.incomplete_details is not None and response.incomplete_details.reason == "max_output_tokens"


def _weather_call(client: openai.OpenAI, **kwargs: Any) -> Any:
    response = client.responses.create(model="default", input="What is the weather like in Paris today?",
                                       tools=[WEATHER], tool_choice="required", temperature=0, **kwargs)
    calls = _calls(response)
    assert len(calls) >= 1, response.output
    call = calls[0]
    assert call.name == "get_weather" and call.call_id.startswith("call_") and call.id
    assert call.status == "completed"
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    return response


def test_a_required_tool_is_called_and_its_result_answered_with_previous_response_id(
        client: openai.OpenAI) -> None:
    response = _weather_call(client)
    assert response.tool_choice == "required"
    assert response.tools[0].name == "get_weather"
    outputs = [{"type": "function_call_output", "call_id": call.call_id, "output": json.dumps(
        {"city": "Paris", "temperature_c": 21, "sky": "sunny"})} for call in _calls(response)]
    follow_up = client.responses.create(model="default", previous_response_id=response.id, input=outputs,
                                        tools=[WEATHER], tool_choice="none", max_output_tokens=48, temperature=0)
    assert follow_up.previous_response_id == response.id
    assert [item.type for item in follow_up.output] == ["message"]
    assert follow_up.output_text.strip()
    # the conversation so far (the tools' system turn, the question and the call) came from the prefix cache
    assert follow_up.usage.input_tokens_details.cached_tokens >= response.usage.input_tokens // 16 * 16  # blocks


def test_a_named_function_is_called(client: openai.OpenAI) -> None:
    other = {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {
        "zone": {"type": "string"}}, "required": ["zone"]}}
    response = client.responses.create(model="default", input="What is the weather like in Paris today?",
                                       tools=[other, WEATHER], temperature=0,
                                       tool_choice={"type": "function", "name": "get_weather"})
    assert {call.name for call in _calls(response)} == {"get_weather"}


def test_a_streamed_call_comes_in_order_with_the_whole_answers_shape(client: openai.OpenAI) -> None:
    whole = _weather_call(client, store=False)
    events = list(client.responses.create(model="default", input="What is the weather like in Paris today?",
                                          tools=[WEATHER], tool_choice="required", temperature=0, stream=True))
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"], kinds
    assert kinds[-1] == "response.completed", kinds
    assert [event.sequence_number for event in events] == list(range(len(events)))
    added = kinds.index("response.output_item.added")
    assert kinds[added:][:2] == ["response.output_item.added", "response.function_call_arguments.delta"], kinds
    done = kinds.index("response.function_call_arguments.done")
    assert kinds[done + 1] == "response.output_item.done"
    assert all(k == "response.function_call_arguments.delta" for k in kinds[added + 1:done])
    final = events[-1].response
    streamed = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    calls = _calls(final)
    assert calls[0].arguments == streamed == events[done].arguments
    # the same shape as the whole answer (greedy: the same call), ids aside
    assert [(c.type, c.name, c.arguments, c.status) for c in calls] == \
        [(c.type, c.name, c.arguments, c.status) for c in _calls(whole)]
    jsonschema.validate(json.loads(streamed), WEATHER["parameters"])
    # a streamed response is stored like a whole one
    assert client.responses.retrieve(final.id).output[0].arguments == streamed


def test_a_streamed_message_comes_in_order(client: openai.OpenAI) -> None:
    events = list(client.responses.create(model="default", input=QUESTION, max_output_tokens=32, temperature=0,
                                          stream=True))
    kinds = [event.type for event in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"], kinds
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"], kinds
    assert set(kinds[4:-4]) == {"response.output_text.delta"}, kinds
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert "paris" in text.lower()
    assert events[-1].response.output_text == text


def test_text_format_json_schema_output_validates(client: openai.OpenAI) -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
              "required": ["city", "country"], "additionalProperties": False}
    response = client.responses.create(model="default", input="Name the capital of France and its country.",
                                       text={"format": {"type": "json_schema", "name": "capital", "schema": schema,
                                                        "strict": True}}, max_output_tokens=64, temperature=0)
    assert response.status == "completed"
    jsonschema.validate(json.loads(response.output_text), schema)
    assert response.text.format.type == "json_schema"


def test_instructions_and_history_items(client: openai.OpenAI) -> None:
    response = client.responses.create(model="default", instructions="Answer in one word.", temperature=0,
                                       max_output_tokens=16, input=[
                                           {"role": "user", "content": "What is the capital of Italy?"},
                                           {"type": "message", "role": "assistant",
                                            "content": [{"type": "output_text", "text": "Rome."}]},
                                           {"role": "user", "content": [{"type": "input_text", "text": QUESTION}]}])
    assert "paris" in response.output_text.lower(), response.output_text
    assert response.instructions == "Answer in one word."


def test_store_get_delete_and_404(client: openai.OpenAI, default_server: ServerProcess) -> None:
    response = client.responses.create(model="default", input=QUESTION, max_output_tokens=16,
                                       metadata={"purpose": "test"})
    got = client.responses.retrieve(response.id)
    assert got.id == response.id and got.output_text == response.output_text and got.metadata == {"purpose": "test"}
    client.responses.delete(response.id)  # the package returns None; the body is checked below
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.retrieve(response.id)
    assert missing.value.body["param"] == "response_id"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError) as unknown:
        client.responses.create(model="default", input="And of Spain?", previous_response_id=response.id)
    assert unknown.value.body["param"] == "previous_response_id"  # type: ignore[index]
    with httpx.Client(base_url=default_server.url, headers=default_server.headers, timeout=60) as http:
        kept = client.responses.create(model="default", input=QUESTION, max_output_tokens=4)
        deleted = http.delete(f"/v1/responses/{kept.id}")
        assert deleted.status_code == 200 and deleted.json() == {"id": kept.id, "object": "response",
                                                                 "deleted": True}
        again = http.delete(f"/v1/responses/{kept.id}")
        assert again.status_code == 404 and again.json()["error"]["param"] == "response_id"
        not_kept = client.responses.create(model="default", input=QUESTION, max_output_tokens=4, store=False)
        assert http.get(f"/v1/responses/{not_kept.id}").status_code == 404


BAD: list[tuple[dict[str, Any], str]] = [
    ({"tools": [{"type": "function", "parameters": {"type": "object"}}]}, "tools[0].name"),
    ({"tools": [WEATHER, WEATHER]}, "tools[1].name"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "get_time"}}, "tool_choice.name"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"input": [{"role": "user", "content": "Hi."},
                {"type": "function_call", "call_id": "call_a", "name": "get_weather", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "call_b", "output": "sunny"}]}, "input[2].call_id"),
    ({"input": [{"type": "function_call", "call_id": "call_a", "name": "f", "arguments": "[1]"},
                {"type": "function_call_output", "call_id": "call_a", "output": "x"}]}, "input[0].arguments"),
    ({"input": [{"role": "assistant", "content": "Hello."}]}, "input[0]"),
    ({"input": []}, "input"),
    ({"text": {"format": {"type": "json_schema", "name": "x",
                          "schema": {"type": "object", "properties": {"a": {"type": "nope"}}}}}},
     "text.format.schema"),
    ({"text": {"format": {"type": "json_schema", "schema": {"type": "object"}}}}, "text.format.name"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://example.com/a.png"}]}]},
     "input[0].content[0].image_url"),
    ({"max_output_tokens": "10"}, "max_output_tokens"),
    ({"reasoning": {"effort": "high"}}, "reasoning"),
    ({"frequency_penalty": 1}, "frequency_penalty"),
]


@pytest.mark.parametrize(("extra", "param"), BAD, ids=[param for _, param in BAD])
def test_bad_input_is_refused_by_name(client: openai.OpenAI, extra: dict[str, Any], param: str) -> None:
    body = {"model": "default", "input": QUESTION, **extra}
    with pytest.raises(openai.BadRequestError) as refused:
        client.post("/responses", body=body, cast_to=httpx.Response)
    assert refused.value.body["param"] == param, refused.value.body  # type: ignore[index]
    _answers(client)


def test_an_unknown_previous_response_id_is_a_404_naming_it(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as unknown:
        client.responses.create(model="default", input=QUESTION, previous_response_id="resp_nope")
    assert unknown.value.body["param"] == "previous_response_id"  # type: ignore[index]
    assert "resp_nope" in unknown.value.body["message"]  # type: ignore[index]
    _answers(client)

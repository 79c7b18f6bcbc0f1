"""Tests of ``omnipipe bench tools``: the prompt set, how a free answer's calls are read and scored, and a real run
on 2 prompts (the packaged thinker) printing its tables with the expected columns."""

from __future__ import annotations

import os

import pytest

from omnipipe.bench.tools import (
    COST_HEADERS,
    FOLLOW_HEADERS,
    PROMPTS,
    SCORE_HEADERS,
    TOOLS,
    Answer,
    Call,
    main,
    parse_free_text,
    right_arguments,
    score,
    subset,
    valid_arguments,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def test_half_the_prompts_need_one_of_the_three_tools() -> None:
    assert len(PROMPTS) >= 24 and len({p.text for p in PROMPTS}) == len(PROMPTS)
    need = [p for p in PROMPTS if p.tool is not None]
    assert len(need) * 2 == len(PROMPTS)
    assert {p.tool for p in need} == {t["name"] for t in TOOLS}
    assert all(p.args and p.result and p.value for p in need)
    assert [p.tool is not None for p in subset(4)] == [True, False, True, False]


@pytest.mark.parametrize(("text", "calls"), [
    ('<tool_call>\n{"name": "get_time", "arguments": {"timezone": "Asia/Tokyo"}}\n</tool_call>',
     [Call("get_time", '{"timezone": "Asia/Tokyo"}')]),
    ('{"name": "get_weather", "arguments": {"city": "Paris"}}', [Call("get_weather", '{"city": "Paris"}')]),
    ('```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```',
     [Call("get_weather", '{"city": "Paris"}')]),
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": \n</tool_call>',
     [Call("get_weather", '{"name": "get_weather", "arguments": {"city":')]),
    ("Paris is the capital of France.", []),
])
def test_a_free_answer_is_read_as_hermes_calls_or_one_bare_object(text: str, calls: list[Call]) -> None:
    assert parse_free_text(text) == calls


def test_arguments_are_valid_when_they_parse_and_follow_the_schema() -> None:
    assert valid_arguments(Call("get_weather", '{"city": "Paris", "unit": "celsius"}'))
    assert not valid_arguments(Call("get_weather", '{"city": "Paris", "unit": "kelvin"}'))  # not in the enum
    assert not valid_arguments(Call("convert_currency", '{"amount": "100", "from": "USD", "to": "EUR"}'))
    assert not valid_arguments(Call("get_weather", '{"city": '))
    assert not valid_arguments(Call("get_stock", "{}"))


def test_a_decision_is_scored_on_every_prompt_and_arguments_on_those_that_need_a_tool() -> None:
    weather, capital = PROMPTS[0], next(p for p in PROMPTS if p.tool is None)
    assert right_arguments(Call("get_weather", '{"city": "PARIS, France"}'), weather)
    answers = [Answer(weather.text, "", [Call("get_weather", '{"city": "Paris"}')], 10, 1.0),
               Answer(capital.text, "", [Call("get_weather", '{"city": "Paris"}')], 10, 1.0)]
    s = score("constrained", "spoken", [weather, capital], answers)
    assert (s.decision, s.called, s.answered, s.function, s.arguments, s.valid, s.calls) == (1, 1, 0, 1, 1, 2, 2)


@pytest.mark.models
def test_a_run_on_two_prompts_prints_the_three_tables(capsys) -> None:
    import torch

    threads = torch.get_num_threads()
    try:  # the bench runs on one torch thread; later tests must not inherit it
        assert main(["--prompts", "2", "--systems", "spoken", "--max-tokens", "24", "--cost-steps", "2"]) == 0
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    for headers in (SCORE_HEADERS, FOLLOW_HEADERS, COST_HEADERS):
        assert all(h in out for h in headers)
    rows = [line for line in out.splitlines() if line.startswith("| spoken")]
    assert [row.split("|")[2].strip() for row in rows] == ["constrained", "unconstrained"]
    assert all(row.split("|")[3].strip().endswith("/2") for row in rows)  # right decision, of 2 prompts
    costs = [line.split("|")[1].strip() for line in out.splitlines() if line.endswith("|") and "%" in line]
    assert costs == ["1", "8"]  # the grammar's share of a decode step at batch 1 and 8

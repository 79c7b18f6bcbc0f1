"""The scoring of ``omnipipe bench quality`` (no model: a model's wrong answer fails no test)."""

from __future__ import annotations

import pytest

from omnipipe.bench.quality import MODELS, QUESTIONS, RECALL_ACCEPT, ModelResult, format_report, is_correct


@pytest.mark.parametrize(("answer", "accept", "right"), [
    ("The largest planet is Jupiter.", ("jupiter",), True),
    ("JUPITER", ("jupiter",), True),
    ("There are four.", ("4", "four"), True),
    ("A week has 7 days.", ("7", "seven"), True),
    ("It has 14 legs.", ("4", "four"), False),  # a number inside another is not it
    ("Fourteen of them.", ("4", "four"), False),
    ("Earth is the largest planet.", ("jupiter",), False),
    ("It boils at 100°C.", ("100", "one hundred"), True),
    ("Plants take in carbon dioxide.", ("carbon dioxide", "co2"), True),
    ("Plants take in carbon.", ("carbon dioxide", "co2"), False),
    ("Twenty-four hours.", ("24", "twenty-four"), True),
    ("", ("paris",), False),
    ("Your name is Zorblat!", RECALL_ACCEPT, True),
    ("I don't know your name.", RECALL_ACCEPT, False),
])
def test_an_answer_is_right_when_a_variant_is_a_whole_word(answer: str, accept: tuple[str, ...], right: bool) -> None:
    assert is_correct(answer, accept) is right


def test_the_question_list_is_thirty_distinct_questions_with_answers() -> None:
    assert len(QUESTIONS) == 30
    assert len({q.text for q in QUESTIONS}) == 30
    assert all(q.accept and all(v.strip() for v in q.accept) for q in QUESTIONS)


def test_the_report_names_each_model_its_score_and_its_misses() -> None:
    results = [ModelResult(MODELS[0], 29, 30, True, "Zorblat.", 90, 10.0, [("What is 2+2?", "five")]),
               ModelResult(MODELS[1], 20, 30, False, "I don't know.", 0, 0.0, [])]
    report = format_report(results)
    assert "29/30" in report and "20/30" in report
    assert "9.0" in report  # 90 tokens in 10 s
    assert "What is 2+2? -> 'five'" in report
    assert "I don't know." in report

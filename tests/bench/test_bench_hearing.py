"""``omnipipe bench hearing``: how it scores a transcript, what it asks, and one question heard end to end (spoken by
the tts pipeline, heard live and whole by whisper)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from omnipipe.bench.hearing import PAUSED, PLAIN, main, questions, said, word_errors


def test_fillers_case_punctuation_and_number_spelling_are_not_errors() -> None:
    assert said("Who wrote, um, Romeo and Juliet?") == ["who", "wrote", "romeo", "and", "juliet"]
    assert said("What is 2 plus 2?") == said("What is two plus two?")
    assert word_errors(said("What is the capital of, um, Italy?"), said("what is the capital of italy")) == 0


def test_word_errors_count_substitutions_deletions_and_insertions() -> None:
    reference = said("How many legs does a spider have?")
    assert word_errors(reference, said("How many likes does a spider have?")) == 1
    assert word_errors(reference, said("How many legs does a spider")) == 1
    assert word_errors(reference, said("How many legs does this a spider have")) == 1
    assert word_errors(said("What is the capital of Italy?"), said("What is the capital of? Middle East.")) == 2


def test_the_questions_are_twenty_whole_and_four_with_a_pause() -> None:
    asked = questions(PLAIN + len(PAUSED))
    paused = [q for q in asked if q.tail]
    assert len(asked) == 24 and len(paused) == len(PAUSED) == 4
    assert len({q.text for q in asked}) == 24
    assert paused[0].text == "What is the capital of, um, Italy?"


def test_bad_flags_are_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--speeds", "fast"], ["--speeds", "9"], ["--deliveries", "loud"], ["--voices", "nobody"],
                 ["--questions", "0"]):
        with pytest.raises(SystemExit):
            main(argv)
        assert argv[0] in capsys.readouterr().err


@pytest.mark.models
def test_the_paused_question_is_heard_whole_live(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The first question ("What is the capital of, um," a pause, "Italy?") spoken in both packaged voices (the tts
    pipeline's and hibari-tts's), heard live (one pass over the turn's speech) and whole: both keep the word after
    the pause."""
    pytest.importorskip("faster_whisper")
    assert main(["--questions", "1", "--speeds", "1", "--deliveries", "steady", "--cache-dir", str(tmp_path / "c"),
                 "--json", str(tmp_path / "heard.json")]) == 0
    results = json.loads((tmp_path / "heard.json").read_text())["results"]
    assert [r["voice"] for r in results] == ["joe", "heart"]
    for heard in results:
        assert "italy" in said(heard["live"]) and "italy" in said(heard["whole"]), heard
    assert "WER live" in capsys.readouterr().out

"""``omnipipe bench prefix-cache``: its arguments refused by name, its system prompts, its tables from made-up turns,
and the bench end to end in a reduced form (one round, a shorter system prompt): a server with the cache and one
without, their tables, and the cached tokens each reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from omnipipe.bench.prefix_cache import (
    HEADERS,
    HOTELS,
    QUESTIONS,
    RATIO_HEADERS,
    Turn,
    conversations,
    differing_answers,
    format_report,
    main,
    system_prompt,
)
from omnipipe.stage.kv_cache import DEFAULT_BLOCK_TOKENS
from tests.bench.test_bench_gateway import table_rows
from tests.conftest import child_processes

PREAMBLE_AT_MOST = 60  # the shared preamble (the spoken-answer system turn) and a marker or two


@pytest.mark.parametrize(("argv", "message"), [
    (["--variants", "on,maybe"], "--variants: comma-separated among on, off (unknown: 'maybe')"),
    (["--variants", ","], "--variants: comma-separated among on, off"),
    (["--rounds", "0"], "--rounds must be 1.."),
    (["--rounds", str(len(HOTELS))], "--rounds must be 1.."),
    (["--rooms", "0"], "--rooms must be >= 1"),
    (["--turns", "1"], f"--turns must be 2..{len(QUESTIONS)}"),
    (["--max-tokens", "0"], "--max-tokens must be >= 1"),
    (["--warmup", "-1"], "--warmup >= 0"),
    (["--request-timeout", "0"], "--request-timeout and --startup-timeout must be > 0"),
    (["--deploy", "/nonexistent/deploy.yaml"], "--deploy: "),
])
def test_bad_arguments_are_refused_by_name(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_deploy_without_the_cache_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    deploy = tmp_path / "deploy.yaml"
    deploy.write_text("stages:\n  thinker:\n    options: {prefix_cache: false}\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["--deploy", str(deploy)])
    assert exit_info.value.code == 2
    assert "turns the thinker's prefix cache off" in capsys.readouterr().err


def test_the_system_prompts_are_fixed_and_differ_only_in_the_hotel_named_first() -> None:
    assert system_prompt(15) == system_prompt(15)
    first, other = system_prompt(15, HOTELS[1]), system_prompt(15, HOTELS[2])
    assert first.startswith(HOTELS[1]) and other.startswith(HOTELS[2])
    assert first.removeprefix(HOTELS[1]) == other.removeprefix(HOTELS[2])
    assert system_prompt(15).count("Room ") == 15 and "Room 303 " in system_prompt(15)
    assert conversations(3) == [list(QUESTIONS[:3]), [conversations(3)[1][0]]]
    assert conversations(3)[1][0] not in QUESTIONS


def _turn(variant: str, round_: int, conversation: int, turn: int, cached: int, ttft: float,
          answer: str = "Yes.") -> Turn:
    return Turn(variant, round_, conversation, turn, "?", ok=True, prompt_tokens=700 + turn, cached_tokens=cached,
                ttft_ms=ttft, answer=answer)


def test_the_report_has_a_row_per_turn_the_median_of_the_rounds_and_the_ratio() -> None:
    turns = [_turn("on", 1, 1, 1, 41, 2000.0), _turn("on", 1, 1, 2, 690, 100.0),
             _turn("on", 2, 1, 1, 43, 2200.0), _turn("on", 2, 1, 2, 690, 120.0),
             _turn("on", 3, 1, 1, 41, 2100.0), _turn("on", 3, 1, 2, 690, 300.0),
             _turn("off", 1, 1, 1, 38, 2000.0), _turn("off", 1, 1, 2, 38, 2400.0, answer="No."),
             _turn("off", 2, 1, 1, 38, 2300.0), _turn("off", 2, 1, 2, 38, 2500.0),
             _turn("off", 3, 1, 1, 38, 1900.0), _turn("off", 3, 1, 2, 38, 2600.0)]
    turns.append(Turn("off", 3, 2, 1, "?", error="HTTP 500: boom"))
    report = format_report(turns)
    rows = table_rows(report, HEADERS)
    assert rows == [["on", "1", "1", "701", "41-43", "2100"], ["on", "1", "2", "702", "690", "120"],
                    ["off", "1", "1", "701", "38", "2000"], ["off", "1", "2", "702", "38", "2500"]]
    assert table_rows(report, RATIO_HEADERS) == [["1", "1", "2000", "2100", "0.95"],
                                                 ["1", "2", "2500", "120", "20.83"]]
    assert "off, round 3, conversation 2, turn 1: HTTP 500: boom" in report
    assert differing_answers(turns) == ["round 1, conversation 1, turn 2"]


@pytest.mark.models  # two default-pipeline servers, one after the other
@pytest.mark.timeout(900)
def test_the_cache_spares_the_system_prompt_and_the_earlier_turns(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """One round, a shorter system prompt: with the cache on, turns 2 and 3 and the second conversation go on from
    at least the system prompt's whole blocks (turn 2 from all of turn 1's); with it off every turn reports only
    the shared preamble, and so does the first turn with it on."""
    path = tmp_path / "prefix-cache.json"
    before = {p.pid for p in child_processes()}  # a server another module's fixture keeps for the session
    code = main(["--rounds", "1", "--rooms", "6", "--max-tokens", "8", "--json", str(path)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    left = [p for p in child_processes() if p.pid not in before and "omnipipe" in " ".join(p.cmdline())]
    assert not left  # both servers stopped

    turns = [("1", "1"), ("1", "2"), ("1", "3"), ("2", "1")]  # (conversation, turn)
    rows = table_rows(printed, HEADERS)
    assert [tuple(r[:3]) for r in rows] == [(variant, *turn) for variant in ("on", "off") for turn in turns]
    assert all(int(r[3]) > int(r[4]) >= 0 and int(r[5]) > 0 for r in rows), rows
    ratios = table_rows(printed, RATIO_HEADERS)
    assert [tuple(r[:2]) for r in ratios] == turns
    assert all(float(r[4]) > 0 for r in ratios), ratios

    data = json.loads(path.read_text())
    [system_tokens] = data["meta"]["system_prompt_tokens"]
    assert 150 < system_tokens < 400, system_tokens
    cached = {(r["variant"], r["conversation"], r["turn"]): r["cached_tokens"][0] for r in data["rows"]}
    prompt = {(r["variant"], r["conversation"], r["turn"]): r["prompt_tokens"][0] for r in data["rows"]}
    def blocks(tokens: int) -> int:  # the cache shares whole blocks: the tokens of those a prefix fills
        return tokens // DEFAULT_BLOCK_TOKENS * DEFAULT_BLOCK_TOKENS

    for key in ((1, 2), (1, 3), (2, 1)):
        assert cached[("on", *key)] >= blocks(system_tokens), (key, cached)
    assert cached[("on", 1, 2)] >= blocks(prompt[("on", 1, 1)])
    assert cached[("on", 1, 3)] >= blocks(prompt[("on", 1, 2)])
    preamble = cached[("off", 1, 1)]
    assert 0 < preamble < PREAMBLE_AT_MOST
    assert all(cached[("off", *key)] == preamble for key in ((1, 1), (1, 2), (1, 3), (2, 1))), cached
    assert preamble <= cached[("on", 1, 1)] < PREAMBLE_AT_MOST  # the warm-up's system turn shares its marker

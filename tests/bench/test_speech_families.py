"""``omnipipe bench speech-families`` end to end on tiny checkpoints with small sizes: every family's measures at
max_num_seqs 8 and 1 are positive and printed with their ratio (no timing thresholds), the released parameter
counts are each family's published one; the measures' arithmetic; bad flags refused naming the flag."""

from __future__ import annotations

import json
import re

import pytest

from omnipipe.bench import speech_families
from omnipipe.bench.speech_families import FAMILIES, MEASURES, Done, figures
from omnipipe.cli.bench import SUITES

RELEASED = {"csm": 1_632_100_161, "voxtral": 4_676_271_104, "voxtral_realtime": 4_429_679_360,
            "moshi": 7_767_037_761}


def test_the_measures_count_units_over_the_wall_time() -> None:
    assert SUITES["speech-families"] == "omnipipe.bench.speech_families"
    csm = figures("csm", [Done(25, 2.0), Done(15, 1.2)], wall_s=2.0)
    assert csm["frames_s"] == 20.0 and csm["audio_s_per_s"] == pytest.approx(1.6)
    moshi = figures("moshi", [Done(25, 2.0)], wall_s=0.5)
    assert moshi["frames_s"] == 50.0 and moshi["rtf"] == pytest.approx(4.0)  # 25 frames: 2 s of user audio heard
    assert figures("voxtral", [Done(8, 0.0), Done(4, 0.0)], wall_s=4.0)["tokens_s"] == 3.0
    assert "audio_s_per_s" not in figures("voxtral_realtime", [Done(3, 0.0)], wall_s=1.0)
    split = figures("moshi", [Done(5, 0.4, {"duplex": 0.25, "mimi": 0.5}), Done(5, 0.4, {"duplex": 0.25})], 1.0)
    assert split["compute_s.duplex"] == 0.5 and split["compute_s.mimi"] == 0.5


@pytest.mark.parametrize(("argv", "flag"), [(["--families", "csm,qwen3_omni"], "--families"),
                                            (["--families", "csm,csm"], "--families"),
                                            (["--requests", "0"], "--requests"),
                                            (["--rounds", "0"], "--rounds"),
                                            (["--clip-seconds", "0"], "--clip-seconds")])
def test_bad_flags_are_refused_naming_the_flag(argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        speech_families.main(argv)
    assert exited.value.code == 2 and flag in capsys.readouterr().err


@pytest.mark.slow
def test_every_family_measured_at_8_and_1_with_its_released_parameter_count(tmp_path, capsys) -> None:
    result = tmp_path / "figures.json"
    assert speech_families.main(["--requests", "2", "--rounds", "1", "--frames", "4", "--max-tokens", "3",
                                 "--clip-seconds", "0.4", "--json", str(result)]) == 0
    out = capsys.readouterr().out
    rows = json.loads(result.read_text())["rows"]
    assert [row["family"] for row in rows] == list(FAMILIES)
    for row in rows:
        family = row["family"]
        for key, label in MEASURES[family]:
            eight, one = row["by_max_num_seqs"]["8"][key], row["by_max_num_seqs"]["1"][key]
            assert eight > 0 and one > 0, (family, key)
            # the printed line: family, measure, both values and their ratio
            line = re.search(rf"\| {family} +\| {re.escape(label)} +\| +([\d.]+) \| +([\d.]+) \| +([\d.]+) \|", out)
            assert line is not None, (family, label)
            assert float(line.group(3)) == pytest.approx(eight / one, abs=0.01)
        assert row["released_parameters"] == RELEASED[family]
        assert re.search(rf"\| {family} +\| {RELEASED[family]:,} +\|", out)
    # moshi's sessions end with their clips: 0.4 s heard is 5 frames (the last partial one padded) each
    assert rows[-1]["by_max_num_seqs"]["1"]["units"] == 2 * 5

"""``omnipipe bench streaming-audio``: bad arguments refused by name, and a short run on the tiny checkpoints of both
families prints a row per clip whose streamed encoder output is the whole clip's within the stated bound."""

from __future__ import annotations

import re

import pytest

from omnipipe.bench.streaming_audio import main


@pytest.mark.parametrize("argv", [["--repeats", "0"], ["--seconds", "0"], ["--released-layers", "-1"],
                                  ["--family", "whisper"]])
def test_bad_arguments_are_usage_errors(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2


@pytest.mark.slow  # writes and loads the two tiny checkpoints
def test_a_short_run_prints_each_family_and_clip_within_the_bound(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--seconds", "1.5", "3", "--repeats", "1"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()
            if re.match(r"qwen(2_5|3)_omni\s", line)]
    assert [(row[0], float(row[1])) for row in rows] == [("qwen2_5_omni", 1.5), ("qwen2_5_omni", 3.0),
                                                          ("qwen3_omni", 1.5), ("qwen3_omni", 3.0)]
    assert all(float(row[4]) <= 2e-6 for row in rows), rows  # diff / absmax

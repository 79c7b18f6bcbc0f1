"""``omnipipe bench gpu-check``: on a machine without CUDA it says so and exits 0; with ``--device cpu`` the same
checks and the released-width step table run on the CPU (the figures that matter come from a CUDA machine)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from omnipipe.bench import gpu_check


def test_without_cuda_it_says_so_and_exits_0() -> None:
    result = subprocess.run([sys.executable, "-m", "omnipipe.cli.main", "bench", "gpu-check"], capture_output=True,
                            text=True, timeout=120, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert result.returncode == 0, result.stderr
    assert "no CUDA device here" in result.stdout and "--device cpu" in result.stdout


@pytest.mark.parametrize(("args", "message"), [
    (["--batches", "1,x"], "--batches: comma-separated whole numbers, got '1,x'"),
    (["--layers", "0"], "--batches, --layers, --context and --steps must be at least 1"),
    (["--device", "cuda:0"], "--device cuda:0: torch"),
])
def test_bad_arguments_are_refused_by_name(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        gpu_check.main(args)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.slow
def test_on_the_cpu_it_runs_every_check_and_times_the_released_width_step(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert gpu_check.main(["--device", "cpu", "--batches", "1,2", "--layers", "1", "--context", "32",
                           "--steps", "2"]) == 0
    printed = capsys.readouterr().out
    rows = {line.split("|")[1].strip(): line.split("|")[2].strip() for line in printed.splitlines()
            if line.startswith("| ") and line.count("|") == 4}
    assert rows["placement"] == "PASS" and rows["NaN isolation"] == "PASS", printed
    assert rows["batched == alone (float32, TF32 off)"] == "PASS", printed
    assert rows["syncs per decode step"] == "skipped", printed
    assert rows["recompiles after warm-up"] == "PASS", printed  # the thinker's and the talker's warm-ups cover serving
    steps = [line for line in printed.splitlines() if line.startswith("|") and "not captured yet" in line]
    assert [int(line.split("|")[1]) for line in steps] == [1, 2], printed

"""Tests of ``omnipipe bench thinker``: its arguments are checked by name, the report ends with the ratio line a
script reads, and a real run of our int8 decoder (two sequences, a few tokens) fills its row."""

from __future__ import annotations

import os
import re

import pytest

from omnipipe.bench.thinker import Result, format_report, main

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.mark.parametrize(("argv", "message"), [
    (["--backends", "omnipipe-int8,vllm"], "--backends: unknown vllm"),
    (["--tokens", "0"], "--tokens must be at least 1"),
    (["--batch", "1000"], "--batch must be at most"),
    (["--prompt-tokens", "-1"], r"--prompt-tokens must be in \[0, 2048\]"),
    (["--model", "llama-70b"], "--model: .*unknown thinker"),
])
def test_bad_arguments_are_refused_by_name(argv: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert re.search(message, capsys.readouterr().err)


def test_the_report_ends_with_the_decode_time_ratio() -> None:
    results = [Result("omnipipe float32", 10.0, 50, 5.0, 20.0, "Paris."),
               Result("omnipipe int8", 8.0, 50, 20.0, 60.0, "Paris."),
               Result("llama.cpp (Q4_K_M)", 5.0, 50, 25.0, 30.0, "Paris.")]
    report = format_report(results, batch=8)
    assert report.splitlines()[-1] == "llama.cpp / omnipipe decode time at batch 1: 0.80"
    assert "omnipipe int8 / llama.cpp aggregate tok/s at batch 8: 2.00" in report


def test_without_llama_cpp_there_is_no_ratio_and_the_row_says_why() -> None:
    results = [Result("omnipipe int8", 8.0, 50, 20.0, 60.0, "Paris."),
               Result("llama.cpp", note="not installed (pip install llama-cpp-python==0.3.36)")]
    report = format_report(results, batch=8)
    assert "decode time at batch 1" not in report
    assert "not installed (pip install llama-cpp-python==0.3.36)" in report


@pytest.mark.models
def test_a_run_of_the_int8_decoder_fills_its_row(capsys) -> None:
    import torch

    threads = torch.get_num_threads()
    try:  # the bench sets the process's torch threads (--threads); later tests must not inherit them
        assert main(["--model", "gemma3-270m", "--backends", "omnipipe-int8", "--tokens", "3", "--batch", "2"]) == 0
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| omnipipe int8"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert int(cells[1]) > 10  # prompt tokens: the few-shot preamble and the question
    assert all(float(c) > 0 for c in cells[2:5])

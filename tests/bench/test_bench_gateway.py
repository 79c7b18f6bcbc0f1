"""``omnipipe bench gateway`` end to end through the real CLI on the toy pipeline: its own worker and gateways
start and stop, the tables and JSON have every target, and nothing is left running (no timing thresholds)."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from omnipipe.bench.gateway import MAIN_HEADERS, OVERHEAD_HEADERS, REALTIME_HEADERS, TARGETS, main

pytestmark = pytest.mark.slow  # a worker and two gateways started by the bench, end to end

RUN_TIMEOUT_S = 840


def number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def table_rows(printed: str, headers: list[str]) -> list[list[str]]:
    """The cells of the table whose header line is ``headers``."""
    lines = printed.splitlines()
    start = next(i for i, line in enumerate(lines)
                 if line.startswith("| ") and [c.strip() for c in line.strip("|").split("|")] == headers)
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("| "):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows


def omnipipe_processes(processes: list[psutil.Process]) -> list[str]:
    alive = []
    for process in processes:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                alive.append(" ".join(process.cmdline()))
        except psutil.Error:
            continue
    return [c for c in alive if "omnipipe" in c]


@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_toy_run_through_the_cli(tmp_path: Path) -> None:
    path = tmp_path / "gateway.json"
    command = [sys.executable, "-m", "omnipipe.cli.main", "bench", "gateway", "--pipeline", "toy",
               "--num-prompts", "4", "--max-concurrency", "1,2", "--json", str(path)]
    out_path, err_path = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with out_path.open("wb") as out, err_path.open("wb") as err:
        bench = subprocess.Popen(command, stdout=out, stderr=err, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    seen: dict[int, psutil.Process] = {}  # everything the bench started, also what might outlive it
    deadline = time.monotonic() + RUN_TIMEOUT_S
    try:
        while bench.poll() is None and time.monotonic() < deadline:
            try:
                for child in psutil.Process(bench.pid).children(recursive=True):
                    seen.setdefault(child.pid, child)
            except psutil.Error:
                pass
            time.sleep(0.5)  # stays: how often the bench's children are sampled while it runs
    finally:
        if bench.poll() is None:
            bench.kill()
        bench.wait(timeout=60)
    printed, errors = out_path.read_text(), err_path.read_text()
    assert bench.returncode == 0, f"{printed}\n{errors}"
    assert len(seen) >= 3, "the worker and two gateways should have run as child processes"

    # stopped: the worker, both gateways and the worker's stage processes; the temporary directory is gone
    _, alive = psutil.wait_procs(list(seen.values()), timeout=30)
    assert not omnipipe_processes(alive), omnipipe_processes(alive)
    assert not omnipipe_processes(psutil.Process().children(recursive=True))
    workdir = re.search(r"logs in (\S+)\)", errors)
    assert workdir and not Path(workdir.group(1)).exists(), errors

    # the tables
    assert "machine: " in printed and " cpus, load average " in printed
    main_rows = table_rows(printed, MAIN_HEADERS)
    assert [(r[0], r[1], r[2]) for r in main_rows] == [(level, t, "4") for level in ("1", "2") for t in TARGETS]
    over_rows = table_rows(printed, OVERHEAD_HEADERS)
    assert [(r[0], r[1]) for r in over_rows] == [(level, t) for level in ("1", "2") for t in TARGETS[1:]]
    assert all(cell != "-" for r in over_rows for cell in r), over_rows
    realtime_rows = table_rows(printed, REALTIME_HEADERS)
    assert [r[0] for r in realtime_rows] == list(TARGETS) and all(r[1] == "10" for r in realtime_rows)

    # the JSON
    data = json.loads(path.read_text())
    assert data["meta"]["pipeline"] == "toy" and data["meta"]["model"] == "toy"
    assert data["meta"]["levels"] == [1, 2] and data["meta"]["worker_capacity"] == 2
    assert [(r["max_concurrency"], r["target"]) for r in data["rows"]] == [(level, t) for level in (1, 2)
                                                                           for t in TARGETS]
    for row in data["rows"]:
        assert row["prompts"] == row["completed"] == 4 and row["failed"] == 0 and not row["errors"], row
        assert number(row["throughput_rps"]) and row["throughput_rps"] > 0
        for name in ("ttft", "ttfp", "e2el"):
            assert row[name]["count"] == 4 and all(number(v) and v >= 0 for v in row[name].values()), (name, row)
    for entry in data["overhead"]:
        assert entry["target"] in TARGETS[1:]
        assert all(number(entry[f"{m}_median_{k}"]) for m in ("ttft", "ttfp", "e2el") for k in ("delta_ms", "ratio"))
    for target in TARGETS:
        stats = data["realtime"]["targets"][target]["session_created"]
        assert stats["count"] == 10 and all(number(v) and v > 0 for v in stats.values())
    assert set(data["realtime"]["overhead"]) == set(TARGETS[1:])
    # every request through the recording gateway was recorded, none through the other
    assert data["recorded_sessions"] >= 2 * 4 and data["no_record_gateway_recorded_nothing"] is True


def test_bad_arguments_are_usage_errors() -> None:
    for argv in (["--max-concurrency", "0"], ["--max-concurrency", "a"], ["--num-prompts", "0"],
                 ["--pipeline", "nosuch"], ["--realtime-samples", "-1"], ["--deploy", "/no/such/file"]):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2

"""``omnipipe bench soak`` through the real CLI, short form: a spawned default-pipeline server under load while each
stage is killed once and the thinker is stopped, with clients that leave and the malformed requests alongside;
nothing may get stuck, no malformed request may get a 5xx, every fault must be seen and healed, and nothing may be
left after the stop. And a gateway run on the toy pipeline, whose fault is a killed worker."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from omnipipe.bench.soak import main
from omnipipe.bench.soak_faults import KILL, KILL_WORKER, STOP, fault_share
from omnipipe.bench.soak_load import cause_of, leave_plan
from omnipipe.bench.soak_report import FAULT_HEADERS, MALFORMED_HEADERS, REQUEST_HEADERS, RESOURCE_HEADERS
from tests.bench.test_bench_gateway import table_rows

RUN_TIMEOUT_S = 540
STAGES = ("thinker", "talker", "code2wav")


def run_soak(tmp_path: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    """Run the CLI; its exit code, its JSON and what it printed (stdout, then stderr)."""
    path = tmp_path / "soak.json"
    command = [sys.executable, "-m", "omnipipe.cli.main", "bench", "soak", *args, "--json", str(path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    printed = f"{done.stdout}\n{done.stderr}"
    assert path.is_file(), printed
    return done.returncode, json.loads(path.read_text()), printed


def check_causes(report: dict[str, Any], allowed: tuple[str, ...]) -> None:
    """Every failed request has a cause that names a stage (or the worker), or says the stream was cut."""
    for kind in ("load", "probes"):
        for cause in report["requests"][kind]["causes"]:
            assert any(word in cause for word in allowed), (kind, cause)


def check_no_leftovers(report: dict[str, Any], printed: str) -> None:
    assert report["after_stop"] == [], report["after_stop"]
    assert report["leaks"] == [], report["leaks"]
    workdir = re.search(r"log in (\S+)/\w+\.log\)", printed)
    assert workdir and not Path(workdir.group(1)).exists(), printed
    assert "after the stop: no process, /dev/shm segment or run directory left" in printed


@pytest.mark.models
@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_spawned_server_survives_stage_faults(tmp_path: Path) -> None:
    # stall_report_s 1 sees the 3 s stop; stall_restart_s 30, not 4: on a busy 2-core machine
    # one thinker step can outlast 4 s (the malformed 1 MB prompt's tokenization alone), and the watchdog's kills that
    # follow use up the thinker's restarts
    code, report, printed = run_soak(
        tmp_path, "--spawn", "--pipeline", "default", "--requests", "24", "--concurrency", "4", "--abort-rate", "0.2",
        "--kill-stages", ",".join(STAGES), "--stop-stage-s", "3", "--malformed", "1", "--stall-report-s", "1",
        "--stall-restart-s", "30",
        "--max-tokens", "16")
    load, probes = report["requests"]["load"], report["requests"]["probes"]
    assert load["stuck"] == 0 and probes["stuck"] == 0, printed
    assert load["total"] == 24 and load["completed"] >= 1 and load["left_by_client"] >= 1, load
    check_causes(report, (*(f"stage '{s}'" for s in STAGES), "stream cut", "client"))
    malformed = report["malformed"]
    assert malformed["requests"] >= 80 and malformed["4xx"] >= 70, malformed
    assert malformed["5xx"] == 0, malformed["server_errors"]
    assert malformed["no_answer"] == [], malformed["no_answer"]
    faults = report["faults"]
    assert [(f["kind"], f["target"]) for f in faults] == [*((KILL, s) for s in STAGES), (STOP, "thinker")]
    for fault in faults:
        assert fault["error"] is None and fault["pid"], fault
        assert fault["detected_s"] is not None, f"not detected: {fault}"
        assert fault["ok_again_s"] is not None and fault["recovered_s"] is not None, f"not healed: {fault}"
        assert fault["answered_s"] is not None and fault["answered_s"] <= fault["recovered_s"], fault
        if fault["kind"] == KILL:
            assert fault["restarted_s"] is not None, fault
    assert any(f["under_load"] for f in faults), faults
    check_no_leftovers(report, printed)
    assert all(s["state"] == "ok" for s in report["stages_at_end"].values()), report["stages_at_end"]
    assert report["resources"]["before"]["child_processes"] >= 4, report["resources"]
    assert code == 0 and report["fail"] == [] and "PASS: " in printed, printed
    for headers in (REQUEST_HEADERS, FAULT_HEADERS, RESOURCE_HEADERS, MALFORMED_HEADERS):
        assert table_rows(printed, headers), headers


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_gateway_survives_a_killed_worker(tmp_path: Path) -> None:
    code, report, printed = run_soak(
        tmp_path, "--gateway", "--pipeline", "toy", "--requests", "12", "--concurrency", "4", "--abort-rate", "0.25",
        "--kill-stages", "thinker")
    load, probes = report["requests"]["load"], report["requests"]["probes"]
    assert load["stuck"] == 0 and probes["stuck"] == 0, printed
    assert load["total"] == 12 and load["completed"] >= 1 and load["left_by_client"] >= 1, load
    check_causes(report, ("stage 'thinker'", "worker 127.0.0.1:", "stream cut", "client"))
    faults = report["faults"]
    assert [f["kind"] for f in faults] == [KILL, KILL_WORKER], faults
    for fault in faults:
        assert fault["error"] is None and fault["pid"], fault
        assert fault["detected_s"] is not None and fault["restarted_s"] is not None, fault
        assert fault["ok_again_s"] is not None and fault["recovered_s"] is not None, fault
    check_no_leftovers(report, printed)
    assert report["malformed"] is None
    assert code == 0 and report["fail"] == [], printed


def test_plan_and_causes() -> None:
    assert cause_of("request chatcmpl-0a1b: stage 'thinker' died (exit code -9)") == \
        "stage 'thinker' died (exit code -9)"
    assert cause_of("stage 'talker': bad\n  chatcmpl-ff00 again") == "stage 'talker': bad <id> again"
    plan = leave_plan(20, 0.25, 3)
    assert len(plan) == 5 and all(0 <= i < 20 and 1 <= n <= 6 for i, n in plan.items())
    assert plan == leave_plan(20, 0.25, 3) and leave_plan(20, 0.0, 3) == {}
    assert fault_share(24, 4) == 4 and fault_share(24, 0) == 24


def test_bad_arguments_are_usage_errors() -> None:
    for argv in (["--requests", "0"], ["--concurrency", "0"], ["--abort-rate", "1.5"], ["--stop-stage-s", "-1"],
                 ["--kill-stages", "thinker,thinker"], ["--spawn", "--gateway"], ["--spawn", "--pipeline", "nosuch"],
                 ["--spawn", "--deploy", "/no/such/file"], ["--stall-restart-s", "0.5"], ["--malformed", "-1"]):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2, argv


def test_a_well_formed_request_meeting_a_killed_stage_is_not_a_malformed_failure() -> None:
    from omnipipe.bench.soak_malformed import malformed_summary

    down = '{"error": {"message": "stage died", "type": "server_error", "param": null, "code": "stage_unavailable"}}'
    results = [{"case": "accepted", "round": 0, "status": 503, "expected": 200, "body": down},
               {"case": "refused", "round": 0, "status": 503, "expected": 400, "body": down},
               {"case": "accepted crash", "round": 0, "status": 500, "expected": 200, "body": '{"error": {}}'},
               {"case": "refused", "round": 1, "status": 400, "expected": 400},
               # tools: the toy refuses them, the default pipeline serves them (so they reach its thinker)
               {"case": "feature", "round": 0, "status": 503, "expected": 400, "feature": True, "body": down}]
    summary = malformed_summary(results, rounds=2)
    assert summary["stage_down"] == 2
    assert summary["5xx"] == 2 and {e["case"] for e in summary["server_errors"]} == {"refused", "accepted crash"}
    assert summary["4xx"] == 1 and summary["requests"] == 5

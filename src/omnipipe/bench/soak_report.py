"""The soak's report: its tables (requests, faults, resources, malformed requests) and its verdict."""

from __future__ import annotations

from typing import Any

from omnipipe.bench.report import format_table
from omnipipe.bench.soak_load import COMPLETED, LEFT, STUCK

REQUEST_HEADERS = ["Outcome", "Load", "Probes"]
FAULT_HEADERS = ["Fault", "Target", "Pid", "Under load", "Detection (ms)", "Restart (ms)", "OK again (ms)",
                 "First answer (ms)", "Recovery (ms)"]
RESOURCE_HEADERS = ["Resource", "Before", "After", "Change (%)"]
MALFORMED_HEADERS = ["Rounds", "Requests", "2xx (tolerated)", "4xx", "5xx", "503 stage down (well-formed)",
                     "No answer"]


def change_percent(before: float | None, after: float | None) -> float | None:
    if before is None or after is None or before == 0:
        return None
    return (after - before) / before * 100


def format_report(report: dict[str, Any]) -> str:
    load, probes = report["requests"]["load"], report["requests"]["probes"]
    causes = list(dict.fromkeys([*load["causes"], *probes["causes"]]))
    rows: list[list[Any]] = [[COMPLETED, load["completed"], probes["completed"]]]
    rows += [[f"failed: {cause}", load["causes"].get(cause, 0), probes["causes"].get(cause, 0)] for cause in causes]
    rows += [[LEFT, load["left_by_client"], probes["left_by_client"]], [STUCK, load["stuck"], probes["stuck"]],
             ["total", load["total"], probes["total"]]]
    lines = [format_table(REQUEST_HEADERS, rows, title="Requests (probes: sent after each fault until one completes)")]
    for o in report["requests"]["timeline"]:
        if o["kind"] == STUCK:
            queue = f", out of the gateway's queue at {o['dequeued_s']:.1f} s" if o["dequeued_s"] is not None else ""
            last = f", the last at {o['last_event_s']:.1f} s" if o["last_event_s"] is not None else ""
            lines.append(f"  stuck: {'probe' if o['probe'] else 'request'} sent at {o['started_s']:.1f} s"
                         f"{queue}: {o['events']} events{last}")

    def ms(value: float | None) -> float | None:
        return None if value is None else value * 1000

    faults = report["faults"]
    if faults:
        lines += ["", format_table(FAULT_HEADERS, [
            [f["label"], f["target"], f["pid"], None if f["at_s"] is None else "yes" if f["under_load"] else "no",
             ms(f["detected_s"]), ms(f["restarted_s"]), ms(f["ok_again_s"]), ms(f["answered_s"]),
             ms(f["recovered_s"])]
            for f in faults], digits=0, title="Faults (times from the signal)")]
        lines += [f"  {f['label']} {f['target']}: not done: {f['error']}" for f in faults if f["error"]]
    res = report["resources"]
    if res.get("before") and res.get("after"):
        names = [("rss_mib", "RSS (MiB)"), ("rss_lived_through_mib",
                                            f"RSS of the {res['before']['lived_through']} alive throughout (MiB)"),
                 ("open_fds", "open fds"), ("threads", "threads"), ("child_processes", "child processes"),
                 ("shm_segments", "shm segments")]
        lines += ["", format_table(RESOURCE_HEADERS, [
            [label, res["before"][key], res["after"][key], change_percent(res["before"][key], res["after"][key])]
            for key, label in names], digits=1,
            title=f"Resources of pid {res['root_pid']} and its descendants (after warm-up; after the run, idle)")]
    elif res.get("note"):
        lines += ["", f"resources: {res['note']}"]
    mal = report["malformed"]
    if mal:
        lines += ["", format_table(MALFORMED_HEADERS, [[mal["rounds"], mal["requests"], mal["2xx"], mal["4xx"],
                                                         mal["5xx"], mal["stage_down"], len(mal["no_answer"])]],
                                   title="Malformed requests")]
        lines += [f"  {e['status']} x{e['count']} {e['case']}: {e['body']}" for e in mal["server_errors"]]
        lines += [f"  no answer: {line}" for line in mal["no_answer"]]
    if report["stages_at_end"]:
        lines += ["", "stages at the end: " + ", ".join(
            f"{name} {s['state']} (restarts {s['restarts']}, stall reports {s['stalls']})"
            for name, s in report["stages_at_end"].items())]
    if report["leaks"]:
        lines += ["", "Leaks:", *(f"  {leak}" for leak in report["leaks"])]
    return "\n".join(lines)


def verdict(report: dict[str, Any]) -> list[str]:
    """Why the run fails (nothing: it passes)."""
    reasons = []
    stuck = report["requests"]["load"]["stuck"] + report["requests"]["probes"]["stuck"]
    if stuck:
        reasons.append(f"{stuck} stuck request(s)")
    mal = report["malformed"]
    if mal and mal["5xx"]:
        reasons.append(f"{mal['5xx']} malformed request(s) got a 5xx "
                       f"({', '.join(e['case'] for e in mal['server_errors'])})")
    if mal and mal["no_answer"]:
        reasons.append(f"{len(mal['no_answer'])} malformed request(s) got no answer")
    for f in report["faults"]:
        name = f"{f['label']} {f['target']}"
        if f["error"]:
            reasons.append(f"{name} could not be done ({f['error']})")
        elif f["detected_s"] is None:
            reasons.append(f"{name} was not detected")
        elif f["recovered_s"] is None:
            reasons.append(f"{name} did not heal: no request sent after it completed")
        elif f["ok_again_s"] is None:
            reasons.append(f"{name} did not heal: /health not healthy again")
    down = [name for name, s in report["stages_at_end"].items() if s["state"] == "down"]
    if down:
        reasons.append(f"the server gave up stage(s) {', '.join(down)} (down at the end)")
    if report["leaks"]:
        reasons.append("leaked: " + "; ".join(report["leaks"]))
    return reasons

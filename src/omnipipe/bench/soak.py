"""``omnipipe bench soak``: a server under load while things go wrong, and what it does about them.

    omnipipe bench soak --spawn --requests 60 --concurrency 8 --abort-rate 0.2 \\
        --kill-stages thinker,talker,code2wav --stop-stage-s 5 --malformed 2

Load: ``--requests`` streaming chat completions (text + pcm16 audio, the built-in questions) with at most
``--concurrency`` in flight. The client leaves a share ``--abort-rate`` of them after their first few chunks (it
closes the connection); these count as "left by client". Every other request ends one way: completed (``[DONE]``
after a finish_reason), failed with the cause the server gave (an error status or error event; a stream that ends
without ``[DONE]`` fails as "stream cut"), or stuck (no end within ``--request-timeout``).

Faults, one at a time, spread over the run while the load is on (a share of the requests is held back per fault
and sent once it has come, so the load still runs at the last one): ``--kill-stages`` SIGKILLs each named stage's
process once; ``--stop-stage-s S`` SIGSTOPs one stage (``--stop-stage``, the thinker by default) for S seconds and
then SIGCONTs it (unless the server replaced it meanwhile). The pids come from the server (``/health``'s stages,
else ``/debug/state``). Per fault, from the signal on: detection (``/health``, polled every 50 ms, reports the
stage not ok; from a server whose ``/health`` has no per-stage states: anything but 200, or a new pid for the stage
in ``/debug/state``, which answers only once every stage does, so within about 10 s), restart (a new pid for the
stage), ok again (``/health`` healthy again after that), first answer (the first text or audio of a request sent
after the fault) and recovery (the first request sent after the fault completes: load, or the short probe requests
the bench sends after each fault until one completes). The next fault comes once this one healed (bounded by
``--recovery-timeout``).

``--malformed M``: M rounds of the malformed requests of ``bench/malformed.py``, sent one by one while the load
runs; 4xx and 5xx are counted and every 5xx is listed with its body.

Resources of the server process and all its descendants, from /proc: RSS (also of just the processes that lived
through the run), open fds, threads, child processes and the /dev/shm segments of its engines' runs; measured after
a warm-up round and again after the run, once the engines hold no request. Against a running server
(``--base-url``) they are measured when the server runs on this machine (the process listening on the URL's port,
or ``--server-pid``).

``--spawn`` starts ``omnipipe serve`` on a free loopback port with a deploy file holding short liveness bounds
(``stall_report_s``, ``stall_restart_s`` for every stage), waits for ``/health`` 200 and stops it at the end
(SIGINT, then SIGKILL): nothing it started may be left, neither processes nor /dev/shm segments nor run
directories. ``--gateway`` starts ``omnipipe up`` with two workers instead and sends everything through the gateway;
its own fault is the SIGKILL of the first worker process (``up`` starts it again), detected when the gateway's
``/health`` no longer shows that worker serving; stage faults go to the first worker.

Exit code 1, with a FAIL line saying why, if a request got stuck, a malformed request got a 5xx or no answer, a
fault was not detected or did not heal, or something leaked: processes, segments or run directories after the stop,
requests the engines still hold after the run, or RSS grown by more than ``--max-rss-growth`` percent (the RSS of
the processes that lived through the run: a restarted stage, or an engine started on first use, is no growth).
"""


from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import Any

import httpx

from omnipipe.bench.gateway import BenchError, Child, stop_children
from omnipipe.bench.report import machine_info, write_json
from omnipipe.bench.serve_datasets import load_prompts
from omnipipe.bench.soak_faults import Rig, fault_share, measure, plan_faults, run_faults
from omnipipe.bench.soak_health import HealthWatch, StatePidWatch, served_model, stage_pids, wait_idle
from omnipipe.bench.soak_load import Outcome, Progress, leave_plan, run_load, soak_request, tally
from omnipipe.bench.soak_malformed import malformed_list, malformed_summary, run_malformed
from omnipipe.bench.soak_processes import ProcessWatch, after_stop, resources, survivors_rss
from omnipipe.bench.soak_report import change_percent, format_report, verdict
from omnipipe.bench.soak_targets import GATEWAY_WORKERS, running_target, spawn_target
from omnipipe.gateway.proxy.http import QUEUE_EVENTS_HEADER
from omnipipe.protocol.worker import DEFAULT_MAX_BODY_BYTES

PROBE_MAX_TOKENS = 8  # probes are short: they tell when a whole request goes through again


async def soak(args: argparse.Namespace, target: dict[str, Any]) -> tuple[dict[str, Any], ProcessWatch | None]:
    """Warm-up, resources, then load + faults + malformed together, then resources again. Returns the report and
    what was seen of the server's processes (to check the stop)."""
    url, headers, root = target["url"], target["headers"], target["root_pid"]
    # through a gateway, a request tells its wait in the queue (queue events) from a silent one
    request_headers = {**headers, QUEUE_EVENTS_HEADER: "1"} if target["gateway"] else headers
    timeout = httpx.Timeout(args.request_timeout + 10, connect=10.0)
    limits = httpx.Limits(max_connections=args.concurrency + 2, max_keepalive_connections=args.concurrency + 2)
    async with contextlib.AsyncExitStack() as stack:
        load_client = await stack.enter_async_context(httpx.AsyncClient(base_url=url, headers=request_headers,
                                                                        timeout=timeout, limits=limits))
        probe_client = await stack.enter_async_context(httpx.AsyncClient(base_url=url, headers=request_headers,
                                                                         timeout=timeout))
        watch_client = await stack.enter_async_context(httpx.AsyncClient(timeout=10.0))
        malformed_client = await stack.enter_async_context(httpx.AsyncClient(base_url=url, timeout=timeout))
        model = await served_model(watch_client, url, headers)
        engine = target["engine"]
        rig = Rig(url, headers, target["stage_url"], engine, watch_client, HealthWatch(watch_client,
                                                                                        target["stage_url"]))
        if target["gateway"]:
            rig.gateway_health = HealthWatch(watch_client, url)
        processes = ProcessWatch(root, target["worker_ports"]) if root is not None else None
        rig.processes = processes
        stage_names = list((await stage_pids(watch_client, target["stage_url"], headers, engine)).keys())
        unknown = [s for s in [*args.kill, *([args.stop_stage] if args.stop_stage_s > 0 else [])]
                   if s not in stage_names]
        if unknown:
            raise BenchError(f"no stage {', '.join(map(repr, unknown))} in pipeline {engine!r} "
                             f"(its stages: {', '.join(stage_names)})")
        prompts = load_prompts("random", args.requests + args.warmup * args.concurrency, args.seed)
        warm, prompts = prompts[:args.warmup * args.concurrency], prompts[args.warmup * args.concurrency:]
        cases = malformed_list(model, target["max_body_bytes"], bool(headers)) if args.malformed else []
        if warm:  # with one round of the malformed requests, which may start the speech and transcription engines
            print(f"omnipipe bench soak: warm-up ({len(warm)} requests{' and the malformed ones' if cases else ''})",
                  file=sys.stderr, flush=True)
            await asyncio.gather(run_load(load_client, model, warm, {}, args.concurrency, args.max_tokens,
                                          args.request_timeout, Progress(len(warm))),
                                 run_malformed(malformed_client, cases, 1, headers, args.request_timeout))
        idle_urls = target["idle_urls"]
        held_before = await wait_idle(watch_client, idle_urls, headers, 60.0)
        if held_before:
            print(f"omnipipe bench soak: before the run the engines still hold: {'; '.join(held_before)}",
                  file=sys.stderr)
        before = None
        if processes is not None:
            processes.sample_tree()
            before, rss_before = resources(root, processes.runs)
        first = await rig.stage_health.poll_once()
        if first.stages is None:  # no per-stage /health: pids from /debug/state
            rig.state_pids = StatePidWatch(watch_client, target["stage_url"], headers, engine)
        monitors = [asyncio.create_task(m.run()) for m in (rig.stage_health, rig.gateway_health, rig.state_pids,
                                                           processes) if m is not None]
        faults = plan_faults(args.kill, args.stop_stage, args.stop_stage_s, target["fault_worker"])
        progress = Progress(len(prompts), len(prompts) - fault_share(len(prompts), len(faults)) * len(faults))
        probes: list[Outcome] = []
        leave = leave_plan(len(prompts), args.abort_rate, args.seed)
        probe_prompts = iter(load_prompts("random", 10_000, args.seed + 1))

        def probe() -> Awaitable[Outcome]:
            return soak_request(probe_client, model, next(probe_prompts), min(args.max_tokens, PROBE_MAX_TOKENS),
                                None, args.request_timeout)

        print(f"omnipipe bench soak: {len(prompts)} requests at concurrency {args.concurrency} "
              f"({len(leave)} left by the client), {len(faults)} fault(s), {args.malformed} malformed round(s) of "
              f"{len(cases)}", file=sys.stderr, flush=True)
        start, started_at_unix = time.perf_counter(), time.time()

        def since(t: float | None) -> float | None:
            return None if t is None else t - start

        try:
            outcomes, _, malformed = await asyncio.gather(
                run_load(load_client, model, prompts, leave, args.concurrency, args.max_tokens,
                         args.request_timeout, progress),
                run_faults(rig, faults, progress, args.concurrency, probe, probes, args.recovery_timeout,
                           random.Random(args.seed)),
                run_malformed(malformed_client, cases, args.malformed, headers, args.request_timeout))
            wall = time.perf_counter() - start
            held_after = await wait_idle(watch_client, idle_urls, headers, 60.0)
        finally:
            for task in monitors:
                task.cancel()
            await asyncio.gather(*monitors, return_exceptions=True)
        end_health = await rig.stage_health.poll_once()
        after = None
        if processes is not None:
            processes.sample_tree()
            after, rss_after = resources(root, processes.runs)
    starts = [f.at for f in faults if f.at is not None]
    for fault in faults:
        later = [t for t in starts if fault.at is not None and t > fault.at]
        measure(rig, fault, [*outcomes, *probes], min(later, default=math.inf))
    leaks = [f"the engines still hold {h}" for h in held_after]
    if before and after:
        before["rss_lived_through_mib"], after["rss_lived_through_mib"], lived = survivors_rss(rss_before, rss_after)
        before["lived_through"] = after["lived_through"] = lived
        growth = change_percent(before["rss_lived_through_mib"], after["rss_lived_through_mib"])
        if growth is not None and growth > args.max_rss_growth:
            leaks.append(f"RSS of the {lived} processes that lived through the run grew {growth:.1f}% (over "
                         f"{args.max_rss_growth:g}%): {before['rss_lived_through_mib']:.0f} -> "
                         f"{after['rss_lived_through_mib']:.0f} MiB")
    return {
        "model": model, "wall_s": wall, "per_stage_health": rig.per_stage_health(),
        "stages_at_end": {name: {k: info.get(k) for k in ("state", "pid", "restarts", "stalls")}
                          for name, info in (end_health.stages or {}).items()},
        "requests": {"load": tally(outcomes), "probes": tally(probes),
                     "timeline": [{"probe": probe_flag, "kind": o.kind, "cause": o.cause,
                                   "started_s": o.started - start, "ended_s": o.ended - start,
                                   "answered_s": since(o.answered), "events": o.events,
                                   "last_event_s": since(o.last_event), "dequeued_s": since(o.dequeued)}
                                  for probe_flag, group in ((False, outcomes), (True, probes)) for o in group]},
        "started_at_unix": started_at_unix,
        "faults": [{"label": f.label, "kind": f.kind, "target": f.target, "stop_s": f.stop_s, "pid": f.pid,
                    "at_s": None if f.at is None else f.at - start, "under_load": f.under_load, "error": f.error,
                    "detected_s": f.detected_s, "restarted_s": f.restarted_s, "ok_again_s": f.ok_again_s,
                    "answered_s": f.answered_s, "recovered_s": f.recovered_s} for f in faults],
        "resources": {"root_pid": root, "before": before, "after": after,
                      "note": None if root is not None else "the server's process is not on this machine"},
        "malformed": malformed_summary(malformed, args.malformed) if args.malformed else None,
        "leaks": leaks,
    }, processes


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="omnipipe bench soak", description=__doc__.split("\n\n")[0],
                                     epilog="\n\n".join(__doc__.split("\n\n")[2:]),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--base-url", default=None, help="a running server (default: http://127.0.0.1:8091)")
    where.add_argument("--spawn", action="store_true", help="start omnipipe serve (and stop it at the end)")
    where.add_argument("--gateway", action="store_true",
                       help=f"start omnipipe up with {GATEWAY_WORKERS} workers and go through its gateway")
    parser.add_argument("--pipeline", default="default", help="with --spawn/--gateway (default: %(default)s)")
    parser.add_argument("--deploy", type=Path, help="with --spawn/--gateway: a deploy YAML to start from")
    parser.add_argument("--api-key", default=os.environ.get("OMNIPIPE_API_KEY"),
                        help="sent as 'Authorization: Bearer KEY' (default: $OMNIPIPE_API_KEY; --spawn: a random "
                             "one the server is started with)")
    parser.add_argument("--server-pid", type=int, help="with --base-url: the server's pid, for its resources "
                        "(default: the process listening on the URL's port, if on this machine)")
    parser.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                        help="with --base-url: the server's body limit, for the malformed case just over it")
    parser.add_argument("--requests", type=int, default=60, help="streaming chat completions (default: %(default)s)")
    parser.add_argument("--concurrency", type=int, default=8, help="at most this many in flight")
    parser.add_argument("--abort-rate", type=float, default=0.2, help="share of requests the client leaves mid-stream")
    parser.add_argument("--kill-stages", default="", help="comma-separated stages to SIGKILL once each, e.g. "
                        "thinker,talker,code2wav")
    parser.add_argument("--stop-stage-s", type=float, default=0.0, help="SIGSTOP a stage this long (0: not at all)")
    parser.add_argument("--stop-stage", default="thinker", help="the stage --stop-stage-s stops (default: thinker)")
    parser.add_argument("--malformed", type=int, default=0, help="rounds of the malformed request list")
    # short enough that a --stop-stage-s of 25 s goes through the restart path, wide enough that a busy 2-core
    # machine's slow steps are only reported (at 1 s / 4 s the watchdog killed a loaded thinker until it was given up)
    parser.add_argument("--stall-report-s", type=float, default=2.0,
                        help="--spawn/--gateway: every stage's stall_report_s in the deploy file")
    parser.add_argument("--stall-restart-s", type=float, default=20.0,
                        help="--spawn/--gateway: every stage's stall_restart_s (a negative value: null, never)")
    parser.add_argument("--max-tokens", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0, help="question order and which requests are left")
    parser.add_argument("--warmup", type=int, default=1, help="rounds of --concurrency requests first, not counted")
    parser.add_argument("--request-timeout", type=float, default=120.0,
                        help="a request without an end after this many seconds is stuck")
    parser.add_argument("--recovery-timeout", type=float, default=180.0,
                        help="how long a fault may take to heal before the next one")
    parser.add_argument("--startup-timeout", type=float, default=900.0, help="seconds to wait for the models")
    parser.add_argument("--max-rss-growth", type=float, default=10.0, help="percent of RSS growth that is a leak")
    parser.add_argument("--json", help="also write everything here")
    return parser


def _check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The flags checked together (``parser.error`` on a mistake); ``args.kill`` the stages to kill, a negative
    ``--stall-restart-s`` None, and ``--base-url``'s default where no server is started."""
    args.kill = [s.strip() for s in args.kill_stages.split(",") if s.strip()]
    if len(set(args.kill)) != len(args.kill):
        parser.error("--kill-stages: each stage once")
    if args.requests < 1 or args.concurrency < 1 or args.max_tokens < 1 or args.warmup < 0 or args.malformed < 0:
        parser.error("--requests, --concurrency and --max-tokens must be >= 1, --warmup and --malformed >= 0")
    if not 0 <= args.abort_rate <= 1:
        parser.error("--abort-rate: a share in [0, 1]")
    if not (math.isfinite(args.stop_stage_s) and args.stop_stage_s >= 0):
        parser.error("--stop-stage-s: a number of seconds >= 0")
    for flag in ("request_timeout", "recovery_timeout", "startup_timeout", "stall_report_s"):
        if not getattr(args, flag) > 0:
            parser.error(f"--{flag.replace('_', '-')}: must be > 0")
    if args.stall_restart_s < 0:
        args.stall_restart_s = None
    elif args.stall_restart_s <= args.stall_report_s:
        parser.error("--stall-restart-s: must be above --stall-report-s (or negative: never)")
    spawn = args.spawn or args.gateway
    if spawn and args.deploy is not None and not args.deploy.is_file():
        parser.error(f"--deploy: file not found: {args.deploy}")
    if spawn:
        from omnipipe.models.registry import UnknownPipelineError, get_pipeline

        try:
            get_pipeline(args.pipeline)
        except UnknownPipelineError as exc:
            parser.error(f"--pipeline: {exc}")
    if not spawn and args.base_url is None:
        args.base_url = "http://127.0.0.1:8091"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _check_args(parser, args)
    spawn = args.spawn or args.gateway
    info = machine_info()
    workdir = Path(tempfile.mkdtemp(prefix="omnipipe-bench-soak-"))
    children: list[Child] = []
    report: dict[str, Any] | None = None
    try:
        target = spawn_target(args, workdir, children) if spawn else running_target(args)
        try:
            report, processes = asyncio.run(soak(args, target))
        except (OSError, httpx.HTTPError) as exc:  # OSError includes TimeoutError
            for child in children:
                child.check_alive()
            raise BenchError(f"{type(exc).__name__}: {exc}") from exc
    except BenchError as exc:
        print(f"omnipipe bench soak: {exc}", file=sys.stderr)
        if children:
            print(f"omnipipe bench soak: logs kept in {workdir}", file=sys.stderr)
        return 1
    finally:
        killed = stop_children(children)
        if killed:
            print(f"omnipipe bench soak: had to kill {', '.join(killed)}", file=sys.stderr)
        if report is not None and spawn:
            report["after_stop"] = after_stop(processes)
            report["leaks"] += report["after_stop"]
            code = children[0].process.returncode
            if code != 0:
                report["leaks"].append(f"{children[0].name} exited with code {code} when stopped")
                print(f"omnipipe bench soak: the end of {children[0].name}'s log:\n{children[0].log_tail()}",
                      file=sys.stderr)
    mode = "gateway (omnipipe up)" if args.gateway else "spawned server" if args.spawn else target["url"]
    print(f"omnipipe bench soak: {mode}, pipeline {target['engine']!r}, model {report['model']!r}; "
          f"{args.requests} requests at concurrency {args.concurrency}, abort rate {args.abort_rate:g}, "
          f"{report['wall_s']:.1f} s; /health per stage: {'yes' if report['per_stage_health'] else 'no'}")
    print(format_report(report))
    if spawn and not report["after_stop"]:
        print(f"\nafter the stop: no process, /dev/shm segment or run directory left of the "
              f"{len(processes.seen)} processes and {len(processes.runs)} engine runs seen")
    reasons = verdict(report)
    print()
    print(f"FAIL: {'; '.join(reasons)}" if reasons else "PASS: nothing stuck, no 5xx, every fault healed, no leak")
    if reasons and children:
        print(f"logs kept in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        _write_json(args, target, report, reasons, info)
    return 1 if reasons else 0


def _write_json(args: argparse.Namespace, target: dict[str, Any], report: dict[str, Any], reasons: list[str],
                info: dict[str, Any]) -> None:
    """Everything of the run to ``--json``: how it was run, the report and the verdict."""
    write_json(args.json, {
        "meta": {"mode": "gateway" if args.gateway else "spawn" if args.spawn else "base-url",
                 "url": target["url"], "pipeline": target["engine"], "requests": args.requests,
                 "concurrency": args.concurrency, "abort_rate": args.abort_rate, "kill_stages": args.kill,
                 "stop_stage": args.stop_stage if args.stop_stage_s > 0 else None,
                 "stop_stage_s": args.stop_stage_s, "malformed_rounds": args.malformed,
                 "max_tokens": args.max_tokens, "seed": args.seed, "request_timeout_s": args.request_timeout,
                 "deploy": target["deploy"], "machine": info},
        **report, "fail": reasons})
    print(f"figures written to {args.json}")


if __name__ == "__main__":
    sys.exit(main())

"""What the soak runs against: ``omnipipe serve`` or ``omnipipe up`` started on free loopback ports with short
liveness bounds (``--spawn``, ``--gateway``), or a server someone else started (``--base-url``)."""

from __future__ import annotations

import argparse
import dataclasses
import math
import secrets
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import yaml

from omnipipe.bench.gateway import BenchError, Child, wait_until
from omnipipe.bench.soak_processes import listening_pid, worker_name
from omnipipe.protocol.worker import DEFAULT_MAX_BODY_BYTES
from omnipipe.util.net import free_port, free_ports

SPAWN_MAX_BODY_BYTES = 2_000_000
GATEWAY_WORKERS = 2


def liveness_deploy(base: Path | None, stages: Sequence[str], report_s: float,
                    restart_s: float | None) -> dict[str, Any]:
    """The deploy file for ``--spawn``: ``base`` (if given) with the liveness bounds set for every stage that does
    not set its own; the bounds only where this build's deploy config knows them."""
    from omnipipe.config.deploy_config import StageDeploy

    raw: dict[str, Any] = (yaml.safe_load(base.read_text()) or {}) if base is not None else {}
    known = {f.name for f in dataclasses.fields(StageDeploy)}
    if not {"stall_report_s", "stall_restart_s"} <= known:
        return raw
    stages_raw = raw.setdefault("stages", {})
    for stage in stages:
        settings = stages_raw.setdefault(stage, {}) or {}
        settings.setdefault("stall_report_s", report_s)
        settings.setdefault("stall_restart_s", restart_s)
        stages_raw[stage] = settings
    return raw


def spawn_target(args: argparse.Namespace, workdir: Path, children: list[Child]) -> dict[str, Any]:
    """Start ``omnipipe serve`` (or ``omnipipe up``) and wait until it serves; what ``soak`` needs to know of it."""
    from omnipipe.models.registry import get_pipeline

    pipeline = get_pipeline(args.pipeline)
    deploy = liveness_deploy(args.deploy, pipeline.stage_names, args.stall_report_s, args.stall_restart_s)
    deploy_path = workdir / "deploy.yaml"
    deploy_path.write_text(yaml.safe_dump(deploy))
    port = free_port()
    if not args.gateway:
        api_key = args.api_key or secrets.token_urlsafe(12)
        server = Child("server", ["serve", "--pipeline", args.pipeline, "--host", "127.0.0.1", "--port", str(port),
                                  "--deploy", str(deploy_path), f"--api-key={api_key}",
                                  "--max-body-bytes", str(SPAWN_MAX_BODY_BYTES)], workdir, port)
        children.append(server)
        print(f"omnipipe bench soak: starting omnipipe serve --pipeline {args.pipeline} on port {port} "
              f"(log in {server.log_path})", file=sys.stderr, flush=True)
        wait_until(lambda: httpx.get(f"{server.url}/health", timeout=5).status_code == 200, args.startup_timeout,
                   "the server", children)
        return {"url": server.url, "headers": {"Authorization": f"Bearer {api_key}"}, "root_pid": server.process.pid,
                "stage_url": server.url, "engine": args.pipeline, "gateway": False, "worker_ports": [],
                "fault_worker": None, "idle_urls": [server.url], "max_body_bytes": SPAWN_MAX_BODY_BYTES,
                "deploy": deploy}
    try:
        worker_ports = free_ports(GATEWAY_WORKERS)
    except OSError as exc:
        raise BenchError(str(exc)) from exc
    capacity = max(1, math.ceil(args.concurrency / GATEWAY_WORKERS))
    up = Child("up", ["up", "--workers", str(GATEWAY_WORKERS), "--pipeline", args.pipeline, "--deploy",
                      str(deploy_path), "--capacity", str(capacity), "--worker-port", str(worker_ports[0]), "--port",
                      str(port), f"--admin-token={secrets.token_urlsafe(12)}", "--data-dir", str(workdir / "data")],
               workdir, port)
    children.append(up)
    print(f"omnipipe bench soak: starting omnipipe up --workers {GATEWAY_WORKERS} --pipeline {args.pipeline} "
          f"(gateway on port {port}, workers on {worker_ports[0]}..{worker_ports[-1]}; log in {up.log_path})",
          file=sys.stderr, flush=True)
    worker_urls = [f"http://127.0.0.1:{p}" for p in worker_ports]

    def all_ready() -> bool:
        reply = httpx.get(f"{up.url}/health", timeout=5).json()
        workers = reply.get("workers") or {}
        return len(workers) == GATEWAY_WORKERS and all(s == "IDLE" for s in workers.values()) and \
            all(httpx.get(f"{u}/health", timeout=5).status_code == 200 for u in worker_urls)

    wait_until(all_ready, args.startup_timeout, "omnipipe up", children)
    return {"url": up.url, "headers": {}, "root_pid": up.process.pid, "stage_url": worker_urls[0],
            "engine": args.pipeline, "gateway": True, "worker_ports": worker_ports,
            "fault_worker": worker_name(worker_ports[0]), "idle_urls": worker_urls,
            "max_body_bytes": DEFAULT_MAX_BODY_BYTES, "deploy": deploy}


def running_target(args: argparse.Namespace) -> dict[str, Any]:
    """A server started by someone else, at ``--base-url``."""
    url = args.base_url.rstrip("/")
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    try:
        health = httpx.get(f"{url}/health", timeout=10)
        engines = httpx.get(f"{url}/debug/state", headers=headers, timeout=30)
        engines.raise_for_status()
    except httpx.HTTPError as exc:
        raise BenchError(f"cannot reach {url}: {exc}") from exc
    pipeline = health.json().get("pipeline") or next(iter(engines.json()["engines"]))
    root = args.server_pid
    split = urlsplit(url)
    if root is None and split.hostname in ("127.0.0.1", "localhost", "::1"):
        root = listening_pid(split.port or 80)
    return {"url": url, "headers": headers, "root_pid": root, "stage_url": url, "engine": pipeline,
            "gateway": False, "worker_ports": [], "fault_worker": None, "idle_urls": [url],
            "max_body_bytes": args.max_body_bytes, "deploy": None}

"""The gateway's commands: ``omnipipe gateway``, ``omnipipe up`` and ``omnipipe sessions``.

    omnipipe gateway --workers 127.0.0.1:22400,127.0.0.1:22401 --port 8006 --admin-token T --presets presets.yaml
    omnipipe up --workers 2
    omnipipe sessions cleanup --data-dir data --retention-days 30 --max-storage-gb 10
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from omnipipe.cli.supervisor import Supervised, Supervisor
from omnipipe.protocol.header_limits import PARSER_HEADER_BLOCK_BYTES
from omnipipe.protocol.worker import DEFAULT_MAX_BODY_BYTES
from omnipipe.util.field_error import FieldError
from omnipipe.util.process import kill_group, start_in_group, stop_groups


class GatewayCLIError(Exception):
    """A mistake the user can fix; printed as one line, exit code 2."""


def _flag_message(exc: FieldError) -> str:
    """``FieldError("max_queue", "must be ...")`` -> ``--max-queue: must be ...``."""
    return f"--{exc.field.replace('_', '-')}: {exc.rule}"


def _add_storage_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", type=Path, default=Path("data"), help="where sessions are recorded (default: ./data)")
    p.add_argument("--retention-days", type=float, default=30.0, help="delete recordings older than this")
    p.add_argument("--max-storage-gb", type=float, default=10.0, help="then delete the oldest beyond this size")


def add_gateway(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("gateway", help="queue, record and serve web pages in front of workers (loads no model)")
    p.add_argument("--workers", required=True, help="comma-separated worker addresses host:port")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8006)
    p.add_argument("--max-queue", type=int, default=1000, help="requests that may wait at once; more get 503")
    p.add_argument("--admin-token", default=os.environ.get("OMNIPIPE_ADMIN_TOKEN"),
                   help="token for the admin API and page (default: $OMNIPIPE_ADMIN_TOKEN; none disables admin)")
    p.add_argument("--no-record", action="store_true", help="do not record sessions")
    p.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES, help="larger request bodies get 413")
    _add_presets_flag(p)
    _add_storage_flags(p)
    _add_tls_flags(p)
    p.add_argument("--verbose", "-v", action="store_true")


def _add_presets_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--presets", type=Path, help="YAML or JSON file of named presets (system prompt, voice, output "
                   "modalities) the chat and voice pages offer; see docs/gateway.md")


def _add_tls_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ssl-certfile", type=Path, help="serve https/wss with this certificate (PEM); browsers give "
                   "the microphone only to https pages or localhost")
    p.add_argument("--ssl-keyfile", type=Path, help="the certificate's private key (PEM)")


def _tls_options(args: argparse.Namespace) -> dict[str, str]:
    cert, key = getattr(args, "ssl_certfile", None), getattr(args, "ssl_keyfile", None)
    if (cert is None) != (key is None):
        raise GatewayCLIError("--ssl-certfile and --ssl-keyfile go together")
    for flag, path in (("--ssl-certfile", cert), ("--ssl-keyfile", key)):
        if path is not None and not path.is_file():
            raise GatewayCLIError(f"{flag}: file not found: {path}")
    return {"ssl_certfile": str(cert), "ssl_keyfile": str(key)} if cert is not None else {}


def _presets(path: Path | None) -> list[Any]:
    """The presets in the ``--presets`` file (none without one); a bad one names the file and its field."""
    from omnipipe.gateway.presets import load_presets

    if path is None:
        return []
    try:
        return load_presets(path)
    except FieldError as exc:
        raise GatewayCLIError(f"--presets {path}: {exc}") from None


def gateway_config(args: argparse.Namespace) -> Any:
    from omnipipe.gateway.config import GatewayConfig

    workers = [w.strip() for w in args.workers.split(",") if w.strip()]
    presets = _presets(getattr(args, "presets", None))
    try:
        return GatewayConfig(workers=workers, host=args.host, port=args.port, max_queue=args.max_queue,
                             admin_token=args.admin_token, data_dir=args.data_dir, record=not args.no_record,
                             retention_days=args.retention_days, max_storage_gb=args.max_storage_gb,
                             max_body_bytes=getattr(args, "max_body_bytes", DEFAULT_MAX_BODY_BYTES), presets=presets)
    except FieldError as exc:
        raise GatewayCLIError(_flag_message(exc)) from None


def run_gateway(args: argparse.Namespace) -> int:
    import uvicorn

    from omnipipe.gateway.app import create_gateway_app

    config = gateway_config(args)
    tls = _tls_options(args)
    try:
        app = create_gateway_app(config)
    except FieldError as exc:  # the stored share links cannot be read
        raise GatewayCLIError(_flag_message(exc)) from None
    scheme = "https" if tls else "http"
    print(f"omnipipe: gateway on {scheme}://{config.host}:{config.port} for {len(config.workers)} worker(s); "
          f"recordings in {config.data_dir.resolve() if config.record else '(off)'}", file=sys.stderr)
    class GatewayServer(uvicorn.Server):
        async def shutdown(self, sockets: Any = None) -> None:
            # uvicorn drains open requests before the app's own shutdown runs: answer the queued ones first
            # (queue_cancelled), so none waits out the drain and ends as a bare 500 when it is cut
            cancelled = app.state.pool.cancel_all()
            if cancelled:
                print(f"omnipipe: gateway stopping; told {cancelled} queued client(s) (queue_cancelled)",
                      file=sys.stderr)
            await super().shutdown(sockets)

    server = GatewayServer(uvicorn.Config(app, host=config.host, port=config.port,
                                          log_level="info" if args.verbose else "warning",
                                          timeout_graceful_shutdown=5,
                                          h11_max_incomplete_event_size=PARSER_HEADER_BLOCK_BYTES, **tls))
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    return 0


# ---------------------------------------------------------------------------------------------- up
def add_up(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("up", help="start N workers and a gateway on this machine; Ctrl-C stops them all",
                       description="Start N workers and a gateway on this machine. A worker that exits is started "
                       "again (same command, same port) after 1 s, 2 s, 4 s ... (at most 30 s) while the gateway "
                       "serves with the others and takes it back once it answers; past --max-worker-restarts "
                       "restarts in a row it stays down. If the gateway exits, everything stops (exit code 1), as "
                       "it does when no worker is left. Ctrl-C or SIGTERM stops everything.")
    p.add_argument("--workers", type=int, default=1, help="how many workers")
    p.add_argument("--max-worker-restarts", type=int, default=5,
                   help="restarts of one worker in a row before it stays down (0: never restart); the "
                   "count starts over once a restarted worker has run 10 minutes")
    p.add_argument("--pipeline", default="default")
    p.add_argument("--deploy", type=Path, help="deploy YAML for every worker")
    p.add_argument("--capacity", type=int, default=2, help="sessions each worker takes at once")
    p.add_argument("--worker-port", type=int, default=22400, help="first worker's port; the next ones follow")
    p.add_argument("--host", default="127.0.0.1", help="the gateway's address (workers stay on 127.0.0.1)")
    p.add_argument("--port", type=int, default=8006, help="the gateway's port")
    p.add_argument("--max-queue", type=int, default=1000)
    p.add_argument("--admin-token", default=os.environ.get("OMNIPIPE_ADMIN_TOKEN"),
                   help="admin token (default: $OMNIPIPE_ADMIN_TOKEN, else a random one, printed)")
    p.add_argument("--no-record", action="store_true")
    _add_presets_flag(p)
    _add_storage_flags(p)
    _add_tls_flags(p)
    p.add_argument("--verbose", "-v", action="store_true")


def _port_free(host: str, port: int) -> bool:
    """Whether a server could listen on ``host:port`` now (sockets of a just-stopped run in TIME-WAIT do not count,
    as servers set SO_REUSEADDR too)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _check_up_flags(args: argparse.Namespace) -> list[int]:
    """``up``'s flags checked before anything starts (the ports free); the workers' ports."""
    from omnipipe.models.registry import get_pipeline

    if not 1 <= args.workers <= 64:
        raise GatewayCLIError(f"--workers: must be in 1..64, got {args.workers}")
    if args.capacity < 1:
        raise GatewayCLIError(f"--capacity: must be >= 1, got {args.capacity}")
    if args.max_worker_restarts < 0:
        raise GatewayCLIError(f"--max-worker-restarts: must be >= 0, got {args.max_worker_restarts}")
    if args.deploy is not None and not args.deploy.is_file():
        raise GatewayCLIError(f"--deploy: file not found: {args.deploy}")
    get_pipeline(args.pipeline)
    worker_ports = [args.worker_port + i for i in range(args.workers)]
    ports = [*(("--worker-port", "127.0.0.1", p) for p in worker_ports), ("--port", args.host, args.port)]
    for flag, host, port in ports:
        if not 0 < port < 65536:
            raise GatewayCLIError(f"{flag}: must be in 1..65535, got {port}")
        if not _port_free(host, port):
            raise GatewayCLIError(f"{flag}: port {port} on {host} is already in use")
    return worker_ports


def run_up(args: argparse.Namespace) -> int:
    worker_ports = _check_up_flags(args)
    tls = _tls_options(args)
    token = args.admin_token or secrets.token_urlsafe(12)
    gateway_args = argparse.Namespace(workers=",".join(f"127.0.0.1:{p}" for p in worker_ports), host=args.host,
                                      port=args.port, max_queue=args.max_queue, admin_token=token,
                                      data_dir=args.data_dir, no_record=args.no_record,
                                      retention_days=args.retention_days, max_storage_gb=args.max_storage_gb,
                                      max_body_bytes=getattr(args, "max_body_bytes", DEFAULT_MAX_BODY_BYTES),
                                      presets=args.presets)
    gateway_config(gateway_args)  # validate before starting anything
    cli = [sys.executable, "-m", "omnipipe.cli.main"]
    verbose = ["--verbose"] if args.verbose else []
    commands = {f"worker {port}": [*cli, "worker", "--port", str(port), "--pipeline", args.pipeline,
                                   "--capacity", str(args.capacity), *(["--deploy", str(args.deploy)]
                                                                       if args.deploy else []), *verbose]
                for port in worker_ports}
    commands["gateway"] = [*cli, "gateway", "--workers", gateway_args.workers, "--host", args.host, "--port",
                           str(args.port), "--max-queue", str(args.max_queue), "--data-dir", str(args.data_dir),
                           "--retention-days", str(args.retention_days), "--max-storage-gb",
                           str(args.max_storage_gb), *(["--no-record"] if args.no_record else []), *verbose,
                           *(["--presets", str(args.presets)] if args.presets else []),
                           *(["--ssl-certfile", tls["ssl_certfile"], "--ssl-keyfile", tls["ssl_keyfile"]]
                             if tls else [])]
    env = {**os.environ, "OMNIPIPE_ADMIN_TOKEN": token, "PYTHONUNBUFFERED": "1"}
    # own process groups: a Ctrl-C reaches only `up`, which then stops every child in order; and each gets SIGTERM
    # if `up` itself dies (even by SIGKILL)
    children = [Supervised(name, command, restart=name != "gateway") for name, command in commands.items()]
    supervisor = Supervisor(children, start=lambda command: start_in_group(command, env=env),
                            max_restarts=args.max_worker_restarts)
    stopping = False

    def stop(signum: int, _: Any) -> None:
        nonlocal stopping
        if stopping:  # a second Ctrl-C: kill everything now rather than wait for the orderly stop
            with contextlib.suppress(OSError):
                os.write(sys.stderr.fileno(), b"omnipipe: killing the workers and the gateway\n")
            for _, process in supervisor.processes():
                kill_group(process.pid)  # each child leads its own group: a worker's stages go with it
            os._exit(128 + signum)
        stopping = True
        with contextlib.suppress(OSError):
            os.write(sys.stderr.fileno(), b"omnipipe: stopping (again to kill everything at once)\n")

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        supervisor.start_all()
        url = f"{'https' if tls else 'http'}://{args.host}:{args.port}"
        print(f"omnipipe: starting {args.workers} worker(s) (pipeline {args.pipeline!r}, ports "
              f"{worker_ports[0]}..{worker_ports[-1]}) and the gateway on {url}", file=sys.stderr)
        announced = False
        while not stopping:
            fatal = supervisor.check()
            if fatal:
                print(f"omnipipe: {fatal}", file=sys.stderr)
                return 1
            awaiting = supervisor.awaiting_back()
            states = _worker_states(url) if not announced or awaiting else {}
            _announce_back(supervisor, awaiting, states, url)
            if not announced and states and "LOADING" not in states.values() and "OFFLINE" not in states.values():
                announced = True
                failed = sorted(address for address, state in states.items() if state == "ERROR")
                if failed:
                    print(f"omnipipe: worker(s) {', '.join(failed)} failed to load (see their output above; "
                          f"{url}/admin shows the reason)", file=sys.stderr)
                print(f"omnipipe: ready. Open {url}/chat or {url}/voice; admin: {url}/admin "
                      f"(token {token}). Ctrl-C stops everything.", file=sys.stderr)
            time.sleep(0.5)
        return 0
    finally:
        _stop_children(supervisor.processes())
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _announce_back(supervisor: Supervisor, restarted: Sequence[Supervised], states: dict[str, str],
                   url: str) -> None:
    """Say which restarted workers are back: the new process answers on its port and the gateway (whose health
    checks take it back by themselves) no longer reports it offline. The worker's own answer is asked for as the
    gateway may still report the state it had before the exit."""
    for child in restarted:
        port = child.name.removeprefix("worker ")
        state = _health(f"http://127.0.0.1:{port}").get("state")
        if state == "ERROR":
            supervisor.back(child, f"is back but failed to load (see {url}/admin)")
        elif state not in (None, "LOADING") and states.get(f"127.0.0.1:{port}") not in (None, "OFFLINE", "LOADING"):
            supervisor.back(child)


def _health(url: str) -> dict[str, Any]:
    """The /health reply of the gateway or worker at ``url`` ({} if it does not answer yet); the gateway's own
    certificate is not checked: it is ours."""
    for wildcard in ("0.0.0.0", "[::]", "::"):
        url = url.replace(f"//{wildcard}:", "//127.0.0.1:")
    try:
        reply = httpx.get(f"{url}/health", timeout=1.0, verify=False).json()
    except (httpx.HTTPError, ValueError):
        return {}
    return reply if isinstance(reply, dict) else {}


def _worker_states(url: str) -> dict[str, str]:
    """The worker states the gateway at ``url`` reports ({} if it does not answer yet)."""
    workers = _health(url).get("workers", {})
    return workers if isinstance(workers, dict) else {}


def _stop_children(children: list[tuple[str, subprocess.Popen[bytes]]]) -> None:
    """The gateway first (so no new work goes out and queued clients are told), then the workers; each gets
    SIGTERM, then SIGKILL of its process group if it has not ended within 15 s."""
    gateway = [c for n, c in children if n == "gateway"]
    workers = [c for n, c in children if n != "gateway"]
    for group in (gateway, workers):
        stop_groups(group, signum=signal.SIGTERM, timeout_s=15.0)


# ---------------------------------------------------------------------------------------------- sessions
def add_sessions(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sessions", help="recorded sessions: list them, or clean up old ones")
    actions = p.add_subparsers(dest="action", required=True)
    c = actions.add_parser("cleanup", help="delete recordings past the retention time, then the oldest beyond the size")
    _add_storage_flags(c)
    c.add_argument("--dry-run", action="store_true", help="report what would be deleted, delete nothing")
    ls = actions.add_parser("list", help="list recorded sessions, newest first")
    ls.add_argument("--data-dir", type=Path, default=Path("data"))


def run_sessions(args: argparse.Namespace) -> int:
    from omnipipe.gateway.recording.cleanup import cleanup_sessions
    from omnipipe.gateway.recording.store import SessionStore

    if not args.data_dir.is_dir():
        raise GatewayCLIError(f"--data-dir: not a directory: {args.data_dir}")
    store = SessionStore(args.data_dir)
    if args.action == "list":
        for s in store.list_sessions():
            created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(s.created_at))
            print(f"{s.session_id:<48} {s.type:<13} {created}  {s.status:<10} {s.size_bytes / 1e6:8.2f} MB")
        return 0
    try:
        report = cleanup_sessions(store, retention_days=args.retention_days, max_storage_gb=args.max_storage_gb,
                                  dry_run=args.dry_run)
    except FieldError as exc:
        raise GatewayCLIError(_flag_message(exc)) from None
    print(report.format())
    return 1 if report.errors else 0

"""``omnipipe serve`` (the OpenAI-compatible HTTP server) and ``omnipipe worker`` (the same server as a gateway
worker: sessions, capacity, ``/health`` state).

    omnipipe serve --pipeline default --port 8091
    omnipipe worker --pipeline default --port 22400 --capacity 2
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
from pathlib import Path
from typing import Any

from omnipipe.cli.errors import CLIError
from omnipipe.cli.pipeline_flags import add_pipeline_flags, deploy_source
from omnipipe.models.registry import get_pipeline
from omnipipe.protocol.header_limits import PARSER_HEADER_BLOCK_BYTES
from omnipipe.protocol.worker import DEFAULT_MAX_BODY_BYTES


def _add_server_options(p: argparse.ArgumentParser, port: int) -> None:
    """The options ``serve`` and ``worker`` share."""
    add_pipeline_flags(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=port, help="port to listen on")
    p.add_argument("--api-key", default=os.environ.get("OMNIPIPE_API_KEY") or None,
                   help="require 'Authorization: Bearer KEY' on /v1 and /debug routes (default: $OMNIPIPE_API_KEY)")
    p.add_argument("--served-model-name", nargs="+", metavar="NAME",
                   help="the model id /v1/models lists (the first) and further names every endpoint accepts as "
                        "'model', e.g. --served-model-name omni tts-1 whisper-1 (default: the pipeline's name)")
    p.add_argument("--allowed-origins", nargs="+", default=[], metavar="ORIGIN",
                   help="browser origins allowed to call the API (CORS), e.g. https://app.example.com or '*' "
                        "(default: none, no CORS headers)")
    p.add_argument("--allowed-methods", nargs="+", default=["*"], metavar="METHOD", help="CORS methods")
    p.add_argument("--allowed-headers", nargs="+", default=["*"], metavar="HEADER", help="CORS request headers")
    p.add_argument("--allow-credentials", action="store_true", help="CORS: allow credentials (not with origin '*')")
    p.add_argument("--no-async-chunk", action="store_true",
                   help="stages pass whole outputs instead of streaming chunks (over the deploy file's async_chunk)")
    p.add_argument("--ssl-keyfile", type=Path, help="serve HTTPS with this private key (with --ssl-certfile)")
    p.add_argument("--ssl-certfile", type=Path, help="serve HTTPS with this certificate (with --ssl-keyfile)")
    p.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES, help="larger request bodies get 413")
    p.add_argument("--voice-alias", action="append", default=[], metavar="NAME=VOICE",
                   help="map an OpenAI voice name (alloy, ash, ...) to a pipeline voice (repeatable; default: each "
                        "to 'default', or the family's own mapping)")
    p.add_argument("--verbose", "-v", action="store_true")


def add_serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run the OpenAI-compatible HTTP server")
    _add_server_options(p, port=8091)


def add_worker(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("worker", help="run the server as a gateway worker (sessions, capacity, /health state)")
    _add_server_options(p, port=22400)
    p.add_argument("--capacity", type=int, default=2, help="sessions at once; beyond it 429 / WebSocket close 1013")
    p.add_argument("--pause-timeout-s", type=float, default=300.0,
                   help="close a realtime session paused for longer than this")
    p.add_argument("--idle-timeout-s", type=float, default=120.0,
                   help="close a realtime session in which nothing happened for this long (warned 15 s before), "
                        "so an open page nobody uses gives its slot back; 0: never")


def run_worker(args: argparse.Namespace) -> int:
    """``serve`` plus the worker protocol; unlike ``serve`` it keeps running (state ERROR) if the engine fails."""
    if args.capacity < 1:
        raise CLIError(f"--capacity: must be >= 1, got {args.capacity}")
    if not (math.isfinite(args.pause_timeout_s) and args.pause_timeout_s > 0):
        raise CLIError(f"--pause-timeout-s: must be a number > 0, got {args.pause_timeout_s:g}")
    if not (math.isfinite(args.idle_timeout_s) and args.idle_timeout_s >= 0):
        raise CLIError(f"--idle-timeout-s: must be a number >= 0 (0: never), got {args.idle_timeout_s:g}")
    return run_serve(args, capacity=args.capacity, pause_timeout_s=args.pause_timeout_s,
                     exit_on_engine_failure=False, idle_timeout_s=args.idle_timeout_s or None,
                     preload_companions=("transcription",))  # the voice page transcribes every turn


def _check_server_flags(args: argparse.Namespace) -> dict[str, str]:
    """The server flags checked (port, body limit, voice aliases, TLS, CORS); returns ``--voice-alias`` as a
    mapping."""
    if not 0 < args.port < 65536:
        raise CLIError(f"--port: must be in 1..65535, got {args.port}")
    if args.max_body_bytes < 1:
        raise CLIError(f"--max-body-bytes: must be >= 1, got {args.max_body_bytes}")
    aliases = dict(item.split("=", 1) for item in args.voice_alias if "=" in item)
    bad = [item for item in args.voice_alias if "=" not in item or not all(item.split("=", 1))]
    if bad:
        raise CLIError(f"--voice-alias: expected NAME=VOICE, got {bad[0]!r}")
    if bool(args.ssl_keyfile) != bool(args.ssl_certfile):
        raise CLIError("--ssl-keyfile and --ssl-certfile: give both or neither")
    for flag, path in (("--ssl-keyfile", args.ssl_keyfile), ("--ssl-certfile", args.ssl_certfile)):
        if path is not None and not path.is_file():
            raise CLIError(f"{flag}: no such file: {path}")
    if args.allow_credentials and "*" in args.allowed_origins:
        raise CLIError("--allow-credentials: browsers refuse credentials with origin '*'; name the origins")
    return aliases


def _deploy(args: argparse.Namespace) -> Any:
    """The deploy file's path, or its settings with the changes of ``--no-async-chunk``, ``--ray-address`` and
    ``--model``."""
    if not (args.no_async_chunk or args.model is not None or args.ray_address is not None):
        return args.deploy
    import yaml

    deploy = (yaml.safe_load(args.deploy.read_text()) if args.deploy is not None else None) or {}
    if args.no_async_chunk:
        deploy["async_chunk"] = False
    if args.ray_address is not None:
        deploy.setdefault("placement", {}).update(backend="ray", address=args.ray_address)
    if args.model is not None:
        if not get_pipeline(args.pipeline).model_stages:
            raise CLIError(f"--model: pipeline {args.pipeline!r} has no stage whose model can be chosen")
        for stage in get_pipeline(args.pipeline).model_stages:
            deploy.setdefault("stages", {}).setdefault(stage, {}).setdefault("options", {})["model"] = args.model
    return deploy


def run_serve(args: argparse.Namespace, **options: Any) -> int:
    """Run the server until interrupted; ``options`` are further ``ServerConfig`` fields (the worker's)."""
    import uvicorn

    from omnipipe.server import ServerConfig, create_app

    deploy_source(args)  # validate the pipeline and deploy file before anything starts
    aliases = _check_server_flags(args)
    names = args.served_model_name or []
    config = ServerConfig(pipeline=args.pipeline, deploy=_deploy(args), host=args.host, port=args.port,
                          api_key=args.api_key, max_body_bytes=args.max_body_bytes, voice_aliases=aliases,
                          served_model_name=names[0] if names else None, model_aliases=tuple(names[1:]),
                          cors_origins=tuple(args.allowed_origins), cors_methods=tuple(args.allowed_methods),
                          cors_headers=tuple(args.allowed_headers), cors_credentials=args.allow_credentials,
                          log_level="INFO" if args.verbose else "WARNING", **options)
    failures: list[str] = []
    server: uvicorn.Server | None = None

    def on_engine_failure(message: str) -> None:
        failures.append(message)
        if server is not None:
            server.should_exit = True

    app = create_app(config, on_engine_failure)
    server = _uvicorn_server(app.state.pool, uvicorn.Config(
        app, host=args.host, port=args.port, log_level="info" if args.verbose else "warning",
        timeout_graceful_shutdown=5, h11_max_incomplete_event_size=PARSER_HEADER_BLOCK_BYTES,
        ssl_keyfile=args.ssl_keyfile, ssl_certfile=args.ssl_certfile))
    role = "serving" if config.exit_on_engine_failure else \
        f"worker (capacity {config.capacity if config.capacity is not None else 'unlimited'}) serving"
    scheme = "https" if args.ssl_certfile else "http"
    print(f"omnipipe: {role} pipeline {args.pipeline!r} on {scheme}://{args.host}:{args.port} (loading models)",
          file=sys.stderr)
    with contextlib.suppress(KeyboardInterrupt):  # uvicorn re-raises the signal it stopped on, after a clean shutdown
        server.run()
    if failures:
        raise CLIError(f"the engine failed to start: {failures[0]}")
    return 0


def _say_now(line: str) -> None:
    """One line on stderr, written at once (safe in a signal handler, unlike print)."""
    with contextlib.suppress(OSError):
        os.write(sys.stderr.fileno(), f"omnipipe: {line}\n".encode())


def _uvicorn_server(pool: Any, config: Any) -> Any:
    """A uvicorn server for ``config`` that stops ``pool``'s engines as a user expects on a signal."""
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, told what a signal means here: the first SIGINT/SIGTERM says "stopping stages..." and
        stops gracefully (stages still loading are stopped, not waited for); a second kills every stage and exits
        at once."""

        def __init__(self, pool: Any, config: uvicorn.Config) -> None:
            super().__init__(config)
            self._pool = pool
            self._signalled = False

        def handle_exit(self, sig: int, frame: Any) -> None:
            if self._signalled:
                _say_now("killing stages")
                self._pool.kill_now()
                os._exit(128 + sig)
            self._signalled = True
            _say_now("stopping stages... (again to kill them at once)")
            super().handle_exit(sig, frame)

    return Server(pool, config)

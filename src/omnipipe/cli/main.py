"""The ``omnipipe`` command.

    omnipipe generate "What is the capital of France?" --output answer.wav [--stats]
    omnipipe serve --pipeline default --port 8091
    omnipipe worker --pipeline default --port 22400 --capacity 2
    omnipipe models | download | bench engine | bench relay | bench quality
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

from omnipipe.cli import gateway as gateway_cli
from omnipipe.models.registry import PIPELINES, UnknownPipelineError, get_pipeline
from omnipipe.protocol.worker import DEFAULT_MAX_BODY_BYTES

USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, FileNotFoundError, PermissionError)


class CLIError(Exception):
    """A mistake the user can fix; printed as one line, exit code 2."""


def _user_errors() -> tuple[type[BaseException], ...]:
    from omnipipe.api.async_omni import RequestFailedError
    from omnipipe.engine.orchestrator import EngineStartError
    from omnipipe.models.preparation import ModelPreparationError

    return (*USER_ERRORS, CLIError, gateway_cli.GatewayCLIError, UnknownPipelineError, RequestFailedError, EngineStartError, ModelPreparationError)


# pipeline -> dotted path of ``write_tiny_checkpoint(directory, seed) -> Path``
TINY_CHECKPOINTS = {
    "qwen2_5_omni": "omnipipe.models.qwen2_5_omni.weights.tiny:write_tiny_checkpoint",
    "qwen3_omni": "omnipipe.models.qwen3_omni.weights.tiny:write_tiny_checkpoint",
}


def _tiny_checkpoint(args: argparse.Namespace) -> int:
    from omnipipe.util.dotted import resolve

    if args.directory.exists() and not args.directory.is_dir():
        raise CLIError(f"directory: {args.directory} exists and is not a directory")
    if args.directory.is_dir() and any(args.directory.iterdir()) and not args.force:
        raise CLIError(f"directory: {args.directory} is not empty (its config, tokenizer and weights would be "
                       "replaced): give an empty or new directory, or --force")
    path = resolve(TINY_CHECKPOINTS[args.family])(args.directory, seed=args.seed)
    print(f"wrote a tiny random {args.family} checkpoint to {path}")
    print(f"run it: omnipipe generate --pipeline {args.family} --model {path} \"hello\" -o answer.wav")
    return 0


# ---------------------------------------------------------------------------------------------- generate
def _add_generate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="answer one question (text and/or spoken) and write the spoken answer")
    p.add_argument("prompt", nargs="?", default="", help="the question as text")
    p.add_argument("--audio-in", type=Path, help="a spoken question (wav/flac/ogg/mp3)")
    p.add_argument("--image", type=Path, action="append", default=[], metavar="FILE",
                   help="an image attached to the question (png/jpeg/webp; repeat for several)")
    p.add_argument("--video", type=Path, action="append", default=[], metavar="FILE",
                   help="a video attached to the question (mp4/webm/...; sampled at the thinker's video_fps; "
                        "repeat for several; pipelines that take video: qwen3_omni, qwen2_5_omni)")
    p.add_argument("--output", "-o", type=Path, help="where to write the spoken answer (WAV) or the image (PNG, "
                   "WebP, JPEG); without it the answer is text only")
    p.add_argument("--pipeline", default="default", help=f"one of: {', '.join(sorted(PIPELINES))}")
    p.add_argument("--deploy", type=Path, help="deploy YAML (threads, batch sizes, chunk sizes, relays)")
    p.add_argument("--model", help=_MODEL_HELP)
    p.add_argument("--ray-address", metavar="ADDRESS", help=_RAY_HELP)
    p.add_argument("--no-async-chunk", action="store_true", help="hand whole outputs between stages")
    p.add_argument("--text-only", action="store_true", help="produce text only (even with --output)")
    p.add_argument("--max-tokens", type=int, default=None, help="most tokens the thinker writes")
    p.add_argument("--temperature", type=float, default=None, help="sampling temperature (0: greedy)")
    p.add_argument("--seed", type=int, default=None, help="sampling seed, for a repeatable answer")
    p.add_argument("--stats", action="store_true", help="print the request's metrics table")
    p.add_argument("--verbose", "-v", action="store_true")


_MODEL_HELP = ("the model of the pipeline's main stage (its deploy option 'model'): default, a thinker name "
               "(qwen2.5-0.5b-instruct, gemma3-270m); image, think-and-draw: digits or a diffusers checkpoint "
               "directory")


_RAY_HELP = ("run the stages as Ray actors on this cluster (auto, HOST:PORT or ray://HOST:PORT): the deploy file's "
             "placement.backend ray with this address; stages.<name>.node pins a stage to a node")


def _ray_address(args: argparse.Namespace) -> str | None:
    address = getattr(args, "ray_address", None)
    if address is not None and not address.strip():
        raise CLIError("--ray-address: give auto, HOST:PORT or ray://HOST:PORT")
    return address


def _deploy_source(args: argparse.Namespace) -> Any:
    from omnipipe.config.deploy_config import DeployConfigError, load_deploy

    pipeline = get_pipeline(args.pipeline)
    if args.deploy is not None and not args.deploy.is_file():
        raise CLIError(f"--deploy: file not found: {args.deploy}")
    address = _ray_address(args)
    overrides = {"placement": {"backend": "ray", "address": address}} if address is not None else None
    try:
        config = load_deploy(args.deploy, pipeline, overrides)
    except DeployConfigError as exc:
        raise CLIError(str(exc)) from exc
    if getattr(args, "no_async_chunk", False):
        config.async_chunk = False
    if getattr(args, "model", None) is not None:
        if not pipeline.model_stages:
            raise CLIError(f"--model: pipeline {pipeline.name!r} has no stage whose model can be chosen")
        for stage in pipeline.model_stages:
            config.stage(stage).options["model"] = args.model
    return pipeline, config


_PROMPT_FLAGS = {"prompt.multi_modal_data.image": "--image", "prompt.multi_modal_data.audio": "--audio-in",
                 "prompt.multi_modal_data.video": "--video"}


def _check_prompt(pipeline: Any, prompt: Any) -> None:
    """The pipeline's own rules for a prompt, before any model loads: a mistake is one line naming the flag."""
    from omnipipe.api.prompt import normalize_prompt
    from omnipipe.util.dotted import resolve
    from omnipipe.util.field_error import FieldError

    try:
        resolve(pipeline.prompt_processor)(normalize_prompt(prompt, pipeline.input_modalities,
                                                            pipeline.takes_history))
    except FieldError as exc:
        flag = next((f for key, f in _PROMPT_FLAGS.items() if exc.field.startswith(key)), "prompt")
        raise CLIError(f"{flag}: {exc.rule}") from None


async def _generate(args: argparse.Namespace) -> int:
    from omnipipe import AsyncOmni, SamplingParams
    from omnipipe.util.audio import load_audio, write_wav
    from omnipipe.util.image import encode_image, format_for_path

    pipeline, deploy = _deploy_source(args)
    prompt: Any = args.prompt
    takes = pipeline.input_modalities
    media: dict[str, Any] = {}
    if args.audio_in is not None:
        if "audio" not in takes:
            raise CLIError(f"--audio-in: pipeline {pipeline.name!r} takes {' and '.join(takes)}, not audio")
        if not args.audio_in.is_file():
            raise CLIError(f"--audio-in: file not found: {args.audio_in}")
        media["audio"] = load_audio(args.audio_in)
    for flag, key, paths in (("--image", "image", args.image), ("--video", "video", args.video)):
        if not paths:
            continue
        if key not in takes:
            raise CLIError(f"{flag}: pipeline {pipeline.name!r} takes {' and '.join(takes)}, not {key}s")
        missing = [str(path) for path in paths if not path.is_file()]
        if missing:
            raise CLIError(f"{flag}: file not found: {missing[0]}")
        media[key] = [str(path) for path in paths]
    if media:  # which combinations a pipeline takes is its prompt processor's rule (a one-line error otherwise)
        prompt = {"prompt": args.prompt, "multi_modal_data": media}
    elif "text" not in takes:
        raise CLIError(f"pipeline {pipeline.name!r} takes {' and '.join(takes)}, not a text prompt: "
                       "use --audio-in FILE")
    elif not args.prompt.strip():
        raise CLIError("give a question as text, or --audio-in FILE")
    _check_prompt(pipeline, prompt)
    params = None
    overrides = {k: v for k, v in (("max_tokens", args.max_tokens), ("temperature", args.temperature),
                                   ("seed", args.seed)) if v is not None}
    if overrides:
        params = SamplingParams(**overrides)
    if args.output is not None and args.output.parent and not args.output.parent.exists():
        raise CLIError(f"--output: directory does not exist: {args.output.parent}")
    draws = "image" in pipeline.output_modalities
    if draws and args.output is not None and format_for_path(args.output) is None:
        raise CLIError(f"--output: pipeline {pipeline.name!r} draws images: give a .png, .webp or .jpg file")
    if "text" not in pipeline.output_modalities and (args.output is None or args.text_only):
        what = "draws: give --output FILE.png" if draws else "only speaks: give --output FILE.wav"
        raise CLIError(f"pipeline {pipeline.name!r} {what}")
    # speech and images are made only where they go somewhere: without --output the answer is text only
    modalities = ["text"] if args.text_only or args.output is None else None
    final = None
    async with AsyncOmni(pipeline, deploy, log_level="INFO" if args.verbose else "WARNING",
                         progress=_progress_printer()) as engine:
        async for out in engine.generate(prompt, sampling_params=params, output_modalities=modalities):
            if out.modality == "text":
                print(out.text_delta, end="", flush=True)
            if out.finished:
                final = out
    if final is not None and final.text:
        print()
    assert final is not None
    if final.image is not None and args.output is not None:
        fmt = format_for_path(args.output)
        assert fmt is not None
        args.output.write_bytes(encode_image(final.image, fmt))
        height, width = final.image.shape[:2]
        print(f"wrote {args.output} ({width}x{height} image)", file=sys.stderr)
    elif final.audio is not None and final.audio.size:
        if args.output is not None:
            write_wav(args.output, final.audio, final.sample_rate_hz or 0)
            print(f"wrote {args.output} ({final.audio_duration_s:.2f} s of audio)", file=sys.stderr)
    elif args.output is not None:
        why = "text-only output" if modalities == ["text"] else "the answer had none"
        print(f"no {'image' if draws else 'audio'} was produced ({why}); {args.output} not written", file=sys.stderr)
    if args.stats and final.metrics is not None:
        from omnipipe.api.metrics import format_request_metrics

        print(format_request_metrics(final.metrics))
    return 0


def _progress_printer() -> Callable[[str], None]:
    """Start-up lines on stderr with the seconds since the command started (the answer goes to stdout)."""
    start = time.monotonic()

    def say(line: str) -> None:
        print(f"omnipipe: {line} [{time.monotonic() - start:.0f} s]", file=sys.stderr, flush=True)

    return say


# ---------------------------------------------------------------------------------------------- models
def _models(args: argparse.Namespace) -> int:
    from omnipipe.models.preparation import pipeline_status

    width = max(len(name) for name in PIPELINES)
    for name in sorted(PIPELINES):
        pipeline = get_pipeline(name)
        ready, detail = pipeline_status(name)
        print(f"{name:<{width}} {'ready' if ready else 'not ready':<10} {pipeline.description}")
        if detail:
            print(f"{'':<{width}} {detail}")
    return 0


def _download(args: argparse.Namespace) -> int:
    from omnipipe.models.preparation import prepare_pipeline

    names = [args.pipeline] if args.pipeline else sorted(PIPELINES)
    for name in names:
        get_pipeline(name)
        prepare_pipeline(name, progress=True)
        print(f"{name}: ready")
    return 0


# ---------------------------------------------------------------------------------------------- serve
def _add_server_options(p: argparse.ArgumentParser, port: int) -> None:
    """The options ``serve`` and ``worker`` share."""
    p.add_argument("--pipeline", default="default", help=f"one of: {', '.join(sorted(PIPELINES))}")
    p.add_argument("--deploy", type=Path, help="deploy YAML (threads, batch sizes, chunk sizes, relays)")
    p.add_argument("--model", help=_MODEL_HELP)
    p.add_argument("--ray-address", metavar="ADDRESS", help=_RAY_HELP)
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


def _add_serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run the OpenAI-compatible HTTP server")
    _add_server_options(p, port=8091)


def _serve(args: argparse.Namespace, **options: Any) -> int:
    """Run the server until interrupted; ``options`` are further ``ServerConfig`` fields (the worker's)."""
    import uvicorn

    from omnipipe.server import ServerConfig, create_app

    _deploy_source(args)  # validate the pipeline and deploy file before anything starts
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
    names = args.served_model_name or []
    deploy: Any = args.deploy
    if args.no_async_chunk or args.model is not None or args.ray_address is not None:
        import yaml  # the deploy file's settings, with the flags' changes

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
    config = ServerConfig(pipeline=args.pipeline, deploy=deploy, host=args.host, port=args.port,
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
        timeout_graceful_shutdown=5, ssl_keyfile=args.ssl_keyfile, ssl_certfile=args.ssl_certfile))
    role = "serving" if config.exit_on_engine_failure else \
        f"worker (capacity {config.capacity if config.capacity is not None else 'unlimited'}) serving"
    scheme = "https" if args.ssl_certfile else "http"
    print(f"omnipipe: {role} pipeline {args.pipeline!r} on {scheme}://{args.host}:{args.port} (loading models)",
          file=sys.stderr)
    try:
        server.run()
    except KeyboardInterrupt:
        pass  # uvicorn re-raises the signal it stopped on, after a clean shutdown
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


# ---------------------------------------------------------------------------------------------- worker
def _add_worker(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("worker", help="run the server as a gateway worker (sessions, capacity, /health state)")
    _add_server_options(p, port=22400)
    p.add_argument("--capacity", type=int, default=2, help="sessions at once; beyond it 429 / WebSocket close 1013")
    p.add_argument("--pause-timeout-s", type=float, default=300.0,
                   help="close a realtime session paused for longer than this")
    p.add_argument("--idle-timeout-s", type=float, default=120.0,
                   help="close a realtime session in which nothing happened for this long (warned 15 s before), "
                        "so an open page nobody uses gives its slot back; 0: never")


def _worker(args: argparse.Namespace) -> int:
    """``serve`` plus the worker protocol; unlike ``serve`` it keeps running (state ERROR) if the engine fails."""
    import math

    if args.capacity < 1:
        raise CLIError(f"--capacity: must be >= 1, got {args.capacity}")
    if not (math.isfinite(args.pause_timeout_s) and args.pause_timeout_s > 0):
        raise CLIError(f"--pause-timeout-s: must be a number > 0, got {args.pause_timeout_s:g}")
    if not (math.isfinite(args.idle_timeout_s) and args.idle_timeout_s >= 0):
        raise CLIError(f"--idle-timeout-s: must be a number >= 0 (0: never), got {args.idle_timeout_s:g}")
    return _serve(args, capacity=args.capacity, pause_timeout_s=args.pause_timeout_s, exit_on_engine_failure=False,
                  idle_timeout_s=args.idle_timeout_s or None,
                  preload_companions=("transcription",))  # the voice page transcribes every turn


# ---------------------------------------------------------------------------------------------- main
class _HelpFormatter(argparse.HelpFormatter):
    """Shows each option's default in --help (when it has one worth showing)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (default not in (None, False, argparse.SUPPRESS) and "%(default)" not in text and action.option_strings
                and action.nargs != 0):
            text += " (default: %(default)s)" if text else "default: %(default)s"
        return text


class _Parser(argparse.ArgumentParser):
    """Every (sub)command's parser: defaults shown in --help; a mistake is reported with that command's usage."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> tuple[argparse.Namespace, list[str]]:
        parsed, extra = super().parse_known_args(args, namespace)
        if extra and self.prog != "omnipipe":  # a subcommand: its own usage, not the top level's
            self.error(f"unrecognized arguments: {' '.join(extra)}")
        return parsed, extra


def build_parser() -> argparse.ArgumentParser:
    from omnipipe import __version__

    parser = _Parser(prog="omnipipe", description="Serve multi-stage omni-modal models.")
    parser.add_argument("--version", action="version", version=f"omnipipe {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_generate(sub)
    _add_serve(sub)
    _add_worker(sub)
    gateway_cli.add_gateway(sub)
    gateway_cli.add_up(sub)
    gateway_cli.add_sessions(sub)
    sub.add_parser("models", help="list pipelines and whether their weights are ready")
    t = sub.add_parser("tiny-checkpoint", help="write a tiny random checkpoint of a model family (offline), to run "
                       "its pipeline on a CPU without a download")
    t.add_argument("family", choices=sorted(TINY_CHECKPOINTS), help="the pipeline whose checkpoint to write")
    t.add_argument("directory", type=Path, help="where to write it (created)")
    t.add_argument("--seed", type=int, default=0, help="weights seed (the same seed writes the same weights)")
    t.add_argument("--force", action="store_true", help="write into a directory that already holds files")
    d = sub.add_parser("download", help="prepare model weights in the cache (with progress bars)")
    d.add_argument("--pipeline", default=None)
    b = sub.add_parser("bench", help="benchmarks (print a table)")
    b.add_argument("suite", choices=["engine", "relay", "offline", "quality", "serve", "gateway", "soak", "images",
                                        "broadcast", "thinker", "placement", "vocoder-seams"],
                   help="engine: "
                   "framework costs on test stages; relay: relay throughput between two processes per backend "
                   "(mooncake beside raw Mooncake reads and shm); offline: the default pipeline vs a sequential baseline; quality: "
                   "the default pipeline's thinkers side by side on 30 factual questions (right answers, decode "
                   "tok/s) and a multi-turn recall; serve: load on a "
                   "running server; gateway: a worker directly vs through a gateway (recording and not), side by "
                   "side; soak: load with stage kills, a stopped stage, clients that leave and malformed requests, "
                   "and what was left behind; images: the image pipeline's images/s and latency with step-level, "
                   "request-level and no batching; broadcast: a two-rank thinker's requests/s and latency with images "
                   "moved to its ranks blocking, async or as raw bytes; thinker: the thinker decoder (float32 and int8) "
                   "against llama.cpp and transformers on the same weights: prefill, decode tok/s at batch 1 and 8; "
                   "placement: TTFP with every stage on one host vs split over two Ray nodes (a loopback cluster); "
                   "vocoder-seams: a streamed vocoder decode (omnipipe's exact windows, transformers' chunked_decode) "
                   "against one whole decode: difference over absmax and samples missing")
    b.add_argument("rest", nargs=argparse.REMAINDER, help="arguments for the suite (see --help of the suite)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if getattr(args, "verbose", False) else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "generate":
            return asyncio.run(_generate(args))
        if args.command == "serve":
            return _serve(args)
        if args.command == "worker":
            return _worker(args)
        if args.command == "gateway":
            return gateway_cli.run_gateway(args)
        if args.command == "up":
            return gateway_cli.run_up(args)
        if args.command == "sessions":
            return gateway_cli.run_sessions(args)
        if args.command == "models":
            return _models(args)
        if args.command == "tiny-checkpoint":
            return _tiny_checkpoint(args)
        if args.command == "download":
            return _download(args)
        if args.command == "bench":
            if args.suite == "engine":
                from omnipipe.bench.engine import main as bench_main
            elif args.suite == "relay":
                from omnipipe.bench.relay import main as bench_main
            elif args.suite == "serve":
                from omnipipe.bench.serve import main as bench_main
            elif args.suite == "gateway":
                from omnipipe.bench.gateway import main as bench_main
            elif args.suite == "soak":
                from omnipipe.bench.soak import main as bench_main
            elif args.suite == "quality":
                from omnipipe.bench.quality import main as bench_main
            elif args.suite == "images":
                from omnipipe.bench.images import main as bench_main
            elif args.suite == "thinker":
                from omnipipe.bench.thinker import main as bench_main
            elif args.suite == "broadcast":
                from omnipipe.bench.broadcast import main as bench_main
            elif args.suite == "placement":
                from omnipipe.bench.placement import main as bench_main
            elif args.suite == "vocoder-seams":
                from omnipipe.bench.vocoder_seams import main as bench_main
            else:
                from omnipipe.bench.offline import main as bench_main
            return bench_main(args.rest)
    except KeyboardInterrupt:
        print("\nomnipipe: interrupted", file=sys.stderr)
        return 130
    except _user_errors() as exc:
        print(f"omnipipe: error: {exc}", file=sys.stderr)
        return 2
    return 1


if __name__ == "__main__":
    sys.exit(main())

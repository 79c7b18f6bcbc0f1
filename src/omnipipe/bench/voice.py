"""``omnipipe bench voice``: how soon the answer to a spoken question starts to sound, the gap a person talking to
the voice page feels, with one or many sessions at once, and with each variant of the server side by side.

    omnipipe bench voice [--url URL] [--concurrency 1,4,8] [--modes commit,server_vad,semantic_vad] [--questions 3]
                         [--question-set voice|quality] [--question-voice server|heart] [--pause-s 0.8]
                         [--variants baseline] [--json FILE]

Without ``--url`` it starts ``omnipipe serve --pipeline default`` on a free loopback port (a server per distinct
deploy among the variants, one after the other), waits for ``/health``, and stops it at the end.

Each run is a variant, a mode and a concurrency c: c realtime sessions start half a second apart (``--stagger-s``),
and each asks ``--questions`` short factual questions in turn, spoken by the server's tts pipeline (or with
``--question-voice heart`` by the second packaged voice, ``bench/second_voice.py``) and streamed at real-time pace
in 40 ms chunks (``bench/voice_session.py`` says how a turn ends in each mode: ``commit``, the client commits at the
end of speech; ``server_vad``, the server's VAD at its defaults; ``semantic_vad``, the VAD with the end-of-turn
model, eagerness auto). ``--pause-s S`` speaks every question with a thinking pause of S seconds after a filler
("What is the capital of, um," ... "Italy?"). A warm-up turn per mode runs first on each server, unmeasured.

Columns: ``Turns ok`` (answered turns / asked); ``Cut``: questions the server took for more than one turn (a
cut turn fails and ends its session); ``p50 ms``, ``p99 ms``, ``max ms``: end of speech (the last speech
sample sent) -> first ``response.output_audio.delta``, over the answered turns of all sessions; ``Underruns/stream``:
the times an answer's playback at real-time pace would have run dry (a gap over 20 ms) before ``response.done``,
per answer; ``Answers right``: answers whose audio, transcribed by the server's ``/v1/audio/transcriptions``, holds
the question's key word / answers transcribed; ``Server mean ms``: the mean of the same gap as the server measured
it (``omnipipe:realtime_speech_end_to_first_audio_seconds`` in ``/metrics``, over the run).

Exit code 1 when a turn was not answered or the server could not be started.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import yaml

from omnipipe.bench.gateway import BenchError, Child, stop_children, wait_until
from omnipipe.bench.report import machine_info, write_json
from omnipipe.bench.voice_questions import (
    QUESTION_SETS,
    QUESTION_VOICES,
    SpokenQuestion,
    spoken_questions,
    transcribe,
)
from omnipipe.bench.voice_report import format_rows, server_histogram, server_mean_ms, summarize_turns
from omnipipe.bench.voice_session import SessionPlan, Turn, run_session
from omnipipe.bench.voice_variants import MODES, VARIANTS, Variant, parse_variants, session_update
from omnipipe.config.deploy_config import merge_settings
from omnipipe.protocol.worker import REALTIME_PATH
from omnipipe.util.net import free_port

PROG = "omnipipe bench voice"
QUESTIONS_VOICED_BY = "default"  # the model whose spoken questions a server that cannot speak reuses (as cached)


def ws_url(base_url: str) -> str:
    scheme, _, rest = base_url.partition("://")
    return f"{'wss' if scheme == 'https' else 'ws'}://{rest}{REALTIME_PATH}"


@contextlib.contextmanager
def serving(args: argparse.Namespace, variant_deploy: dict[str, Any], workdir: Path,
            ) -> Iterator[tuple[str, dict[str, str]]]:
    """The server a group of variants runs against (its URL and headers): ``--url``, or a spawned one."""
    if args.url:
        yield args.url.rstrip("/"), ({"Authorization": f"Bearer {args.api_key}"} if args.api_key else {})
        return
    base = (yaml.safe_load(args.deploy.read_text()) or {}) if args.deploy else {}
    deploy = merge_settings(base, variant_deploy)
    command = ["serve", "--pipeline", args.pipeline, "--host", "127.0.0.1"]
    if deploy:
        path = workdir / f"deploy-{len(list(workdir.glob('deploy-*.yaml')))}.yaml"
        path.write_text(yaml.safe_dump(deploy))
        command += ["--deploy", str(path)]
    api_key = args.api_key or secrets.token_urlsafe(12)
    port = free_port()
    server = Child(f"server-{port}", [*command, "--port", str(port), f"--api-key={api_key}"], workdir, port)
    print(f"{PROG}: starting omnipipe serve --pipeline {args.pipeline} on port {port} (log in {server.log_path})",
          file=sys.stderr, flush=True)
    try:
        wait_until(lambda: httpx.get(f"{server.url}/health", timeout=5).status_code == 200, args.startup_timeout,
                   "the server", [server])
        yield server.url, {"Authorization": f"Bearer {api_key}"}
    finally:
        stop_children([server])


def served_model(url: str, headers: dict[str, str]) -> str:
    response = httpx.get(f"{url}/v1/models", headers=headers, timeout=30)
    response.raise_for_status()
    return str(response.json()["data"][0]["id"])


def session_questions(spoken: list[SpokenQuestion], session: int, count: int) -> list[SpokenQuestion]:
    """The questions of session ``session``: ``count`` in a row, each session starting further along the list."""
    return [spoken[(session * count + k) % len(spoken)] for k in range(count)]


async def _transcribe_answers(client: httpx.AsyncClient, model: str, turns: list[Turn]) -> list[str]:
    """Each answered turn's audio transcribed (``turn.heard``); the transcription errors."""
    errors = []
    for turn in turns:
        if not turn.ok or not turn.audio:
            continue
        try:
            turn.heard = await transcribe(client, model, bytes(turn.audio))
        except (httpx.HTTPError, RuntimeError, ValueError) as exc:
            if "endpoint_not_available" in str(exc):  # a pipeline that transcribes nothing: said once
                return ["answers not judged: the server has no /v1/audio/transcriptions"]
            errors.append(f"transcribing an answer: {exc}")
    return errors


async def run_cell(url: str, headers: dict[str, str], model: str, variant: Variant, mode: str, concurrency: int,
                   spoken: list[SpokenQuestion], args: argparse.Namespace) -> dict[str, Any]:
    """One run: ``concurrency`` sessions of ``variant`` in ``mode``, their answers transcribed; its row."""
    plan = SessionPlan(ws_url(url), headers, session_update(mode, args.max_tokens, variant), mode, args.turn_timeout,
                       variant.camera_fps)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=args.turn_timeout) as client:
        before = server_histogram((await client.get("/metrics")).text)
        sessions = await asyncio.gather(*(run_session(plan, session_questions(spoken, i, args.questions),
                                                      i * args.stagger_s) for i in range(concurrency)))
        after = server_histogram((await client.get("/metrics")).text)
        problems = await _transcribe_answers(client, model, [t for s in sessions for t in s])
    row = summarize_turns(variant.name, mode, concurrency, list(sessions))
    row["server_turns"], row["server_mean_ms"] = server_mean_ms(before, after, mode)
    row["errors"] += problems[:3]
    return row


def run_group(args: argparse.Namespace, variants: list[Variant], workdir: Path, modes: list[str],
              levels: list[int]) -> list[dict[str, Any]]:
    """Every run of ``variants`` (which share a deploy) on one server, after a warm-up turn per mode."""
    rows = []
    with serving(args, variants[0].deploy, workdir) as (url, headers):
        model = served_model(url, headers)
        with httpx.Client(base_url=url, headers=headers, timeout=args.turn_timeout) as client:
            spoken = _spoken(client, model, args)
        for mode in modes:
            for _ in range(args.warmup):
                plan = SessionPlan(ws_url(url), headers, session_update(mode, args.max_tokens, variants[0]), mode,
                                   args.turn_timeout, variants[0].camera_fps)
                asyncio.run(run_session(plan, spoken[:1]))
        for variant in variants:
            for mode in modes:
                for level in levels:
                    print(f"{PROG}: {variant.name}, {mode}, c={level}", file=sys.stderr, flush=True)
                    rows.append(asyncio.run(run_cell(url, headers, model, variant, mode, level, spoken, args)))
    return rows


def _spoken(client: httpx.Client, model: str, args: argparse.Namespace) -> list[SpokenQuestion]:
    """The questions spoken by the server; a server that cannot speak (a Qwen-Omni pipeline serves no
    ``/v1/audio/speech``) asks them in the default pipeline's voice, as a run against it cached them."""
    questions = QUESTION_SETS[args.question_set]
    if args.question_voice != "server":
        return spoken_questions(client, model, args.spoken_cache_dir, args.pause_s, questions, args.question_voice)
    try:
        return spoken_questions(client, model, args.spoken_cache_dir, args.pause_s, questions)
    except RuntimeError as cannot:
        if model == QUESTIONS_VOICED_BY:
            raise
        try:
            return spoken_questions(client, QUESTIONS_VOICED_BY, args.spoken_cache_dir, args.pause_s, questions)
        except RuntimeError:
            raise RuntimeError(f"{cannot}; a run with --pipeline {QUESTIONS_VOICED_BY} (same --question-set and "
                               "--pause-s) keeps its spoken questions for later runs to reuse") from None


def groups(variants: list[Variant]) -> list[list[Variant]]:
    """The variants by deploy (a server each), in the order they were named."""
    by_deploy: dict[str, list[Variant]] = {}
    for variant in variants:
        by_deploy.setdefault(variant.deploy_key, []).append(variant)
    return list(by_deploy.values())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                     epilog="\n\n".join(__doc__.split("\n\n")[2:]),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=None, help="a running server (default: start omnipipe serve)")
    parser.add_argument("--pipeline", default="default", help="the pipeline a started server serves")
    parser.add_argument("--deploy", type=Path, default=None, help="a deploy YAML a started server begins from")
    parser.add_argument("--api-key", default=os.environ.get("OMNIPIPE_API_KEY"),
                        help="sent as 'Authorization: Bearer KEY' (default: $OMNIPIPE_API_KEY; a started server: a "
                             "random one)")
    parser.add_argument("--variants", default=VARIANTS[0].name,
                        help=f"comma-separated, or 'all' (default: %(default)s): "
                             f"{'; '.join(f'{v.name}: {v.about}' for v in VARIANTS)}")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated among {','.join(MODES)} "
                        "(default: %(default)s)")
    parser.add_argument("--concurrency", default="1,4,8", help="comma-separated session counts (default: %(default)s)")
    parser.add_argument("--questions", type=int, default=3, help="questions per session (default: %(default)s)")
    parser.add_argument("--question-set", default="voice", choices=list(QUESTION_SETS),
                        help="voice: 8 short questions (default); quality: the 30 of bench quality")
    parser.add_argument("--question-voice", default="server", choices=list(QUESTION_VOICES),
                        help="who asks: the server's tts (default), or heart, the second packaged voice (a woman's, "
                             "hibari-tts's, spoken in this process)")
    parser.add_argument("--pause-s", type=float, default=0.0,
                        help="a thinking pause this long in the middle of every question (default: none)")
    parser.add_argument("--stagger-s", type=float, default=0.5, help="between session starts (default: %(default)s)")
    parser.add_argument("--max-tokens", type=int, default=40, help="answer length limit (default: %(default)s)")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured turns per mode first (default: %(default)s)")
    parser.add_argument("--turn-timeout", type=float, default=180.0, help="seconds a turn may take")
    parser.add_argument("--startup-timeout", type=float, default=600.0, help="seconds a started server may take")
    parser.add_argument("--spoken-cache-dir", type=Path, default=None,
                        help="where the spoken questions are kept (default: $OMNIPIPE_CACHE/bench-spoken)")
    parser.add_argument("--json", help="also write every run's figures (and each turn's) here")
    return parser


def _check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[list[Variant], list[str], list[int]]:
    """The variants, modes and levels the arguments name; a usage error (exit 2) naming the flag otherwise."""
    try:
        variants = parse_variants(args.variants)
        levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    except ValueError as exc:
        parser.error(str(exc) if "--variants" in str(exc) else "--concurrency: comma-separated integers, e.g. 1,4,8")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        parser.error(f"--modes: comma-separated among {', '.join(MODES)}")
    if not levels or min(levels) < 1:
        parser.error("--concurrency: every level must be >= 1")
    if not 0 <= args.pause_s <= 5:
        parser.error("--pause-s: seconds in [0, 5]")
    if args.pause_s and args.question_set != "voice":
        parser.error("--pause-s: the paused forms are of the voice question set's questions")
    if args.questions < 1 or args.max_tokens < 1 or args.warmup < 0 or args.stagger_s < 0 or args.turn_timeout <= 0:
        parser.error("--questions and --max-tokens must be >= 1, --warmup and --stagger-s >= 0, --turn-timeout > 0")
    if args.url and any(v.deploy for v in variants):
        parser.error(f"--variants: {', '.join(v.name for v in variants if v.deploy)} change the server's deploy; "
                     "leave out --url so the bench starts a server for each")
    return variants, list(dict.fromkeys(modes)), list(dict.fromkeys(levels))


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    variants, modes, levels = _check(parser, args)
    workdir = Path(tempfile.mkdtemp(prefix="omnipipe-bench-voice-"))
    rows: list[dict[str, Any]] = []
    try:
        for group in groups(variants):
            rows += run_group(args, group, workdir, modes, levels)
    except (BenchError, httpx.HTTPError, RuntimeError) as exc:
        print(f"{PROG}: {exc}\nlogs kept in {workdir}", file=sys.stderr)
        return 1
    shutil.rmtree(workdir, ignore_errors=True)
    info = machine_info()
    print(f"{PROG}: {args.url or f'omnipipe serve --pipeline {args.pipeline}'}, {args.questions} question(s) per "
          f"session{f' with a {args.pause_s:g} s pause in each' if args.pause_s else ''}, sessions "
          f"{args.stagger_s:g} s apart, max_tokens {args.max_tokens}; {info['cpu_count']} CPUs, "
          f"load {' '.join(f'{x:.1f}' for x in info['load_avg_1_5_15'])}")
    print(format_rows(rows))
    if args.json:
        write_json(args.json, {"meta": {"url": args.url, "pipeline": args.pipeline, "modes": modes,
                                        "concurrency": levels, "questions": args.questions, "pause_s": args.pause_s,
                                        "question_set": args.question_set, "question_voice": args.question_voice,
                                        "stagger_s": args.stagger_s, "max_tokens": args.max_tokens,
                                        "variants": [{"name": v.name, "about": v.about, "deploy": v.deploy,
                                                      "session": v.session} for v in variants],
                                        "machine": info}, "rows": rows})
    return 0 if all(r["ok"] == r["turns"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

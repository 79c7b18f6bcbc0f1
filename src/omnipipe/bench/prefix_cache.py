"""``omnipipe bench prefix-cache``: what the default thinker's automatic prefix caching spares a conversation, with
the cache on and off side by side in one run.

    omnipipe bench prefix-cache [--variants on,off] [--rounds 3] [--rooms 15] [--turns 3] [--max-tokens 16]
                                [--json FILE]

For each variant it starts ``omnipipe serve --pipeline default`` on a free loopback port (``on``: the server as it
ships; ``off``: ``stages.thinker.options.prefix_cache_bytes: 0``, which keeps only the shared preamble's cache),
one after the other, waits for ``/health`` and stops it at the end. On each server, after ``--warmup`` unmeasured
requests, the conversations go as streamed chat completions (temperature 0, ``--max-tokens``, text only), one
request at a time:

- conversation 1: a long system prompt (a hotel's booking assistant and its facts, about 600 tokens with the default
  ``--rooms``, built the same on every run) and ``--turns`` short questions, each turn's messages holding the
  earlier questions and the answers the server gave;
- conversation 2: the same system prompt and a different first question (it shares only the system prompt).

Each of ``--rounds`` rounds runs both conversations again with another hotel, whose name is the system prompt's
first word (the same facts, the same number of tokens): a round shares no more than the system turn's opening
marker with the rounds and the warm-up before it (the warm-up: a third hotel's conversation, its first turn).

Columns: ``prompt tokens`` and ``cached tokens`` as the server's usage reports them (``usage.prompt_tokens`` and
``usage.prompt_tokens_details.cached_tokens``, from the stream's last chunk): the prompt tokens whose KV the thinker
took from a cache instead of prefilling them (a range where the rounds differ); ``TTFT ms``: request sent -> the
first chunk with content, from the client's side, the median over the rounds. The second table puts each turn's
TTFT off and on side by side, with off / on.

Exit code 1 when a request failed or a server could not be started.
"""

from __future__ import annotations

import argparse
import contextlib
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from omnipipe.bench.gateway import BenchError, Child, stop_children, wait_until
from omnipipe.bench.report import Cell, format_table, machine_info, median, write_json
from omnipipe.bench.serve_endpoints import EndOfStream, StreamEventError, sse_event
from omnipipe.config.deploy_config import merge_settings
from omnipipe.protocol.worker import CHAT_PATH, HEALTH_PATH, MODELS_PATH
from omnipipe.util.net import free_port

PROG = "omnipipe bench prefix-cache"
PIPELINE = "default"
MODEL = "qwen2.5-coder-0.5b-instruct"  # the default pipeline's thinker, unless the deploy names another
VARIANTS: dict[str, dict[str, Any]] = {  # name -> deploy settings merged over --deploy
    "on": {},
    "off": {"stages": {"thinker": {"options": {"prefix_cache_bytes": 0}}}},
}
QUESTIONS = ("How much is a night in room 203?", "Does that room look onto the river?", "And when is breakfast?",
             "Can I bring my dog?", "What does a late check-out cost?")
OTHER_QUESTION = "Is there a shuttle to the airport?"  # conversation 2's first question
# each hotel's name is the first word of its system prompt, each a different first token and two tokens in the
# default thinker's vocabulary: the warm-up's hotel, then a round's each
HOTELS = ("Castelo", "Miramar", "Solmar", "Palacio", "Douro", "Vista")
VIEWS = ("the river", "the old town", "the garden", "the courtyard")
ROOMS_PER_FLOOR = 6
HEADERS = ["variant", "conversation", "turn", "prompt tokens", "cached tokens", "TTFT ms"]
RATIO_HEADERS = ["conversation", "turn", "TTFT off ms", "TTFT on ms", "off / on"]


def system_prompt(rooms: int, hotel: str = HOTELS[1]) -> str:
    """The booking assistant's system prompt: the hotel's name first, its rooms (``rooms`` of them, six a floor)
    and its services; the same text on every run."""
    facts = [f"{hotel} Hotel in Porto: you are its booking assistant. Answer each guest's question in one short "
             "sentence, using only these facts."]
    for i in range(rooms):
        floor, number = 1 + i // ROOMS_PER_FLOOR, 100 * (1 + i // ROOMS_PER_FLOOR) + 1 + i % ROOMS_PER_FLOOR
        beds = 1 + number % 3
        facts.append(f"Room {number} is on floor {floor}, has {beds} bed{'s' if beds > 1 else ''}, looks onto "
                     f"{VIEWS[(number + floor) % len(VIEWS)]} and costs {80 + number * 7 % 9 * 10} euros a night.")
    facts += ["Breakfast is served from 7:00 to 10:30 in the winter garden and costs 14 euros.",
              "Check-in starts at 15:00 and check-out is until 11:00; a late check-out until 14:00 costs 25 euros.",
              "Parking is in the garage under the hotel: 18 euros a day, 24 spaces, no booking needed.",
              "Pets up to 10 kilograms are welcome for 15 euros a night.",
              "The airport shuttle leaves every full hour from 6:00 to 22:00 and costs 12 euros a person."]
    return " ".join(facts)


def conversations(turns: int) -> list[list[str]]:
    """The questions of each conversation: ``turns`` in the first, one in the second."""
    return [list(QUESTIONS[:turns]), [OTHER_QUESTION]]


@dataclass
class Turn:
    variant: str
    round: int
    conversation: int
    turn: int
    question: str
    ok: bool = False
    error: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    ttft_ms: float | None = None
    e2e_ms: float = 0.0
    answer: str = ""


def _events(response: httpx.Response) -> Iterator[dict[str, Any]]:
    """The JSON events of an SSE body until ``[DONE]`` (``sse_event``)."""
    try:
        for line in response.iter_lines():
            if (event := sse_event(line)) is not None:
                yield event
    except EndOfStream:
        return


def chat(client: httpx.Client, model: str, messages: list[dict[str, str]], max_tokens: int, turn: Turn) -> Turn:
    """One streamed chat completion of ``messages`` (greedy, text only), timed into ``turn``."""
    body = {"model": model, "messages": messages, "stream": True, "max_tokens": max_tokens, "temperature": 0,
            "stream_options": {"include_usage": True}}
    pieces: list[str] = []
    start = time.perf_counter()
    try:
        with client.stream("POST", CHAT_PATH, json=body) as response:
            if response.status_code != 200:
                turn.error = f"HTTP {response.status_code}: {response.read().decode(errors='replace')[:300]}"
                return turn
            for event in _events(response):
                for choice in event.get("choices") or []:
                    content = (choice.get("delta") or {}).get("content")
                    if content:
                        if turn.ttft_ms is None:
                            turn.ttft_ms = (time.perf_counter() - start) * 1e3
                        pieces.append(content)
                usage = event.get("usage")
                if usage:
                    turn.prompt_tokens = int(usage["prompt_tokens"])
                    turn.cached_tokens = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0))
    except (httpx.HTTPError, StreamEventError, ValueError, KeyError) as exc:
        turn.error = f"{type(exc).__name__}: {exc}"
        return turn
    turn.e2e_ms = (time.perf_counter() - start) * 1e3
    turn.answer = "".join(pieces)
    if turn.ttft_ms is None:
        turn.error = "no content in the answer"
    elif not turn.prompt_tokens:
        turn.error = "no usage in the stream"
    else:
        turn.ok = True
    return turn


def run_round(client: httpx.Client, model: str, variant: str, round_: int, system: str, turns: int,
              max_tokens: int) -> list[Turn]:
    """Every conversation of a round, one request at a time, each turn after the answers of the earlier ones."""
    out = []
    for number, questions in enumerate(conversations(turns), start=1):
        messages = [{"role": "system", "content": system}]
        for index, question in enumerate(questions, start=1):
            messages.append({"role": "user", "content": question})
            turn = chat(client, model, messages, max_tokens, Turn(variant, round_, number, index, question))
            out.append(turn)
            print(f"{PROG}: {variant}, round {round_}, conversation {number}, turn {index}: "
                  + (f"{turn.prompt_tokens} prompt tokens, {turn.cached_tokens} cached, TTFT {turn.ttft_ms:.0f} ms, "
                     f"answered in {turn.e2e_ms:.0f} ms" if turn.ok else f"failed: {turn.error}"),
                  file=sys.stderr, flush=True)
            if not turn.ok:
                return out
            messages.append({"role": "assistant", "content": turn.answer})
    return out


@contextlib.contextmanager
def serving(deploy: dict[str, Any], workdir: Path, startup_timeout: float) -> Iterator[tuple[str, dict[str, str]]]:
    """``omnipipe serve --pipeline default`` with ``deploy`` on a free loopback port: its URL and headers."""
    command = ["serve", "--pipeline", PIPELINE, "--host", "127.0.0.1"]
    if deploy:
        path = workdir / f"deploy-{len(list(workdir.glob('deploy-*.yaml')))}.yaml"
        path.write_text(yaml.safe_dump(deploy))
        command += ["--deploy", str(path)]
    api_key = secrets.token_urlsafe(12)
    port = free_port()
    server = Child(f"server-{port}", [*command, "--port", str(port), f"--api-key={api_key}"], workdir, port)
    print(f"{PROG}: starting omnipipe serve --pipeline {PIPELINE} on port {port} (log in {server.log_path})",
          file=sys.stderr, flush=True)
    try:
        wait_until(lambda: httpx.get(f"{server.url}{HEALTH_PATH}", timeout=5).status_code == 200, startup_timeout,
                   "the server", [server])
        yield server.url, {"Authorization": f"Bearer {api_key}"}
    finally:
        stop_children([server])


def run_variant(name: str, deploy: dict[str, Any], args: argparse.Namespace, workdir: Path) -> list[Turn]:
    """One variant's server: the warm-up requests, then every round (the first failed request ends it)."""
    with serving(deploy, workdir, args.startup_timeout) as (url, headers), \
            httpx.Client(base_url=url, headers=headers, timeout=args.request_timeout) as client:
        response = client.get(MODELS_PATH)
        response.raise_for_status()
        model = str(response.json()["data"][0]["id"])
        warmup = system_prompt(args.rooms, HOTELS[0])
        for i in range(args.warmup):
            question = QUESTIONS[i % len(QUESTIONS)]
            warm = chat(client, model, [{"role": "system", "content": warmup}, {"role": "user", "content": question}],
                        args.max_tokens, Turn(name, 0, 0, 0, question))
            if not warm.ok:
                raise BenchError(f"the warm-up request failed: {warm.error}")
        out: list[Turn] = []
        for round_ in range(1, args.rounds + 1):
            out += run_round(client, model, name, round_, system_prompt(args.rooms, HOTELS[round_]), args.turns,
                             args.max_tokens)
            if not out[-1].ok:
                break
        return out


@dataclass
class Row:
    """A turn of a conversation in one variant, over the rounds."""

    variant: str
    conversation: int
    turn: int
    prompt_tokens: list[int]  # each round's
    cached_tokens: list[int]
    ttft_ms: float  # the median over the rounds

    def cells(self) -> list[Cell]:
        return [self.variant, self.conversation, self.turn, _span(self.prompt_tokens), _span(self.cached_tokens),
                round(self.ttft_ms)]


def _span(values: list[int]) -> Cell:
    """A count the rounds agree on, or their range ("41-43")."""
    return values[0] if min(values) == max(values) else f"{min(values)}-{max(values)}"


def summarize_rows(turns: list[Turn]) -> list[Row]:
    """A row per variant, conversation and turn, in the order run, from its answered rounds."""
    grouped: dict[tuple[str, int, int], list[Turn]] = {}
    for t in turns:
        if t.ok:
            grouped.setdefault((t.variant, t.conversation, t.turn), []).append(t)
    return [Row(variant, conversation, turn, [t.prompt_tokens for t in group], [t.cached_tokens for t in group],
                median([t.ttft_ms for t in group if t.ttft_ms is not None]))
            for (variant, conversation, turn), group in grouped.items()]


def ratio_rows(rows: list[Row]) -> list[list[Cell]]:
    """Each turn measured in both variants: the median TTFT off, on, and off / on."""
    off = {(r.conversation, r.turn): r for r in rows if r.variant == "off"}
    return [[r.conversation, r.turn, round(off[key].ttft_ms), round(r.ttft_ms), off[key].ttft_ms / r.ttft_ms]
            for r in rows if r.variant == "on" and (key := (r.conversation, r.turn)) in off]


def format_report(turns: list[Turn]) -> str:
    rows = summarize_rows(turns)
    parts = [format_table(HEADERS, [r.cells() for r in rows])]
    ratios = ratio_rows(rows)
    if ratios:
        parts += ["", format_table(RATIO_HEADERS, ratios)]
    failed = [t for t in turns if not t.ok]
    if failed:
        parts.append("\nFailed:")
        parts += [f"  {t.variant}, round {t.round}, conversation {t.conversation}, turn {t.turn}: {t.error}"
                  for t in failed]
    return "\n".join(parts)


def differing_answers(turns: list[Turn]) -> list[str]:
    """The turns whose answer differs between the variants (greedy decoding: the same prompt, the same answer,
    unless going on from a cache changes the numbers)."""
    answers: dict[tuple[int, int, int], set[str]] = {}
    for t in turns:
        if t.ok:
            answers.setdefault((t.round, t.conversation, t.turn), set()).add(t.answer)
    return [f"round {r}, conversation {c}, turn {n}" for (r, c, n), seen in answers.items() if len(seen) > 1]


def system_prompt_tokens(model: str, prompts: list[str]) -> list[int]:
    """Each system prompt's own tokens by the thinker's tokenizer (the prompt adds the turn's markers around it);
    none when the tokenizer cannot be loaded here."""
    try:
        from transformers import AutoTokenizer

        from omnipipe.models.default.weights.thinker import prepare_thinker

        tokenizer = AutoTokenizer.from_pretrained(str(prepare_thinker(model, progress=False)), local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - only the header's count is lost
        print(f"{PROG}: cannot count the system prompt's tokens: {exc}", file=sys.stderr)
        return []
    return [len(tokenizer.encode(prompt, add_special_tokens=False)) for prompt in prompts]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                     epilog="\n\n".join(__doc__.split("\n\n")[2:]),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help="comma-separated among on (the cache as it ships), off (prefix_cache_bytes: 0) "
                             "(default: %(default)s)")
    parser.add_argument("--deploy", type=Path, default=None, help="a deploy YAML both servers begin from")
    parser.add_argument("--rounds", type=int, default=3,
                        help=f"times each conversation runs (another hotel each time), 1..{len(HOTELS) - 1}; TTFT is "
                             "the median (default: %(default)s)")
    parser.add_argument("--rooms", type=int, default=15,
                        help="rooms the system prompt describes, ~30 tokens each (default: %(default)s: ~615 tokens)")
    parser.add_argument("--turns", type=int, default=3,
                        help=f"turns of the first conversation, 2..{len(QUESTIONS)} (default: %(default)s)")
    parser.add_argument("--max-tokens", type=int, default=16, help="answer length limit (default: %(default)s)")
    parser.add_argument("--warmup", type=int, default=1,
                        help="unmeasured requests first on each server (default: %(default)s)")
    parser.add_argument("--request-timeout", type=float, default=300.0, help="seconds a request may take")
    parser.add_argument("--startup-timeout", type=float, default=600.0, help="seconds a started server may take")
    parser.add_argument("--json", help="also write every turn's figures (and answers) here")
    return parser


def thinker_options(deploy: dict[str, Any]) -> dict[str, Any]:
    """``stages.thinker.options`` of a deploy (empty where it names none)."""
    options = ((deploy.get("stages") or {}).get("thinker") or {}).get("options") or {}
    return options if isinstance(options, dict) else {}


def _check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[list[str], dict[str, Any]]:
    """The variants named and the base deploy; a usage error (exit 2) naming the flag otherwise."""
    names = [n.strip() for n in args.variants.split(",") if n.strip()]
    unknown = [n for n in names if n not in VARIANTS]
    if not names or unknown:
        parser.error(f"--variants: comma-separated among {', '.join(VARIANTS)}"
                     + (f" (unknown: {', '.join(map(repr, unknown))})" if unknown else ""))
    if not 1 <= args.rounds < len(HOTELS):
        parser.error(f"--rounds must be 1..{len(HOTELS) - 1}")
    if args.rooms < 1:
        parser.error("--rooms must be >= 1")
    if not 2 <= args.turns <= len(QUESTIONS):
        parser.error(f"--turns must be 2..{len(QUESTIONS)}")
    if args.max_tokens < 1 or args.warmup < 0:
        parser.error("--max-tokens must be >= 1 and --warmup >= 0")
    if args.request_timeout <= 0 or args.startup_timeout <= 0:
        parser.error("--request-timeout and --startup-timeout must be > 0")
    base: dict[str, Any] = {}
    if args.deploy is not None:
        try:
            base = yaml.safe_load(args.deploy.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            parser.error(f"--deploy: {exc}")
        if not isinstance(base, dict):
            parser.error(f"--deploy: {args.deploy} is not a mapping of settings")
        options = thinker_options(base)
        if options.get("prefix_cache") is False or options.get("prefix_cache_bytes") == 0 \
                or options.get("session_cache_bytes") == 0:
            parser.error(f"--deploy: {args.deploy} turns the thinker's prefix cache off; the variant 'on' needs it")
    return list(dict.fromkeys(names)), base


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    names, base = _check(parser, args)
    deploys = {name: merge_settings(base, VARIANTS[name]) for name in names}
    model = str(thinker_options(base).get("model", MODEL))
    system_tokens = system_prompt_tokens(model, [system_prompt(args.rooms, HOTELS[r])
                                                 for r in range(1, args.rounds + 1)])
    workdir = Path(tempfile.mkdtemp(prefix="omnipipe-bench-prefix-cache-"))
    turns: list[Turn] = []
    started = time.perf_counter()
    try:
        for name in names:
            turns += run_variant(name, deploys[name], args, workdir)
    except (BenchError, httpx.HTTPError, RuntimeError) as exc:
        print(f"{PROG}: {exc}\nlogs kept in {workdir}", file=sys.stderr)
        return 1
    shutil.rmtree(workdir, ignore_errors=True)
    info = machine_info()
    print(f"{PROG}: omnipipe serve --pipeline {PIPELINE} ({model}), a server per variant; system prompt "
          f"{_span(system_tokens) if system_tokens else '?'} tokens ({args.rooms} rooms); {args.turns} turns + a "
          f"second conversation, {args.rounds} round(s), TTFT the median; greedy, max_tokens {args.max_tokens}; "
          f"{time.perf_counter() - started:.0f} s; {info['cpu_count']} CPUs, load "
          f"{' '.join(f'{x:.1f}' for x in info['load_avg_1_5_15'])}")
    print(format_report(turns))
    differ = differing_answers(turns)
    if differ:
        print(f"answers differ between the variants at: {'; '.join(differ)}")
    if args.json:
        rows = summarize_rows(turns)
        write_json(args.json, {"meta": {"pipeline": PIPELINE, "model": model, "variants": deploys,
                                        "rooms": args.rooms, "system_prompt_tokens": system_tokens,
                                        "turns": args.turns, "rounds": args.rounds, "max_tokens": args.max_tokens,
                                        "warmup": args.warmup, "machine": info},
                               "rows": [asdict(r) for r in rows],
                               "ratios": [dict(zip(RATIO_HEADERS, row, strict=True)) for row in ratio_rows(rows)],
                               "turns": [asdict(t) for t in turns]})
    expected = len(names) * args.rounds * (args.turns + 1)
    return 0 if len(turns) == expected and all(t.ok for t in turns) else 1


if __name__ == "__main__":
    sys.exit(main())

"""``omnipipe bench tools``: how well the default thinker calls tools with omnipipe's grammar and without it, side
by side in one run, and what the grammar costs per decode step.

Twenty-four fixed prompts, offered the same three tools (``get_weather``, ``get_time``, ``convert_currency``): half
need one of them (varied wording), half need none (facts, greetings, arithmetic, a joke). Each is decoded greedily
by the thinker's own model in-process, the prompt rendered with the tools as the thinker stage renders it, in two
modes:

- ``constrained``: what omnipipe does with ``tool_choice`` ``auto``: the request's grammar (``AnswerShape``) masks
  every step, and the text is split into content and calls (``ToolCallSplitter``), gathered as the server gathers
  them (``ToolCalls``);
- ``unconstrained``: the same prompt decoded free, its text read as Qwen's hermes format
  (``<tool_call>\\n{json}\\n</tool_call>``) or one bare ``{"name": ..., "arguments": ...}`` object.

Scored per mode: the right decision (a call or none), the right function, the right arguments (each expected key's
value contains the expected text, ignoring case) and calls whose arguments parse and validate against the tool's
schema (jsonschema). Each mode runs with the spoken-answer system prompt (the stage's) and with Qwen's default one.

Then, for the prompts that need a tool, the turn after its result: the model's own first call (the first system
prompt's constrained answer; the expected call where it had none right) and a made-up result are put in the
conversation and the model goes on; a constrained turn that only repeats the answered call is decoded again
without the tools, as the thinker runner does (``AnswerShape.repeats_a_call`` / ``answer_instead``). Scored: the
answer is text (no call) and holds the result's value.

Last, the grammar engine's cost per decode step: ``TokenConstraint.mask_`` (and ``accept``) per row beside the
decode step itself (``decode`` of 1 and of 8 rows), greedy, one torch thread.

    omnipipe bench tools [--weights int8|int8-split|float32] [--prompts N] [--max-tokens 64] [--json FILE] [-v]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from omnipipe.bench.report import format_table, machine_info, write_json

MODEL = "qwen2.5-coder-0.5b-instruct"  # the default pipeline's thinker
QWEN_SYSTEM_PROMPT = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
SYSTEM_PROMPTS = ("spoken", "qwen")  # the stage's spoken-answer prompt; Qwen's own default
MODES = ("constrained", "unconstrained")

TOOLS: list[dict[str, Any]] = [
    {"name": "get_weather", "description": "Get the current weather in a city",
     "parameters": {"type": "object", "properties": {
         "city": {"type": "string", "description": "The city, e.g. Paris"},
         "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
         "required": ["city"]}},
    {"name": "get_time", "description": "Get the current local time in a time zone",
     "parameters": {"type": "object", "properties": {
         "timezone": {"type": "string", "description": "An IANA time zone, e.g. Europe/Paris"}},
         "required": ["timezone"]}},
    {"name": "convert_currency", "description": "Convert an amount of money from one currency to another",
     "parameters": {"type": "object", "properties": {
         "amount": {"type": "number"},
         "from": {"type": "string", "description": "ISO currency code, e.g. USD"},
         "to": {"type": "string", "description": "ISO currency code, e.g. EUR"}},
         "required": ["amount", "from", "to"]}},
]


@dataclass(frozen=True)
class Prompt:
    text: str
    tool: str | None = None  # the function it needs; None: it needs none
    args: tuple[tuple[str, str], ...] = ()  # (key, text its value must contain, ignoring case)
    result: str = ""  # a made-up result of the expected call
    value: str = ""  # what the answer after the result must hold


PROMPTS: tuple[Prompt, ...] = (
    Prompt("What's the weather like in Paris right now?", "get_weather", (("city", "paris"),),
           '{"temperature": 18, "condition": "sunny"}', "18"),
    Prompt("Is it raining in London today?", "get_weather", (("city", "london"),),
           '{"temperature": 11, "condition": "rain"}', "11"),
    Prompt("How hot is it in Tokyo in fahrenheit?", "get_weather", (("city", "tokyo"), ("unit", "fahrenheit")),
           '{"temperature": 86, "unit": "fahrenheit"}', "86"),
    Prompt("Should I take a coat in Berlin? Check the weather there in celsius.", "get_weather",
           (("city", "berlin"), ("unit", "celsius")), '{"temperature": 4, "condition": "windy"}', "4"),
    Prompt("What time is it in Tokyo?", "get_time", (("timezone", "tokyo"),), '{"time": "21:45"}', "21:45"),
    Prompt("Tell me the current time in New York.", "get_time", (("timezone", "new_york"),),
           '{"time": "08:15"}', "8:15"),
    Prompt("What's the local time in the Europe/Berlin time zone?", "get_time", (("timezone", "berlin"),),
           '{"time": "14:05"}', "14:05"),
    Prompt("Is it morning or evening in Sydney right now?", "get_time", (("timezone", "sydney"),),
           '{"time": "19:30"}', "19:30"),
    Prompt("Convert 100 US dollars to euros.", "convert_currency",
           (("amount", "100"), ("from", "usd"), ("to", "eur")), '{"result": 92.31}', "92.31"),
    Prompt("How many Japanese yen is 50 euros?", "convert_currency",
           (("amount", "50"), ("from", "eur"), ("to", "jpy")), '{"result": 8125}', "8125"),
    Prompt("I have 250 GBP. What is that in US dollars?", "convert_currency",
           (("amount", "250"), ("from", "gbp"), ("to", "usd")), '{"result": 317.5}', "317.5"),
    Prompt("Change 20 Swiss francs into British pounds, please.", "convert_currency",
           (("amount", "20"), ("from", "chf"), ("to", "gbp")), '{"result": 17.6}', "17.6"),
    Prompt("What is the capital of France?"),
    Prompt("Hello! How are you today?"),
    Prompt("What is 12 times 7?"),
    Prompt("Tell me a joke."),
    Prompt("Who wrote Romeo and Juliet?"),
    Prompt("How many legs does a spider have?"),
    Prompt("Good morning!"),
    Prompt("What is the largest planet in our solar system?"),
    Prompt("What is 15 plus 27?"),
    Prompt("Thanks, that's all for now."),
    Prompt("What color is the sky on a clear day?"),
    Prompt("Can you tell me a short joke about cats?"),
)


@dataclass
class Call:
    name: str
    arguments: str  # the text the model wrote as the arguments


@dataclass
class Answer:
    prompt: str
    text: str  # the content (constrained) or the whole text (unconstrained)
    calls: list[Call]
    tokens: int
    seconds: float
    redone: bool = False  # the answer after a result: the turn only repeated the call and was decoded again


@dataclass
class Score:
    mode: str
    system: str
    decision: int = 0
    total: int = 0
    called: int = 0  # prompts that need a tool and got a call
    need: int = 0
    answered: int = 0  # prompts that need none and got none
    no_need: int = 0
    function: int = 0
    arguments: int = 0
    valid: int = 0  # calls whose arguments parse and validate
    calls: int = 0
    tokens: int = 0
    seconds: float = 0.0
    answers: list[Answer] = field(default_factory=list)


@dataclass
class FollowUp:
    mode: str
    total: int = 0
    text: int = 0  # the turn is text, no call
    value: int = 0  # ... and holds the result's value
    redone: int = 0  # the model repeated the answered call first (decoded again as words)
    answers: list[Answer] = field(default_factory=list)


@dataclass
class StepCost:
    batch: int
    steps: int
    decode_ms: float  # one decode step of ``batch`` rows
    mask_ms: float  # the grammar's masks of the step's rows, summed
    accept_ms: float  # the grammar following the tokens chosen, summed
    compile_ms: float  # one request's grammar, built at its start (not per step)

    @property
    def share(self) -> float:
        return (self.mask_ms + self.accept_ms) / (self.decode_ms + self.mask_ms + self.accept_ms)


def parse_free_text(text: str) -> list[Call]:
    """The calls in an unconstrained answer: each ``<tool_call>...</tool_call>`` block (an unclosed last one
    too), else the whole answer as one bare ``{"name", "arguments"}`` object (in a code fence or not). A block
    whose JSON does not parse is a call of an unknown function ("?") with its text as arguments."""
    blocks = re.findall(r"<tool_call>(.*?)(?:</tool_call>|$)", text, flags=re.S)
    if not blocks:
        bare = re.sub(r"^```[A-Za-z]*\s*", "", text.strip())
        if not bare.startswith("{"):
            return []
        try:  # the first object, whatever follows it (lenient: a client reading the answer's JSON)
            blocks = [json.dumps(json.JSONDecoder().raw_decode(bare)[0])]
        except ValueError:
            blocks = [bare]
    calls = []
    for block in blocks:
        try:
            data = json.loads(block.strip())
        except ValueError:
            name = re.search(r'"name"\s*:\s*"([^"]*)"', block)
            calls.append(Call(name.group(1) if name else "?", block.strip()))
            continue
        if not isinstance(data, dict):
            calls.append(Call("?", block.strip()))
            continue
        arguments = data.get("arguments", data.get("parameters"))
        calls.append(Call(str(data.get("name", "?")), json.dumps(arguments) if arguments is not None else ""))
    return calls


def valid_arguments(call: Call) -> bool:
    """The call names one of the tools and its arguments parse as JSON and validate against its schema."""
    import jsonschema  # type: ignore[import-untyped]

    tool = next((t for t in TOOLS if t["name"] == call.name), None)
    if tool is None:
        return False
    try:
        arguments = json.loads(call.arguments)
        jsonschema.validate(arguments, tool["parameters"])
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def right_arguments(call: Call, prompt: Prompt) -> bool:
    if call.name != prompt.tool:
        return False
    try:
        arguments = json.loads(call.arguments)
    except ValueError:
        return False
    if not isinstance(arguments, dict):
        return False
    for key, expected in prompt.args:
        value = str(arguments.get(key, "")).lower().replace(" ", "_")
        if expected.lower().replace(" ", "_") not in value:
            return False
    return True


def score(mode: str, system: str, prompts: Sequence[Prompt], answers: list[Answer]) -> Score:
    s = Score(mode, system, total=len(prompts), answers=answers)
    for prompt, answer in zip(prompts, answers, strict=True):
        made = bool(answer.calls)
        s.decision += made == (prompt.tool is not None)
        s.tokens += answer.tokens
        s.seconds += answer.seconds
        s.calls += len(answer.calls)
        s.valid += sum(valid_arguments(call) for call in answer.calls)
        if prompt.tool is None:
            s.no_need += 1
            s.answered += not made
            continue
        s.need += 1
        s.called += made
        if made:
            s.function += answer.calls[0].name == prompt.tool
            s.arguments += right_arguments(answer.calls[0], prompt)
    return s


class Bench:
    """The thinker's model, tokenizer and grammar engine, in-process, as the thinker runner holds them."""

    def __init__(self, weights: str, max_tokens: int) -> None:
        import torch

        from omnipipe.models.default.runners.thinker import thinker_model
        from omnipipe.models.default.weights.thinker import prepare_thinker
        from omnipipe.stage.structured_output import GrammarCompiler, tool_call_format_for

        torch.set_num_threads(1)
        self.model = thinker_model(MODEL).decoder(prepare_thinker(MODEL, progress=False), num_threads=1,
                                                  weights=weights)
        self.tokenizer = self.model.tokenizer
        self.compiler = GrammarCompiler(self.tokenizer).ready()  # built now, not inside a timed run
        from omnipipe.models.default.prompting import ChatMLFormat

        self.fmt = tool_call_format_for(ChatMLFormat.tool_calls, self.tokenizer)
        self.max_tokens = max_tokens
        self._n = 0

    def prompt_format(self, system: str) -> Any:
        from omnipipe.models.default.prompting import ChatMLFormat

        return ChatMLFormat() if system == "spoken" else ChatMLFormat(QWEN_SYSTEM_PROMPT)

    def _decode_text(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    def _run(self, ids: list[int], shape: Any) -> tuple[list[int], str, list[Call], float]:
        """Greedy decode of ``ids``; with ``shape`` (an ``AnswerShape``) as the thinker runner does it: masked,
        split, the call pieces gathered. Returns (tokens, text, calls, seconds)."""
        from omnipipe.server.tool_calls import ToolCalls
        from omnipipe.stage.sampling import TokenSamplingParams, sample_next_token
        from omnipipe.stage.text_stream import TextStream

        self._n += 1
        rid = f"r{self._n}"
        started = time.perf_counter()
        stream = TextStream(self._decode_text, (), strip=True)
        gathered = ToolCalls()
        content = ""
        out: list[int] = []
        params = TokenSamplingParams()
        logits = _tensor(self.model.prefill(rid, ids))
        try:
            while True:
                constraint = shape.constraint if shape is not None else None
                token = sample_next_token(logits, params, stream.ids, None, constraint=constraint)
                eos = token in self.model.eos_token_ids
                if shape is not None:
                    shape.accept(token, logits, is_text=not eos)
                if eos:
                    delta, _ = stream.finish()
                else:
                    out.append(token)
                    delta, _ = stream.push(token)
                final = eos or len(stream.ids) >= self.max_tokens
                if final and not eos:
                    more, _ = stream.finish()
                    delta += more
                if shape is not None:
                    delta, details = shape.shape(delta, final=final)
                    gathered.add((details or {}).get("tool_calls", []))
                content += delta
                if final:
                    break
                logits = _tensor(self.model.decode([rid], [token]))[0]
        finally:
            self.model.free(rid)
        seconds = time.perf_counter() - started
        if shape is None:  # free text: the markers are not special tokens, so the text keeps them
            text = str(self.tokenizer.decode(out, skip_special_tokens=False))
            return out, text, parse_free_text(text), seconds
        return out, content.strip(), [Call(c["name"], c["arguments"]) for c in gathered.calls], seconds

    def answer(self, prompt: Prompt, mode: str, system: str) -> Answer:
        from omnipipe.stage.answer_shape import AnswerShape

        ids = self.prompt_format(system).encode_turns(self.tokenizer, prompt.text, [], TOOLS)
        shape = AnswerShape.start({"tool_choice": "auto"}, TOOLS, self.compiler, self.fmt) \
            if mode == "constrained" else None
        out, text, calls, seconds = self._run(ids, shape)
        return Answer(prompt.text, text, calls, len(out), seconds)

    def follow_up(self, prompt: Prompt, mode: str, call: Call | None) -> Answer:
        """The turn after a call's made-up result (the spoken system prompt): ``call`` (the model's own first
        call, as an agent would run it) or else the expected one. Constrained, a turn that only repeats the
        answered call is decoded again from the conversation without the tools, as the runner does."""
        from omnipipe.stage.answer_shape import AnswerShape

        assert prompt.tool is not None
        if call is None or call.name != prompt.tool or not valid_arguments(call):
            call = Call(prompt.tool, json.dumps(_call_arguments(prompt)))
        history: list[dict[str, Any]] = [
            {"role": "user", "content": prompt.text},
            {"role": "assistant", "content": "",
             "tool_calls": [{"id": "call_1", "name": call.name, "arguments": call.arguments}]},
            {"role": "tool", "tool_call_id": "call_1", "content": prompt.result}]
        form = self.prompt_format("spoken")
        ids = form.encode_turns(self.tokenizer, "", history, TOOLS)
        if mode != "constrained":
            out, text, calls, seconds = self._run(ids, None)
            return Answer(prompt.text, text, calls, len(out), seconds)
        shape = AnswerShape.start({"tool_choice": "auto"}, TOOLS, self.compiler, self.fmt, history)
        assert shape is not None
        out, text, calls, seconds = self._run(ids, shape)
        redone = bool(calls) and shape.repeats_a_call()
        if redone:  # the runner's _answer_instead: the conversation without the tools, words only
            shape.answer_instead(self.compiler, None, self.fmt)
            again = self.tokenizer.encode(form.preamble()) + form.encode_turns(self.tokenizer, "", history)
            more, text, calls, spent = self._run(again, shape)
            out, seconds = out + more, seconds + spent
        return Answer(prompt.text, text, calls, len(out), seconds, redone)

    def step_cost(self, batch: int, steps: int) -> StepCost:
        """Greedy constrained decode of ``batch`` prompts (``subset``) together: each step's ``decode`` of the rows
        beside the grammar's per-row ``mask_`` and ``accept``, over the steps where every row is still writing."""
        import torch

        from omnipipe.stage.answer_shape import AnswerShape

        form = self.prompt_format("spoken")
        chosen = subset(batch)
        rids = [f"cost{batch}-{i}" for i in range(batch)]
        compile_s = 0.0
        constraints = []
        for _ in chosen:
            started = time.perf_counter()
            shape = AnswerShape.start({"tool_choice": "auto"}, TOOLS, self.compiler, self.fmt)
            compile_s += time.perf_counter() - started
            assert shape is not None and shape.constraint is not None
            constraints.append(shape.constraint)
        rows = torch.stack([_tensor(self.model.prefill(rid, form.encode_turns(self.tokenizer, p.text, [], TOOLS)))
                            for rid, p in zip(rids, chosen, strict=True)])
        decode_s: list[float] = []
        mask_s: list[float] = []
        accept_s: list[float] = []
        try:
            for _ in range(steps):
                masked = rows.detach().clone()
                started = time.perf_counter()
                for i, constraint in enumerate(constraints):
                    constraint.mask_(masked[i])
                masking = time.perf_counter() - started
                tokens = masked.argmax(dim=-1).tolist()
                if any(t in self.model.eos_token_ids for t in tokens):
                    break
                started = time.perf_counter()
                for constraint, token in zip(constraints, tokens, strict=True):
                    constraint.accept(token)
                accepting = time.perf_counter() - started
                started = time.perf_counter()
                rows = _tensor(self.model.decode(rids, tokens))
                decode_s.append(time.perf_counter() - started)
                mask_s.append(masking)
                accept_s.append(accepting)
        finally:
            for rid in rids:
                self.model.free(rid)
        if not decode_s:
            raise RuntimeError("a row ended at its first token: no step to time")
        return StepCost(batch, len(decode_s), statistics.median(decode_s) * 1e3, statistics.median(mask_s) * 1e3,
                        statistics.median(accept_s) * 1e3, compile_s / batch * 1e3)


def _tensor(logits: Any) -> Any:
    """The model's logits (asked for, so never None)."""
    assert logits is not None
    return logits


def _call_arguments(prompt: Prompt) -> dict[str, Any]:
    """The expected call's arguments, as a caller would send them back (the amount a number)."""
    values: dict[str, Any] = {}
    for key, text in prompt.args:
        if key == "amount":
            values[key] = float(text)
        elif key == "timezone":
            values[key] = {"tokyo": "Asia/Tokyo", "new_york": "America/New_York", "berlin": "Europe/Berlin",
                           "sydney": "Australia/Sydney"}[text]
        else:
            values[key] = text.upper() if key in ("from", "to") else text.title() if key == "city" else text
    return values


SCORE_HEADERS = ["System prompt", "Mode", "Right decision", "Need a tool: called", "Need none: answered",
                 "Right function", "Right arguments", "Valid JSON (calls)", "Tokens/s (with prefill)"]
FOLLOW_HEADERS = ["Mode", "Answered in text", "Holds the result's value", "Repeated the call first"]
COST_HEADERS = ["Batch", "Steps", "Decode step ms", "mask_ ms (all rows)", "accept ms (all rows)",
                "Grammar share of step", "Grammar build ms / request"]


def format_report(scores: list[Score], follow: list[FollowUp], costs: list[StepCost], weights: str) -> str:
    def frac(a: int, b: int) -> str:
        return f"{a}/{b}"

    parts = [format_table(SCORE_HEADERS, [
        [s.system, s.mode, frac(s.decision, s.total), frac(s.called, s.need), frac(s.answered, s.no_need),
         frac(s.function, s.need), frac(s.arguments, s.need), frac(s.valid, s.calls),
         s.tokens / s.seconds if s.seconds else None] for s in scores], digits=1,
        title=f"Tool calls, {MODEL} ({weights} weights, greedy, 1 thread), tools offered on every prompt:")]
    if follow:
        parts.append(format_table(FOLLOW_HEADERS, [
            [f.mode, frac(f.text, f.total), frac(f.value, f.total), frac(f.redone, f.total)] for f in follow],
            title="\nThe turn after a made-up result of the model's own call (spoken system prompt):"))
    if costs:
        parts.append(format_table(COST_HEADERS, [
            [c.batch, c.steps, c.decode_ms, c.mask_ms, c.accept_ms, f"{100 * c.share:.1f}%", c.compile_ms]
            for c in costs], digits=2,
            title=f"\nThe grammar's cost per decode step (medians; {weights} weights, greedy, 1 torch thread):"))
    by_text = {p.text: p for p in PROMPTS}
    wrong = [(s, a) for s in scores for a in s.answers if not _right(by_text[a.prompt], a)]
    if wrong:
        parts.append("\nWrong answers:")
        parts += [f"  [{s.system} {s.mode}] {a.prompt} -> "
                  + (", ".join(f"{c.name}({c.arguments})" for c in a.calls) if a.calls else repr(a.text[:80]))
                  for s, a in wrong]
    return "\n".join(parts)


def _right(prompt: Prompt, answer: Answer) -> bool:
    if prompt.tool is None:
        return not answer.calls
    return bool(answer.calls) and right_arguments(answer.calls[0], prompt)


def main(argv: Sequence[str] | None = None) -> int:
    from omnipipe.models.default.modeling.quantized import WEIGHT_FORMATS
    from omnipipe.models.default.pipeline import THINKER

    parser = argparse.ArgumentParser(prog="omnipipe bench tools", description=__doc__.split("\n\n")[0])
    default_weights = THINKER.default_options["weights"]
    parser.add_argument("--weights", default=default_weights, choices=list(WEIGHT_FORMATS),
                        help=f"the thinker's weights (default: the default pipeline's, {default_weights})")
    parser.add_argument("--prompts", type=int, default=len(PROMPTS),
                        help="the first N prompts, alternating need-a-tool and need-none (a quick run)")
    parser.add_argument("--systems", default=",".join(SYSTEM_PROMPTS),
                        help=f"comma-separated system prompts of: {', '.join(SYSTEM_PROMPTS)}")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--cost-steps", type=int, default=24, help="decode steps timed per batch (at most)")
    parser.add_argument("--json", help="also write the raw results here")
    parser.add_argument("--verbose", "-v", action="store_true", help="print each answer as it comes")
    args = parser.parse_args(argv)
    if not 1 <= args.prompts <= len(PROMPTS):
        parser.error(f"--prompts must be 1..{len(PROMPTS)}")
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if not systems or any(s not in SYSTEM_PROMPTS for s in systems):
        parser.error(f"--systems: choose from {', '.join(SYSTEM_PROMPTS)}")
    if args.max_tokens < 1 or args.cost_steps < 1:
        parser.error("--max-tokens and --cost-steps must be >= 1")

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    prompts = subset(args.prompts)
    started = time.perf_counter()
    bench = Bench(args.weights, args.max_tokens)
    say(f"loaded {MODEL} ({args.weights}) in {time.perf_counter() - started:.0f} s")
    scores = []
    for system in systems:
        for mode in MODES:
            answers = []
            for p in prompts:
                answers.append(bench.answer(p, mode, system))
                if args.verbose:
                    a = answers[-1]
                    say(f"[{system} {mode}] {p.text} -> {a.text!r} {[asdict(c) for c in a.calls]}")
            scores.append(score(mode, system, prompts, answers))
            say(f"{system} {mode}: done ({time.perf_counter() - started:.0f} s)")
    follow = []
    first = scores[0]  # the model's own calls (the first system prompt, constrained) are the ones run
    own = {a.prompt: (a.calls[0] if a.calls else None) for a in first.answers}
    for mode in MODES:
        f = FollowUp(mode)
        for p in (p for p in prompts if p.tool is not None):
            a = bench.follow_up(p, mode, own.get(p.text))
            f.answers.append(a)
            f.total += 1
            f.text += not a.calls
            f.value += not a.calls and p.value.lower() in a.text.lower()
            f.redone += a.redone
            if args.verbose:
                say(f"[after result, {mode}] {p.text} -> {a.text!r} {[asdict(c) for c in a.calls]}")
        follow.append(f)
    say(f"follow-ups: done ({time.perf_counter() - started:.0f} s)")
    costs = [bench.step_cost(batch, args.cost_steps) for batch in (1, 8)]
    print(format_report(scores, follow, costs, args.weights))
    if args.json:
        write_json(args.json, {"machine": machine_info(), "model": MODEL, "weights": args.weights, "threads": 1,
                               "max_tokens": args.max_tokens,
                               "scores": [asdict(s) for s in scores], "follow_up": [asdict(f) for f in follow],
                               "step_cost": [{**asdict(c), "share": c.share} for c in costs]})
    return 0


def subset(n: int) -> list[Prompt]:
    """The first ``n`` prompts taken alternately from those that need a tool and those that need none."""
    need = [p for p in PROMPTS if p.tool is not None]
    none = [p for p in PROMPTS if p.tool is None]
    mixed = [p for pair in zip(need, none, strict=True) for p in pair]
    return mixed[:n]


if __name__ == "__main__":
    sys.exit(main())

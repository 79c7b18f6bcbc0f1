"""``omnipipe bench quality``: how often each thinker of the default pipeline answers right, and how fast it writes,
side by side in one run.

Thirty short factual questions, each scored by exact match on a key word (case-insensitive, whole words, any of
the listed variants: "4" or "four"), asked one at a time, text only, through ``AsyncOmni``. Then a multi-turn
check: a name given in turn 1 and asked for in turn 3. Decode tok/s is the tokens after the first over the time
they took, summed over the questions.

    omnipipe bench quality [--models qwen2.5-coder-0.5b-instruct,gemma3-270m] [--weights float32,int8,int8-split]
                           [--max-tokens 48] [--json FILE]

Each model is run with each weight format (the deploy option ``stages.thinker.options.weights``).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from omnipipe.bench.report import format_table, machine_info, write_json
from omnipipe.models.default.modeling.quantized import WEIGHT_FORMATS
from omnipipe.models.default.weights.thinker import THINKER_MODELS, canonical_thinker

PIPELINE = "default"
MODELS = tuple(THINKER_MODELS)  # the default pipeline's selectable thinkers


@dataclass(frozen=True)
class Question:
    text: str
    accept: tuple[str, ...]  # any of these, as whole words, makes the answer right


QUESTIONS: tuple[Question, ...] = (
    Question("What is the largest planet in our solar system?", ("jupiter",)),
    Question("What is the capital of Italy?", ("rome",)),
    Question("How many days are in a week?", ("7", "seven")),
    Question("What is the capital of France?", ("paris",)),
    Question("How many legs does a spider have?", ("8", "eight")),
    Question("What color is the sky on a clear day?", ("blue",)),
    Question("At how many degrees Celsius does water boil at sea level?", ("100", "one hundred", "a hundred")),
    Question("Who wrote Romeo and Juliet?", ("shakespeare",)),
    Question("What is the chemical symbol for gold?", ("au",)),
    Question("How many continents are there?", ("7", "seven")),
    Question("At how many degrees Celsius does water freeze?", ("0", "zero")),
    Question("Which planet is known as the Red Planet?", ("mars",)),
    Question("What is the capital of Germany?", ("berlin",)),
    Question("How many hours are in a day?", ("24", "twenty-four", "twenty four")),
    Question("What is the largest ocean on Earth?", ("pacific",)),
    Question("What gas do plants take in from the air to make food?", ("carbon dioxide", "co2")),
    Question("What is two plus two?", ("4", "four")),
    Question("How many sides does a triangle have?", ("3", "three")),
    Question("What is the capital of Spain?", ("madrid",)),
    Question("Who was the first president of the United States?", ("washington",)),
    Question("What is the tallest mountain in the world?", ("everest",)),
    Question("What language is spoken in Brazil?", ("portuguese",)),
    Question("How many months are in a year?", ("12", "twelve")),
    Question("What star is at the center of our solar system?", ("sun",)),
    Question("What is the square root of 81?", ("9", "nine")),
    Question("What is the capital of Canada?", ("ottawa",)),
    Question("Which animal is called the king of the jungle?", ("lion",)),
    Question("How many minutes are in an hour?", ("60", "sixty")),
    Question("What is the longest river in Africa?", ("nile",)),
    Question("In which country are the pyramids of Giza?", ("egypt",)),
)

# the multi-turn check: a fact given in turn 1, another question in turn 2, the fact asked for in turn 3
RECALL_TURNS = ("My name is Zorblat.", "What is the capital of France?", "What is my name?")
RECALL_ACCEPT = ("zorblat",)


def is_correct(answer: str, accept: Sequence[str]) -> bool:
    """Whether any accepted variant occurs in ``answer`` as whole words, ignoring case ("4" is not in "14")."""
    text = answer.lower()
    return any(re.search(rf"(?<![\w]){re.escape(variant.lower())}(?![\w])", text) for variant in accept)


@dataclass
class ModelResult:
    model: str
    correct: int
    total: int
    recall: bool
    recall_answer: str
    decode_tokens: int
    decode_s: float
    misses: list[tuple[str, str]]  # (question, answer)

    @property
    def decode_tok_s(self) -> float | None:
        return self.decode_tokens / self.decode_s if self.decode_s > 0 else None


async def _ask(engine: Any, question: str, history: list[dict[str, str]], max_tokens: int) -> tuple[str, Any]:
    from omnipipe import SamplingParams

    text, metrics = "", None
    prompt = {"prompt": question, "history": history}
    async for out in engine.generate(prompt, sampling_params=SamplingParams(max_tokens=max_tokens),
                                     output_modalities=["text"]):
        if out.modality == "text":
            text += out.text_delta
        if out.finished:
            metrics = out.metrics
    return text.strip(), metrics


async def evaluate(model: str, max_tokens: int, say: Any = None, weights: str = "float32") -> ModelResult:
    """Ask the questions and run the recall check with ``model`` (its ``weights`` format) as the default
    pipeline's thinker."""
    from omnipipe import AsyncOmni

    deploy = {"stages": {"thinker": {"options": {"model": model, "weights": weights}}}}
    result = ModelResult(f"{model} {weights}", 0, len(QUESTIONS), False, "", 0, 0.0, [])
    async with AsyncOmni(PIPELINE, deploy) as engine:
        await _ask(engine, "Hello?", [], 4)  # warm-up
        for index, question in enumerate(QUESTIONS, start=1):
            answer, metrics = await _ask(engine, question.text, [], max_tokens)
            if is_correct(answer, question.accept):
                result.correct += 1
            else:
                result.misses.append((question.text, answer))
            if metrics is not None and metrics.tpot_s is not None and metrics.num_output_tokens > 1:
                result.decode_tokens += metrics.num_output_tokens - 1
                result.decode_s += metrics.tpot_s * (metrics.num_output_tokens - 1)
            if say is not None:
                say(f"{model}: {index}/{len(QUESTIONS)} {question.text} -> {answer}")
        history: list[dict[str, str]] = []
        for turn in RECALL_TURNS:
            answer, _ = await _ask(engine, turn, history, max_tokens)
            history += [{"role": "user", "content": turn}, {"role": "assistant", "content": answer}]
        result.recall_answer = history[-1]["content"]
        result.recall = is_correct(result.recall_answer, RECALL_ACCEPT)
    return result


def format_report(results: list[ModelResult]) -> str:
    table = format_table(
        ["Model", "Correct", "Multi-turn recall", "Decode tok/s"],
        [[r.model, f"{r.correct}/{r.total}", "yes" if r.recall else "no", r.decode_tok_s] for r in results],
        digits=1,
    )
    lines = [table]
    for r in results:
        lines.append(f"\n{r.model} misses ({len(r.misses)}):")
        lines += [f"  {q} -> {a!r}" for q, a in r.misses] or ["  none"]
        lines.append(f"  turn 3 ({RECALL_TURNS[-1]}) -> {r.recall_answer!r}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="omnipipe bench quality", description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated thinker models")
    parser.add_argument("--weights", default="float32", help=f"comma-separated of: {', '.join(WEIGHT_FORMATS)}")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--json", help="also write the raw results here")
    parser.add_argument("--verbose", "-v", action="store_true", help="print each answer as it comes")
    args = parser.parse_args(argv)
    models = [str(canonical_thinker(m.strip())) for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in MODELS]
    if not models or unknown:
        parser.error(f"--models: choose from {', '.join(MODELS)}")
    formats = [w.strip() for w in args.weights.split(",") if w.strip()]
    if not formats or any(w not in WEIGHT_FORMATS for w in formats):
        parser.error(f"--weights: choose from {', '.join(WEIGHT_FORMATS)}")
    if args.max_tokens < 1:
        parser.error("--max-tokens must be >= 1")

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    results = []
    for model in models:
        for weights in formats:
            started = time.perf_counter()
            results.append(asyncio.run(evaluate(model, args.max_tokens, say if args.verbose else None, weights)))
            say(f"{model} {weights}: done in {time.perf_counter() - started:.0f} s")
    print(format_report(results))
    if args.json:
        write_json(args.json, {"machine": machine_info(), "results": [
            {**vars(r), "decode_tok_s": r.decode_tok_s} for r in results]})
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Thinker: a packaged LLM (Qwen2.5 0.5B Instruct or Gemma 3 270M, the stage option ``model``) with continuous
batching and a KV cache per request.

New requests are prefilled one by one (different lengths); running requests decode together in one batched
forward. Text streams out as it is detokenised; anything that could still turn into a stop string is held back
until it is clear, so a stop marker is never spoken.

A request's params are checked when it arrives (``validate``), so a bad one fails alone, never its batch. Should a
batched step still raise, the stage retries its requests one by one: ``snapshot`` marks each request's decoding
state and KV cache (no copy) before the step and ``restore`` rewinds them, so a retry continues exactly where the
request stood.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from omnipipe.models.default.modeling.decoder import CachedDecoder
from omnipipe.models.default.modeling.gemma import GemmaThinker
from omnipipe.models.default.modeling.qwen2 import Qwen2Thinker
from omnipipe.models.default.modeling.sampling import TokenSamplingParams, sample_next_token
from omnipipe.models.default.prompting import (
    ChatMLFormat,
    FewShotFormat,
    PromptFormat,
    should_stop,
    stream_safe_length,
)
from omnipipe.models.default.weights.thinker import prepare_thinker
from omnipipe.stage.request import StageRequest
from omnipipe.stage.runner import RunnerOutput, StageRunner

MAX_PROMPT_TOKENS = 2048
# no token of either thinker's vocabulary is longer than this (Qwen's longest: a run of 128 spaces): a question with
# more characters than the limit allows is refused before tokenising it (a megabyte of text costs seconds of one
# step, holding every request of the batch)
MAX_CHARS_PER_TOKEN = 128


@dataclass(frozen=True)
class ThinkerModel:
    """A selectable thinker: its decoder and its prompt format (the weights are ``weights.thinker``'s)."""

    decoder: type[CachedDecoder]
    prompt_format: Callable[[], PromptFormat]


# the deploy option stages.thinker.options.model; the pipeline's StageSpec names the default
THINKER_MODELS: dict[str, ThinkerModel] = {
    "qwen2.5-0.5b-instruct": ThinkerModel(Qwen2Thinker, ChatMLFormat),
    "gemma3-270m": ThinkerModel(GemmaThinker, FewShotFormat),
}


def thinker_model(name: Any) -> ThinkerModel:
    """The thinker called ``name``; a ValueError naming the choices otherwise."""
    if not isinstance(name, str) or name not in THINKER_MODELS:
        raise ValueError(f"stages.thinker.options.model: unknown thinker {name!r}; choose one of: "
                         f"{', '.join(THINKER_MODELS)}")
    return THINKER_MODELS[name]


@dataclass
class _Decoding:
    sampling: TokenSamplingParams
    max_tokens: int
    stops: list[str]
    generator: torch.Generator | None
    generated: list[int] = field(default_factory=list)
    emitted_chars: int = 0  # of the answer text already sent


class ThinkerRunner(StageRunner):
    def load(self) -> None:
        self.model_name = self.context.options["model"]
        chosen = thinker_model(self.model_name)
        model_dir = prepare_thinker(self.model_name, progress=True)
        self.model = chosen.decoder(model_dir, num_threads=self.context.threads)
        self.tokenizer = self.model.tokenizer
        self.prompt_format = chosen.prompt_format()
        self.max_prompt_tokens = int(self.context.options.get("max_prompt_tokens", MAX_PROMPT_TOKENS))
        # every prompt starts with the same preamble (few-shot examples, a system prompt): its KV cache once
        self.preamble_ids = self.tokenizer.encode(self.prompt_format.preamble())
        if self.context.options.get("prefix_cache", True):
            self.model.set_shared_prefix(self.preamble_ids)

    def encode_prompt(self, question: str, history: list[dict[str, str]] | None = None) -> list[int]:
        """Preamble and turns tokenised apart, so every prompt starts with exactly the cached preamble tokens."""
        return self.preamble_ids + self.prompt_format.encode_turns(self.tokenizer, question, history or [])

    # No warm-up: it cost 1.2 s of start-up (Qwen2.5 0.5B, fp32, 1 thread) and the first request's prefill and
    # decode were no faster after it than without; the preamble's prefill above already runs the model once.

    def validate(self, params: dict[str, Any]) -> str | None:
        sampling = _sampling(params)
        if isinstance(sampling, str):
            return sampling
        max_tokens = params.get("max_tokens", 64)
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            return f"max_tokens: must be an integer >= 1, got {max_tokens!r}"
        stop = params.get("stop", [])
        if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
            return f"stop: must be a list of non-empty strings, got {stop!r}"
        return None

    def _start(self, request: StageRequest) -> tuple[_Decoding, list[int]] | RunnerOutput:
        params = request.params
        problem = self.validate(params)
        if problem is not None:
            return RunnerOutput(request.request_id, error=problem)
        inputs = request.take_all_inputs()
        question = " ".join(str(item.get("text", "")) for item in inputs).strip()
        history: list[dict[str, str]] = next((item["history"] for item in inputs if item.get("history")), [])
        if not question:  # the caller's input: no text, and no speech heard in its audio
            return RunnerOutput(request.request_id, error="is empty (no text, and no speech heard in the audio)",
                                error_field="prompt")
        chars = len(question) + sum(len(turn["content"]) for turn in history)
        if chars > self.max_prompt_tokens * MAX_CHARS_PER_TOKEN:  # too long to be worth tokenising
            return RunnerOutput(request.request_id, error=f"is {chars} characters long, more than the "
                                f"{self.max_prompt_tokens} tokens the thinker takes", error_field="prompt")
        ids = self.encode_prompt(question, history)
        if len(ids) > self.max_prompt_tokens:
            return RunnerOutput(request.request_id, error=f"is {len(ids)} tokens long, more than the limit of "
                                f"{self.max_prompt_tokens}", error_field="prompt")
        request.num_prompt_tokens = len(ids)
        sampling = _sampling(params)
        assert not isinstance(sampling, str)
        generator = sampling.make_generator()
        stops = [*self.prompt_format.stop_strings(), *params.get("stop", [])]
        return _Decoding(sampling, int(params.get("max_tokens", 64)), stops, generator), ids

    def snapshot(self, request: StageRequest) -> Any:
        state: _Decoding | None = request.runner_state
        if state is None:  # not prefilled yet: restore frees whatever a failed prefill built
            return None
        rng = state.generator.get_state() if state.generator is not None else None
        return len(state.generated), state.emitted_chars, rng, self.model.checkpoint(request.request_id)

    def restore(self, request: StageRequest, snapshot: Any) -> None:
        if snapshot is None:
            self.free(request)
            return
        state: _Decoding = request.runner_state
        generated, state.emitted_chars, rng, kv = snapshot
        del state.generated[generated:]
        if rng is not None:
            state.generator.set_state(rng)  # type: ignore[union-attr]
        self.model.rewind(request.request_id, kv)

    @torch.inference_mode()
    def execute(self, batch: list[StageRequest], is_prefill: bool) -> list[RunnerOutput]:
        if is_prefill:
            outputs = []
            for request in batch:
                started = self._start(request)
                if isinstance(started, RunnerOutput):
                    outputs.append(started)
                    continue
                state, ids = started
                request.runner_state, request.prefilled = state, True
                outputs.append(self._advance(request, state, self.model.prefill(request.request_id, ids)))
            return outputs
        states: list[_Decoding] = [r.runner_state for r in batch]
        logits = self.model.decode([r.request_id for r in batch], [s.generated[-1] for s in states])
        return [self._advance(r, s, logits[i]) for i, (r, s) in enumerate(zip(batch, states))]

    def _advance(self, request: StageRequest, state: _Decoding, logits: torch.Tensor) -> RunnerOutput:
        token = sample_next_token(logits, state.sampling, state.generated, state.generator)
        eos = token in self.model.eos_token_ids
        if not eos:
            state.generated.append(token)
        answer = self.tokenizer.decode(state.generated, skip_special_tokens=True).lstrip()
        finish_reason = "stop" if eos else None
        stopped, kept = should_stop(answer, state.stops)
        if stopped:
            answer, finish_reason = kept.rstrip(), "stop"
        elif not eos and len(state.generated) >= state.max_tokens:
            finish_reason = "length"
        if finish_reason is None:
            ready = stream_safe_length(answer, state.stops)
            if answer.endswith("\ufffd"):  # an incomplete multi-byte character
                ready = min(ready, len(answer) - 1)
        else:
            ready = len(answer.rstrip())
        delta = answer[state.emitted_chars : max(ready, state.emitted_chars)]
        state.emitted_chars = max(ready, state.emitted_chars)
        return RunnerOutput(request.request_id, text_delta=delta, data={"text": delta} if delta else None,
                            num_units=0 if eos else 1, finished=finish_reason is not None,
                            finish_reason=finish_reason)

    def free(self, request: StageRequest) -> None:
        self.model.free(request.request_id)
        request.runner_state = None


def _sampling(params: dict[str, Any]) -> TokenSamplingParams | str:
    """The sampling settings of a request's params, or why they cannot be used."""
    try:
        return TokenSamplingParams(
            temperature=params.get("temperature", 0.0), top_p=params.get("top_p", 1.0), top_k=params.get("top_k", 0),
            repetition_penalty=params.get("repetition_penalty", 1.0),
            presence_penalty=params.get("presence_penalty", 0.0),
            frequency_penalty=params.get("frequency_penalty", 0.0), seed=params.get("seed"),
        )
    except ValueError as exc:
        return str(exc)

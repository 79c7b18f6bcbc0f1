"""Thinker: a packaged LLM (Qwen2.5 0.5B Instruct or Gemma 3 270M, the stage option ``model``) with continuous
batching and a KV cache per request.

New requests are prefilled one by one (different lengths); running requests decode together in one batched
forward. Text streams out as it is detokenised; anything that could still turn into a stop string is held back
until it is clear, so a stop marker is never spoken.

A request's params are checked when it arrives (``validate``), so a bad one fails alone, never its batch. Should a
batched step still raise, the stage retries its requests one by one: ``snapshot`` marks each request's decoding
state and KV cache (no copy) before the step and ``restore`` rewinds them, so a retry continues exactly where the
request stood.

Attached images (``attachments.py``) are decoded off the stage loop as soon as a request arrives (``admit``) and
read as one line of the prompt each.

Tensor parallel (``tensor_parallel_size`` > 1): every rank holds a shard of the decoder. Rank 0 runs this runner in
the stage loop and sends each model call (prefill of a request, a batched decode, free, rewind) through the step
channel before making it itself; the other ranks run :meth:`ThinkerRunner.follow`, which makes the same call on
their shard. Every rank builds a request's prompt itself from the question and the decoded attachments (which the
input broadcaster brings it), so the prompts agree token for token. Each rank scores its slice of the vocabulary;
rank 0 gathers the logits and samples.

Automatic prefix caching (``modeling/prefix_cache.py``): when a request ends (finished, aborted or freed), its KV
cache (the prompt and the answer tokens that went through the model) is kept under those tokens; a new request goes
on from the longest token prefix it shares with any kept cache (or with the shared preamble), so it prefills only
the rest: a conversation's next turn its new question, another conversation with the same system prompt and tools
what follows them. ``request.num_cached_tokens`` counts the prompt tokens it was spared (``cached_tokens`` in the
API's usage). The stage option ``prefix_cache_bytes`` (default ``DEFAULT_PREFIX_CACHE_BYTES``; 0 turns it off;
``session_cache_bytes`` is its older name) bounds the kept caches, the least recently used dropped first;
``end_session`` drops what a session's requests kept; ``memory_stats`` (/debug/state) reports the entries, the
sessions they belong to and their bytes. ``prefix_cache: false`` turns every kind off, the preamble's too. Every
rank of a tensor-parallel stage keeps its shard of the same entries: rank 0 sends each keep, and the prefill's
cached count, which the other ranks' lookups must find too (else the ranks went apart: the stage restarts).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from omnipipe.models.default.attachments import describe, materialize
from omnipipe.models.default.modeling.decoder import CachedDecoder, KVPrefix
from omnipipe.models.default.modeling.gemma import GemmaThinker
from omnipipe.models.default.modeling.prefix_cache import PrefixCache
from omnipipe.models.default.modeling.quantized import check_weight_format
from omnipipe.models.default.modeling.qwen2 import Qwen2Thinker
from omnipipe.models.default.prompting import (
    ChatMLFormat,
    FewShotFormat,
    PromptFormat,
)
from omnipipe.models.default.weights.thinker import canonical_thinker, prepare_thinker
from omnipipe.stage.answer_shape import AnswerShape
from omnipipe.stage.broadcast import Broadcaster
from omnipipe.stage.request import StageRequest
from omnipipe.stage.runner import RunnerOutput, StageRunner
from omnipipe.stage.sampling import TokenSamplingParams, sample_next_token
from omnipipe.stage.structured_output import GrammarCompiler, GrammarError, ToolCallFormat, tool_call_format_for
from omnipipe.stage.text_stream import TextStream

logger = logging.getLogger(__name__)

MAX_PROMPT_TOKENS = 2048
# the deploy option stages.thinker.options.weights when a pipeline names none: "float32" (the checkpoint as converted),
# "int8" or "int8-split" (per-row int8 projections, ``quantized.py``; int8-split is the default pipeline's choice)
DEFAULT_WEIGHTS = "float32"
# no token of either thinker's vocabulary is longer than this (Qwen's longest: a run of 128 spaces): a question with
# more characters than the limit allows is refused before tokenising it (a megabyte of text costs seconds of one
# step, holding every request of the batch)
MAX_CHARS_PER_TOKEN = 128
# the stage option prefix_cache_bytes when the deploy names none: what the KV caches kept for later requests may hold
# (Qwen2.5 0.5B keeps 24 KiB a token in float32: some 10,000 tokens, a few long conversations)
DEFAULT_PREFIX_CACHE_BYTES = 256 << 20
# a model call that fails on a rank other than by its argument checks (which every rank makes alike, before any
# collective) may leave the ranks out of step: the process exits, and the engine restarts the whole stage
_OUT_OF_STEP_EXIT = 70


@dataclass(frozen=True)
class ThinkerModel:
    """A selectable thinker: its decoder and its prompt format (the weights are ``weights.thinker``'s)."""

    decoder: type[CachedDecoder]
    prompt_format: Callable[[], PromptFormat]


# the deploy option stages.thinker.options.model; the pipeline's StageSpec names the default
THINKER_MODELS: dict[str, ThinkerModel] = {
    "qwen2.5-coder-0.5b-instruct": ThinkerModel(Qwen2Thinker, ChatMLFormat),
    "gemma3-270m": ThinkerModel(GemmaThinker, FewShotFormat),
}


def thinker_model(name: Any) -> ThinkerModel:
    """The thinker called ``name`` (or a former id of it, ``THINKER_ALIASES``); a ValueError naming the choices
    otherwise."""
    name = canonical_thinker(name)
    if not isinstance(name, str) or name not in THINKER_MODELS:
        raise ValueError(f"stages.thinker.options.model: unknown thinker {name!r}; choose one of: "
                         f"{', '.join(THINKER_MODELS)}")
    return THINKER_MODELS[name]


@dataclass
class _Decoding:
    sampling: TokenSamplingParams
    max_tokens: int
    stream: TextStream  # the answer's tokens (an end token not among them) and text
    generator: torch.Generator | None
    question: str = ""  # what the other ranks of a tensor-parallel stage build the same prompt from
    history: list[dict[str, Any]] = field(default_factory=list)
    prompt_ids: list[int] = field(default_factory=list)  # what its prefill ran (the answer's tokens follow)
    tools: list[dict[str, Any]] = field(default_factory=list)  # the functions the prompt offers
    shape: AnswerShape | None = None  # its grammar, tool-call split and logprobs, when it asks for any


_PENDING_ATTACHMENTS: Any = object()  # runner_state of a request whose attached images are on their way


class ThinkerRunner(StageRunner):
    supports_tensor_parallel = True

    def load(self) -> None:
        self.model_name = str(canonical_thinker(self.context.options["model"]))
        chosen = thinker_model(self.model_name)
        self.prefixes = _prefix_cache(self.context.options)
        model_dir = prepare_thinker(self.model_name, progress=self.context.rank == 0)
        group = self.context.tensor_parallel
        shard = {} if group is None else {"rank": group.rank, "world_size": group.world_size, "group": group.model}
        weights = check_weight_format(self.context.options.get("weights", DEFAULT_WEIGHTS))
        self.model = chosen.decoder(model_dir, num_threads=self.context.threads, weights=weights,
                                    device=self.context.device, **shard)
        self.tokenizer = self.model.tokenizer
        self.prompt_format = chosen.prompt_format()
        self.max_prompt_tokens = int(self.context.options.get("max_prompt_tokens", MAX_PROMPT_TOKENS))
        # every prompt starts with the same preamble (few-shot examples, a system prompt): its KV cache once (every
        # rank computes it here, in the same order, before any request)
        self.preamble_ids = self.tokenizer.encode(self.prompt_format.preamble())
        if self.context.options.get("prefix_cache", True):
            self.model.set_shared_prefix(self.preamble_ids)
        self.attachments = Broadcaster(self.context.input_broadcast, self.context.rank, self.context.world_size,
                                       group.inputs if group is not None else None, materialize,
                                       raw_threshold_bytes=self.context.input_broadcast_threshold_bytes)
        self._marks: dict[str, Any] = {}  # follower: each request's KV mark before the latest batched decode
        # each request's decoded images once taken from the broadcaster, until it is freed (a prefill that fails in
        # a batch is retried alone, and must read them again)
        self._images: dict[str, list[Any]] = {}
        fmt: ToolCallFormat | None = getattr(self.prompt_format, "tool_calls", None)
        self.tool_calls = tool_call_format_for(fmt, self.tokenizer) if fmt is not None else None
        self.grammars = GrammarCompiler(self.tokenizer)

    def close(self) -> None:
        attachments = getattr(self, "attachments", None)
        if attachments is not None:
            attachments.close()
        if self.context.steps is not None and self.context.rank == 0:
            self.context.steps.send({"op": "stop"})

    def encode_prompt(self, question: str, history: list[dict[str, Any]] | None = None,
                      images: list[Any] | None = None, tools: list[dict[str, Any]] | None = None) -> list[int]:
        """Preamble and turns tokenised apart, so every prompt starts with exactly the cached preamble tokens;
        attached images (decoded) are read as a line each after the question. With tools, the format writes its
        own system turn listing them (no shared preamble)."""
        if images:
            question = f"{question}\n{describe(images)}"
        if tools:
            return self.prompt_format.encode_turns(self.tokenizer, question, history or [], tools)  # type: ignore[call-arg]
        return self.preamble_ids + self.prompt_format.encode_turns(self.tokenizer, question, history or [])

    def admit(self, request: StageRequest) -> None:
        """Start decoding (and, tensor parallel, moving to every rank) a request's attached images now, while other
        requests run; its prefill waits for them only if they are not there yet."""
        images = [image for item in request.inputs for image in item.get("images") or []]
        if images:
            self.attachments.submit(request.request_id, {"images": images})
            request.runner_state = _PENDING_ATTACHMENTS

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
            return RunnerOutput.failed(request.request_id, problem)
        inputs = request.take_all_inputs()
        question = " ".join(str(item.get("text", "")) for item in inputs).strip()
        history: list[dict[str, Any]] = next((item["history"] for item in inputs if item.get("history")), [])
        tools: list[dict[str, Any]] = next((item["tools"] for item in inputs if item.get("tools")), [])
        if tools and self.tool_calls is None:
            return RunnerOutput.failed(request.request_id, f"the thinker {self.model_name!r} has no tool-call "
                                       "format (it is not an instruction-tuned chat model): send the request "
                                       "without tools", error_field="prompt.tools")
        answers_a_call = bool(history) and history[-1]["role"] == "tool"
        if not question and not answers_a_call:  # the caller's input: no text, and no speech heard in its audio
            return RunnerOutput.failed(request.request_id, "is empty (no text, and no speech heard in the audio)",
                                       error_field="prompt")
        chars = len(question) + sum(len(turn["content"]) for turn in history)
        if chars > self.max_prompt_tokens * MAX_CHARS_PER_TOKEN:  # too long to be worth tokenising
            return RunnerOutput.failed(request.request_id, f"is {chars} characters long, more than the "
                                       f"{self.max_prompt_tokens} tokens the thinker takes", error_field="prompt")
        images = self._images.get(request.request_id)  # taken already (a prefill retried alone)
        if request.runner_state is _PENDING_ATTACHMENTS:
            request.runner_state = None
            waited = time.perf_counter()
            try:
                images = self._images[request.request_id] = self.attachments.take(request.request_id)["images"]
            except Exception as exc:  # noqa: BLE001 - an undecodable image fails its request alone
                return RunnerOutput.failed(request.request_id, f"the attached image could not be read: {exc}",
                                           error_field="prompt.multi_modal_data.image")
            # what the images cost on rank 0: decoding, moving to the other ranks, and how long prefill waited
            stats = self.attachments.stats(request.request_id) or {}
            request.runner_metrics.update({"attachments_materialize_s": stats.get("materialize_s", 0.0),
                                           "attachments_broadcast_s": stats.get("broadcast_s", 0.0),
                                           "attachments_wait_s": time.perf_counter() - waited})
        try:
            shape = AnswerShape.start(params, tools, self.grammars, self.tool_calls, history)
        except GrammarError as exc:
            return RunnerOutput.failed(request.request_id, exc.reason, error_field=exc.engine_field)
        ids = self.encode_prompt(question, history, images, tools)
        if len(ids) > self.max_prompt_tokens:
            return RunnerOutput.failed(request.request_id, f"is {len(ids)} tokens long, more than the limit of "
                                       f"{self.max_prompt_tokens}", error_field="prompt")
        request.num_prompt_tokens = len(ids)
        sampling = _sampling(params)
        assert not isinstance(sampling, str)
        generator = sampling.make_generator()
        stops = [*self.prompt_format.stop_strings(), *params.get("stop", [])]
        return _Decoding(sampling, int(params.get("max_tokens", 64)), TextStream(self._decode_ids, stops, strip=True),
                         generator, question=question, history=history, prompt_ids=ids, tools=tools,
                         shape=shape), ids

    def snapshot(self, request: StageRequest) -> Any:
        state: _Decoding | None = request.runner_state
        if state is None or state is _PENDING_ATTACHMENTS:  # not prefilled: restore undoes what a failed prefill built
            return None
        rng = state.generator.get_state() if state.generator is not None else None
        shape = state.shape.snapshot() if state.shape is not None else None
        return state.stream.copy(), rng, self.model.checkpoint(request.request_id), shape

    def restore(self, request: StageRequest, snapshot: Any) -> None:
        if snapshot is None:  # a prefill: drop its KV cache, keep its images for the retry
            if request.runner_state is not _PENDING_ATTACHMENTS:
                if self.model.free(request.request_id):
                    self._drive({"op": "free", "id": request.request_id, "keep_inputs": True})
                request.runner_state = None
            return
        state: _Decoding = request.runner_state
        stream, rng, kv, shape = snapshot
        state.stream = stream.copy()
        if state.shape is not None:
            state.shape.restore(shape)
        if rng is not None:
            state.generator.set_state(rng)  # type: ignore[union-attr]
        self._drive({"op": "rewind", "id": request.request_id})
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
                logits = self._prefill(request, ids)
                outputs.append(self._advance(request, state, logits))
            return outputs
        states: list[_Decoding] = [r.runner_state for r in batch]
        keys, tokens = [r.request_id for r in batch], [s.stream.ids[-1] for s in states]
        self._drive({"op": "decode", "ids": keys, "tokens": tokens})
        logits = self._model_call(self.model.decode, keys, tokens)
        return [self._advance(r, s, logits[i]) for i, (r, s) in enumerate(zip(batch, states, strict=True))]

    def _prefill(self, request: StageRequest, ids: list[int]) -> torch.Tensor:
        """Prefill a request's prompt (on every rank), going on from the kept cache that shares the most leading
        tokens with it (or the shared preamble's)."""
        state: _Decoding = request.runner_state
        kept = self._lookup(ids)
        request.num_cached_tokens = kept[1] if kept is not None else self.model.shared_prefix_tokens(ids)
        self._drive({"op": "prefill", "id": request.request_id, "question": state.question, "history": state.history,
                     "tools": state.tools, "attached": request.request_id in self._images, "tokens": len(ids),
                     "cached": request.num_cached_tokens})
        return self._model_call(self.model.prefill, request.request_id, ids, continue_from=kept)

    def _lookup(self, ids: list[int]) -> KVPrefix | None:
        """The kept cache a prompt goes on from; None when the preamble's serves as much (no copy made then)."""
        if self.prefixes is None or not self.model.within_window(len(ids)):
            return None
        kept = self.prefixes.lookup(ids)
        return None if kept is None or kept[1] <= self.model.shared_prefix_tokens(ids) else kept

    def _release_cache(self, request: StageRequest) -> bool:
        """Free a request's KV cache on every rank, or keep it for later requests; False if it held none."""
        if self._keep(request):
            return True
        if self.model.free(request.request_id):
            self._drive({"op": "free", "id": request.request_id})
            return True
        return False

    def _keep(self, request: StageRequest) -> bool:
        """A request ends: keep its KV cache under the tokens it ran (True), if it holds one."""
        state = request.runner_state
        if self.prefixes is None or not isinstance(state, _Decoding):
            return False
        held = self.model.detach(request.request_id)
        if held is None:
            return False
        caches, num_tokens = held
        ran = state.prompt_ids + state.stream.ids[: num_tokens - len(state.prompt_ids)]
        keep = len(ran) == num_tokens and self.model.within_window(num_tokens)
        if keep:
            self.prefixes.keep(ran, caches, request.session_id)
        # the other ranks keep (or drop) theirs alike, so every rank's prefix cache holds the same entries
        self._drive({"op": "keep", "id": request.request_id, "tokens": ran if keep else None,
                     "session": request.session_id})
        return True

    def end_session(self, session_id: str) -> None:
        if self.prefixes is not None:
            self.prefixes.end(session_id)
            self._drive({"op": "end_session", "session": session_id})

    def memory_stats(self) -> dict[str, int] | None:
        return self.prefixes.stats() if self.prefixes is not None else None

    # ------------------------------------------------------------------ tensor parallel
    def _drive(self, message: dict[str, Any]) -> None:
        """Rank 0 of a tensor-parallel stage: have the other ranks make this model call on their shards too."""
        if self.context.steps is not None:
            self.context.steps.send(message)

    def _model_call(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self.context.steps is None:
            return call(*args, **kwargs)
        try:
            return call(*args, **kwargs)
        except (ValueError, KeyError):  # argument checks, made alike on every rank before any collective
            raise
        except Exception:
            logger.exception("a model call failed half-way; the ranks may be out of step: exiting")
            os._exit(_OUT_OF_STEP_EXIT)

    def follow(self) -> None:
        """Ranks 1..N-1: make each model call rank 0 sends, on this rank's shard, until it says stop."""
        assert self.context.steps is not None
        while True:
            message = self.context.steps.recv()
            op = message["op"]
            if op == "stop":
                return
            try:
                self._follow(op, message)
            except (ValueError, KeyError) as exc:  # rank 0 met the same check and failed that request alone
                logger.debug("%s refused alike on every rank: %s", op, exc)
            except Exception:
                logger.exception("%s failed on this rank; the ranks may be out of step: exiting", op)
                os._exit(_OUT_OF_STEP_EXIT)

    def _follow(self, op: str, message: dict[str, Any]) -> None:
        if op == "prefill":
            self._follow_prefill(message)
        elif op == "decode":
            if len(message["ids"]) > 1:  # what rank 0's stage snapshots before a batched step, to rewind to
                self._marks = {rid: self.model.checkpoint(rid) for rid in message["ids"]}
            self.model.decode(message["ids"], message["tokens"])
        elif op == "discard":
            if self._images.pop(message["id"], None) is None:
                self.attachments.take(message["id"])  # rank 0 took it, so it is here or on its way
        elif op == "rewind":
            self.model.rewind(message["id"], self._marks[message["id"]])
        elif op in ("free", "keep"):
            self._follow_release(op, message)
        elif op == "end_session":
            if self.prefixes is not None:
                self.prefixes.end(message["session"])
        else:
            raise RuntimeError(f"unknown step {op!r}")

    def _follow_prefill(self, message: dict[str, Any]) -> None:
        """Build the request's prompt as rank 0 did and prefill it from the same kept prefix rank 0 found."""
        images = self._images.get(message["id"])
        if message["attached"] and images is None:
            images = self._images[message["id"]] = self.attachments.take(message["id"])["images"]
        ids = self.encode_prompt(message["question"], message["history"], images, message.get("tools"))
        if len(ids) != message["tokens"]:
            raise RuntimeError(f"request {message['id']}: this rank's prompt has {len(ids)} tokens, rank 0's "
                               f"{message['tokens']}")
        kept = self._lookup(ids)
        cached = kept[1] if kept is not None else self.model.shared_prefix_tokens(ids)
        if cached != message["cached"]:  # the ranks' prefix caches went apart: restart the stage
            raise RuntimeError(f"request {message['id']}: this rank's prefix cache holds {cached} of its tokens, "
                               f"rank 0's {message['cached']}")
        self.model.prefill(message["id"], ids, continue_from=kept)  # its slice of the logits goes to rank 0

    def _follow_release(self, op: str, message: dict[str, Any]) -> None:
        """A request ended: free its cache, or keep it under the tokens rank 0 kept it under."""
        held = self.model.detach(message["id"])
        self._marks.pop(message["id"], None)
        if op == "free" and message.get("keep_inputs"):
            return  # a prefill to retry alone: its images stay
        self._images.pop(message["id"], None)
        if op == "keep" and held is not None and message["tokens"] is not None and self.prefixes is not None:
            self.prefixes.keep(message["tokens"], held[0], message["session"])

    def _decode_ids(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    def _advance(self, request: StageRequest, state: _Decoding, logits: torch.Tensor) -> RunnerOutput:
        stream, shape = state.stream, state.shape
        constraint = shape.constraint if shape is not None else None
        token = sample_next_token(logits, state.sampling, stream.ids, state.generator, constraint=constraint)
        eos = token in self.model.eos_token_ids
        if shape is not None:
            shape.accept(token, logits, is_text=not eos)
        finish_reason = None
        if eos:
            delta, _ = stream.finish()
            finish_reason = "stop"
        else:
            delta, _ = stream.push(token)
            if stream.stopped:
                finish_reason = "stop"
            elif len(stream.ids) >= state.max_tokens:
                more, _ = stream.finish()
                delta += more
                finish_reason = "stop" if stream.stopped else "length"
        details = None
        if finish_reason is not None and shape is not None and self.context.steps is None \
                and not shape.redone and shape.repeats_a_call():
            return self._answer_instead(request, state)
        if shape is not None:  # the content is what is shown and spoken; tool calls and logprobs ride beside it
            delta, details = shape.shape(delta, final=finish_reason is not None)
            if finish_reason == "stop" and shape.made_calls:
                finish_reason = "tool_calls"
        return RunnerOutput.decoded(request.request_id, finish_reason, text_delta=delta,
                                    data={"text": delta} if delta else None, details=details, num_units=0 if eos else 1)

    def _answer_instead(self, request: StageRequest, state: _Decoding) -> RunnerOutput:
        """The turn only repeated calls already answered: the turn again, from the conversation without the tools
        on offer (their calls and results stay in it), so the model answers from the results."""
        assert state.shape is not None
        self.model.free(request.request_id)
        state.prompt_ids = self.encode_prompt(state.question, state.history, self._images.get(request.request_id))
        state.stream = TextStream(self._decode_ids, state.stream.stops, strip=True)
        state.shape.answer_instead(self.grammars, request.params.get("response_format"), self.tool_calls)
        return self._advance(request, state, self._prefill(request, state.prompt_ids))

    def free(self, request: StageRequest) -> None:
        taken = self._images.pop(request.request_id, None) is not None
        if request.runner_state is _PENDING_ATTACHMENTS:  # still on their way: the broadcaster drops them
            self.attachments.cancel(request.request_id)
        elif not self._release_cache(request) and taken:
            # taken here but never prefilled (its prompt was refused): the other ranks drop their copy
            self._drive({"op": "discard", "id": request.request_id})
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


def _prefix_cache(options: dict[str, Any]) -> PrefixCache | None:
    """The stage's prefix cache of the option ``prefix_cache_bytes`` (or its older name ``session_cache_bytes``);
    None when that is 0 or ``prefix_cache`` is false. Every rank of a tensor-parallel stage holds one, kept alike
    (rank 0 drives each lookup and keep; a rank whose lookup finds another count stops the stage)."""
    if "prefix_cache_bytes" in options and "session_cache_bytes" in options:
        raise ValueError("stages.thinker.options: give prefix_cache_bytes or its older name session_cache_bytes, "
                         "not both")
    name = "session_cache_bytes" if "session_cache_bytes" in options else "prefix_cache_bytes"
    budget = options.get(name, DEFAULT_PREFIX_CACHE_BYTES)
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
        raise ValueError(f"stages.thinker.options.{name}: must be an integer >= 0 (0: keep no request's KV cache), "
                         f"got {budget!r}")
    enabled = options.get("prefix_cache", True)
    if not isinstance(enabled, bool):
        raise ValueError(f"stages.thinker.options.prefix_cache: must be true or false, got {enabled!r}")
    return PrefixCache(budget) if budget and enabled else None

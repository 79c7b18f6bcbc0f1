"""Thinker: a packaged LLM (Qwen2.5 0.5B Instruct or Gemma 3 270M, the stage option ``model``) on the shared
batched-decoding runtime (``stage/batched_decoder.py``) and its paged KV cache (``stage/kv_cache.py``).

Each step feeds the prompts of the requests not yet prefilled (a whole prompt in a step, within
``max_prompt_tokens``) and decodes every prefilled request together in one batched forward. A request reserves its
KV blocks when its prefill starts (its prompt and ``max_tokens``, within the model's context); while the pool is
full it waits, and one that could never fit fails naming ``max_tokens``. Text streams out as it is detokenised;
anything that could still turn into a stop string is held back until it is clear, so a stop marker is never spoken.

A request's params are checked when it arrives (``validate``), so a bad one fails alone, never its batch. Should a
batched step still raise, the stage retries its requests one by one: ``snapshot`` marks each request's decoding
state and KV length before the step and ``restore`` rewinds them, so a retry continues exactly where the request
stood.

Attached images (``attachments.py``) are decoded off the stage loop as soon as a request arrives (``admit``) and
read as one line of the prompt each.

Tensor parallel (``tensor_parallel_size`` > 1): every rank holds a shard of the decoder and a KV pool of its own KV
heads, in as many blocks as rank 0's. Rank 0 runs this runner in the stage loop and sends each model call (a
reservation, a prefill, a batched decode, a rewind, a release) through the step channel before making it itself;
the other ranks run :meth:`ThinkerRunner.follow`, which makes the same call on their shard, so every rank's block
tables agree. Every rank builds a request's prompt itself from the question and the decoded attachments (which the
input broadcaster brings it), so the prompts agree token for token; a rank whose reservation shares another number
of tokens than rank 0's stops (the stage restarts). Each rank scores its slice of the vocabulary; rank 0 gathers
the logits and samples.

Automatic prefix caching (the cache's, by chained block hashes): a prompt's leading full blocks that an earlier
request computed are shared, not prefilled again; a request that ends (finished, aborted or freed) leaves the full
blocks of what it ran, its prompt and its reply, for later requests. So a conversation's next turn prefills little
more than its new question, and another conversation with the same system prompt and tools what follows them.
The preamble every prompt without tools starts with is computed at load and held for good.
``request.num_cached_tokens`` counts the prompt tokens it was spared (``cached_tokens`` in the API's usage; whole
blocks of ``KV_BLOCK_TOKENS``). Stage options (``_kv_options``): ``prefix_cache_bytes`` (default
``DEFAULT_PREFIX_CACHE_BYTES``; ``session_cache_bytes`` is its older name) bounds the blocks kept for later requests
that no request holds, the least recently used forgotten first (0: none kept but the preamble's); ``prefix_cache:
false`` shares nothing, the preamble neither; ``kv_cache_bytes`` sizes the whole pool (by default room for
``max_num_seqs`` requests of ``max_prompt_tokens`` and ``REPLY_TOKENS_PER_ROW`` each, the preamble and
``prefix_cache_bytes``). ``memory_stats`` (/debug/state) reports the pool's blocks and ``prefix_cache_bytes``, what
the kept blocks hold. Ending a session drops nothing: what its requests left is kept like any other request's,
within ``prefix_cache_bytes``.
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
from omnipipe.models.default.modeling.decoder import CachedDecoder
from omnipipe.models.default.modeling.gemma import GemmaThinker
from omnipipe.models.default.modeling.quantized import check_weight_format
from omnipipe.models.default.modeling.qwen2 import Qwen2Thinker
from omnipipe.models.default.prompting import (
    ChatMLFormat,
    FewShotFormat,
    PromptFormat,
)
from omnipipe.models.default.weights.thinker import canonical_thinker, prepare_thinker
from omnipipe.stage.answer_shape import AnswerShape
from omnipipe.stage.batched_decoder import BatchedDecoderRunner, DecodeState
from omnipipe.stage.broadcast import Broadcaster
from omnipipe.stage.request import RequestStatus, StageRequest
from omnipipe.stage.runner import RunnerOutput
from omnipipe.stage.sampling import SamplingRow, TokenSamplingParams
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
# the stage option prefix_cache_bytes when the deploy names none: what the KV blocks kept for later requests may
# hold (Qwen2.5 0.5B keeps 24 KiB a token in float32: some 10,000 tokens, a few long conversations)
DEFAULT_PREFIX_CACHE_BYTES = 256 << 20
# tokens of a KV block: the granularity of prefix sharing (and of ``cached_tokens``)
KV_BLOCK_TOKENS = 16
# the reply room a request of the default pool's ``max_num_seqs`` has beside its prompt (a request may reserve
# more while the pool has it)
REPLY_TOKENS_PER_ROW = 1024
# the request that holds the preamble's blocks from load on
_PREAMBLE_ID = "\0preamble"
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
class _Decoding(DecodeState):
    """A request's decoding: ``generated`` holds every sampled token (an end token included), ``stream`` the
    answer's tokens (an end token not among them) and text; the penalties read the answer only."""

    stream: TextStream = field(kw_only=True)
    question: str = ""  # what the other ranks of a tensor-parallel stage build the same prompt from
    history: list[dict[str, Any]] = field(default_factory=list)
    prompt: list[int] = field(default_factory=list)  # the prompt's tokens (the reply's follow them in the cache)
    tools: list[dict[str, Any]] = field(default_factory=list)  # the functions the prompt offers
    reserved: bool = False  # its KV blocks are reserved

    def sampling_row(self) -> SamplingRow:
        constraint = self.shape.constraint if self.shape is not None else None
        return SamplingRow(self.sampling, self.generator, self.stream.ids, (), constraint)


_PENDING_ATTACHMENTS: Any = object()  # runner_state of a request whose attached images are on their way


class ThinkerRunner(BatchedDecoderRunner):
    supports_tensor_parallel = True

    def load(self) -> None:
        self.model_name = str(canonical_thinker(self.context.options["model"]))
        chosen = thinker_model(self.model_name)
        kv_options = _kv_options(self.context.options)
        model_dir = prepare_thinker(self.model_name, progress=self.context.rank == 0)
        group = self.context.tensor_parallel
        shard = {} if group is None else {"rank": group.rank, "world_size": group.world_size, "group": group.model}
        weights = check_weight_format(self.context.options.get("weights", DEFAULT_WEIGHTS))
        self.model = chosen.decoder(model_dir, num_threads=self.context.threads, weights=weights,
                                    device=self.context.device, kv_cache_tokens=KV_BLOCK_TOKENS, **shard)
        self.tokenizer = self.model.tokenizer
        self.prompt_format = chosen.prompt_format()
        self.max_prompt_tokens = int(self.context.options.get("max_prompt_tokens", MAX_PROMPT_TOKENS))
        self.preamble_ids = self.tokenizer.encode(self.prompt_format.preamble())
        self.model.use_kv_cache(self._pool_tokens(kv_options), block_tokens=KV_BLOCK_TOKENS,
                                prefix_caching=kv_options.prefix_caching,
                                max_cached_blocks=kv_options.prefix_cache_bytes // self._block_bytes())
        self.kv = self.model.kv
        # every prompt but one offering tools starts with the same preamble (few-shot examples, a system prompt):
        # its blocks are computed once here and held for good (every rank, in the same order, before any request)
        if kv_options.prefix_caching and self.preamble_ids:
            self.model.prefill(_PREAMBLE_ID, self.preamble_ids, logits=False)
            self.kv.index_written(_PREAMBLE_ID)
        self.attachments = Broadcaster(self.context.input_broadcast, self.context.rank, self.context.world_size,
                                       group.inputs if group is not None else None, materialize,
                                       raw_threshold_bytes=self.context.input_broadcast_threshold_bytes)
        # each request's decoded images once taken from the broadcaster, until it is freed (a prefill that fails in
        # a batch is retried alone, and must read them again)
        self._images: dict[str, list[Any]] = {}
        self._prompts: dict[str, list[int]] = {}  # follower: each request's prompt, as this rank built it
        fmt: ToolCallFormat | None = getattr(self.prompt_format, "tool_calls", None)
        self.tool_calls = tool_call_format_for(fmt, self.tokenizer) if fmt is not None else None
        self.grammars = GrammarCompiler(self.tokenizer)

    def _block_bytes(self) -> int:
        return self.model.token_bytes() * KV_BLOCK_TOKENS

    def _pool_tokens(self, options: _KVOptions) -> int:
        """The KV pool's size in tokens: ``kv_cache_bytes`` when given, else room for ``max_num_seqs`` requests of
        the longest prompt and ``REPLY_TOKENS_PER_ROW`` each, the held preamble and ``prefix_cache_bytes`` of blocks
        kept for later requests (the same figure on every rank: it counts the whole model's heads)."""
        if options.kv_cache_bytes is not None:
            return max(KV_BLOCK_TOKENS, options.kv_cache_bytes // self.model.token_bytes())
        row = self.max_prompt_tokens + REPLY_TOKENS_PER_ROW + KV_BLOCK_TOKENS
        kept = options.prefix_cache_bytes // self._block_bytes() * KV_BLOCK_TOKENS
        return self.context.max_num_seqs * row + len(self.preamble_ids) + KV_BLOCK_TOKENS + kept

    def prefill_budget(self) -> int:
        """A whole prompt in one step (at most ``max_prompt_tokens``)."""
        return self.max_prompt_tokens

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

    def _start(self, request: StageRequest) -> _Decoding | RunnerOutput:
        """A new request's decoding state (its prompt built from its inputs, which it takes), or the output that
        fails it."""
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
        return _Decoding(sampling, generator, int(params.get("max_tokens", 64)), shape=shape,
                         stream=TextStream(self._decode_ids, stops, strip=True), question=question, history=history,
                         prompt=ids, tools=tools)

    # ------------------------------------------------------------------------------------- the shared step's hooks
    def prefill_piece(self, request: StageRequest, budget: int,
                      wait: bool) -> tuple[RunnerOutput | torch.Tensor, int]:
        """Start the request (its prompt, then its KV reserved: it waits while the pool is full) and feed its prompt
        past what its cache shares, at most ``budget`` tokens in this step, on every rank."""
        state = request.runner_state
        if not isinstance(state, _Decoding):
            started = self._start(request)
            if isinstance(started, RunnerOutput):
                return started, 0
            state = request.runner_state = started
        if not state.reserved:
            waiting = self._reserve(request, state)
            if waiting is not None:
                return waiting, 0
        if budget < 1:
            return RunnerOutput(request.request_id, status=RequestStatus.PREFILLING), 0
        start = self.kv.length(request.request_id)
        end = min(len(state.prompt), start + budget)
        last = end == len(state.prompt)
        self._drive({"op": "prefill", "id": request.request_id, "upto": end, "logits": last})
        logits = self._model_call(self.model.prefill, request.request_id, state.prompt[:end], logits=last)
        if not last:
            return RunnerOutput(request.request_id, status=RequestStatus.PREFILLING), end - start
        request.prefilled = True
        return logits, end - start

    def _reserve(self, request: StageRequest, state: _Decoding) -> RunnerOutput | None:
        """Reserve the request's prompt and ``max_tokens`` (within the model's context) on every rank, sharing the
        leading blocks an earlier request computed; the output that makes it wait or fails it, if it must."""
        tokens = min(len(state.prompt) + state.max_tokens, self.model.max_positions)
        waiting = self.reserve(request, tokens, state.prompt)
        if waiting is not None:
            return waiting
        state.reserved = True
        self._drive({"op": "reserve", "id": request.request_id, "question": state.question,
                     "history": state.history, "tools": state.tools, "attached": request.request_id in self._images,
                     "prompt_tokens": len(state.prompt), "tokens": tokens, "cached": request.num_cached_tokens})
        return None

    def decode(self, rows: list[StageRequest], inputs: list[Any]) -> tuple[torch.Tensor, list[Any]]:
        """One batched forward of every row's last token, on every rank."""
        keys = [request.request_id for request in rows]
        tokens = [request.runner_state.generated[-1] for request in rows]
        self._drive({"op": "decode", "ids": keys, "tokens": tokens})
        return self._model_call(self.model.decode, keys, tokens), [None] * len(rows)

    def emit(self, request: StageRequest, token: int, logits: torch.Tensor, extra: Any) -> RunnerOutput:
        """The text ``token`` lets out (held back while it may still begin a stop string), its answer's shape
        (grammar, tool calls, logprobs) and whether the request ends: an end token, a stop string, ``max_tokens``."""
        state: _Decoding = request.runner_state
        state.generated.append(token)
        stream, shape = state.stream, state.shape
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
        on offer (their calls and results stay in it), so the model answers from the results. Its KV is released
        and the new prompt prefilled in the next prefill step."""
        assert state.shape is not None
        self.model.free(request.request_id, state.prompt + state.generated)
        self._decoding.discard(request.request_id)
        state.prompt = self.encode_prompt(state.question, state.history, self._images.get(request.request_id))
        state.generated, state.reserved = [], False
        state.stream = TextStream(self._decode_ids, state.stream.stops, strip=True)
        state.shape.answer_instead(self.grammars, request.params.get("response_format"), self.tool_calls)
        request.prefilled = False
        return RunnerOutput(request.request_id, status=RequestStatus.PREFILLING)

    # ------------------------------------------------------------------------------- retry, release, statistics
    def snapshot(self, request: StageRequest) -> Any:
        if not isinstance(request.runner_state, _Decoding):  # not started: restore undoes what its prefill built
            return None
        return super().snapshot(request)

    def restore(self, request: StageRequest, snapshot: Any) -> None:
        """Rewind the request's KV length and decoding state (every rank's KV); a request whose failed step
        reserved its KV releases it unwritten. Its decoded images stay for the retry."""
        rid = request.request_id
        length = None if snapshot is None else snapshot["kv_length"]
        if length is None:
            if self.model.free(rid, written=False):
                self._drive({"op": "free", "id": rid, "keep_inputs": True, "written": False})
            self._decoding.discard(rid)
            if snapshot is None:
                if request.runner_state is not _PENDING_ATTACHMENTS:
                    request.runner_state = None
                return
        else:
            self._drive({"op": "rewind", "id": rid, "length": length})
            self.kv.set_length(rid, length)
        request.runner_state.restore(dict(snapshot["state"]))
        request.prefilled = snapshot["prefilled"]
        if not request.prefilled:
            self._decoding.discard(rid)

    def free(self, request: StageRequest) -> None:
        """Release the request's KV on every rank (its prompt's and reply's full blocks kept for later requests
        that begin with them) and drop its images."""
        rid = request.request_id
        taken = self._images.pop(rid, None) is not None
        state = request.runner_state
        if state is _PENDING_ATTACHMENTS:  # still on their way: the broadcaster drops them
            self.attachments.cancel(rid)
        elif self.kv.holds(rid):
            ran = state.prompt + state.generated if isinstance(state, _Decoding) else None
            self._drive({"op": "free", "id": rid, "ran": ran})
            self.model.free(rid, ran)
        elif taken:  # taken here but never prefilled (its prompt was refused): the other ranks drop their copy
            self._drive({"op": "discard", "id": rid})
        self._decoding.discard(rid)
        request.runner_state = None

    def memory_stats(self) -> dict[str, int] | None:
        """The pool's blocks (``BatchedDecoderRunner``'s figures) and ``prefix_cache_bytes``: what the blocks kept
        for later requests hold (no request holds them)."""
        stats = super().memory_stats()
        if stats is not None:
            stats["prefix_cache_bytes"] = self.kv.cached_blocks() * self._block_bytes()
        return stats

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
        if op == "reserve":
            self._follow_reserve(message)
        elif op == "prefill":
            self.model.prefill(message["id"], self._prompts[message["id"]][: message["upto"]],
                               logits=message["logits"])  # its slice of the logits goes to rank 0
        elif op == "decode":
            self.model.decode(message["ids"], message["tokens"])
        elif op == "discard":
            if self._images.pop(message["id"], None) is None:
                self.attachments.take(message["id"])  # rank 0 took it, so it is here or on its way
        elif op == "rewind":
            self.kv.set_length(message["id"], message["length"])
        elif op == "free":
            self._follow_free(message)
        else:
            raise RuntimeError(f"unknown step {op!r}")

    def _follow_reserve(self, message: dict[str, Any]) -> None:
        """Build the request's prompt as rank 0 did and reserve its KV alike, sharing what rank 0's shared."""
        rid = message["id"]
        images = self._images.get(rid)
        if message["attached"] and images is None:
            images = self._images[rid] = self.attachments.take(rid)["images"]
        ids = self.encode_prompt(message["question"], message["history"], images, message.get("tools"))
        if len(ids) != message["prompt_tokens"]:
            raise RuntimeError(f"request {rid}: this rank's prompt has {len(ids)} tokens, rank 0's "
                               f"{message['prompt_tokens']}")
        if not self.model.reserve(rid, message["tokens"], ids):
            raise RuntimeError(f"request {rid}: this rank's KV pool has no room where rank 0's had")
        self._prompts[rid] = ids
        cached = self.kv.shared_tokens(rid)
        if cached != message["cached"]:  # the ranks' KV pools went apart: restart the stage
            raise RuntimeError(f"request {rid}: this rank's KV cache holds {cached} of its tokens, rank 0's "
                               f"{message['cached']}")

    def _follow_free(self, message: dict[str, Any]) -> None:
        """A request ended (or its failed prefill is undone): release its KV as rank 0 did."""
        rid = message["id"]
        self.model.free(rid, message.get("ran"), written=message.get("written", True))
        self._prompts.pop(rid, None)
        if message.get("keep_inputs"):
            return  # a prefill to retry alone: its images stay
        self._images.pop(rid, None)

    def _decode_ids(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))


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


@dataclass(frozen=True)
class _KVOptions:
    prefix_caching: bool
    prefix_cache_bytes: int
    kv_cache_bytes: int | None


def _kv_options(options: dict[str, Any]) -> _KVOptions:
    """The stage's KV options: ``prefix_cache`` (false: no request shares another's blocks, the preamble's
    neither), ``prefix_cache_bytes`` (or its older name ``session_cache_bytes``: what the blocks kept for later
    requests may hold; 0 keeps none but the preamble's) and ``kv_cache_bytes`` (the whole pool; by default sized from
    ``max_num_seqs``, ``max_prompt_tokens`` and ``prefix_cache_bytes``), each refused naming it when it is not
    usable."""
    if "prefix_cache_bytes" in options and "session_cache_bytes" in options:
        raise ValueError("stages.thinker.options: give prefix_cache_bytes or its older name session_cache_bytes, "
                         "not both")
    name = "session_cache_bytes" if "session_cache_bytes" in options else "prefix_cache_bytes"
    budget = options.get(name, DEFAULT_PREFIX_CACHE_BYTES)
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
        raise ValueError(f"stages.thinker.options.{name}: must be an integer >= 0 (0: keep no block for later "
                         f"requests but the preamble's), got {budget!r}")
    enabled = options.get("prefix_cache", True)
    if not isinstance(enabled, bool):
        raise ValueError(f"stages.thinker.options.prefix_cache: must be true or false, got {enabled!r}")
    pool = options.get("kv_cache_bytes")
    if pool is not None and (isinstance(pool, bool) or not isinstance(pool, int) or pool < 1):
        raise ValueError(f"stages.thinker.options.kv_cache_bytes: must be an integer >= 1, got {pool!r}")
    return _KVOptions(enabled, budget if enabled else 0, pool)

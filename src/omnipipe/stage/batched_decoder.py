"""What every batched autoregressive checkpoint runner shares (the Qwen-Omni thinkers and talkers, the default
family's thinker): a per-request ``DecodeState`` (sampling, generator, tokens so far, its cap) that snapshots and
restores the same way for every family, and ``BatchedDecoderRunner``: the step itself, the stage's one
``PagedKVCache`` (``stage/kv_cache.py``), admission of a request's KV reservation (wait for memory, or a 400 naming
what to raise when it can never fit), batch-failure isolation (a failed step rewinds each member's cache length and
state) and release of a request's blocks.

The step (``execute``), written once: every request of the batch not yet prefilled feeds its prompt's next piece
within the step's ``prefill_chunk_tokens`` budget; the prefilled ones whose next input is there decode together in
one forward; then one sampling over every row that has logits, and each row's output. A family supplies the hooks
(and may size a step's prefill otherwise: ``prefill_budget``):
``prefill_piece`` (its prompt, reserved with ``reserve`` and fed piece by piece with ``feed_piece``),
``decode_input`` (what a row's next step reads besides its last token, or that it must wait), ``decode`` (the
batch's forward), ``emit`` (a sampled token's output: stop, cap, hand-off) and ``suppress`` (ids never sampled).
Whether a request decodes is its own ``prefilled`` flag, not the scheduler's guess: a request whose first input
came while it was parked is prefilled in whatever step it is in."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from omnipipe.stage.answer_shape import AnswerShape
from omnipipe.stage.checkpoint_options import DecoderCheckpointOptions
from omnipipe.stage.kv_cache import KVBudgetError, PagedKVCache, block_hashes, step_activation_bytes, token_bytes
from omnipipe.stage.paged_attention import use_paged_attention
from omnipipe.stage.prompt_pieces import PromptPieces
from omnipipe.stage.request import RequestStatus, StageRequest
from omnipipe.stage.runner import RunnerOutput, StageRunner
from omnipipe.stage.sampling import SamplingRow, TokenSamplingParams, sample_next_tokens
from omnipipe.stage.text_stream import TextStream


@dataclass
class DecodeState:
    """One request's decoding: its settings, its own generator (seeded requests stay reproducible whatever they
    are batched with) and every token it sampled (an end token included)."""

    sampling: TokenSamplingParams
    generator: torch.Generator | None
    max_tokens: int
    generated: list[int] = field(default_factory=list)
    prompt_ids: list[int] = field(default_factory=list)  # what the repetition penalty reads besides ``generated``
    shape: AnswerShape | None = None  # a thinker's grammar (response_format, tool calls) and logprobs, if asked

    def sampling_row(self) -> SamplingRow:
        constraint = self.shape.constraint if self.shape is not None else None
        return SamplingRow(self.sampling, self.generator, self.generated, self.prompt_ids, constraint)

    def snapshot(self) -> dict[str, Any]:
        """What ``restore`` needs to undo a step: lists, the text stream and the generator's state copied, a prompt
        being prefilled marked; any other field is taken as it is (a step replaces it rather than change it; a
        family's subclass holding another mutable field copies it in its override)."""
        saved = {name: _saved(value) for name, value in vars(self).items()}
        saved["generator"] = None if self.generator is None else self.generator.get_state()
        return saved

    def restore(self, saved: dict[str, Any]) -> None:
        generator = saved.pop("generator")
        for name, value in saved.items():
            setattr(self, name, _restored(value))
        if generator is not None and self.generator is not None:
            self.generator.set_state(generator)


def _saved(value: Any) -> Any:
    if isinstance(value, AnswerShape):
        return _Shaped(value, value.snapshot())
    if isinstance(value, list):
        return list(value)
    if isinstance(value, TextStream):
        return value.copy()
    if isinstance(value, PromptPieces):
        return _Marked(value, value.mark())
    return value


def _restored(value: Any) -> Any:
    if isinstance(value, _Shaped):
        value.shape.restore(value.saved)
        return value.shape
    if isinstance(value, list):
        return list(value)
    if isinstance(value, TextStream):
        return value.copy()
    if isinstance(value, _Marked):
        value.pieces.rewind(value.mark)
        return value.pieces
    return value


@dataclass(frozen=True)
class _Shaped:
    """An answer's shape (grammar state, tool-call split), and where it stood."""

    shape: AnswerShape
    saved: tuple[Any, ...]


@dataclass(frozen=True)
class _Marked:
    """A prompt being prefilled, and how far it had gone."""

    pieces: PromptPieces
    mark: tuple[int, dict[int, int]]


class BatchedDecoderRunner(StageRunner):
    """The step, KV cache, admission and step isolation of a batched AR checkpoint stage; ``request.runner_state``
    is a ``DecodeState`` subclass (or None before the prefill)."""

    kv: PagedKVCache
    options: DecoderCheckpointOptions
    suppress: torch.Tensor | Sequence[int] = ()  # ids the stage never samples

    def __init__(self, context: Any) -> None:
        super().__init__(context)
        self._decoding: set[str] = set()  # requests past their prefill

    # ----------------------------------------------------------------------------------- what a family supplies
    def prefill_piece(self, request: StageRequest, budget: int, wait: bool) -> tuple[RunnerOutput | torch.Tensor,
                                                                                      int]:
        """Feed the next piece of ``request``'s prompt, at most ``budget`` tokens (``wait``: its prompt's
        processing may be waited for, no stream being held up): the logits [vocab] of its last position once the
        whole prompt is in (and ``request.prefilled`` set), else the output to return now; and the tokens fed."""
        raise NotImplementedError

    def decode_input(self, request: StageRequest) -> Any:
        """What ``request``'s next decode step reads besides its last token (None: nothing), or the output to
        return now when that has not arrived (``WAITING_FOR_CHUNK``)."""
        return None

    def decode(self, rows: list[StageRequest], inputs: list[Any]) -> tuple[torch.Tensor, list[Any]]:
        """One forward for ``rows`` (each its last token at its own next position, with its ``decode_input``):
        the logits [rows, vocab] of their next tokens and what each row's ``emit`` gets with its token."""
        raise NotImplementedError

    def emit(self, request: StageRequest, token: int, logits: torch.Tensor, extra: Any) -> RunnerOutput:
        """The output of ``request``'s sampled ``token`` (chosen from ``logits``; ``extra``: its row's from
        ``decode``, None after a prefill)."""
        raise NotImplementedError

    def emit_all(self, sampled: list[tuple[StageRequest, int, torch.Tensor, Any]]) -> list[RunnerOutput]:
        """Every sampled row's output (a family that works on all of them at once overrides this)."""
        return [self.emit(request, token, logits, extra) for request, token, logits, extra in sampled]

    def prefill_budget(self) -> int:
        """Prompt tokens one step may prefill, over all its requests (the option ``prefill_chunk_tokens``)."""
        return self.options.prefill_chunk_tokens

    def feed_piece(self, request: StageRequest, pieces: PromptPieces, budget: int,
                   forward: Callable[[dict[str, Any]], Any],
                   hidden_states: Callable[[Any], tuple[torch.Tensor, ...] | None] = lambda out: None,
                   ) -> tuple[Any, int]:
        """Feed the next piece of ``request``'s prompt ``pieces`` (at most ``budget`` tokens) through ``forward``
        (the decoder's keyword arguments for the piece -> its output), bound to the request's KV rows, keeping the
        hidden states ``hidden_states`` picks from the output (the layers the pieces keep): the output of the last
        piece and the tokens fed, the request then prefilled; None while pieces remain (or no budget is left), the
        step's answer being PREFILLING."""
        if budget < 1:
            return None, 0
        piece = pieces.next_piece(budget)
        tokens = int(piece["inputs_embeds"].shape[1])
        self.kv.bind([request.request_id], tokens)
        out = forward(piece)
        pieces.record(tokens, hidden_states(out))
        if pieces.remaining:
            return None, tokens
        request.prefilled = True
        return out, tokens

    # ------------------------------------------------------------------------------------------------ the step
    @torch.inference_mode()
    def execute(self, batch: list[StageRequest]) -> list[RunnerOutput]:
        outputs: dict[str, RunnerOutput] = {}
        ready: list[tuple[StageRequest, torch.Tensor, Any]] = []  # (request, logits [vocab], extra)
        rows: list[StageRequest] = []
        inputs: list[Any] = []
        budget = self.prefill_budget()
        wait = not self._decoding  # no stream is held up while this step waits for a prompt's processing
        for request in batch:
            if not request.prefilled:
                result, fed = self.prefill_piece(request, budget, wait)
                budget -= fed
                if isinstance(result, RunnerOutput):
                    outputs[request.request_id] = result
                else:
                    self._decoding.add(request.request_id)
                    ready.append((request, result, None))
                continue
            needed = self.decode_input(request)
            if isinstance(needed, RunnerOutput):
                outputs[request.request_id] = needed
            else:
                rows.append(request)
                inputs.append(needed)
        if rows:
            logits, extras = self.decode(rows, inputs)
            ready += zip(rows, logits, extras, strict=True)
        if ready:
            tokens = sample_next_tokens(torch.stack([logits for _, logits, _ in ready]),
                                        [request.runner_state.sampling_row() for request, _, _ in ready],
                                        suppress=self.suppress)
            sampled = [(request, token, logits, extra) for (request, logits, extra), token in zip(ready, tokens,
                                                                                                   strict=True)]
            for output in self.emit_all(sampled):
                outputs[output.request_id] = output
        return [outputs[request.request_id] for request in batch]

    def make_kv_cache(self, text_config: Any, options: DecoderCheckpointOptions, dtype: torch.dtype,
                      reply_tokens: int, decoder: torch.nn.Module) -> None:
        """The stage's KV cache, from its budget (call once the weights are on the device); without
        ``kv_cache_bytes``, never more than ``max_num_seqs`` requests of the model's whole context plus
        ``reply_tokens`` (the stage's default cap on a reply) can fill. A budget that holds not one block stops the
        stage from starting, with the figures it was reckoned from. With ``paged_attention``, ``decoder``'s
        attention layers read the cache's blocks through that kernel (``stage/paged_attention.py``)."""
        rows = self.context.max_num_seqs
        positions = getattr(text_config, "max_position_embeddings", None)
        context = int(positions or options.prefill_chunk_tokens) + reply_tokens  # the longest history a row has
        activations = step_activation_bytes(text_config, dtype, step_tokens=options.prefill_chunk_tokens,
                                            rows=rows, context=context)
        budget = options.kv_budget(self.context.device, activations)
        nbytes = budget.bytes
        if options.kv_cache_bytes is None and positions:
            nbytes = min(nbytes, rows * context * token_bytes(text_config, dtype))
        try:
            self.kv = PagedKVCache.for_model(text_config, nbytes, block_tokens=options.kv_block_tokens,
                                             dtype=dtype, device=self.context.device,
                                             prefix_caching=options.prefix_caching)
        except KVBudgetError as exc:
            raise KVBudgetError(f"stages.{self.context.stage}: no room for its KV cache: {budget.reckoning} "
                                f"leaves {nbytes} bytes ({exc}); raise gpu_memory_fraction, lower max_num_seqs or "
                                "prefill_chunk_tokens, or set kv_cache_bytes") from None
        if options.paged_attention is not None:
            use_paged_attention(decoder)
            self.kv.kernel = options.paged_attention

    def reserve(self, request: StageRequest, tokens: int, prompt_keys: Sequence[int | bytes] = (),
                needs_extras: bool = False) -> RunnerOutput | None:
        """Reserve ``tokens`` of KV for ``request`` (its prompt plus all it may generate): None when done, else
        the output that makes it wait for memory, or fails it when even the whole cache is too small.
        ``prompt_keys``: each prompt position's key (``kv_cache.block_hashes``): the leading blocks an earlier
        request computed are shared, and ``request.num_cached_tokens`` says how many tokens (its prefill starts
        there: ``PromptPieces.skip``)."""
        hashes = block_hashes(prompt_keys, self.kv.block_tokens) if self.kv.prefix_caching else []
        try:
            if self.kv.reserve(request.request_id, tokens, prompt_tokens=len(prompt_keys), hashes=hashes,
                               needs_extras=needs_extras):
                request.num_cached_tokens = self.kv.shared_tokens(request.request_id)
                return None
        except KVBudgetError as exc:
            return RunnerOutput.failed(request.request_id, str(exc), "sampling_params.max_tokens")
        return RunnerOutput(request.request_id, status=RequestStatus.WAITING_FOR_MEMORY)

    def memory_stats(self) -> dict[str, int] | None:
        kv = getattr(self, "kv", None)
        if kv is None:
            return None
        return {"blocks": kv.num_blocks, "blocks_reserved": kv.reserved_blocks(), "tokens_used": kv.used_tokens(),
                "block_tokens": kv.block_tokens, "blocks_cached": kv.cached_blocks(),
                "prefix_queries": kv.prefix_queries, "prefix_hits": kv.prefix_hits}

    def snapshot(self, request: StageRequest) -> Any:
        state = request.runner_state
        if state is None:
            return None
        held = self.kv.length(request.request_id) if self.kv.holds(request.request_id) else None
        return {"kv_length": held, "state": state.snapshot(), "prefilled": request.prefilled}

    def restore(self, request: StageRequest, snapshot: Any) -> None:
        if snapshot is None:  # its first step failed: what it wrote is not kept for others
            self.kv.release(request.request_id, written=False)
            self.free(request)
            return
        if snapshot["kv_length"] is not None and self.kv.holds(request.request_id):
            self.kv.set_length(request.request_id, snapshot["kv_length"])
        request.runner_state.restore(dict(snapshot["state"]))
        request.prefilled = snapshot["prefilled"]  # a prefill the failed step finished is fed again
        if not request.prefilled:
            self._decoding.discard(request.request_id)

    def free(self, request: StageRequest) -> None:
        self._decoding.discard(request.request_id)
        self.kv.release(request.request_id)
        request.runner_state = None

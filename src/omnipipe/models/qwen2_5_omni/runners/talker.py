"""The Qwen2.5-Omni talker stage: ``Qwen2_5OmniTalkerForConditionalGeneration``'s parts turn the thinker's hidden
states into codec codes, one per step.

Every decoding request of the stage steps in one forward of the talker's decoder (``stage/batched_decoder.py``: one
paged KV cache, each row its own length): a row's input is the codec embedding of its last code plus its next reply
item, projected as the model does, at its own rope position (at decode the three multimodal rows are the row's
cache length plus its own rope delta, which its prompt's media set). A request's prefill reads the thinker's prompt
part and first reply item, builds its prompt (``stage/prompt_pieces.py``), reserves the KV of the prompt and
``max_tokens`` codes (or waits for memory), its leading blocks shared where an earlier request computed them (a
conversation's earlier turns: keyed by input rows and positions, ``content_keys``), and is fed
``prefill_chunk_tokens`` at a time between the others' decode steps. Each later step reads the next
reply item (then the text-end embedding, then the pad embedding for ever once the thinker is done). Under async
chunk a request whose reply item has not arrived yet waits for it (``WAITING_FOR_CHUNK``) while the others step.

Sampling follows the fields of the request's talker SamplingParams the caller set; every field left out keeps the
model's decoding (that of transformers' ``generate``: temperature 0.9, top-k 40, top-p 0.8, repetition penalty 1.05,
up to ``max_new_tokens`` codes), each request with its own generator. The repetition penalty reads the talker's whole
input (as ``generate``), the presence and frequency penalties the codes generated so far. ``stop`` (strings) has no
meaning for codec codes and is refused. The codec's begin token is suppressed; its pad and end tokens end the
speech.

Stage options: ``TalkerOptions`` (``options.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

from omnipipe.models.qwen2_5_omni.handoff import Qwen25TalkerHandoff, Qwen25TalkerPrompt
from omnipipe.models.qwen2_5_omni.options import TalkerOptions
from omnipipe.models.qwen2_5_omni.processors import DEFAULT_SPEAKER, Qwen25TalkerParams
from omnipipe.models.qwen2_5_omni.weights.load import load_part, load_speakers
from omnipipe.stage.batched_decoder import BatchedDecoderRunner, DecodeState
from omnipipe.stage.checkpoint_options import checked_options, compile_if
from omnipipe.stage.checkpoint_tensors import read_rows
from omnipipe.stage.prompt_pieces import PromptPieces, content_keys
from omnipipe.stage.request import RequestStatus, StageRequest
from omnipipe.stage.runner import RunnerOutput
from omnipipe.stage.sampling import TokenSamplingParams, given_params
from omnipipe.stage.warmup import warm_up_talker
from omnipipe.util.field_error import FieldError

if TYPE_CHECKING:
    from transformers.models.qwen2_5_omni import Qwen2_5OmniTalkerForConditionalGeneration

MODEL_DECODING = TokenSamplingParams(temperature=0.9, top_k=40, top_p=0.8, repetition_penalty=1.05)


@dataclass
class Qwen25TalkerState(DecodeState):
    """``prompt_ids`` are the talker's input ids (codec mask tokens, pad, begin), ``generated`` its codes (an end
    code included), ``max_tokens`` its cap in codes."""

    speaker: str = DEFAULT_SPEAKER
    rope_delta: int = 0  # decode positions are the cache length plus this (the prompt's media offset)
    replies: list[torch.Tensor] = field(default_factory=list)  # reply items not read yet
    thinker_done: bool = False
    tail: list[torch.Tensor] = field(default_factory=list)  # text-end, then pad: read after the reply
    pieces: PromptPieces | None = None  # the prompt projected [1, prompt, hidden] at [3, 1, prompt], while prefilled


class Qwen25TalkerRunner(BatchedDecoderRunner):
    options: TalkerOptions

    def load(self) -> None:
        self.options, directory, self.dtype = checked_options(self.context, TalkerOptions)
        self.directory = directory
        self.device = torch.device(self.context.device)
        self.model = cast("Qwen2_5OmniTalkerForConditionalGeneration",
                          load_part(directory, "talker", self.device, self.dtype))
        self.decoder: torch.nn.Module = self.model.model
        compile_if(self.decoder, self.options.torch_compile)
        self.eos_codes = {self.model.codec_pad_token, self.model.codec_eos_token}
        self.bos_tokens = {name: int(s["bos_token"]) for name, s in load_speakers(directory).items()}
        default = DEFAULT_SPEAKER if DEFAULT_SPEAKER in self.bos_tokens else next(iter(self.bos_tokens), "")
        self.speaker = self._speaker(self.options.speaker or default, f"stages.{self.context.stage}.options.speaker")
        self.suppress = [self.model.codec_bos_token]  # the codec's begin token is never sampled
        self.make_kv_cache(self.model.config, self.options, self.dtype, self.options.max_new_tokens, self.decoder)

    def warmup(self) -> None:
        """A compiled decoder is traced and compiled here, for every call serving makes of it, not in the first
        requests, where a compile could outlast the stall watchdog and stalls every stream of its step. With
        ``torch_compile`` on, ``warm_up_talker``'s three requests, their hand-offs made from the checkpoint
        (``_warmup_handoffs``); every block taken is free again after."""
        if self.options.torch_compile:
            warm_up_talker(self, self._warmup_handoffs, self.eos_codes)

    def _warmup_handoffs(self, prompt_tokens: int, reply_tokens: int,
                         whole: bool = False) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """A thinker's hand-offs for a warm-up request, made from the checkpoint without a thinker: a text prompt of
        ``prompt_tokens`` plain ids (the talker reads no roles: only media ids change its positions) with the
        thinker's embedding rows of them as both its embeddings and hidden states, the text-end, pad and voices'
        begin embeddings, then one reply item per chunk (``reply_tokens`` in all, the first with the prompt), the
        last one done; ``whole``: every item in the first chunk."""
        config = self.model.config
        ids = [1 + index % 8 for index in range(prompt_tokens)]  # low ids: plain text in Qwen tokenizers
        reply = [ids[index % len(ids)] for index in range(reply_tokens)]
        speakers = sorted(self.bos_tokens)
        rows = read_rows(self.directory, "thinker.model.embed_tokens.weight",
                         [*ids, *reply, config.tts_text_end_token_id, config.tts_text_pad_token_id,
                          *(self.bos_tokens[name] for name in speakers)])
        if rows is None:
            raise ValueError(f"{self.directory}: no thinker.model.embed_tokens.weight (the talker's warm-up reads it)")
        rows = rows.float()
        prompt_rows, text = rows[:len(ids)], rows[len(ids):len(ids) + len(reply)]
        text_eos, text_pad, *bos = rows[len(ids) + len(reply):].unbind(0)
        prompt = Qwen25TalkerPrompt(torch.tensor(ids), torch.ones(len(ids), dtype=torch.long), prompt_rows,
                                    prompt_rows, reply[0], text_eos, text_pad, dict(zip(speakers, bos, strict=True)))
        if whole:
            return Qwen25TalkerHandoff(text, text, done=True, prompt=prompt).to_chunk(), []
        first = Qwen25TalkerHandoff(text[:1], text[:1], prompt=prompt).to_chunk()
        return first, [Qwen25TalkerHandoff(text[index:index + 1], text[index:index + 1],
                                           done=index == len(text) - 1).to_chunk() for index in range(1, len(text))]

    def validate(self, params: dict[str, Any]) -> str | None:
        if params.get("stop"):
            raise FieldError("sampling_params.stop", "the talker generates codec codes, not text: stop strings do "
                             "not apply (give them to the thinker)")
        self._request_speaker(params)
        return None

    def _speaker(self, name: str, field_name: str) -> str:
        """The checkpoint's name of voice ``name`` (any case); a FieldError naming ``field_name`` when it has none."""
        found = next((known for known in self.bos_tokens if known.lower() == name.lower()), None)
        if found is None:
            raise FieldError(field_name, f"unknown voice {name!r}; this checkpoint has "
                             f"{', '.join(sorted(self.bos_tokens)) or 'none'}")
        return found

    def _request_speaker(self, params: dict[str, Any]) -> str:
        """The voice of a request: its ``extra.speaker``, else the stage option's."""
        speaker = Qwen25TalkerParams(**(params.get("extra") or {})).speaker
        return self.speaker if speaker is None else self._speaker(speaker, "sampling_params.extra.speaker")

    def _tensor(self, value: torch.Tensor) -> torch.Tensor:
        return value.to(self.device, self.dtype, copy=True)  # a copy: inputs are read-only

    def _read(self, request: StageRequest) -> tuple[Qwen25TalkerPrompt | None, list[torch.Tensor], bool]:
        """The arrived hand-offs: (the prompt if one came, the reply items, whether the thinker is done)."""
        prompt, items, done = None, [], False
        for chunk in request.take_all_inputs():
            handoff = Qwen25TalkerHandoff.from_chunk(chunk)
            prompt = handoff.prompt or prompt
            items += list((self._tensor(handoff.text_embeds) + self._tensor(handoff.text_hidden)).unbind(0))
            done = done or handoff.done
        return prompt, items, done

    # ------------------------------------------------------------------------------------------------ prefill
    def _start(self, request: StageRequest) -> RunnerOutput | None:
        """Read the request's first input, build its prompt (embeddings projected, positions) and reserve its KV,
        the leading blocks an earlier request computed (a conversation's earlier turns) shared; an output when it
        must wait or fail."""
        if request.runner_state is None:
            failed = self._prompt(request)
            if failed is not None:
                return failed
        state: Qwen25TalkerState = request.runner_state
        assert state.pieces is not None  # made by _prompt, cleared once the request is prefilled
        waiting = self.reserve(request, state.pieces.length + state.max_tokens,
                               content_keys(state.pieces.inputs_embeds, state.pieces.position_ids))
        if waiting is not None:
            return waiting
        if request.num_cached_tokens:
            state.pieces.skip(request.num_cached_tokens, {})
        return None

    def _prompt(self, request: StageRequest) -> RunnerOutput | None:
        """The request's state with its prompt, from its first input; the output that fails it when that input is
        not a talker's."""
        rid = request.request_id
        if not any("prompt" in chunk for chunk in request.inputs):
            return RunnerOutput.failed(rid, "the talker's first input carries no thinker prompt part")
        max_codes = int(given_params(request.params).get("max_tokens", self.options.max_new_tokens))
        prompt, replies, done = self._read(request)
        if prompt is None or (not replies and not done):
            return RunnerOutput.failed(rid, "the talker's first input carries no reply item")
        speaker = self._request_speaker(request.params)
        eos_embed, pad_embed = self._tensor(prompt.text_eos), self._tensor(prompt.text_pad)
        model, device = self.model, self.device
        input_ids = prompt.input_ids.to(device).view(1, -1)
        length = input_ids.shape[1]
        text_ids = torch.cat([input_ids, torch.tensor([[self.bos_tokens[speaker], prompt.first_token]],
                                                      device=device)], dim=1)
        talker_ids = [model.codec_mask_token] * length + [model.codec_pad_token, model.codec_bos_token]
        codec = model.get_input_embeddings()(torch.tensor([model.codec_pad_token, model.codec_bos_token],
                                                          device=device))
        first_reply = replies[0] if replies else eos_embed
        embeds = torch.cat([self._tensor(prompt.hidden) + self._tensor(prompt.embeds),
                            (self._tensor(prompt.speaker_bos[speaker]) + codec[0])[None],
                            (first_reply + codec[1])[None]])
        mask = torch.cat([prompt.attention_mask.to(device).view(1, -1),
                          torch.ones(1, 2, dtype=torch.long, device=device)], dim=1)
        grids = {k: v.to(device) for k, v in prompt.grids.items()}
        # transformers annotates the ids, grids and lengths torch.LongTensor, a class no tensor is typed as
        positions, deltas = model.get_rope_index(text_ids, grids.get("image_grid_thw"),  # type: ignore[arg-type]
                                                 grids.get("video_grid_thw"), mask, False,  # type: ignore[arg-type]
                                                 grids.get("audio_feature_lengths"),  # type: ignore[arg-type]
                                                 grids.get("video_second_per_grid"))
        # the fields a caller gives replace the model's decoding; the others stay the model's
        sampling = TokenSamplingParams.from_params(request.params, MODEL_DECODING)
        request.runner_state = Qwen25TalkerState(
            sampling, sampling.make_generator(salt=1), max_codes, prompt_ids=talker_ids, speaker=speaker,
            rope_delta=int(deltas[0, 0] - (1 - mask).sum()), replies=replies[1:], thinker_done=done,
            tail=[eos_embed, pad_embed], pieces=PromptPieces(model.thinker_to_talker_proj(embeds[None]), positions))
        return None

    def prefill_piece(self, request: StageRequest, budget: int,
                      wait: bool) -> tuple[RunnerOutput | torch.Tensor, int]:
        """Feed the next piece of the request's prompt (at most ``budget`` tokens): the last position's logits once
        the whole prompt is in, else the output to return now; and the tokens fed."""
        if not self.kv.holds(request.request_id):
            waiting = self._start(request)
            if waiting is not None:
                return waiting, 0
        state: Qwen25TalkerState = request.runner_state
        pieces = state.pieces
        assert pieces is not None  # made by _start, cleared once the request is prefilled
        logits, tokens = self.feed_piece(request, pieces, budget,
                                         lambda piece: self._forward(piece["inputs_embeds"], piece["position_ids"]))
        if logits is None:
            return RunnerOutput(request.request_id, status=RequestStatus.PREFILLING), tokens
        state.pieces = None
        return logits[0], tokens

    # ------------------------------------------------------------------------------------------------- steps
    def _forward(self, projected: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The decoder over the bound rows' projected inputs [rows, query, hidden] at ``positions`` [3, rows, query];
        the codec logits of each row's last position [rows, codes]."""
        out = self.decoder(inputs_embeds=projected, position_ids=positions, **self.kv.step_inputs())
        return self.model.codec_head(out.last_hidden_state[:, -1]).float()

    def _next_item(self, request: StageRequest) -> torch.Tensor | None:
        """The request's next reply item (the text-end, then pad embeddings once the thinker is done); None while
        it has not arrived."""
        state: Qwen25TalkerState = request.runner_state
        _, items, done = self._read(request)
        state.replies += items
        state.thinker_done = state.thinker_done or done
        if state.replies:
            return state.replies.pop(0)
        if state.thinker_done:
            return state.tail.pop(0) if len(state.tail) > 1 else state.tail[0]
        return None

    def decode_input(self, request: StageRequest) -> Any:
        """The request's next reply item, or that it waits for the thinker's."""
        item = self._next_item(request)
        return RunnerOutput(request.request_id, status=RequestStatus.WAITING_FOR_CHUNK) if item is None else item

    def decode(self, rows: list[StageRequest], inputs: list[Any]) -> tuple[torch.Tensor, list[Any]]:
        """One forward for every request of ``rows`` (each its last code at its own next position, with its reply
        item): the logits of each one's next code [rows, codes]."""
        items = inputs
        states: list[Qwen25TalkerState] = [request.runner_state for request in rows]
        self.kv.bind([request.request_id for request in rows], 1)
        codes = torch.tensor([[state.generated[-1]] for state in states], device=self.device)
        embeds = self.model.get_input_embeddings()(codes) + torch.stack(items)[:, None]
        deltas = torch.tensor([state.rope_delta for state in states], device=self.device)
        positions = (self.kv.positions() + deltas[:, None])[None].expand(3, -1, -1)
        logits = self._forward(self.model.thinker_to_talker_proj(embeds), positions)
        return logits, [None] * len(rows)

    def emit(self, request: StageRequest, code: int, logits: torch.Tensor, extra: Any) -> RunnerOutput:
        state: Qwen25TalkerState = request.runner_state
        state.generated.append(code)
        if code in self.eos_codes:
            return RunnerOutput.decoded(request.request_id, "stop")
        done = len(state.generated) >= state.max_tokens
        return RunnerOutput.decoded(request.request_id, "length" if done else None, num_units=1,
                                    data={"frames": np.array([[code]], dtype=np.int64), "speaker": state.speaker})

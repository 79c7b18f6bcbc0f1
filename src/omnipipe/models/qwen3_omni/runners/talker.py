"""The Qwen3-Omni talker stage: the thinker's prompt and text embeddings in, one frame of codec codes
(``num_code_groups`` codes: the talker's own and its code predictor's residuals) out per step.

The prefill is the model's: the prompt's user turns projected into the talker (text positions through
``text_projection`` of their embeddings, multimodal positions through ``hidden_projection`` of the thinker's hidden
states), then the assistant's opening with the codec's think/speaker/bos ids. It starts once the thinker's first
chunk (the prompt and the first text embedding) is there, whether the scheduler gave the request a prefill step or,
its chunk having come in while it was parked, a decode step, and feeds at most ``prefill_chunk_tokens`` a step
(``stage/prompt_pieces.py``: a long prompt goes in pieces between the others' decode steps). The prompt's leading
blocks that an earlier request computed (a conversation's next turn repeats the user turns before it) come from the
prefix cache, keyed by their input rows and positions (``content_keys``). Each step then feeds
the sum of the last frame's code embeddings plus the next text embedding (``tts_eos`` once the text is done,
``tts_pad`` after). A step whose text embedding has not arrived yet waits for the thinker (``WAITING_FOR_CHUNK``).

Every decoding request with its text embedding steps together (``stage/batched_decoder.py``): the code predictor's
residual codes for all of them in one loop over the codebooks (``modeling/code_predictor.py``), then one talker
forward over the paged KV cache, each row at its own 4-row rope position (the last one plus one).

Stage options: ``TalkerOptions`` (``options.py``). Decoding: the model's own (sampling at temperature 0.9, top-k 50,
repetition penalty 1.05, up to ``max_new_tokens`` frames), each field of the talker's SamplingParams the caller set
replacing its counterpart. The code predictor's residual codes follow the talker: greedy when it is, else sampled as
the model does (top-k 50, top-p 0.8) from the request's generator. ``stop`` has no meaning for codec frames and is
refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import torch

from omnipipe.models.qwen3_omni.handoff import Qwen3TalkerHandoff, Qwen3TalkerPrompt
from omnipipe.models.qwen3_omni.modeling.code_predictor import BatchedCodePredictor
from omnipipe.models.qwen3_omni.options import DEFAULT_SPEAKER, Qwen3TalkerParams, TalkerOptions
from omnipipe.models.qwen3_omni.weights.load import load_config, load_part, speaker_ids
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
    from transformers import PreTrainedConfig, Qwen3OmniMoeTalkerForConditionalGeneration

MODEL_DECODING = TokenSamplingParams(temperature=0.9, top_k=50, top_p=1.0, repetition_penalty=1.05)


@dataclass
class Qwen3TalkerState(DecodeState):
    """A talker request: what the thinker sent so far, and where its decoding stands (``generated``: its codes)."""

    text: list[torch.Tensor] = field(default_factory=list)  # the thinker's token embeddings, unprojected
    done: bool = False  # the thinker's text is all there
    prompt: Qwen3TalkerPrompt | None = None  # the prompt of the thinker's first hand-off, until the prefill
    pieces: PromptPieces | None = None  # the talker's prompt while it is prefilled
    step: int = 0  # decode steps taken: the next text embedding is text[step + 1]
    last_position: torch.Tensor | None = None  # [4]: the rope rows of the last position fed
    last_hidden: torch.Tensor | None = None  # [hidden]: the talker's last hidden state (the predictor's input)


class Qwen3TalkerRunner(BatchedDecoderRunner):
    options: TalkerOptions

    def load(self) -> None:
        self.options, self.directory, self.dtype = checked_options(self.context, TalkerOptions)
        self.device = self.context.device
        self.config = load_config(self.directory)
        self.model = cast("Qwen3OmniMoeTalkerForConditionalGeneration",
                          load_part(self.directory, "talker", self.device, self.dtype))
        compile_if(self.model.model, self.options.torch_compile)
        self.predictor = BatchedCodePredictor(self.model.code_predictor)
        talker = self.config.talker_config
        self.speakers = {name.lower(): index for name, index in speaker_ids(self.config).items()}
        default = DEFAULT_SPEAKER if DEFAULT_SPEAKER in self.speakers else next(iter(self.speakers), "")
        self.speaker_id = self._speaker_id(self.options.speaker or default,
                                           f"stages.{self.context.stage}.options.speaker")
        self.eos = int(talker.codec_eos_token_id)
        vocab = int(talker.text_config.vocab_size)
        self.suppress = torch.tensor([i for i in range(vocab - 1024, vocab) if i != self.eos], device=self.device)
        self._load_text_tokens()
        self.make_kv_cache(self.model.config.text_config, self.options, self.dtype,
                           self.options.max_new_tokens, self.model.model)

    def warmup(self) -> None:
        """A compiled decoder is traced and compiled here, for every call serving makes of it, not in the first
        requests, where a compile could outlast the stall watchdog and stalls every stream of its step. With
        ``torch_compile`` on, ``warm_up_talker``'s three requests, their hand-offs made from the checkpoint
        (``_warmup_handoffs``); every block taken is free again after."""
        if self.options.torch_compile:
            warm_up_talker(self, self._warmup_handoffs, [self.eos])

    def _warmup_handoffs(self, user_tokens: int, reply_tokens: int,
                         whole: bool = False) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """A thinker's hand-offs for a warm-up request, made from the checkpoint without a thinker: the prompt
        ``<|im_start|>user`` (``user_tokens`` plain text ids) ``<|im_end|>`` then ``<|im_start|>assistant`` and its
        first text embedding, then one chunk per further text token (``reply_tokens`` in all), the last one done;
        ``whole``: all of the text in the first chunk. The embeddings are the thinker's rows of those ids."""
        config = self.config
        plain = [1 + index % 8 for index in range(max(user_tokens, 1))]  # low ids: plain text in Qwen tokenizers
        newline = plain[0]
        ids = [config.im_start_token_id, config.user_token_id, *plain, config.im_end_token_id, newline,
               config.im_start_token_id, config.assistant_token_id, newline]
        reply = [plain[index % len(plain)] for index in range(reply_tokens)]
        rows = read_rows(self.directory, "thinker.model.embed_tokens.weight", [*ids, *reply])
        if rows is None:
            raise ValueError(f"{self.directory}: no thinker.model.embed_tokens.weight (the talker's warm-up reads it)")
        rows = rows.float()
        prompt_embeds, text = rows[:len(ids)], rows[len(ids):]
        prompt = Qwen3TalkerPrompt(torch.tensor(ids), prompt_embeds, prompt_embeds[:0])
        if whole:
            return Qwen3TalkerHandoff(text, done=True, prompt=prompt).to_chunk(), []
        first = Qwen3TalkerHandoff(text[:1], prompt=prompt).to_chunk()
        return first, [Qwen3TalkerHandoff(text[index:index + 1], done=index == len(text) - 1).to_chunk()
                       for index in range(1, len(text))]

    def _load_text_tokens(self) -> None:
        """tts_bos / tts_eos / tts_pad: the thinker's embeddings of them (three rows read from the checkpoint),
        projected."""
        key = "thinker.model.embed_tokens.weight"
        ids = [self.config.tts_bos_token_id, self.config.tts_eos_token_id, self.config.tts_pad_token_id]
        rows = read_rows(self.directory, key, ids)
        if rows is None:
            raise ValueError(f"{self.directory}: no {key} (the talker projects the thinker's tts tokens)")
        with torch.inference_mode():
            projected = self.model.text_projection(rows.to(self.device, self.dtype))
        self.tts_bos, self.tts_eos, self.tts_pad = projected.unbind(0)

    def _speaker_id(self, name: str, field_name: str) -> int:
        if name.lower() not in self.speakers:
            raise FieldError(field_name, f"unknown speaker {name!r} (this checkpoint has "
                             f"{', '.join(sorted(self.speakers)) or 'none'})")
        return self.speakers[name.lower()]

    def _request_speaker_id(self, params: dict[str, Any]) -> int:
        """The voice of a request: its ``extra.speaker`` (checked when it arrived), else the stage option's."""
        speaker = Qwen3TalkerParams(**(params.get("extra") or {})).speaker
        return self.speaker_id if speaker is None else self._speaker_id(speaker, "sampling_params.extra.speaker")

    def validate(self, params: dict[str, Any]) -> str | None:
        if params.get("stop"):
            raise FieldError("sampling_params.stop", "the talker writes codec frames, not text: it takes no stop "
                             "strings")
        self._request_speaker_id(params)
        return None

    # ------------------------------------------------------------------------------------------------- inputs
    def _state(self, request: StageRequest) -> Qwen3TalkerState:
        """The request's state (made on its first step), with the inputs that came since its last step taken."""
        state: Qwen3TalkerState | None = request.runner_state
        if state is None:
            sampling = TokenSamplingParams.from_params(request.params, MODEL_DECODING)
            max_tokens = int(given_params(request.params).get("max_tokens", self.options.max_new_tokens))
            state = request.runner_state = Qwen3TalkerState(sampling, sampling.make_generator(), max_tokens)
        for item in request.take_all_inputs():
            handoff = Qwen3TalkerHandoff.from_chunk(item)
            if handoff.prompt is not None:
                state.prompt = handoff.prompt
            if len(handoff.text_embeds):
                state.text = [*state.text, *handoff.text_embeds.unbind(0)]
            state.done = state.done or handoff.done
        return state

    def _text_embedding(self, state: Qwen3TalkerState) -> tuple[torch.Tensor, bool] | None:
        """The text the next decode step adds, and whether it is projected already: the next generated token's
        embedding (not yet), then tts_eos, then tts_pad (projected); None: not here yet."""
        index = state.step + 1  # the first text embedding went into the prefill
        if index < len(state.text):
            return state.text[index], False
        if not state.done:
            return None
        return (self.tts_eos if index == len(state.text) else self.tts_pad), True

    # ----------------------------------------------------------------------------------------------- prefill
    def _user_part(self, ids: torch.Tensor, embed: torch.Tensor, mm_hidden: torch.Tensor) -> tuple[torch.Tensor,
                                                                                                     torch.Tensor]:
        """Every position of the prompt's user turns, projected into the talker (the model's own rule)."""
        config, talker_config = self.config, self.config.talker_config
        mm = (ids == talker_config.audio_token_id) | (ids == talker_config.image_token_id) | \
             (ids == talker_config.video_token_id)
        positions = torch.arange(len(ids))
        starts = torch.where(ids == config.im_start_token_id, positions, torch.full_like(positions, -1))
        previous = torch.cummax(starts, dim=0).values.clamp_min(0)
        roles = ids[(previous + 1).clamp_max(len(ids) - 1)]
        user = roles == config.user_token_id
        # a built config's text_config is a config (transformers types the field as what it may be given)
        hidden_size = cast("PreTrainedConfig", self.model.config.text_config).hidden_size
        part = torch.empty(int(user.sum()), hidden_size, dtype=self.dtype, device=self.device)
        user_mm = mm[user]
        mm_rank = torch.cumsum(mm.long(), 0) - 1  # index of each multimodal position among mm_hidden's rows
        if user_mm.any():
            rows = mm_hidden[mm_rank[user & mm]].to(self.device, self.dtype)
            part[user_mm.to(self.device)] = self.model.hidden_projection(rows)
        text_rows = embed[user & ~mm].to(self.device, self.dtype)
        part[~user_mm.to(self.device)] = self.model.text_projection(text_rows)
        return part, ids[user]

    def _prompt_inputs(self, request: StageRequest, state: Qwen3TalkerState,
                       prompt: Qwen3TalkerPrompt) -> tuple[torch.Tensor, torch.Tensor]:
        """The talker's prompt (``prompt``: the thinker's prompt part): its input embeddings [1, length, hidden] and
        rope positions [4, 1, length]."""
        config, talker_config = self.config, self.config.talker_config
        ids, embed = prompt.ids, prompt.embeds
        user_embeds, user_ids = self._user_part(ids, embed, prompt.mm_hidden)
        starts = ((ids[:-1] == config.im_start_token_id) & (ids[1:] == config.assistant_token_id)).nonzero()
        # the assistant's opening: <|im_start|> assistant \n
        opening = self.model.text_projection(embed[int(starts[-1, 0]):].to(self.device, self.dtype))
        first_text = self.model.text_projection(state.text[0].to(self.device, self.dtype))[None]
        text_part = torch.cat([opening[:3], self.tts_pad.expand(4, -1), self.tts_bos[None], first_text])
        codec_ids = torch.tensor([talker_config.codec_nothink_id, talker_config.codec_think_bos_id,
                                  talker_config.codec_think_eos_id, self._request_speaker_id(request.params),
                                  talker_config.codec_pad_id, talker_config.codec_bos_id], device=self.device)
        codec_part = torch.cat([torch.zeros(3, text_part.shape[-1], dtype=self.dtype, device=self.device),
                                self.model.get_input_embeddings()(codec_ids)])
        inputs_embeds = torch.cat([user_embeds, text_part + codec_part])[None]
        talker_ids = torch.cat([user_ids, torch.full((len(text_part),), config.tts_pad_token_id)])[None]
        mask = torch.ones(1, inputs_embeds.shape[1], dtype=torch.long, device=self.device)
        kwargs = {"attention_mask": mask, "talker_input_ids": talker_ids.to(self.device), "past_key_values": None,
                  **{k: v.to(self.device) for k, v in prompt.grids.items()}}
        position_ids = self.model._prepare_position_ids_for_generation(inputs_embeds, kwargs)
        self.model.rope_deltas = None  # positions are passed explicitly; leave nothing on the shared model
        # float positions for every prompt (the model's are int64 for text, float with media; the rotary embedding
        # reads them as floats either way): a compiled decoder meets one dtype, so one graph
        return inputs_embeds, position_ids.float()

    def _start(self, request: StageRequest, state: Qwen3TalkerState) -> RunnerOutput | None:
        """The request's prompt built and its KV reserved; else the output to return now (waiting for the thinker
        or for KV memory, or nothing to speak)."""
        prompt = state.prompt
        if prompt is None or (not state.text and not state.done):
            return RunnerOutput(request.request_id, status=RequestStatus.WAITING_FOR_CHUNK)
        if not state.text:  # the thinker said nothing to speak
            return RunnerOutput.decoded(request.request_id, "stop")
        inputs_embeds, position_ids = self._prompt_inputs(request, state, prompt)
        # the prompt's leading blocks another request computed (an earlier turn of the conversation) are shared
        waiting = self.reserve(request, int(inputs_embeds.shape[1]) + state.max_tokens,
                               content_keys(inputs_embeds, position_ids))
        if waiting is not None:
            return waiting
        state.pieces, state.prompt = PromptPieces(inputs_embeds, position_ids), None
        if request.num_cached_tokens:
            state.pieces.skip(request.num_cached_tokens, {})
        return None

    def prefill_piece(self, request: StageRequest, budget: int,
                      wait: bool) -> tuple[RunnerOutput | torch.Tensor, int]:
        """Feed the next piece of the request's prompt (at most ``budget`` tokens; its first chunk may have come
        while it was parked): its first code's logits [vocab] once the whole prompt is in, else the output to return
        now; and the tokens fed."""
        state = self._state(request)
        if state.pieces is None:
            waiting = self._start(request, state)
            if waiting is not None:
                return waiting, 0
        pieces = state.pieces
        assert pieces is not None  # set by _start, cleared once the request is prefilled
        out, tokens = self.feed_piece(request, pieces, budget, lambda piece: self.model.model(**piece,
                                                                                              **self.kv.step_inputs()))
        if out is None:
            return RunnerOutput(request.request_id, status=RequestStatus.PREFILLING), tokens
        state.last_position = pieces.position_ids[:, 0, -1]
        state.last_hidden = out.last_hidden_state[0, -1]
        state.pieces = None
        return self.model.codec_head(out.last_hidden_state[0, -1]), tokens

    # ------------------------------------------------------------------------------------------------- steps
    def _project_texts(self, texts: list[tuple[torch.Tensor, bool]]) -> torch.Tensor:
        """The steps' text embeddings [rows, hidden]: the thinker's tokens projected together, the others as they
        are."""
        rows = [text for text, _ in texts]
        raw = [i for i, (_, projected) in enumerate(texts) if not projected]
        if raw:
            projected = self.model.text_projection(torch.stack([rows[i] for i in raw]).to(self.device, self.dtype))
            for i, row in zip(raw, projected, strict=True):
                rows[i] = row
        return torch.stack(rows)

    def decode_input(self, request: StageRequest) -> Any:
        """The text the request's next step adds (``_text_embedding``), or that it waits for the thinker's."""
        text = self._text_embedding(self._state(request))
        return RunnerOutput(request.request_id, status=RequestStatus.WAITING_FOR_CHUNK) if text is None else text

    def decode(self, rows: list[StageRequest], inputs: list[Any]) -> tuple[torch.Tensor, list[Any]]:
        """One step for every request of ``rows``: the residual codes of each one's last code, then one talker
        forward. Returns the logits of each one's next code [rows, vocab] and the frames just completed (each
        row's [groups])."""
        batch, texts = rows, inputs
        states: list[Qwen3TalkerState] = [request.runner_state for request in batch]
        codes = torch.tensor([state.generated[-1] for state in states], device=self.device)
        code_embeds = self.model.get_input_embeddings()(codes)[:, None]
        last_hidden, last_positions = [], []
        for state in states:  # both set when the request's prompt went in
            assert state.last_hidden is not None and state.last_position is not None
            last_hidden.append(state.last_hidden)
            last_positions.append(state.last_position)
        talker_hidden = torch.stack(last_hidden)[:, None]
        sampling_rows = self.predictor.rows([state.sampling.greedy for state in states],
                                            [state.generator for state in states])
        residuals, frame_embeds = self.predictor(talker_hidden, code_embeds, sampling_rows)
        inputs_embeds = frame_embeds + self._project_texts(texts)[:, None]
        positions = torch.stack([position + 1 for position in last_positions], dim=1)  # [4, rows]
        self.kv.bind([request.request_id for request in batch], 1)
        out = self.model.model(inputs_embeds=inputs_embeds, position_ids=positions[:, :, None],
                               **self.kv.step_inputs())
        hidden = out.last_hidden_state[:, -1]
        for row, state in enumerate(states):
            state.step += 1
            state.last_position = positions[:, row]
            state.last_hidden = hidden[row]
        frames = torch.cat((codes[:, None], residuals), dim=1).cpu()
        return self.model.codec_head(hidden), list(frames)

    def emit(self, request: StageRequest, code: int, logits: torch.Tensor, frame: Any) -> RunnerOutput:
        """The frame completed this step (none after the prefill), and whether ``code`` ends the request."""
        state: Qwen3TalkerState = request.runner_state
        state.generated.append(code)
        reason = "stop" if code == self.eos else "length" if len(state.generated) >= state.max_tokens else None
        if frame is None:
            return RunnerOutput.decoded(request.request_id, reason)
        return RunnerOutput.decoded(request.request_id, reason, data={"frames": frame.long().numpy()[:, None]},
                                    num_units=1)

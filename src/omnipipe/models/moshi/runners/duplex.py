"""The Moshi duplex stage: a request is a live session. Every step takes one frame of the user's audio (80 ms: 8
Mimi codes) and gives one text token of Moshi's inner monologue (a text delta) and one frame of Moshi's own speech
(8 codes, to the Mimi decoder stage through the frame edge), as ``modeling/columns.py`` lays them out.

A session starts with its prefill: the unconditional column, after a prompt's columns when it has one, whose last
position gives the first text token (before any user audio). Each step then, for every session whose next user
frame is there, together: the depth decoder's codes from each one's last hidden state and text token
(``modeling/depth.py``), then one forward of the temporal transformer over the stage's paged KV cache
(``stage/batched_decoder.py``), each row at its own position (its column). A session whose next user frame has not
arrived waits outside the batch (``WAITING_FOR_CHUNK``) and is woken when it comes (``stage/live_audio.py``).

The user's frames come from (a request item's key, one of): ``stream`` (the id of a live stream appended to with
``AsyncOmni.append_audio``, 16 kHz; the session ends when the stream is dropped or its session ended), ``audio`` (a
16 kHz clip given whole, heard as if streamed), ``user_codes`` ([K, N] Mimi codes) or ``silence`` (true:
transformers' ``generate`` after its prompt, the codes of one frame of zeros every step, until ``max_tokens``).
``prompt`` (optional): ``{"text": [T] ids, "moshi_codes": [K, T], "user_codes": [K, T]}`` frames the session starts
from, as ``generate``'s ``input_ids``, ``moshi_audio_codes`` and ``user_audio_codes``.

A session ends when its user's frames end (``finish_reason`` "stop") or after ``max_tokens`` user frames ("length");
then one more depth call completes Moshi's last frame. N user frames give N + 1 text tokens and N Moshi frames
(N x 1920 samples at 24 kHz: the user's duration).

Stage options: ``MoshiDuplexOptions`` (``options.py``). SamplingParams (``stage/sampling.py``): temperature, top-k,
top-p, seed, the penalties and ``max_tokens`` (user frames) apply to the text; each the caller leaves out is the
checkpoint's (``weights/load.model_sampling``). Moshi's audio codes are greedy for a greedy request, else sampled as
the checkpoint's depth decoder config says, from the request's generator. ``stop`` is refused."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import torch

from omnipipe.models.mimi.modeling.stream import MimiEncodeStream, check_codes
from omnipipe.models.moshi.modeling.columns import ColumnEmbedder, Layout, delayed
from omnipipe.models.moshi.modeling.depth import BatchedDepthDecoder
from omnipipe.models.moshi.modeling.user_audio import INPUT_RATE_HZ, HeardAudio, UserFrames, silence_codes
from omnipipe.models.moshi.options import MoshiDuplexOptions
from omnipipe.models.moshi.pipeline import FRAME_RATE_HZ
from omnipipe.models.moshi.weights.load import load_config, load_model, load_tokenizer, model_sampling
from omnipipe.stage.batched_decoder import BatchedDecoderRunner, DecodeState
from omnipipe.stage.checkpoint_options import checked_options, compile_if
from omnipipe.stage.live_audio import LiveAudioRunner, LiveStreams
from omnipipe.stage.prompt_pieces import PromptPieces
from omnipipe.stage.request import RequestStatus, StageRequest
from omnipipe.stage.runner import RunnerOutput
from omnipipe.stage.sampling import TokenSamplingParams, given_params
from omnipipe.stage.streaming_audio import AUDIO_FIELD
from omnipipe.stage.text_stream import TextStream
from omnipipe.util.field_error import FieldError

# the text tokens Kyutai's models write between words (``existing_text_padding_id``, ``end_of_text_padding_id`` in
# Kyutai's LM config): the inner monologue is mostly these; they are never text
TEXT_PADDING_IDS = (3, 0)
SOURCES = ("stream", "audio", "user_codes", "silence")


@dataclass
class MoshiDuplexState(DecodeState):
    """A session: its user's frames, its text, and where its columns stand (``generated``: its text tokens)."""

    user: UserFrames = field(kw_only=True)
    stream: TextStream = field(kw_only=True)
    prompt: PromptPieces | None = None  # its first columns, while they are prefilled
    hidden: torch.Tensor | None = None  # [hidden]: the last column's hidden state (the depth decoder reads it)
    user_previous: torch.Tensor | None = None  # [K]: the user's last frame (its acoustic codes go in the next column)
    acoustics: torch.Tensor | None = None  # [K - 1]: the prompt's last frame's acoustic codes, for the first step
    semantic: torch.Tensor | None = None  # []: the semantic code of the frame the next step completes (None: none)
    frames: int = 0  # user frames taken (steps)
    # the next user frame, taken from its source and not yet fed: it survives a failed step's restore (its source
    # cannot give it again), so ``snapshot`` leaves it out
    pending: torch.Tensor | None = None

    def snapshot(self) -> dict[str, Any]:
        saved = super().snapshot()
        del saved["pending"]
        return saved


class MoshiDuplexRunner(LiveAudioRunner, BatchedDecoderRunner):
    options: MoshiDuplexOptions

    def load(self) -> None:
        self.options, directory, dtype = checked_options(self.context, MoshiDuplexOptions)
        self.device = self.context.device
        config = load_config(directory)
        self.model = load_model(directory, self.device, dtype)
        self.decoder: torch.nn.Module = self.model.decoder.model
        compile_if(self.decoder, self.options.torch_compile)
        self.lm_head = self.model.decoder.lm_head
        self.layout = Layout.of(config)
        self.embed = ColumnEmbedder(self.model)
        self.text_sampling, audio_sampling = model_sampling(directory)
        self.depth = BatchedDepthDecoder(self.model.depth_decoder, audio_sampling)
        self.tokenizer = load_tokenizer(directory)
        self.silent_ids = {*TEXT_PADDING_IDS, *self.tokenizer.all_special_ids, self.layout.initial_text}
        self.mimi = self.model.audio_encoder
        self.silence = silence_codes(self.mimi, self.layout.codebooks).to(self.device)
        # the columns the temporal transformer attends over: the released cache is a sliding window of 3000; a
        # session never outgrows it, so every step sees all of its past as the model does
        self.max_columns = int(config.sliding_window or config.max_position_embeddings)
        self.max_audio_streams = self.options.audio_streams
        self.max_audio_stream_s = self.max_columns / FRAME_RATE_HZ
        self.streams = LiveStreams(lambda: HeardAudio(MimiEncodeStream(self.mimi, self.layout.codebooks)),
                                   self.max_audio_streams, int(self.max_audio_stream_s * INPUT_RATE_HZ))
        self.make_kv_cache(config, self.options, dtype, 0, self.decoder)

    def validate(self, params: dict[str, Any]) -> str | None:
        if params.get("stop"):
            raise FieldError("sampling_params.stop", "a Moshi session ends with its user's audio: it takes no stop "
                             "strings")
        return None

    # ------------------------------------------------------------------------------------------------ prefill
    def _user_frames(self, request: StageRequest, item: dict[str, Any]) -> UserFrames:
        given = [key for key in SOURCES if item.get(key) is not None and item.get(key) is not False]
        if len(given) != 1:
            raise FieldError(AUDIO_FIELD, "give the user's audio: one live stream or one clip")
        if "stream" in given:
            return UserFrames(audio=self.streams.claim(request.request_id, str(item["stream"])))
        if "audio" in given:
            heard = HeardAudio(MimiEncodeStream(self.mimi, self.layout.codebooks))
            heard.append(np.asarray(item["audio"], dtype=np.float32).reshape(-1))
            heard.close()
            return UserFrames(audio=heard)
        if "user_codes" in given:
            codes = check_codes(item["user_codes"], self.mimi.config, self.layout.codebooks, "user_codes")
            return UserFrames(codes=codes.to(self.device))
        return UserFrames(silence=self.silence)

    def _prompt(self, item: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The prompt's text [T], Moshi's codes and the user's [K, T] (T may be 0)."""
        prompt = item.get("prompt") or {}
        codebooks, config = self.layout.codebooks, self.mimi.config
        text = torch.as_tensor(np.asarray(prompt.get("text", []), dtype=np.int64)).reshape(-1)
        if text.numel() and (int(text.min()) < 0 or int(text.max()) >= self.layout.initial_text):
            raise FieldError("prompt.text", f"token ids must be in [0, {self.layout.initial_text})")
        empty = np.zeros((codebooks, 0), dtype=np.int64)
        moshi = check_codes(np.asarray(prompt.get("moshi_codes", empty)), config, codebooks, "prompt.moshi_codes")
        user = check_codes(np.asarray(prompt.get("user_codes", empty)), config, codebooks, "prompt.user_codes")
        if not text.shape[0] == moshi.shape[1] == user.shape[1]:
            raise FieldError("prompt", f"its text ({text.shape[0]}), Moshi's codes ({moshi.shape[1]}) and the "
                             f"user's ({user.shape[1]}) must have as many frames")
        return text.to(self.device), moshi.to(self.device), user.to(self.device)

    def _start(self, request: StageRequest) -> RunnerOutput | None:
        """The session's first columns built and its KV reserved; else the output to return now."""
        item = request.inputs[0] if request.inputs else {}
        try:
            text, moshi, user = self._prompt(item)
            columns = text.shape[0] + 1
            most = self.max_columns - columns
            max_tokens = int(given_params(request.params).get("max_tokens") or self.options.max_frames or most)
            if max_tokens > most:
                raise FieldError("sampling_params.max_tokens", f"a session of {columns} prompt column(s) takes at "
                                 f"most {most} user frames (the model's window of {self.max_columns}), got "
                                 f"{max_tokens}")
            frames = self._user_frames(request, item)
        except FieldError as error:
            return RunnerOutput.failed(request.request_id, error.rule, error.field)
        waiting = self.reserve(request, columns + max_tokens)
        if waiting is not None:
            if waiting.status is not RequestStatus.WAITING_FOR_MEMORY:
                self.streams.release(request.request_id)
            return waiting
        request.take_all_inputs()
        request.num_prompt_tokens = columns
        text_columns, moshi_columns, user_columns = self.layout.prompt_columns(text, moshi, user)
        embeds = self.embed(text_columns[None], moshi_columns[None], user_columns[None])
        pieces = PromptPieces(embeds, torch.arange(columns, device=self.device)[None])
        initial = self.layout.initial_frame(self.device)
        sampling = TokenSamplingParams.from_params(request.params, self.text_sampling)
        request.runner_state = MoshiDuplexState(
            sampling, sampling.make_generator(), max_tokens, user=frames,
            stream=TextStream(self._decode_ids), prompt=pieces,
            user_previous=user[:, -1] if user.shape[1] else initial,
            acoustics=(moshi[:, -1] if moshi.shape[1] else initial)[1:])
        return None

    def prefill_piece(self, request: StageRequest, budget: int,
                      wait: bool) -> tuple[RunnerOutput | torch.Tensor, int]:
        """Feed the next piece of the session's first columns (at most ``budget``): the first text token's logits
        [vocab] once they are all in, else the output to return now; and the columns fed."""
        if request.runner_state is None:
            failed = self._start(request)
            if failed is not None:
                return failed, 0
        state: MoshiDuplexState = request.runner_state
        pieces = state.prompt
        assert pieces is not None  # set by _start, cleared once the session is prefilled
        out, tokens = self.feed_piece(request, pieces, budget, lambda piece: self.decoder(**piece,
                                                                                          **self.kv.step_inputs()))
        if out is None:
            return RunnerOutput(request.request_id, status=RequestStatus.PREFILLING), tokens
        state.prompt = None
        state.hidden = out.last_hidden_state[0, -1]
        return self.lm_head(state.hidden), tokens

    # ------------------------------------------------------------------------------------------------- steps
    def _decode_ids(self, ids: list[int]) -> str:
        # a flat list of ids decodes to one string (transformers types the result str | list[str] for both forms)
        return cast(str, self.tokenizer.decode(ids, skip_special_tokens=True))

    def decode_input(self, request: StageRequest) -> Any:
        """The session's next user frame [K] (taken from its source once), or the output that ends it (its frames
        ended, or ``max_tokens`` of them were taken) or parks it until the frame comes."""
        state: MoshiDuplexState = request.runner_state
        if state.pending is None:
            if state.user.error is not None:
                return RunnerOutput.failed(request.request_id, state.user.error, AUDIO_FIELD)
            if state.frames >= state.max_tokens:
                return self._last_frame(request, "length")
            if state.user.ready:
                state.pending = state.user.next()
            elif state.user.ended:
                return self._last_frame(request, "stop")
            else:
                return RunnerOutput(request.request_id, status=RequestStatus.WAITING_FOR_CHUNK)
        return state.pending

    def _depth_rows(self, states: list[MoshiDuplexState]) -> list[Any]:
        return self.depth.rows([state.sampling.greedy for state in states], [state.generator for state in states])

    def decode(self, rows: list[StageRequest], inputs: list[Any]) -> tuple[torch.Tensor, list[Any]]:
        """One step for every session of ``rows``: Moshi's column from the depth decoder, the user's from its new
        frame, then one temporal forward. Returns the next text tokens' logits [rows, vocab] and the Moshi frame
        each step completed (codes [K], or None on a session's first step, which completes the prompt's last
        frame)."""
        states: list[MoshiDuplexState] = [request.runner_state for request in rows]
        hidden, previous = [], []
        for state in states:  # both set by the prefill and every step
            assert state.hidden is not None and state.user_previous is not None
            hidden.append(state.hidden)
            previous.append(state.user_previous)
        text = torch.tensor([state.generated[-1] for state in states], device=self.device)
        moshi = self.depth(torch.stack(hidden), text, self._depth_rows(states))
        for row, state in enumerate(states):
            if state.acoustics is not None:  # the first step: the frame it completes is the prompt's own
                moshi[row, 1:] = state.acoustics
        user = torch.stack(inputs).to(self.device)
        embeds = self.embed(text[:, None], moshi[:, :, None], delayed(torch.stack(previous), user, 1)[:, :, None])
        self.kv.bind([request.request_id for request in rows], 1)
        out = self.decoder(inputs_embeds=embeds, position_ids=self.kv.positions(), **self.kv.step_inputs())
        last = out.last_hidden_state[:, -1]
        frames: list[Any] = []
        for row, state in enumerate(states):
            frames.append(None if state.semantic is None else torch.cat([state.semantic[None], moshi[row, 1:]]))
            state.hidden, state.user_previous, state.semantic = last[row], user[row], moshi[row, 0]
            state.acoustics, state.pending = None, None
            state.frames += 1
        return self.lm_head(last), frames

    def _last_frame(self, request: StageRequest, reason: str) -> RunnerOutput:
        """The session's end: one more depth call completes Moshi's last frame (as ``generate`` does after its
        loop); the text held back goes out."""
        state: MoshiDuplexState = request.runner_state
        frame = None
        if state.semantic is not None:
            assert state.hidden is not None
            text = torch.tensor([state.generated[-1]], device=self.device)
            codes = self.depth(state.hidden[None], text, self._depth_rows([state]))[0]
            frame = torch.cat([state.semantic[None], codes[1:]])
            state.semantic = None
        delta, _ = state.stream.finish()
        return RunnerOutput.decoded(request.request_id, reason, text_delta=delta, **self._frame_fields(frame))

    @staticmethod
    def _frame_fields(frame: torch.Tensor | None) -> dict[str, Any]:
        if frame is None:
            return {}
        return {"data": {"frames": frame.cpu().numpy().astype(np.int64)[:, None]}, "num_units": 1,
                "playback_s": 1 / FRAME_RATE_HZ}

    def emit(self, request: StageRequest, token: int, logits: torch.Tensor, extra: Any) -> RunnerOutput:
        """The step's text token (a delta when it is text) and the Moshi frame it completed, if any."""
        state: MoshiDuplexState = request.runner_state
        state.generated.append(token)
        delta = "" if token in self.silent_ids else state.stream.push(token)[0]
        fields = self._frame_fields(extra)
        fields["data"] = {**fields.get("data", {}), "token": token}
        return RunnerOutput.decoded(request.request_id, None, text_delta=delta, **fields)

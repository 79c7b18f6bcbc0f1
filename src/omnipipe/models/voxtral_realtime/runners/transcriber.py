"""The Voxtral Realtime transcriber stage: one clip in, its transcript out; or a live stream in, its transcript
streamed as the audio comes.

Voxtral Realtime reads one audio token (80 ms: 8 mel frames, 4 encoder frames stacked and projected) at every
position, the prompt's included: a position's input is its text token's embedding plus that audio embedding, and its
output the text of the audio heard ``num_delay_tokens`` (480 ms) earlier. So a clip of N audio tokens (with
mistral-common's offline padding: ``prompting.py``) gives N - len(prompt) text tokens, then the transcript ends.

A clip's prompt is made on a background thread (its log-mel frames). At its prefill the causal encoder runs over
the whole clip (its convolutions once, its sliding-window attention ``ENCODER_CHUNK_TOKENS`` at a time over a KV
cache, as ``generate`` steps it), giving every position's audio embedding; then the prompt is fed in pieces between
the others' decode steps. Every decoding request steps in one forward of the language model
(``stage/batched_decoder.py``: one paged KV cache, each row its own length), each row's audio embedding at its own
position added to its last token's, the ada-RMSNorm's time conditioning (the delay's) shared. The language model's
sliding window (``text_config.sliding_window``) is applied to the paged cache's mask.

A live session (a request item ``{"stream": id}``, the stream appended to with ``AsyncOmni.append_audio`` before
and while it runs, and ended by ``AsyncOmni.drop_audio_stream`` or the end of its session: ``stage/live_audio.py``)
hears its stream token by token (``streaming.py``: the log-mel frames once their windows are heard, the encoder one
token at a time). Its prefill waits (``WAITING_FOR_CHUNK``) until the prompt's positions have their audio (the left
silence and the clip's first 560 ms), then each step waits for its position's audio; the stream's end adds the
offline right padding, so the transcript runs to the same last position as the whole clip's, and equals it (to the
encoder's float rounding: ``streaming.py``).

Stage options: ``VoxtralRealtimeOptions`` (``options.py``: a batched decoder's, the live streams kept and their
length; no paged attention kernel: it would not apply the sliding window). SamplingParams (``stage/sampling.py``):
temperature, top-k, top-p, seed, the penalties, ``max_tokens`` (at most the clip's tokens; a live stream's:
``max_stream_s``), ``stop``. The last output carries the clip's duration in its details (``duration``, seconds), as
the transcription endpoint reports it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import torch

from omnipipe.models.voxtral.prompting import EOS
from omnipipe.models.voxtral_realtime.options import VoxtralRealtimeOptions
from omnipipe.models.voxtral_realtime.prompting import RealtimePrompts
from omnipipe.models.voxtral_realtime.streaming import AudioTokens, HeardClip
from omnipipe.models.voxtral_realtime.weights.load import load_config, load_model
from omnipipe.stage.batched_decoder import BatchedDecoderRunner, DecodeState
from omnipipe.stage.checkpoint_options import checked_options, compile_if
from omnipipe.stage.live_audio import INPUT_RATE_HZ, LiveAudioRunner, LiveStreams
from omnipipe.stage.prompt_pieces import PromptPieces
from omnipipe.stage.prompt_processing import BackgroundPrompts
from omnipipe.stage.request import RequestStatus, StageRequest
from omnipipe.stage.runner import RunnerOutput
from omnipipe.stage.sampling import TokenSamplingParams, given_params
from omnipipe.stage.streaming_audio import AUDIO_FIELD
from omnipipe.stage.text_stream import TextStream
from omnipipe.util.field_error import FieldError

# audio tokens the encoder's attention takes at once (x4 encoder frames): a long clip is encoded in chunks over the
# encoder's sliding-window KV cache, so its activations stay bounded whatever the clip's length
ENCODER_CHUNK_TOKENS = 64


@dataclass
class RealtimeState(DecodeState):
    stream: TextStream = field(kw_only=True)
    audio: AudioTokens = field(kw_only=True)  # every position's audio embedding (a live stream's as it comes)
    prompt_tokens: int = field(kw_only=True)
    position: int = 0  # positions fed so far
    prompt: PromptPieces | None = None  # while its prefill is in pieces (None before, while its audio is awaited)


class VoxtralRealtimeRunner(LiveAudioRunner, BatchedDecoderRunner):
    options: VoxtralRealtimeOptions

    def load(self) -> None:
        self.options, directory, dtype = checked_options(self.context, VoxtralRealtimeOptions)
        if self.options.paged_attention is not None:
            raise FieldError(f"stages.{self.context.stage}.options.paged_attention",
                             "Voxtral Realtime's sliding-window attention runs on the model's own attention; leave "
                             "it unset")
        self.device = self.context.device
        config = load_config(directory)
        self.model = load_model(directory, self.device, dtype)
        self.decoder: torch.nn.Module = self.model.model.language_model
        compile_if(self.decoder, self.options.torch_compile)
        self.inputs = RealtimePrompts(directory, config)
        self.eos_ids = {self.inputs.ids[EOS]}
        self.window: int | None = config.text_config.sliding_window
        self.frames_per_token = int(config.audio_length_per_tok)
        self.encoder_chunk = ENCODER_CHUNK_TOKENS * int(config.downsample_factor)  # encoder frames
        delay = torch.full((1,), self.inputs.num_delay_tokens, device=self.device, dtype=self.model.dtype)
        with torch.inference_mode():  # the delay's time conditioning, the same for every position and request
            self.t_cond = self.model.model.time_embedding(delay)[None]
        self.make_kv_cache(config.text_config, self.options, dtype, 0, self.decoder)
        self.prompts: BackgroundPrompts[dict[str, Any]] = BackgroundPrompts(self._process)
        # live streams: as long as the option says and the language model's positions hold with the padding
        geometry = self.inputs.geometry
        padding = geometry.left_pad_tokens + geometry.right_pad_tokens + 1
        positions = int(config.text_config.max_position_embeddings)
        stream_tokens = min(int(self.options.max_stream_s * INPUT_RATE_HZ) // geometry.samples_per_token,
                            positions - padding)
        self.max_stream_positions = stream_tokens + padding
        live = self.inputs.feature_extractor.global_log_mel_max is not None  # else frames need the whole clip
        self.max_audio_streams = self.options.audio_streams if live else 0
        self.max_audio_stream_s = stream_tokens * geometry.samples_per_token / INPUT_RATE_HZ
        self.streams = LiveStreams(lambda: HeardClip(self.inputs, self.model), self.max_audio_streams,
                                   stream_tokens * geometry.samples_per_token)

    def close(self) -> None:
        self.prompts.close()

    # ------------------------------------------------------------------------------------- inputs, off the loop
    def admit(self, request: StageRequest) -> None:
        if not self._live_item(request):  # a live stream is heard on the stage loop, not processed ahead
            self.prompts.start(request)

    @staticmethod
    def _live_item(request: StageRequest) -> dict[str, Any] | None:
        item = request.inputs[0] if request.inputs else None
        return item if isinstance(item, dict) and item.get("stream") is not None else None

    def _process(self, request: StageRequest) -> dict[str, Any]:
        """A request's clip -> its prompt ids and log-mel frames (on the CPU), and the clip's length."""
        item = request.inputs[0] if request.inputs else {}
        samples = item.get("audio")
        if not isinstance(samples, np.ndarray) or samples.ndim != 1 or not samples.size:
            raise FieldError("prompt.multi_modal_data.audio", "give one clip of mono samples")
        try:
            processed: dict[str, Any] = dict(self.inputs(samples))
        except (ValueError, RuntimeError) as exc:
            raise FieldError("prompt.multi_modal_data.audio", f"cannot be processed: {exc}") from None
        processed["clip_s"] = len(samples) / self.inputs.sample_rate_hz
        return processed

    # ------------------------------------------------------------------------------------------------ prefill
    def encode(self, features: torch.Tensor) -> torch.Tensor:
        """Every audio token's embedding [N, D] of log-mel frames [1, mel bins, 8 N]: the causal convolutions over
        the whole clip, the encoder's attention a chunk at a time over its sliding-window KV cache."""
        from transformers import DynamicCache

        model = self.model.model
        frames = model.audio_tower.embedder(features.to(self.device, self.model.dtype))
        cache = DynamicCache(config=model.audio_tower.config)
        chunks = [model.get_audio_features(encoder_inputs_embeds=frames[:, start:start + self.encoder_chunk],
                                           past_key_values=cache, use_cache=True).pooler_output[0]
                  for start in range(0, frames.shape[1], self.encoder_chunk)]
        return torch.cat(chunks)

    def _start(self, request: StageRequest, processed: dict[str, Any]) -> RunnerOutput | None:
        """Reserve the request's KV, encode its clip and build its prompt's pieces; an output when it must wait or
        fail."""
        features: torch.Tensor = processed["input_features"]
        audio_tokens = -(-int(features.shape[-1]) // self.frames_per_token)
        waiting, max_tokens = self._reserve(request, audio_tokens)
        if waiting is not None:
            return waiting
        self.prompts.forget(request)
        request.take_all_inputs()
        self._new_state(request, AudioTokens(self.encode(features), processed["clip_s"]), max_tokens)
        return None

    def _start_live(self, request: StageRequest, item: dict[str, Any]) -> RunnerOutput | None:
        """Claim the session's stream and reserve its KV (for the longest stream the stage takes, or its
        ``max_tokens``); an output when it must wait or fail."""
        try:
            heard: HeardClip = self.streams.claim(request.request_id, str(item["stream"]))
        except FieldError as error:
            return RunnerOutput.failed(request.request_id, error.rule, error.field)
        waiting, max_tokens = self._reserve(request, self.max_stream_positions)
        if waiting is not None:
            if waiting.status is not RequestStatus.WAITING_FOR_MEMORY:
                self.streams.release(request.request_id)
            return waiting
        request.take_all_inputs()
        self._new_state(request, heard, max_tokens)
        return None

    def _reserve(self, request: StageRequest, audio_tokens: int) -> tuple[RunnerOutput | None, int]:
        """Reserve the KV of the prompt and the text tokens of ``audio_tokens`` positions (one a position after
        the prompt's last, to the audio's end), or fewer by ``max_tokens``: the output when it must wait or fail,
        and the request's cap in tokens."""
        prompt_tokens = int(self.inputs.input_ids().shape[1])
        most = audio_tokens - prompt_tokens
        max_tokens = min(most, int(given_params(request.params).get("max_tokens", most)))
        return self.reserve(request, prompt_tokens + max_tokens), max_tokens

    def _new_state(self, request: StageRequest, audio: AudioTokens, max_tokens: int) -> None:
        request.num_prompt_tokens = prompt_tokens = int(self.inputs.input_ids().shape[1])
        sampling = TokenSamplingParams.from_params(request.params)
        stream = TextStream(self._decode_ids, request.params.get("stop") or [])
        request.runner_state = RealtimeState(sampling, sampling.make_generator(), max_tokens, stream=stream,
                                             audio=audio, prompt_tokens=prompt_tokens)

    def _prompt_pieces(self, request: StageRequest) -> RunnerOutput | None:
        """The request's prompt embeddings in pieces once its positions' audio is there; else the output that
        parks it until it comes, or fails it."""
        state: RealtimeState = request.runner_state
        audio, prompt_tokens = state.audio, state.prompt_tokens
        if audio.error is not None:
            return RunnerOutput.failed(request.request_id, audio.error, AUDIO_FIELD)
        if audio.closed and not audio.clip_s:
            return RunnerOutput.failed(request.request_id, "the stream ended before any audio was appended to it",
                                       AUDIO_FIELD)
        if audio.ready < prompt_tokens:
            return RunnerOutput(request.request_id, status=RequestStatus.WAITING_FOR_CHUNK)
        ids = self.inputs.input_ids().to(self.device)
        embeds = self.model.get_input_embeddings()(ids) + torch.stack(audio.embeddings[:prompt_tokens])[None]
        state.prompt = PromptPieces(embeds, torch.arange(prompt_tokens, device=self.device)[None])
        return None

    def _forward(self, inputs_embeds: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """The language model over the bound rows (``self.kv.bind`` first): last hidden states [rows, T, D]."""
        inputs = self.kv.step_inputs()
        if self.window is not None:  # the sliding window: a key ``window`` or more positions back is not seen
            mask = inputs["attention_mask"]
            keys = torch.arange(mask.shape[-1], device=self.device).view(1, 1, -1)
            old = keys <= self.kv.positions()[:, :, None] - self.window
            inputs["attention_mask"] = mask.masked_fill(old[:, None], torch.finfo(mask.dtype).min)
        out = self.decoder(inputs_embeds=inputs_embeds, position_ids=position_ids, t_cond=self.t_cond, **inputs)
        return cast(torch.Tensor, out.last_hidden_state)

    def prefill_piece(self, request: StageRequest, budget: int,
                      wait: bool) -> tuple[RunnerOutput | torch.Tensor, int]:
        """Feed the next piece of the request's prompt (at most ``budget`` tokens; its processing waited for if
        ``wait``): the last position's logits once the whole prompt is in, else the output to return now; and the
        tokens fed."""
        if request.runner_state is None:
            live = self._live_item(request)
            if live is not None:
                waiting = self._start_live(request, live)
            else:
                processed = self.prompts.result(request, wait)
                if isinstance(processed, RunnerOutput):  # still being made, or the caller's input refused
                    return processed, 0
                waiting = self._start(request, processed)
            if waiting is not None:
                return waiting, 0
        state: RealtimeState = request.runner_state
        if state.prompt is None:  # its positions' audio awaited (a live stream's first 560 ms)
            waiting = self._prompt_pieces(request)
            if waiting is not None:
                return waiting, 0
        pieces = state.prompt
        assert pieces is not None  # set above, cleared once the request is prefilled
        hidden, tokens = self.feed_piece(request, pieces, budget,
                                         lambda piece: self._forward(piece["inputs_embeds"], piece["position_ids"]))
        state.position += tokens
        if hidden is None:
            return RunnerOutput(request.request_id, status=RequestStatus.PREFILLING), tokens
        state.prompt = None
        return self.model.lm_head(hidden[0, -1]), tokens

    # ------------------------------------------------------------------------------------------------- steps
    def _decode_ids(self, ids: list[int]) -> str:
        # a flat list of ids decodes to one string (transformers types the result str | list[str] for both forms)
        return cast(str, self.inputs.tokenizer.decode(ids, skip_special_tokens=True))

    def decode_input(self, request: StageRequest) -> Any:
        """None when the request's next position has its audio; else the output that parks it until its stream
        gives it, ends it (the stream ended: the whole clip's last position is past), or fails it."""
        state: RealtimeState = request.runner_state
        audio = state.audio
        if audio.error is not None:
            return RunnerOutput.failed(request.request_id, audio.error, AUDIO_FIELD)
        if audio.total is not None and state.position + 1 >= audio.total:
            # what emit does once the total is known: the last token came from the last position but one
            delta, units = state.stream.finish()
            return RunnerOutput.decoded(request.request_id, "stop", text_delta=delta,
                                        details={"duration": audio.clip_s}, num_units=units)
        if audio.ready > state.position:
            return None
        return RunnerOutput(request.request_id, status=RequestStatus.WAITING_FOR_CHUNK)

    def decode(self, rows: list[StageRequest], inputs: list[Any]) -> tuple[torch.Tensor, list[Any]]:
        """One forward for every request of ``rows``: each one's last token plus its audio at its own next
        position."""
        self.kv.bind([request.request_id for request in rows], 1)
        states: list[RealtimeState] = [request.runner_state for request in rows]
        tokens = torch.tensor([[state.generated[-1]] for state in states], device=self.device)
        audio = torch.stack([state.audio.embeddings[state.position] for state in states])[:, None]
        for state in states:
            state.position += 1
        hidden = self._forward(self.model.get_input_embeddings()(tokens) + audio, self.kv.positions())
        return self.model.lm_head(hidden[:, -1]), [None] * len(rows)

    def emit(self, request: StageRequest, token: int, logits: torch.Tensor, extra: Any) -> RunnerOutput:
        state: RealtimeState = request.runner_state
        state.generated.append(token)
        stream = state.stream
        stopped = token in self.eos_ids  # the end token is no text
        delta, units = ("", 0) if stopped else stream.push(token)
        stopped = stopped or stream.stopped
        total = state.audio.total  # None while a live stream goes on
        heard_all = total is not None and state.position + 1 >= total  # its next position would be past the audio
        done = stopped or heard_all or len(state.generated) >= state.max_tokens
        details = None
        if done:
            more, rest = stream.finish()
            delta, units = delta + more, units + rest
            stopped = stopped or stream.stopped or heard_all
            details = {"duration": state.audio.clip_s}
        reason = ("stop" if stopped else "length") if done else None
        return RunnerOutput.decoded(request.request_id, reason, text_delta=delta, data={"token": token},
                                    details=details, num_units=units)

    def free(self, request: StageRequest) -> None:
        self.prompts.forget(request)
        super().free(request)

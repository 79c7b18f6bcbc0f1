"""The Voxtral Realtime transcriber stage: one clip in, its transcript out.

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

Stage options: ``DecoderCheckpointOptions`` (``stage/checkpoint_options.py``; no paged attention kernel: it would
not apply the sliding window). SamplingParams (``stage/sampling.py``): temperature, top-k, top-p, seed, the
penalties, ``max_tokens`` (at most the clip's tokens), ``stop``. The last output carries the clip's duration in its
details (``duration``, seconds), as the transcription endpoint reports it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import torch

from omnipipe.models.voxtral.prompting import EOS
from omnipipe.models.voxtral_realtime.prompting import RealtimePrompts
from omnipipe.models.voxtral_realtime.weights.load import load_config, load_model
from omnipipe.stage.batched_decoder import BatchedDecoderRunner, DecodeState
from omnipipe.stage.checkpoint_options import DecoderCheckpointOptions, checked_options, compile_if
from omnipipe.stage.prompt_pieces import PromptPieces
from omnipipe.stage.prompt_processing import BackgroundPrompts
from omnipipe.stage.request import RequestStatus, StageRequest
from omnipipe.stage.runner import RunnerOutput
from omnipipe.stage.sampling import TokenSamplingParams, given_params
from omnipipe.stage.text_stream import TextStream
from omnipipe.util.field_error import FieldError

# audio tokens the encoder's attention takes at once (x4 encoder frames): a long clip is encoded in chunks over the
# encoder's sliding-window KV cache, so its activations stay bounded whatever the clip's length
ENCODER_CHUNK_TOKENS = 64


@dataclass
class RealtimeState(DecodeState):
    stream: TextStream = field(kw_only=True)
    audio: torch.Tensor = field(kw_only=True)  # every position's audio embedding [N, D]
    clip_s: float = field(kw_only=True)
    position: int = 0  # positions fed so far
    prompt: PromptPieces | None = None  # while its prefill is in pieces


class VoxtralRealtimeRunner(BatchedDecoderRunner):
    options: DecoderCheckpointOptions

    def load(self) -> None:
        self.options, directory, dtype = checked_options(self.context, DecoderCheckpointOptions)
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

    def close(self) -> None:
        self.prompts.close()

    # ------------------------------------------------------------------------------------- inputs, off the loop
    def admit(self, request: StageRequest) -> None:
        self.prompts.start(request)

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
        ids: torch.Tensor = processed["input_ids"]
        features: torch.Tensor = processed["input_features"]
        prompt_tokens = int(ids.shape[1])
        audio_tokens = -(-int(features.shape[-1]) // self.frames_per_token)
        most = audio_tokens - prompt_tokens  # one text token a position after the prompt's last, to the audio's end
        max_tokens = min(most, int(given_params(request.params).get("max_tokens", most)))
        waiting = self.reserve(request, prompt_tokens + max_tokens)
        if waiting is not None:
            return waiting
        self.prompts.forget(request)
        request.take_all_inputs()
        request.num_prompt_tokens = prompt_tokens
        audio = self.encode(features)
        embeds = self.model.get_input_embeddings()(ids.to(self.device)) + audio[None, :prompt_tokens]
        pieces = PromptPieces(embeds, torch.arange(prompt_tokens, device=self.device)[None])
        sampling = TokenSamplingParams.from_params(request.params)
        stream = TextStream(self._decode_ids, request.params.get("stop") or [])
        request.runner_state = RealtimeState(sampling, sampling.make_generator(), max_tokens, stream=stream,
                                             audio=audio, clip_s=processed["clip_s"], prompt=pieces)
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
            processed = self.prompts.result(request, wait)
            if isinstance(processed, RunnerOutput):  # still being made, or the caller's input refused
                return processed, 0
            waiting = self._start(request, processed)
            if waiting is not None:
                return waiting, 0
        state: RealtimeState = request.runner_state
        pieces = state.prompt
        assert pieces is not None  # set by _start, cleared once the request is prefilled
        if budget < 1:
            return RunnerOutput(request.request_id, status=RequestStatus.PREFILLING), 0
        piece = pieces.next_piece(budget)
        tokens = int(piece["inputs_embeds"].shape[1])
        self.kv.bind([request.request_id], tokens)
        hidden = self._forward(piece["inputs_embeds"], piece["position_ids"])
        pieces.record(tokens, None)
        state.position += tokens
        if pieces.remaining:
            return RunnerOutput(request.request_id, status=RequestStatus.PREFILLING), tokens
        state.prompt = None
        request.prefilled = True
        return self.model.lm_head(hidden[0, -1]), tokens

    # ------------------------------------------------------------------------------------------------- steps
    def _decode_ids(self, ids: list[int]) -> str:
        # a flat list of ids decodes to one string (transformers types the result str | list[str] for both forms)
        return cast(str, self.inputs.tokenizer.decode(ids, skip_special_tokens=True))

    def decode(self, rows: list[StageRequest], inputs: list[Any]) -> tuple[torch.Tensor, list[Any]]:
        """One forward for every request of ``rows``: each one's last token plus its audio at its own next
        position."""
        self.kv.bind([request.request_id for request in rows], 1)
        states: list[RealtimeState] = [request.runner_state for request in rows]
        tokens = torch.tensor([[state.generated[-1]] for state in states], device=self.device)
        audio = torch.stack([state.audio[state.position] for state in states])[:, None]
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
        heard_all = state.position + 1 >= state.audio.shape[0]  # its next position would be past the audio
        done = stopped or heard_all or len(state.generated) >= state.max_tokens
        details = None
        if done:
            more, rest = stream.finish()
            delta, units = delta + more, units + rest
            stopped = stopped or stream.stopped or heard_all
            details = {"duration": state.clip_s}
        reason = ("stop" if stopped else "length") if done else None
        return RunnerOutput.decoded(request.request_id, reason, text_delta=delta, data={"token": token},
                                    details=details, num_units=units)

    def free(self, request: StageRequest) -> None:
        self.prompts.forget(request)
        super().free(request)

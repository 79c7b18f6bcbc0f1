"""The Voxtral thinker stage: text and audio in, text out (an answer about the audio, or its transcript).

Every decoding request of the stage steps in one forward of the Llama language model (``stage/batched_decoder.py``:
one paged KV cache, each row its own length and 1-D rope position). A prompt is processed on a background thread
from the moment it arrives (``prompting.py``: the prompt's ids, each clip's log-mel windows of 30 s). At its
prefill the audio encoder runs over the windows (one encoder row per window, ``ENCODER_WINDOWS_PER_CALL`` at a
time), each window's frames are stacked four by four and projected (the model's own ``get_audio_features``), and
the result is written over the ``[AUDIO]`` placeholders of the prompt's embeddings; then the prompt is fed
``prefill_chunk_tokens`` at a time between the others' decode steps (``stage/prompt_pieces.py``).

Prefix caching: a prompt's blocks are hashed by its tokens, its audio positions by the digest of the clips' log-mel
features (``kv_cache.prompt_keys``), so a clip asked about again shares its blocks; when the shared blocks cover
every audio position, the encoder does not run at all.

Stage options: ``VoxtralThinkerOptions`` (``options.py``). SamplingParams (``stage/sampling.py``): temperature,
top-k, top-p, seed, the penalties, ``max_tokens``, ``stop``. A transcription's last output carries the clip's
duration in its details (``duration``, seconds), as the transcription endpoint reports it; its language, when the
request names one (``SamplingParams.extra["language"]``, ``options.VoxtralTranscriptionParams``), goes into its
prompt."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import torch

from omnipipe.models.voxtral.options import VoxtralThinkerOptions
from omnipipe.models.voxtral.prompting import EOS, TRANSCRIBE_TASK, VoxtralPrompts
from omnipipe.models.voxtral.weights.load import load_config, load_model
from omnipipe.stage.batched_decoder import BatchedDecoderRunner, DecodeState
from omnipipe.stage.checkpoint_options import checked_options, compile_if
from omnipipe.stage.kv_cache import prompt_keys
from omnipipe.stage.prompt_pieces import PromptPieces
from omnipipe.stage.prompt_processing import BackgroundPrompts
from omnipipe.stage.request import RequestStatus, StageRequest
from omnipipe.stage.runner import RunnerOutput
from omnipipe.stage.sampling import TokenSamplingParams, given_params
from omnipipe.stage.text_stream import TextStream
from omnipipe.util.field_error import FieldError

# windows the audio encoder runs at once: a long clip (up to 40 min, 80 windows) is encoded in groups, so the
# encoder's activations stay bounded whatever the clip's length
ENCODER_WINDOWS_PER_CALL = 8


@dataclass
class VoxtralThinkerState(DecodeState):
    stream: TextStream = field(kw_only=True)
    prompt: PromptPieces | None = None  # while its prefill is in pieces
    clip_s: float | None = None  # a transcription's clip, in seconds


class VoxtralThinkerRunner(BatchedDecoderRunner):
    options: VoxtralThinkerOptions

    def load(self) -> None:
        self.options, directory, dtype = checked_options(self.context, VoxtralThinkerOptions)
        self.device = self.context.device
        config = load_config(directory)
        self.model = load_model(directory, self.device, dtype)
        self.decoder: torch.nn.Module = self.model.model.language_model
        compile_if(self.decoder, self.options.torch_compile)
        self.inputs = VoxtralPrompts(directory, config)
        self.audio_token_id = int(config.audio_token_id)
        self.eos_ids = {self.inputs.ids[EOS]}
        # the positions the language model was made for: a prompt and its answer past them are refused, not answered
        self.context_tokens = int(config.text_config.max_position_embeddings)
        self.make_kv_cache(config.text_config, self.options, dtype, self.options.max_new_tokens, self.decoder)
        self.prompts: BackgroundPrompts[dict[str, Any]] = BackgroundPrompts(self._process)

    def close(self) -> None:
        self.prompts.close()

    # ------------------------------------------------------------------------------------- inputs, off the loop
    def admit(self, request: StageRequest) -> None:
        self.prompts.start(request)

    def _process(self, request: StageRequest) -> dict[str, Any]:
        """A request's prompt -> its ids and log-mel windows (on the CPU), and a transcription's clip length."""
        item = request.inputs[0] if request.inputs else {}
        language = (request.params.get("extra") or {}).get("language")  # a transcription's (its stage checked it)
        if language is not None:
            item = {**item, "language": language}
        max_tokens = int(given_params(request.params).get("max_tokens", self.options.max_new_tokens))
        windows = sum(self.inputs.window_count(len(samples)) for samples in item.get("audios") or [])
        self._check_context(windows * self.inputs.tokens_per_window, windows, max_tokens)  # before the mel features
        try:
            processed: dict[str, Any] = dict(self.inputs(item))
        except FieldError:
            raise
        except (ValueError, RuntimeError) as exc:
            raise FieldError("prompt.multi_modal_data", f"cannot be processed: {exc}") from None
        self._check_context(int(processed["input_ids"].shape[1]), windows, max_tokens)
        if item.get("task") == TRANSCRIBE_TASK:
            processed["clip_s"] = len(item["audios"][0]) / self.inputs.sample_rate_hz
        return processed

    def _check_context(self, prompt_tokens: int, windows: int, max_tokens: int) -> None:
        """A prompt of ``prompt_tokens`` (``windows`` of them 30 s audio windows) and up to ``max_tokens`` of answer
        must fit the model's context; else a FieldError naming the audio (when it has some), saying how much fits."""
        if prompt_tokens + max_tokens <= self.context_tokens:
            return
        context = f"the model's context of {self.context_tokens} tokens"
        if windows:
            per_window = self.inputs.tokens_per_window
            window_s = self.inputs.window_samples / self.inputs.sample_rate_hz
            other = prompt_tokens - windows * per_window
            fit = max(0, (self.context_tokens - other - max_tokens) // per_window)
            raise FieldError("prompt.multi_modal_data.audio",
                             f"{windows} windows of {window_s:g} s of audio ({windows * per_window} tokens), "
                             f"{other} other prompt tokens and up to {max_tokens} of answer exceed {context}: give at "
                             f"most {fit * window_s:g} s of audio (or a lower max_tokens)")
        if prompt_tokens >= self.context_tokens:
            raise FieldError("prompt", f"{prompt_tokens} tokens exceed {context}")
        raise FieldError("sampling_params.max_tokens", f"{prompt_tokens} prompt tokens and up to {max_tokens} of "
                         f"answer exceed {context}: ask for at most {self.context_tokens - prompt_tokens}")

    # ------------------------------------------------------------------------------------------------ prefill
    def _start(self, request: StageRequest, processed: dict[str, Any]) -> RunnerOutput | None:
        """Reserve the request's KV and build its prompt's pieces; an output when it must wait or fail."""
        ids: torch.Tensor = processed["input_ids"]
        features: torch.Tensor | None = processed.get("input_features")
        max_tokens = int(given_params(request.params).get("max_tokens", self.options.max_new_tokens))
        audio = ids[0] == self.audio_token_id
        keys = prompt_keys(ids[0], audio, None if features is None else {"input_features": features})
        waiting = self.reserve(request, int(ids.shape[1]) + max_tokens, keys)
        if waiting is not None:
            return waiting
        self.prompts.forget(request)
        request.take_all_inputs()
        request.num_prompt_tokens = int(ids.shape[1])
        embeds = self._prompt_embeds(ids.to(self.device), features, request.num_cached_tokens)
        pieces = PromptPieces(embeds, torch.arange(int(ids.shape[1]), device=self.device)[None])
        if request.num_cached_tokens:
            pieces.skip(request.num_cached_tokens, {})
        sampling = TokenSamplingParams.from_params(request.params)
        stream = TextStream(self._decode_ids, request.params.get("stop") or [])
        request.runner_state = VoxtralThinkerState(sampling, sampling.make_generator(), max_tokens, stream=stream,
                                                   prompt=pieces, clip_s=processed.get("clip_s"))
        return None

    def _prompt_embeds(self, ids: torch.Tensor, features: torch.Tensor | None, cached: int) -> torch.Tensor:
        """The prompt's input embeddings [1, T, D]: its tokens', with the audio encoder's output written over the
        ``[AUDIO]`` placeholders, unless every placeholder lies in the ``cached`` leading tokens (never fed)."""
        embeds = self.model.get_input_embeddings()(ids)
        placeholders = (ids[0] == self.audio_token_id).nonzero()[:, 0]
        if features is None or not placeholders.numel() or int(placeholders[-1]) < cached:
            return embeds
        features = features.to(self.device, self.model.dtype)
        audio = torch.cat([self.model.get_audio_features(features[start:start + ENCODER_WINDOWS_PER_CALL]).pooler_output
                           for start in range(0, features.shape[0], ENCODER_WINDOWS_PER_CALL)])
        if audio.shape[0] != placeholders.numel():
            raise ValueError(f"the audio encoder gave {audio.shape[0]} embeddings for {placeholders.numel()} "
                             "[AUDIO] placeholders")
        embeds[0, placeholders] = audio.to(embeds.dtype)
        return embeds

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
        state: VoxtralThinkerState = request.runner_state
        pieces = state.prompt
        assert pieces is not None  # set by _start, cleared once the request is prefilled
        out, tokens = self.feed_piece(request, pieces, budget, lambda piece: self.decoder(**piece,
                                                                                          **self.kv.step_inputs()))
        if out is None:
            return RunnerOutput(request.request_id, status=RequestStatus.PREFILLING), tokens
        state.prompt = None
        return self.model.lm_head(out.last_hidden_state[0, -1]), tokens

    # ------------------------------------------------------------------------------------------------- steps
    def _decode_ids(self, ids: list[int]) -> str:
        # a flat list of ids decodes to one string (transformers types the result str | list[str] for both forms)
        return cast(str, self.inputs.tokenizer.decode(ids, skip_special_tokens=True))

    def decode(self, rows: list[StageRequest], inputs: list[Any]) -> tuple[torch.Tensor, list[Any]]:
        """One forward for every request of ``rows``: each one's last token at its own next position."""
        self.kv.bind([request.request_id for request in rows], 1)
        tokens = torch.tensor([[request.runner_state.generated[-1]] for request in rows], device=self.device)
        out = self.decoder(inputs_embeds=self.model.get_input_embeddings()(tokens), position_ids=self.kv.positions(),
                           **self.kv.step_inputs())
        return self.model.lm_head(out.last_hidden_state[:, -1]), [None] * len(rows)

    def emit(self, request: StageRequest, token: int, logits: torch.Tensor, extra: Any) -> RunnerOutput:
        state: VoxtralThinkerState = request.runner_state
        state.generated.append(token)
        stream = state.stream
        stopped = token in self.eos_ids  # the end token is no text
        delta, units = ("", 0) if stopped else stream.push(token)
        stopped = stopped or stream.stopped
        done = stopped or len(state.generated) >= state.max_tokens
        details = None
        if done:
            more, rest = stream.finish()
            delta, units = delta + more, units + rest
            stopped = stopped or stream.stopped
            if state.clip_s is not None:
                details = {"duration": state.clip_s}
        reason = ("stop" if stopped else "length") if done else None
        return RunnerOutput.decoded(request.request_id, reason, text_delta=delta, data={"token": token},
                                    details=details, num_units=units)

    def free(self, request: StageRequest) -> None:
        self.prompts.forget(request)
        super().free(request)

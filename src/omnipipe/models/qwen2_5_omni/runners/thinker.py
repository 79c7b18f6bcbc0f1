"""The Qwen2.5-Omni thinker stage: text, images, audio and video in, text out, and per step the hidden states the
talker reads (see ``handoff.py``).

Every decoding request of the stage steps in one forward of the language model (``stage/batched_decoder.py``: one
paged KV cache, each row its own length; at decode a request's four position rows are its cache position, then
three times that plus its multimodal rope delta). A prompt is processed (chat template, tokenizer, feature
extractor, video decoding: ``qwen2_5_omni/thinker_inputs.py``) on a background thread from the moment it arrives,
its multimodal embeddings merged once by the model's own code, then fed to the decoder ``prefill_chunk_tokens`` at
a time between the others' decode steps (``stage/prompt_pieces.py``); only the last position's logits are computed.

What the talker needs goes out as step data (``handoff.py``): with the first token, the prompt
(``Qwen25TalkerPrompt``: ids, layer-0 embeddings with the multimodal positions zeroed, last-layer hidden states, the
grids its rope index needs); with every later token, the layer-0 embedding and last-layer hidden state of the token
the step read. Layer 0 is what the decoder is fed and
the last layer (after the final norm, as transformers' ``hidden_states[-1]``) is what it returns, so no forward
collects the layers in between.

Audio may stream in before its request (``append_audio``; ``stage/streaming_audio.py``): each stream's log-mel
features and audio-encoder chunks are made on the prompt-processing thread as its appends arrive, and a request
whose audio is ``[{"stream": id}]`` takes the finished stream, its encoder output merged into the prompt's
embeddings (the audio tower does not run again).

Stage options: ``MultimodalThinkerOptions`` (``stage/checkpoint_options.py``). SamplingParams (``stage/sampling.py``):
temperature, top-k, top-p, seed, the repetition penalty over the prompt and the reply (as transformers'
``generate``), the presence and frequency penalties over the reply, ``max_tokens``, ``stop``
(``stage/text_stream.py``: the text ends before the first stop string, finish reason ``stop``; text that may begin
one is held back until it is settled; the talker speaks the reply's tokens before the one that completed it)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import torch

from omnipipe.models.qwen2_5_omni.handoff import Qwen25TalkerPrompt
from omnipipe.models.qwen2_5_omni.modeling.audio_stream import streaming_audio
from omnipipe.models.qwen2_5_omni.thinker_inputs import MEDIA_KEYS, ThinkerInputs
from omnipipe.models.qwen2_5_omni.weights.load import load_config, load_part, load_speakers
from omnipipe.stage.answer_shape import AnswerShape
from omnipipe.stage.batched_decoder import BatchedDecoderRunner, DecodeState
from omnipipe.stage.checkpoint_options import MultimodalThinkerOptions, checked_options, compile_if
from omnipipe.stage.kv_cache import prompt_keys
from omnipipe.stage.prompt_pieces import PromptPieces, capture_decoder_inputs
from omnipipe.stage.prompt_processing import BackgroundPrompts
from omnipipe.stage.request import RequestStatus, StageRequest
from omnipipe.stage.runner import RunnerOutput
from omnipipe.stage.sampling import TokenSamplingParams, given_params
from omnipipe.stage.streaming_audio import AudioStreamRunner, AudioStreams, merge_audio_embeds
from omnipipe.stage.structured_output import GrammarCompiler, GrammarError
from omnipipe.stage.text_stream import TextStream
from omnipipe.stage.warmup import WarmupRequest, answers_run_on, short_audio, tiny_image, warm_up_requests

if TYPE_CHECKING:
    from transformers.models.qwen2_5_omni import Qwen2_5OmniThinkerForConditionalGeneration

_GRID_KEYS = ("image_grid_thw", "video_grid_thw", "video_second_per_grid")


@dataclass
class Qwen25ThinkerState(DecodeState):
    stream: TextStream = field(kw_only=True)
    prompt: PromptPieces | None = None  # while its prefill is in pieces
    rope_delta: int = 0  # a decode position's multimodal rows: its cache position plus this
    # the talker's prompt, sent with the first token (its hidden states filled once the prompt is in)
    handoff: Qwen25TalkerPrompt | None = None
    input_shapes: dict[str, list[int]] | None = None  # the processor's tensors' shapes, reported with it


class Qwen25ThinkerRunner(AudioStreamRunner, BatchedDecoderRunner):
    options: MultimodalThinkerOptions

    def load(self) -> None:
        self.options, self.directory, self.dtype = checked_options(self.context, MultimodalThinkerOptions)
        self.device = torch.device(self.context.device)
        self.model = cast("Qwen2_5OmniThinkerForConditionalGeneration",
                          load_part(self.directory, "thinker", self.device, self.dtype))
        self.decoder: torch.nn.Module = self.model.model.language_model
        compile_if(self.decoder, self.options.torch_compile)
        self.inputs = ThinkerInputs(self.directory, self.options.video_fps, self.options.video_max_frames)
        self.tokenizer = self.inputs.tokenizer
        talker_config = load_config(self.directory).talker_config
        eos = self.model.generation_config.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        config = self.model.config
        self.mm_tokens = {"input_features": config.audio_token_index, "pixel_values": config.image_token_index,
                          "pixel_values_videos": config.video_token_index}
        speakers = load_speakers(self.directory)
        with torch.no_grad():
            def vector(token: int) -> torch.Tensor:
                return self._embed(torch.tensor([token], device=self.device))[0].float().cpu()

            # what every request's talker prompt carries: the text-end, pad and voices' begin embeddings
            self.text_eos = vector(talker_config.tts_text_end_token_id)
            self.text_pad = vector(talker_config.tts_text_pad_token_id)
            self.speaker_bos = {name: vector(int(s["bos_token"])) for name, s in speakers.items()}
        self.make_kv_cache(config.text_config, self.options, self.dtype, self.options.max_new_tokens, self.decoder)
        self.prompts: BackgroundPrompts[dict[str, torch.Tensor]] = BackgroundPrompts(
            lambda request: self.inputs(self.audio_streams.resolve(request.request_id, _merged(request))))
        self.max_audio_streams = self.options.audio_streams  # 0: the engine sends every clip whole
        self.audio_streams = AudioStreams(
            lambda: streaming_audio(self.inputs.processor.feature_extractor, self.model), self.prompts.run,
            self.max_audio_streams, self.max_audio_stream_s)
        im_end = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        eos = im_end if im_end in self.eos_ids else min(self.eos_ids, default=None)
        self.grammars = GrammarCompiler(self.tokenizer, eos_token_id=eos)

    def close(self) -> None:
        self.prompts.close()

    def warmup(self) -> None:
        """A compiled decoder is traced and compiled here, for every call serving makes of it, not in the first
        requests, where a compile could outlast the stall watchdog and stalls every stream of its step. With
        ``torch_compile`` on: a text prompt prefilled in two pieces (its last piece one token), then decoded alone
        and across three KV blocks; a prompt with an image and a short clip joining at step 3 and a second text
        prompt at step 5, so decodes of one and of several rows run at more than one KV width. The answers run to
        their ``max_tokens`` (no end token sampled); every block taken is free again after."""
        if not self.options.torch_compile:
            return
        block = self.kv.block_tokens
        text = {"text": "Hello, who are you?", "history": [], "images": [], "audios": [], "videos": []}
        prompt_tokens = int(self.inputs(text)["input_ids"].shape[1])
        requests = [
            WarmupRequest([text], {"temperature": 0.0, "max_tokens": 3 * block}),
            WarmupRequest([{**text, "text": "What is this?", "images": [tiny_image(64)], "audios": [short_audio()]}],
                          {"temperature": 0.0, "max_tokens": 4}, step=3),
            WarmupRequest([{**text, "text": "Tell me more."}], {"temperature": 0.0, "max_tokens": block + 2}, step=5)]
        with answers_run_on(self, self.eos_ids, prefill_chunk_tokens=prompt_tokens - 1):
            warm_up_requests(self, requests)

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model.get_input_embeddings()(tokens)

    # ------------------------------------------------------------------------------------- inputs, off the loop
    def admit(self, request: StageRequest) -> None:
        self.audio_streams.claim(request.request_id, _merged(request))
        self.prompts.start(request)

    # ------------------------------------------------------------------------------------------------ prefill
    def _start(self, request: StageRequest, inputs: dict[str, torch.Tensor]) -> RunnerOutput | None:
        """Reserve the request's KV, merge its prompt's multimodal embeddings and build its pieces; an output when
        it must wait or fail."""
        params = request.params
        try:
            shape = AnswerShape.start(params, [], self.grammars, None)
        except GrammarError as exc:
            self.prompts.forget(request)
            return RunnerOutput.failed(request.request_id, exc.reason, exc.engine_field)
        input_ids = inputs["input_ids"].to(self.device)
        prompt_tokens = int(input_ids.shape[1])
        max_tokens = int(given_params(request.params).get("max_tokens", self.options.max_new_tokens))
        multimodal = torch.isin(inputs["input_ids"][0], torch.tensor(list(self.mm_tokens.values())))
        keys = prompt_keys(inputs["input_ids"][0], multimodal, {k: v for k, v in inputs.items() if k in MEDIA_KEYS})
        # the talker reads the prompt's last-layer hidden states: shared blocks come with theirs
        waiting = self.reserve(request, prompt_tokens + max_tokens, keys, needs_extras=True)
        if waiting is not None:
            return waiting
        self.prompts.forget(request)
        request.take_all_inputs()
        request.num_prompt_tokens = prompt_tokens
        attention_mask = inputs["attention_mask"].to(self.device)
        media = {k: (v.to(self.device, self.dtype) if v.is_floating_point() and k != "video_second_per_grid"
                     else v.to(self.device)) for k, v in inputs.items() if k in MEDIA_KEYS}
        feature_mask = media.get("feature_attention_mask")
        audio_lengths = feature_mask.sum(-1) if feature_mask is not None else None
        # transformers annotates the ids, grids and lengths torch.LongTensor, a class no tensor is typed as
        vision_positions, rope_deltas = self.model.get_rope_index(
            input_ids, media.get("image_grid_thw"), media.get("video_grid_thw"),  # type: ignore[arg-type]
            attention_mask, False, audio_lengths, media.get("video_second_per_grid"))  # type: ignore[arg-type]
        text_positions = torch.arange(prompt_tokens, device=self.device).view(1, 1, -1)
        position_ids = torch.cat([text_positions, vision_positions])
        encoders = dict(media)
        if "audio_embeds" in inputs:  # encoded while it streamed in: merged here, the audio tower not run again
            del encoders["input_features"]
            encoders["inputs_embeds"] = merge_audio_embeds(self.model.get_input_embeddings(), input_ids,
                                                           int(self.mm_tokens["input_features"]),
                                                           inputs["audio_embeds"])
        decoder_inputs = capture_decoder_inputs(self.model.model, self.decoder, input_ids=input_ids,
                                                attention_mask=attention_mask, position_ids=position_ids,
                                                use_cache=False, use_audio_in_video=False, **encoders)
        pieces = PromptPieces(decoder_inputs["inputs_embeds"], position_ids, keep=(-1,))
        if request.num_cached_tokens:
            pieces.skip(request.num_cached_tokens, self.kv.prefix_extras(request.request_id))
        sampling = TokenSamplingParams.from_params(request.params)
        handoff = self._prompt_part(input_ids[0], attention_mask[0], media, decoder_inputs["inputs_embeds"][0])
        request.runner_state = Qwen25ThinkerState(
            sampling, sampling.make_generator(), max_tokens, prompt_ids=input_ids[0].tolist(),
            stream=TextStream(self._decode_ids, list(request.params.get("stop") or [])),
            prompt=pieces,
            rope_delta=int(rope_deltas.view(-1)[0]), handoff=handoff,
            input_shapes={key: list(value.shape) for key, value in inputs.items() if key != "audio_embeds"},
            shape=shape)
        return None

    def _prompt_part(self, ids: torch.Tensor, attention_mask: torch.Tensor, media: dict[str, torch.Tensor],
                     inputs_embeds: torch.Tensor) -> Qwen25TalkerPrompt:
        """The talker's prompt but the last layer's hidden states (filled once the prompt is in) and the first
        token: the ids, the embeddings the decoder's layer 0 reads (the multimodal positions' zeroed: the talker
        does not read them), the grids its rope index needs and the special embeddings it speaks with."""
        grids = {key: media[key].float().cpu() if key == "video_second_per_grid" else media[key].cpu()
                 for key in _GRID_KEYS if key in media}
        if "feature_attention_mask" in media:
            grids["audio_feature_lengths"] = media["feature_attention_mask"].sum(-1).cpu()
        embeds = inputs_embeds.clone()
        for key, token in self.mm_tokens.items():
            if key in media:
                embeds[ids == token] = 0
        return Qwen25TalkerPrompt(ids.cpu(), attention_mask.cpu(), embeds.float().cpu(), torch.empty(0), -1,
                                  self.text_eos, self.text_pad, self.speaker_bos, grids)

    def prefill_piece(self, request: StageRequest, budget: int,
                      wait: bool) -> tuple[RunnerOutput | torch.Tensor, int]:
        """Feed the next piece of the request's prompt (at most ``budget`` tokens; its processing waited for if
        ``wait``): the last position's logits once the whole prompt is in, else the output to return now; and the
        tokens fed."""
        if request.runner_state is None:
            inputs = self.prompts.result(request, wait)
            if isinstance(inputs, RunnerOutput):  # still being made, or the caller's input refused
                return inputs, 0
            waiting = self._start(request, inputs)
            if waiting is not None:
                return waiting, 0
        state: Qwen25ThinkerState = request.runner_state
        pieces, handoff = state.prompt, state.handoff
        assert pieces is not None and handoff is not None  # set by _start, cleared once the request is prefilled
        out, tokens = self.feed_piece(  # the last layer's hidden states kept: the decoder's output
            request, pieces, budget, lambda piece: self.decoder(**piece, **self.kv.step_inputs()),
            hidden_states=lambda out: (out.last_hidden_state,))
        if out is None:
            return RunnerOutput(request.request_id, status=RequestStatus.PREFILLING), tokens
        self.kv.set_extras(request.request_id, {-1: pieces.gathered(-1)})
        state.handoff = dataclasses.replace(handoff, hidden=pieces.gathered(-1).float().cpu())
        state.prompt = None
        return self.model.lm_head(out.last_hidden_state[0, -1]), tokens

    # ------------------------------------------------------------------------------------------------- steps
    def _decode_ids(self, ids: list[int]) -> str:
        # a flat list of ids decodes to one string (transformers types the result str | list[str] for both forms)
        return cast(str, self.tokenizer.decode(ids, skip_special_tokens=True))

    def decode(self, rows: list[StageRequest], inputs: list[Any]) -> tuple[torch.Tensor, list[Any]]:
        """One forward for every request of ``rows``, each reading its last token at its own next position: the
        last position's logits [rows, vocab] and each row's reply item for the talker."""
        states: list[Qwen25ThinkerState] = [request.runner_state for request in rows]
        self.kv.bind([request.request_id for request in rows], 1)
        cache_positions = self.kv.positions()  # [rows, 1]
        deltas = torch.tensor([state.rope_delta for state in states], device=self.device).view(-1, 1)
        positions = torch.stack([cache_positions] + [cache_positions + deltas] * 3)  # [4, rows, 1]
        embeds = self._embed(torch.tensor([[state.generated[-1]] for state in states], device=self.device))
        out = self.decoder(inputs_embeds=embeds, position_ids=positions, **self.kv.step_inputs())
        last = out.last_hidden_state[:, -1]
        embeds, hidden = embeds[:, -1].float().cpu(), last.float().cpu()
        replies = [{"embed": embeds[row], "hidden": hidden[row]} for row in range(len(rows))]
        return self.model.lm_head(last), replies

    def emit(self, request: StageRequest, token: int, logits: torch.Tensor, extra: Any) -> RunnerOutput:
        """The output of the request's next token: the text it lets out (with its answer's shape: logprobs), and
        the talker's part (the prompt's with the first token; ``extra``: the decode step's reply item)."""
        state: Qwen25ThinkerState = request.runner_state
        state.generated.append(token)
        output = self._text(request, state, token)
        if state.shape is not None:
            state.shape.accept(token, logits, is_text=token not in self.eos_ids)
            output.text_delta, output.details = state.shape.shape(output.text_delta, final=output.finished)
        if state.handoff is not None:
            output.data = {**(output.data or {}),
                           "prompt": dataclasses.replace(state.handoff, first_token=token).to_dict()}
            output.details = {**(output.details or {}), "inputs": state.input_shapes}
            state.handoff = None
        if extra:
            output.data = {**(output.data or {}), **extra}
        return output

    def _text(self, request: StageRequest, state: Qwen25ThinkerState, token: int) -> RunnerOutput:
        stream = state.stream
        if token in self.eos_ids:
            delta, units = stream.finish()
            return RunnerOutput.decoded(request.request_id, "stop", text_delta=delta, num_units=units)
        delta, units = stream.push(token)
        if stream.stopped:
            return RunnerOutput.decoded(request.request_id, "stop", text_delta=delta, num_units=units)
        if len(state.generated) >= state.max_tokens:
            more, rest = stream.finish()
            return RunnerOutput.decoded(request.request_id, "stop" if stream.stopped else "length",
                                        text_delta=delta + more, num_units=units + rest, data={"token": token})
        return RunnerOutput(request.request_id, text_delta=delta, num_units=units, data={"token": token})

    def free(self, request: StageRequest) -> None:
        self.prompts.forget(request)
        self.audio_streams.release(request.request_id)
        super().free(request)


def _merged(request: StageRequest) -> dict[str, Any]:
    """The request's input items as one thinker input (read, not consumed)."""
    data: dict[str, Any] = {}
    for item in request.inputs:
        data.update(item)
    return data

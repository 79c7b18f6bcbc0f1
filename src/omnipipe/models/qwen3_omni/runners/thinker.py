"""The Qwen3-Omni thinker stage: text, images, audio and video in, text out, and per step what the talker reads.

Every decoding request of the stage steps in one forward of the language model (``stage/batched_decoder.py``: one
paged KV cache, each row its own length and rope positions; at decode a request's four position rows, text then the
three multimodal ones, each advance by one). A prompt is processed (chat template, tokenizer, feature extractor,
video decoding) on a background thread from the moment it arrives, its multimodal embeddings merged once by the
model's own code, then fed to the decoder ``prefill_chunk_tokens`` at a time between the others' decode steps
(``stage/prompt_pieces.py``). Qwen3's MoE layers route the whole batch's tokens through their experts together.

What the talker needs goes out as step data (``handoff.py``): with the first token, the prompt
(``Qwen3TalkerPrompt``: its ids, its layer-0 embeddings and its multimodal positions' hidden states at the talker's
``accept_hidden_layer``, and the grids its rope index needs); with every token, that token's embedding.

Audio may stream in before its request (``append_audio``; ``stage/streaming_audio.py``): each stream's log-mel
features and audio-encoder chunks are made on the prompt-processing thread as its appends arrive, and a request
whose audio is ``[{"stream": id}]`` takes the finished stream, its encoder output merged into the prompt's
embeddings (the audio tower does not run again).

Stage options: ``MultimodalThinkerOptions`` (``stage/checkpoint_options.py``). SamplingParams (``stage/sampling.py``):
temperature, top-k, top-p, seed, repetition / presence / frequency penalties (over the generated tokens),
``max_tokens``, ``stop`` (``stage/text_stream.py``: the text ends before a stop string; text that may begin one is
held back until it is settled).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import torch

from omnipipe.models.qwen3_omni.handoff import Qwen3TalkerPrompt
from omnipipe.models.qwen3_omni.modeling.audio_stream import streaming_audio
from omnipipe.models.qwen3_omni.modeling.deepstack import DeepStackPieces
from omnipipe.models.qwen3_omni.thinker_inputs import ThinkerInputBuilder
from omnipipe.models.qwen3_omni.weights.load import load_config, load_part
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
from omnipipe.stage.structured_output import GrammarCompiler, GrammarError, ToolCallFormat, tool_call_format_for
from omnipipe.stage.text_stream import TextStream
from omnipipe.stage.warmup import WarmupRequest, answers_run_on, short_audio, tiny_image, warm_up_requests
from omnipipe.util.field_error import FieldError

if TYPE_CHECKING:
    from transformers import Qwen3OmniMoeThinkerForConditionalGeneration

_MEDIA_FLOATS = ("pixel_values", "pixel_values_videos", "input_features")


@dataclass
class Qwen3ThinkerState(DecodeState):
    stream: TextStream = field(kw_only=True)
    prompt: PromptPieces | None = None  # while its prefill is in pieces
    last_position: torch.Tensor | None = None  # [4]: the rope rows of the last position fed
    # the talker's prompt, sent with the first token (its embeddings and hidden states filled once the prompt is in)
    handoff: Qwen3TalkerPrompt | None = None


class Qwen3ThinkerRunner(AudioStreamRunner, BatchedDecoderRunner):
    options: MultimodalThinkerOptions

    def load(self) -> None:
        self.options, self.directory, dtype = checked_options(self.context, MultimodalThinkerOptions)
        self.device = self.context.device
        self.config = load_config(self.directory)
        self.model = cast("Qwen3OmniMoeThinkerForConditionalGeneration",
                          load_part(self.directory, "thinker", self.device, dtype))
        self.decoder: torch.nn.Module = self.model.model.language_model
        compile_if(self.decoder, self.options.torch_compile)
        self.inputs = ThinkerInputBuilder(self.directory, self.config)
        self.accept_layer = int(self.config.talker_config.accept_hidden_layer)
        thinker = self.config.thinker_config
        self.mm_token_ids = torch.tensor([thinker.audio_token_id, thinker.image_token_id, thinker.video_token_id])
        self.eos_ids = {int(self.config.im_end_token_id)}
        if self.inputs.tokenizer.pad_token_id is not None:
            self.eos_ids.add(int(self.inputs.tokenizer.pad_token_id))  # <|endoftext|>
        self.make_kv_cache(self.model.config.text_config, self.options, dtype, self.options.max_new_tokens,
                           self.decoder)
        self.prompts: BackgroundPrompts[dict[str, Any]] = BackgroundPrompts(self._process)
        self.max_audio_streams = self.options.audio_streams  # 0: the engine sends every clip whole
        self.audio_streams = AudioStreams(lambda: streaming_audio(self.inputs.feature_extractor, self.model),
                                          self.prompts.run, self.max_audio_streams, self.max_audio_stream_s)
        self.grammars = GrammarCompiler(self.inputs.tokenizer, eos_token_id=int(self.config.im_end_token_id))
        self.tool_calls = tool_call_format_for(ToolCallFormat(), self.inputs.tokenizer)

    def close(self) -> None:
        self.prompts.close()

    def warmup(self) -> None:
        """A compiled decoder is traced and compiled here, for every call serving makes of it, not in the first
        requests, where a compile could outlast the stall watchdog and stalls every stream of its step. With
        ``torch_compile`` on: a text prompt prefilled in two pieces (its last piece one token: a prefill's call
        with the hidden states the talker reads), then decoded alone and across three KV blocks; a prompt with a
        64-pixel image and a short clip joining at step 3 and one with a 32-pixel image at step 5 (DeepStack's
        inputs for several visual positions and for one), so decodes of one and of several rows run at more than
        one KV width. The answers run to their ``max_tokens`` (no end token sampled); every block taken is free
        again after."""
        if not self.options.torch_compile:
            return
        block = self.kv.block_tokens
        text = {"text": "Hello, who are you?"}
        prompt_tokens = int(self.inputs(text)["input_ids"].shape[1])
        requests = [
            WarmupRequest([text], {"temperature": 0.0, "max_tokens": 3 * block}),
            WarmupRequest([{"text": "What is this?", "images": [tiny_image(64)], "audios": [short_audio()]}],
                          {"temperature": 0.0, "max_tokens": 4}, step=3),
            WarmupRequest([{"text": "And this?", "images": [tiny_image(32)]}],
                          {"temperature": 0.0, "max_tokens": block + 2}, step=5)]
        with answers_run_on(self, self.eos_ids, prefill_chunk_tokens=prompt_tokens - 1):
            warm_up_requests(self, requests)

    # ------------------------------------------------------------------------------------- inputs, off the loop
    def admit(self, request: StageRequest) -> None:
        if request.inputs:
            self.audio_streams.claim(request.request_id, request.inputs[0])
        self.prompts.start(request)

    def _process(self, request: StageRequest) -> dict[str, Any]:
        """A request's prompt (chat and media) -> the model's input tensors (on the CPU), videos sampled at
        ``video_fps``; a streamed clip finished."""
        item = request.inputs[0] if request.inputs else {}
        try:
            item = self.audio_streams.resolve(request.request_id, item)
            return self.inputs(self._sample_videos(item))
        except FieldError:
            raise
        except (ValueError, RuntimeError) as exc:
            raise FieldError("prompt.multi_modal_data", f"cannot be processed: {exc}") from None

    def _sample_videos(self, item: dict[str, Any]) -> dict[str, Any]:
        """Video files (bytes or a data: URL) sampled at ``video_fps``; frames given as frames stay."""
        from omnipipe.util.media import load_video

        videos = item.get("videos")
        if not videos:
            return item
        fps, most = self.options.video_fps, self.options.video_max_frames
        sampled = [load_video(v, f"prompt.multi_modal_data.video[{i}]", fps=fps, max_frames=most)
                   if isinstance(v, (bytes, str)) else v for i, v in enumerate(videos)]
        return {**item, "videos": sampled, "video_fps": fps}

    # ------------------------------------------------------------------------------------------------ prefill
    def _start(self, request: StageRequest, kwargs: dict[str, Any]) -> RunnerOutput | None:
        """Reserve the request's KV and build its prompt's pieces; an output when it must wait or fail."""
        ids = kwargs["input_ids"]
        params = request.params
        tools = (request.inputs[0].get("tools") if request.inputs else None) or []
        try:
            shape = AnswerShape.start(params, tools, self.grammars, self.tool_calls)
        except GrammarError as exc:
            self.prompts.forget(request)
            return RunnerOutput.failed(request.request_id, exc.reason, exc.engine_field)
        max_tokens = int(given_params(request.params).get("max_tokens", self.options.max_new_tokens))
        # a streamed clip's encoder output is no key: its features (identical to the whole clip's) are
        media = {key: value for key, value in kwargs.items()
                 if key not in ("input_ids", "attention_mask", "audio_embeds")}
        keys = prompt_keys(ids[0], torch.isin(ids[0], self.mm_token_ids), media)
        # the talker reads the prompt's layer-0 and accept-layer hidden states: shared blocks come with theirs
        waiting = self.reserve(request, int(ids.shape[1]) + max_tokens, keys, needs_extras=True)
        if waiting is not None:
            return waiting
        self.prompts.forget(request)
        request.take_all_inputs()
        request.num_prompt_tokens = int(ids.shape[1])
        kwargs = {k: v.to(self.device) if torch.is_tensor(v) else v for k, v in kwargs.items()}
        for key in _MEDIA_FLOATS:
            if key in kwargs:
                kwargs[key] = kwargs[key].to(self.model.dtype)
        audio_embeds = kwargs.pop("audio_embeds", None)
        position_ids = self.model._prepare_position_ids_for_generation(ids, {**kwargs, "past_key_values": None})
        self.model.model.rope_deltas = None  # positions are passed explicitly; leave nothing on the shared model
        if audio_embeds is not None:  # encoded while it streamed in: merged here, the audio tower not run again
            kwargs.pop("input_features")
            kwargs["inputs_embeds"] = merge_audio_embeds(self.model.get_input_embeddings(), kwargs["input_ids"],
                                                         int(self.config.thinker_config.audio_token_id),
                                                         audio_embeds)
        decoder_inputs = capture_decoder_inputs(self.model.model, self.decoder, position_ids=position_ids,
                                                use_cache=False, **kwargs)
        deepstack = decoder_inputs.get("deepstack_visual_embeds")
        # float positions for every prompt (the model's are int64 for text, float with media; the rotary embedding
        # reads them as floats either way): a compiled decoder meets one dtype, so one graph
        pieces = DeepStackPieces(decoder_inputs["inputs_embeds"], position_ids.float(), keep=(0, self.accept_layer),
                                 visual_pos_masks=decoder_inputs.get("visual_pos_masks"),
                                 deepstack_visual_embeds=list(deepstack) if deepstack else None)
        if request.num_cached_tokens:
            pieces.skip(request.num_cached_tokens, self.kv.prefix_extras(request.request_id))
        sampling = TokenSamplingParams.from_params(request.params)
        request.runner_state = Qwen3ThinkerState(
            sampling, sampling.make_generator(), max_tokens, stream=TextStream(self._decode_ids,
                                                                               request.params.get("stop") or []),
            prompt=pieces, shape=shape,
            handoff=Qwen3TalkerPrompt(ids[0].cpu(), torch.empty(0), torch.empty(0), self._grids(kwargs)))
        return None

    def _grids(self, kwargs: dict[str, Any]) -> dict[str, torch.Tensor]:
        grids: dict[str, torch.Tensor] = {k: kwargs[k].cpu() for k in ("image_grid_thw", "video_grid_thw",
                                                                        "video_second_per_grid") if k in kwargs}
        if "feature_attention_mask" in kwargs:
            grids["audio_feature_lengths"] = kwargs["feature_attention_mask"].sum(-1).cpu()
        return grids

    def prefill_piece(self, request: StageRequest, budget: int,
                      wait: bool) -> tuple[RunnerOutput | torch.Tensor, int]:
        """Feed the next piece of the request's prompt (at most ``budget`` tokens; its processing waited for if
        ``wait``): the last position's logits once the whole prompt is in, else the output to return now; and the
        tokens fed."""
        if request.runner_state is None:
            kwargs = self.prompts.result(request, wait)
            if isinstance(kwargs, RunnerOutput):  # still being made, or the caller's input refused
                return kwargs, 0
            waiting = self._start(request, kwargs)
            if waiting is not None:
                return waiting, 0
        state: Qwen3ThinkerState = request.runner_state
        pieces, handoff = state.prompt, state.handoff
        assert pieces is not None and handoff is not None  # set by _start, cleared once the request is prefilled
        out, tokens = self.feed_piece(
            request, pieces, budget, lambda piece: self.decoder(**piece, **self.kv.step_inputs(),
                                                                output_hidden_states=True),
            hidden_states=lambda out: out.hidden_states)
        if out is None:
            return RunnerOutput(request.request_id, status=RequestStatus.PREFILLING), tokens
        state.last_position = pieces.position_ids[:, 0, -1]
        self.kv.set_extras(request.request_id, {layer: pieces.gathered(layer) for layer in pieces.keep})
        embeds = pieces.gathered(0)
        mm = torch.isin(handoff.ids, self.mm_token_ids).to(embeds.device)
        state.handoff = dataclasses.replace(handoff, embeds=embeds.float().cpu(),
                                            mm_hidden=pieces.gathered(self.accept_layer)[mm].float().cpu())
        state.prompt = None
        return self.model.lm_head(out.last_hidden_state[0, -1]), tokens

    # ------------------------------------------------------------------------------------------------- steps
    def _decode_ids(self, ids: list[int]) -> str:
        # a flat list of ids decodes to one string (transformers types the result str | list[str] for both forms)
        return cast(str, self.inputs.tokenizer.decode(ids, skip_special_tokens=True))

    def decode(self, rows: list[StageRequest], inputs: list[Any]) -> tuple[torch.Tensor, list[Any]]:
        """One forward for every request of ``rows``: each one's last token at its own next position."""
        states: list[Qwen3ThinkerState] = [request.runner_state for request in rows]
        self.kv.bind([request.request_id for request in rows], 1)
        moved = []
        for state in states:
            assert state.last_position is not None  # set when the request's prompt went in
            state.last_position = state.last_position + 1
            moved.append(state.last_position)
        positions = torch.stack(moved, dim=1)[:, :, None]  # [4, rows, 1]
        tokens = torch.tensor([[state.generated[-1]] for state in states], device=self.device)
        out = self.decoder(inputs_embeds=self.model.get_input_embeddings()(tokens), position_ids=positions,
                           **self.kv.step_inputs())
        return self.model.lm_head(out.last_hidden_state[:, -1]), [None] * len(rows)

    def _emit(self, request: StageRequest, token: int, embed: torch.Tensor, logits: torch.Tensor) -> RunnerOutput:
        state: Qwen3ThinkerState = request.runner_state
        state.generated.append(token)
        shape = state.shape
        if shape is not None:
            shape.accept(token, logits, is_text=token not in self.eos_ids)
        stream = state.stream
        stopped = token in self.eos_ids  # the end token is no text
        delta, units = ("", 0) if stopped else stream.push(token)
        stopped = stopped or stream.stopped
        done = stopped or len(state.generated) >= state.max_tokens
        if done:
            more, rest = stream.finish()
            delta, units = delta + more, units + rest
            stopped = stopped or stream.stopped
        details = None
        calls = False
        if shape is not None:
            delta, details = shape.shape(delta, final=done)
            # a turn of calls (decided by its first token: the grammar lets no answer start like one) is not spoken:
            # the talker gets none of its tokens, so it says nothing
            calls = shape.splitter is not None and shape.splitter.calls_so_far
        data: dict[str, Any] = {"token": token} if calls else {"token": token, "embed": embed.float().cpu()}
        if state.handoff is not None:
            data["prompt"] = state.handoff.to_dict()
            state.handoff = None
        reason = ("tool_calls" if calls and stopped else "stop" if stopped else "length") if done else None
        return RunnerOutput.decoded(request.request_id, reason, text_delta=delta, data=data, details=details,
                                    num_units=units)

    def emit_all(self, sampled: list[tuple[StageRequest, int, torch.Tensor, Any]]) -> list[RunnerOutput]:
        """Each token's output, with its embedding for the talker (looked up for every row at once)."""
        tokens = torch.tensor([token for _, token, _, _ in sampled], device=self.device)
        embeds = self.model.get_input_embeddings()(tokens)
        return [self._emit(request, token, embed, logits)
                for (request, token, logits, _), embed in zip(sampled, embeds, strict=True)]

    def free(self, request: StageRequest) -> None:
        self.prompts.forget(request)
        self.audio_streams.release(request.request_id)
        super().free(request)

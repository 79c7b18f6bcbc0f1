"""The Qwen2.5-Omni thinker stage: the checkpoint's processor turns a prompt's chat and media into inputs, then
``Qwen2_5OmniThinkerForConditionalGeneration`` decodes with a per-request DynamicCache and per-request 3D rope
deltas; each step emits its text delta and the hidden states the talker reads (see ``processors.py``).

Requests of a batch run one after another (each its own cache length and positions); only the last position's
logits are computed. A request's SamplingParams are all honoured (``stage/sampling.py``): the repetition penalty over
the prompt and the reply (as transformers' ``generate``), the presence and frequency penalties over the reply, and
``stop`` (``stage/text_stream.py``): the text ends before the first stop string, which is not part of it (finish
reason ``stop``); text that may begin a stop string is held back until it is settled. The talker speaks the reply's
tokens before the one that completed the stop string.

Stage options: ``MultimodalThinkerOptions`` (``stage/checkpoint_options.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from transformers import DynamicCache

from omnipipe.models.qwen2_5_omni.modeling.processor import OmniProcessor
from omnipipe.models.qwen2_5_omni.processors import chat_messages
from omnipipe.models.qwen2_5_omni.weights.load import (
    load_config,
    load_part,
    load_speakers,
)
from omnipipe.stage.checkpoint_options import MultimodalThinkerOptions, checked_options, compile_if
from omnipipe.stage.request import StageRequest
from omnipipe.stage.runner import RunnerOutput, StageRunner
from omnipipe.stage.sampling import TokenSamplingParams, given_params, sample_next_token
from omnipipe.stage.text_stream import TextStream
from omnipipe.util.field_error import FieldError
from omnipipe.util.media import load_video

_MEDIA_KEYS = ("pixel_values", "image_grid_thw", "input_features", "feature_attention_mask",
               "pixel_values_videos", "video_grid_thw", "video_second_per_grid")


@dataclass
class ThinkerState:
    cache: DynamicCache
    rope_deltas: torch.Tensor
    length: int  # tokens in the cache
    prompt_ids: list[int]
    sampling: TokenSamplingParams
    generator: torch.Generator | None
    stream: TextStream
    max_tokens: int
    generated: list[int] = field(default_factory=list)  # every token sampled, an end token included


class QwenOmniThinkerRunner(StageRunner):
    def load(self) -> None:
        self.options, self.directory, self.dtype = checked_options(self.context, MultimodalThinkerOptions)
        self.device = torch.device(self.context.device)
        self.model = load_part(self.directory, "thinker", self.device, self.dtype)
        compile_if(self.model.model, self.options.torch_compile)
        self.processor = OmniProcessor.from_pretrained(self.directory, local_files_only=True)
        self.tokenizer = self.processor.tokenizer
        self.video_fps, self.video_max_frames = self.options.video_fps, self.options.video_max_frames
        config = load_config(self.directory)
        self.talker_config = config.talker_config
        eos = self.model.generation_config.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        embed = self.model.get_input_embeddings()
        speakers = load_speakers(self.directory)
        with torch.no_grad():
            def vector(token: int) -> np.ndarray:
                return embed(torch.tensor([token], device=self.device))[0].float().cpu().numpy()

            self.special_embeds = {
                "text_eos": vector(self.talker_config.tts_text_end_token_id),
                "text_pad": vector(self.talker_config.tts_text_pad_token_id),
                "bos": {name: vector(int(s["bos_token"])) for name, s in speakers.items()},
            }

    # ------------------------------------------------------------------ steps
    def process(self, data: dict[str, Any]) -> dict[str, torch.Tensor]:
        """A thinker input (chat and media) -> the processor's tensors; video files sampled at ``video_fps``, every
        video cut to ``video_max_frames``."""
        text = self.processor.apply_chat_template(chat_messages(data), add_generation_prompt=True, tokenize=False)
        given = data.get("videos") or []
        fields = data.get("video_fields") or [f"prompt.multi_modal_data.video[{i}]" for i in range(len(given))]
        videos = [load_video(v, field, self.video_fps, self.video_max_frames)
                  for v, field in zip(given, fields, strict=False)]
        inputs = self.processor(text=[text], images=data.get("images") or None, audio=data.get("audios") or None,
                                videos=videos or None, fps=float(self.video_fps), return_tensors="pt")
        return {k: torch.as_tensor(v) for k, v in inputs.items() if k in ("input_ids", "attention_mask") + _MEDIA_KEYS}

    def _prefill(self, request: StageRequest) -> RunnerOutput:
        data: dict[str, Any] = {}
        for item in request.take_all_inputs():
            data.update(item)
        try:
            inputs = self.process(data)
        except FieldError as exc:  # a video file that cannot be decoded: the caller's input
            return RunnerOutput(request.request_id, finished=True, finish_reason="error", error=exc.rule,
                                error_field=exc.field)
        input_ids = inputs["input_ids"].to(self.device)
        attention_mask = inputs["attention_mask"].to(self.device)
        media = {k: (v.to(self.device, self.dtype) if v.is_floating_point() and k != "video_second_per_grid"
                     else v.to(self.device)) for k, v in inputs.items() if k in _MEDIA_KEYS}
        feature_mask = media.get("feature_attention_mask")
        audio_lengths = feature_mask.sum(-1) if feature_mask is not None else None
        vision_positions, rope_deltas = self.model.get_rope_index(
            input_ids, media.get("image_grid_thw"), media.get("video_grid_thw"), attention_mask, False,
            audio_lengths, media.get("video_second_per_grid"))
        text_positions = torch.arange(input_ids.shape[1], device=self.device).view(1, 1, -1)
        cache = DynamicCache()
        out = self.model.model(input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache,
                               use_cache=True, position_ids=torch.cat([text_positions, vision_positions]),
                               output_hidden_states=True, use_audio_in_video=False, **media)
        request.num_prompt_tokens = int(input_ids.shape[1])
        params = request.params
        sampling = TokenSamplingParams.from_params(params)
        state = ThinkerState(cache, rope_deltas, int(input_ids.shape[1]), input_ids[0].tolist(), sampling,
                             sampling.make_generator(),
                             TextStream(self._decode_ids, list(params.get("stop") or [])),
                             int(given_params(params).get("max_tokens", self.options.max_new_tokens)))
        request.runner_state = state
        request.prefilled = True
        embeds = out.hidden_states[0][0].clone()
        for key, token in (("input_features", self.model.config.audio_token_index),
                           ("pixel_values", self.model.config.image_token_index),
                           ("pixel_values_videos", self.model.config.video_token_index)):
            if key in media:  # the talker does not read the multimodal positions' embeddings
                embeds[input_ids[0] == token] = 0
        prompt = {
            "input_ids": input_ids[0].cpu().numpy(),
            "attention_mask": attention_mask[0].cpu().numpy(),
            "embeds": embeds.float().cpu().numpy(),
            "hidden": out.hidden_states[-1][0].float().cpu().numpy(),
            "special_embeds": self.special_embeds,
        }
        for key in ("image_grid_thw", "video_grid_thw", "video_second_per_grid"):
            if key in media:
                prompt[key] = media[key].float().cpu().numpy() if key == "video_second_per_grid" else \
                    media[key].cpu().numpy()
        if audio_lengths is not None:
            prompt["audio_feature_lengths"] = audio_lengths.cpu().numpy()
        output = self._emit(request, state, out.last_hidden_state[0, -1])
        prompt["first_token"] = state.generated[0]
        output.data = {**(output.data or {}), "prompt": prompt}
        output.details = {"inputs": {k: list(v.shape) for k, v in inputs.items()}}
        return output

    def _decode(self, request: StageRequest) -> RunnerOutput:
        state: ThinkerState = request.runner_state
        token = torch.tensor([[state.generated[-1]]], device=self.device)
        position = torch.full((3, 1, 1), state.length, device=self.device) + state.rope_deltas.view(1, -1, 1)
        text_position = torch.full((1, 1, 1), state.length, device=self.device)
        mask = torch.ones(1, state.length + 1, dtype=torch.long, device=self.device)
        out = self.model.model(input_ids=token, attention_mask=mask, past_key_values=state.cache, use_cache=True,
                               position_ids=torch.cat([text_position, position]), output_hidden_states=True)
        state.length += 1
        reply = {"reply_embed": out.hidden_states[0][0, -1].float().cpu().numpy(),
                 "reply_hidden": out.hidden_states[-1][0, -1].float().cpu().numpy()}
        output = self._emit(request, state, out.last_hidden_state[0, -1])
        output.data = {**(output.data or {}), **reply}
        return output

    def _decode_ids(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _emit(self, request: StageRequest, state: ThinkerState, hidden: torch.Tensor) -> RunnerOutput:
        """The next token from the last position's hidden state [H], and the text it lets out."""
        token = sample_next_token(self.model.lm_head(hidden), state.sampling, state.generated, state.generator,
                                  prompt_ids=state.prompt_ids)
        state.generated.append(token)
        if token in self.eos_ids:
            delta, units = state.stream.finish()
            return RunnerOutput(request.request_id, text_delta=delta, num_units=units, finished=True,
                                finish_reason="stop")
        delta, units = state.stream.push(token)
        if state.stream.stopped:
            return RunnerOutput(request.request_id, text_delta=delta, num_units=units, finished=True,
                                finish_reason="stop")
        if len(state.generated) >= state.max_tokens:
            more, rest = state.stream.finish()
            return RunnerOutput(request.request_id, text_delta=delta + more, num_units=units + rest, finished=True,
                                finish_reason="stop" if state.stream.stopped else "length", data={"token": token})
        return RunnerOutput(request.request_id, text_delta=delta, num_units=units, data={"token": token})

    @torch.inference_mode()
    def execute(self, batch: list[StageRequest], is_prefill: bool) -> list[RunnerOutput]:
        return [self._prefill(r) if is_prefill else self._decode(r) for r in batch]

    def free(self, request: StageRequest) -> None:
        request.runner_state = None

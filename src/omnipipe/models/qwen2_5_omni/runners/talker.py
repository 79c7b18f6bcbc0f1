"""The Qwen2.5-Omni talker stage: ``Qwen2_5OmniTalkerForConditionalGeneration`` turns the thinker's hidden states
into codec codes, one per step, with a per-request DynamicCache and rope deltas. Its prefill reads the thinker's
prompt part and first reply item; each later step reads the next reply item (then the text-end embedding, then the
pad embedding for ever once the thinker is done). Under async chunk a step whose reply item has not arrived yet
waits for it (``needs_input``).

Sampling follows the fields of the request's talker SamplingParams the caller set; every field left out keeps the
model's decoding (that of transformers' ``generate``: temperature 0.9, top-k 40, top-p 0.8, repetition penalty 1.05,
up to ``max_codes`` codes). The repetition penalty reads the
talker's whole input (as ``generate``), the presence and frequency penalties the codes generated so far. ``stop``
(strings) has no meaning for codec codes and is refused. The codec's begin token is suppressed; its pad and end
tokens end the speech.

Stage options: ``TalkerOptions`` (``options.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from transformers import DynamicCache

from omnipipe.models.qwen2_5_omni.options import TalkerOptions
from omnipipe.models.qwen2_5_omni.processors import Qwen25TalkerParams
from omnipipe.models.qwen2_5_omni.weights.load import (
    load_part,
    load_speakers,
)
from omnipipe.stage.checkpoint_options import checked_options, compile_if
from omnipipe.stage.request import StageRequest
from omnipipe.stage.runner import RunnerOutput, StageRunner
from omnipipe.stage.sampling import TokenSamplingParams, given_params, sample_next_token
from omnipipe.util.field_error import FieldError

MODEL_DECODING = TokenSamplingParams(temperature=0.9, top_k=40, top_p=0.8, repetition_penalty=1.05)


@dataclass
class TalkerState:
    cache: DynamicCache
    rope_deltas: torch.Tensor
    history: list[int]  # the talker's input ids and codes so far (for the repetition penalty)
    prompt_length: int  # of ``history``: the codes follow
    replies: list[torch.Tensor] = field(default_factory=list)  # reply items not read yet
    thinker_done: bool = False
    tail: list[torch.Tensor] = field(default_factory=list)  # text-end, then pad: read after the reply
    codes: int = 0
    speaker: str = "Chelsie"
    sampling: TokenSamplingParams = MODEL_DECODING
    max_codes: int = 0
    generator: torch.Generator | None = None


class QwenOmniTalkerRunner(StageRunner):
    def load(self) -> None:
        self.options, directory, self.dtype = checked_options(self.context, TalkerOptions)
        self.device = torch.device(self.context.device)
        self.model = load_part(directory, "talker", self.device, self.dtype)
        compile_if(self.model.model, self.options.torch_compile)
        self.eos_codes = {self.model.codec_pad_token, self.model.codec_eos_token}
        self.max_codes = self.options.max_codes
        self.bos_tokens = {name: int(s["bos_token"]) for name, s in load_speakers(directory).items()}

    def validate(self, params: dict[str, Any]) -> str | None:
        if params.get("stop"):
            raise FieldError("sampling_params.stop", "the talker generates codec codes, not text: stop strings do "
                             "not apply (give them to the thinker)")
        speaker = Qwen25TalkerParams(**(params.get("extra") or {})).speaker
        if speaker not in self.bos_tokens:
            raise FieldError("sampling_params.extra.speaker",
                             f"unknown voice {speaker!r}; this checkpoint has {', '.join(sorted(self.bos_tokens))}")
        return None

    def _tensor(self, array: Any) -> torch.Tensor:
        return torch.tensor(np.asarray(array), dtype=self.dtype, device=self.device)  # a copy: inputs are read-only

    def _read(self, request: StageRequest) -> tuple[dict[str, Any] | None, list[torch.Tensor], bool]:
        """The arrived chunks: (the prompt part if one came, the reply items, whether the thinker is done)."""
        prompt, items, done = None, [], False
        for chunk in request.take_all_inputs():
            prompt = chunk.get("prompt", prompt)
            items += [self._tensor(e) + self._tensor(h)
                      for e, h in zip(chunk.get("reply_embeds", []), chunk.get("reply_hidden", []), strict=False)]
            done = done or bool(chunk.get("thinker_done"))
        return prompt, items, done

    def _prefill(self, request: StageRequest) -> RunnerOutput:
        prompt, replies, done = self._read(request)
        if prompt is None:
            return RunnerOutput(request.request_id, error="the talker's first input carries no thinker prompt part")
        speaker = Qwen25TalkerParams(**(request.params.get("extra") or {})).speaker
        special = prompt["special_embeds"]
        eos_embed, pad_embed = self._tensor(special["text_eos"]), self._tensor(special["text_pad"])
        bos_embed = self._tensor(special["bos"][speaker])
        if not replies and not done:
            return RunnerOutput(request.request_id, error="the talker's first input carries no reply item")
        first_reply = replies[0] if replies else eos_embed
        input_ids = torch.tensor(prompt["input_ids"], device=self.device).view(1, -1)
        length = input_ids.shape[1]
        model = self.model
        bos_token = self.bos_tokens[speaker]
        text_ids = torch.cat([input_ids, torch.tensor([[bos_token, int(prompt["first_token"])]], device=self.device)],
                             dim=1)
        talker_ids = torch.tensor([[model.codec_mask_token] * length + [model.codec_pad_token, model.codec_bos_token]],
                                  device=self.device)
        embeds = torch.cat([self._tensor(prompt["hidden"]) + self._tensor(prompt["embeds"]), bos_embed[None],
                            first_reply[None]])[None]
        mask = torch.cat([torch.tensor(prompt["attention_mask"], device=self.device).view(1, -1),
                          torch.ones(1, 2, dtype=torch.long, device=self.device)], dim=1)
        extra = {k: torch.tensor(prompt[k], device=self.device) for k in
                 ("image_grid_thw", "video_grid_thw", "audio_feature_lengths", "video_second_per_grid") if k in prompt}
        cache = DynamicCache()
        model.rope_deltas = None
        out = model(input_ids=talker_ids, input_text_ids=text_ids, inputs_embeds=embeds, attention_mask=mask,
                    past_key_values=cache, use_cache=True, use_audio_in_video=False, **extra)
        # the fields a caller gives replace the model's decoding; the others stay the model's
        sampling = TokenSamplingParams.from_params(request.params, MODEL_DECODING)
        state = TalkerState(cache, model.rope_deltas, talker_ids[0].tolist(), talker_ids.shape[1], replies[1:],
                            done, [eos_embed, pad_embed], speaker=speaker, sampling=sampling,
                            max_codes=int(given_params(request.params).get("max_tokens", self.max_codes)),
                            generator=sampling.make_generator(salt=1))
        request.runner_state = state
        request.prefilled = True
        return self._emit(request, state, out.logits[:, -1])

    def _decode(self, request: StageRequest) -> RunnerOutput:
        state: TalkerState = request.runner_state
        _, items, done = self._read(request)
        state.replies += items
        state.thinker_done = state.thinker_done or done
        if state.replies:
            item = state.replies.pop(0)
        elif state.thinker_done:
            item = state.tail.pop(0) if len(state.tail) > 1 else state.tail[0]
        else:
            return RunnerOutput(request.request_id, needs_input=True)
        model = self.model
        model.rope_deltas = state.rope_deltas
        length = state.cache.get_seq_length()
        mask = torch.ones(1, length + 1, dtype=torch.long, device=self.device)
        out = model(input_ids=torch.tensor([[state.history[-1]]], device=self.device), attention_mask=mask,
                    thinker_reply_part=item.view(1, 1, -1), past_key_values=state.cache, use_cache=True)
        return self._emit(request, state, out.logits[:, -1])

    def _emit(self, request: StageRequest, state: TalkerState, logits: torch.Tensor) -> RunnerOutput:
        code = sample_next_token(logits[0], state.sampling, state.history[state.prompt_length:], state.generator,
                                 prompt_ids=state.history[:state.prompt_length], suppress=[self.model.codec_bos_token])
        state.history.append(code)
        if code in self.eos_codes:
            return RunnerOutput(request.request_id, finished=True, finish_reason="stop")
        state.codes += 1
        done = state.codes >= state.max_codes
        return RunnerOutput(request.request_id, num_units=1, finished=done, finish_reason="length" if done else None,
                            data={"frames": np.array([[code]], dtype=np.int64), "speaker": state.speaker})

    @torch.inference_mode()
    def execute(self, batch: list[StageRequest], is_prefill: bool) -> list[RunnerOutput]:
        return [self._prefill(r) if is_prefill else self._decode(r) for r in batch]

    def free(self, request: StageRequest) -> None:
        request.runner_state = None

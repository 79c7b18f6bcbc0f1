"""The Qwen3-Omni talker stage: the thinker's prompt and text embeddings in, one frame of codec codes
(``num_code_groups`` codes: the talker's own and its code predictor's residuals) out per step.

The prefill is the model's: the prompt's user turns projected into the talker (text positions through
``text_projection`` of their embeddings, multimodal positions through ``hidden_projection`` of the thinker's hidden
states), then the assistant's opening with the codec's think/speaker/bos ids. Each step then feeds the sum of the
last frame's code embeddings plus the next text embedding (``tts_eos`` once the text is done, ``tts_pad`` after). A
step whose text embedding has not arrived yet waits for the thinker (``needs_input``).

Stage options: ``TalkerOptions`` (``options.py``). Decoding: the model's own (sampling at temperature 0.9, top-k 50,
repetition penalty 1.05, up to ``max_new_tokens`` frames), each field of the talker's SamplingParams the caller set
replacing its counterpart. The code predictor's residual codes follow the talker: greedy when it is, else sampled as
the model does (top-k 50, top-p 0.8) from the request's seed. ``stop`` has no meaning for codec frames and is refused.
"""

from __future__ import annotations

from typing import Any

import torch

from omnipipe.models.qwen3_omni.options import Qwen3TalkerParams, TalkerOptions
from omnipipe.models.qwen3_omni.weights.load import load_config, load_part, read_rows, speaker_ids
from omnipipe.stage.checkpoint_options import checked_options, compile_if
from omnipipe.stage.request import StageRequest
from omnipipe.stage.runner import RunnerOutput, StageRunner
from omnipipe.stage.sampling import TokenSamplingParams, given_params, sample_next_token
from omnipipe.util.field_error import FieldError

MODEL_DECODING = TokenSamplingParams(temperature=0.9, top_k=50, top_p=1.0, repetition_penalty=1.05)


class QwenOmniTalkerRunner(StageRunner):
    def load(self) -> None:
        self.options, self.directory, self.dtype = checked_options(self.context, TalkerOptions)
        self.device = self.context.device
        self.config = load_config(self.directory)
        self.model = load_part(self.directory, "talker", self.device, self.dtype)
        compile_if(self.model.model, self.options.torch_compile)
        talker = self.config.talker_config
        self.speakers = {name.lower(): index for name, index in speaker_ids(self.config).items()}
        default = "ethan" if "ethan" in self.speakers else next(iter(self.speakers), "")
        self.speaker_id = self._speaker_id(self.options.speaker or default,
                                           f"stages.{self.context.stage}.options.speaker")
        self.groups = int(talker.num_code_groups)
        self.eos = int(talker.codec_eos_token_id)
        vocab = int(talker.text_config.vocab_size)
        self.suppress = torch.tensor([i for i in range(vocab - 1024, vocab) if i != self.eos], device=self.device)
        self._load_text_tokens()

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

    def _speaker_id(self, name: str, field: str) -> int:
        if name.lower() not in self.speakers:
            raise FieldError(field, f"unknown speaker {name!r} (this checkpoint has "
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

    def snapshot(self, request: StageRequest) -> Any:
        state = request.runner_state
        if state is None:
            return None
        if "cache" not in state:  # waiting for the thinker: nothing built yet
            return {key: list(value) if isinstance(value, list) else value for key, value in state.items()}
        generator = state["generator"]
        return {"length": state["cache"].get_seq_length(), "text": len(state["text"]), "done": state["done"],
                "step": state["step"], "sampled": len(state["sampled"]), "last_position": state["last_position"],
                "last_hidden": state["last_hidden"], "generator": None if generator is None else generator.get_state()}

    def restore(self, request: StageRequest, snapshot: Any) -> None:
        state = request.runner_state
        if snapshot is None or state is None or "length" not in snapshot:
            request.runner_state = snapshot
            return
        state["cache"].crop(snapshot["length"])
        del state["text"][snapshot["text"]:]
        del state["sampled"][snapshot["sampled"]:]
        for key in ("done", "step", "last_position", "last_hidden"):
            state[key] = snapshot[key]
        if snapshot["generator"] is not None:
            state["generator"].set_state(snapshot["generator"])

    # ----------------------------------------------------------------------------------------------- prefill
    def _take(self, request: StageRequest, state: dict[str, Any]) -> None:
        for item in request.take_all_inputs():
            for key in ("prompt_ids", "prompt_embed", "mm_hidden", "grids"):
                if key in item:
                    state[key] = item[key]
            embeds = item.get("text_embeds")
            if embeds is not None and len(embeds):
                state["text"].extend(torch.as_tensor(embeds).unbind(0))
            state["done"] = state["done"] or bool(item.get("done"))

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
        part = torch.empty(int(user.sum()), self.model.config.text_config.hidden_size, dtype=self.dtype,
                           device=self.device)
        user_mm = mm[user]
        mm_rank = torch.cumsum(mm.long(), 0) - 1  # index of each multimodal position among mm_hidden's rows
        if user_mm.any():
            rows = mm_hidden[mm_rank[user & mm]].to(self.device, self.dtype)
            part[user_mm.to(self.device)] = self.model.hidden_projection(rows)
        text_rows = embed[user & ~mm].to(self.device, self.dtype)
        part[~user_mm.to(self.device)] = self.model.text_projection(text_rows)
        return part, ids[user]

    def _prefill(self, request: StageRequest) -> RunnerOutput | None:
        from transformers import DynamicCache

        state: dict[str, Any] = request.runner_state or {"text": [], "done": False}
        request.runner_state = state
        self._take(request, state)
        if "prompt_ids" not in state or (not state["text"] and not state["done"]):
            return RunnerOutput(request.request_id, needs_input=True)
        if not state["text"]:  # the thinker said nothing to speak
            return RunnerOutput(request.request_id, finished=True, finish_reason="stop")
        config, talker_config = self.config, self.config.talker_config
        ids = torch.as_tensor(state.pop("prompt_ids")).long()
        embed = torch.as_tensor(state.pop("prompt_embed"))
        user_embeds, user_ids = self._user_part(ids, embed, torch.as_tensor(state.pop("mm_hidden")))
        starts = ((ids[:-1] == config.im_start_token_id) & (ids[1:] == config.assistant_token_id)).nonzero()
        # the assistant's opening: <|im_start|> assistant \n
        opening = self.model.text_projection(embed[int(starts[-1, 0]):].to(self.device, self.dtype))
        first_text = self.model.text_projection(state["text"][0].to(self.device, self.dtype))[None]
        text_part = torch.cat([opening[:3], self.tts_pad.expand(4, -1), self.tts_bos[None], first_text])
        codec_ids = torch.tensor([talker_config.codec_nothink_id, talker_config.codec_think_bos_id,
                                  talker_config.codec_think_eos_id, self._request_speaker_id(request.params),
                                  talker_config.codec_pad_id,
                                  talker_config.codec_bos_id], device=self.device)
        codec_part = torch.cat([torch.zeros(3, text_part.shape[-1], dtype=self.dtype, device=self.device),
                                self.model.get_input_embeddings()(codec_ids)])
        inputs_embeds = torch.cat([user_embeds, text_part + codec_part])[None]
        talker_ids = torch.cat([user_ids, torch.full((len(text_part),), config.tts_pad_token_id)])[None]
        grids = {k: torch.as_tensor(v) for k, v in state.pop("grids").items()}
        mask = torch.ones(1, inputs_embeds.shape[1], dtype=torch.long, device=self.device)
        kwargs = {"attention_mask": mask, "talker_input_ids": talker_ids.to(self.device),
                  **{k: v.to(self.device) for k, v in grids.items()}}
        position_ids = self.model._prepare_position_ids_for_generation(inputs_embeds, {**kwargs,
                                                                                       "past_key_values": None})
        self.model.rope_deltas = None  # positions are passed explicitly; leave nothing on the shared model
        state["cache"] = DynamicCache(config=self.model.config.text_config)
        state["sampling"] = TokenSamplingParams.from_params(request.params, MODEL_DECODING)
        state["generator"] = state["sampling"].make_generator()
        state["max_tokens"] = int(given_params(request.params).get("max_tokens", self.options.max_new_tokens))
        state["step"] = 0  # index into the text embeddings after the first
        state["sampled"] = []
        out = self._forward(state, position_ids, inputs_embeds=inputs_embeds, attention_mask=mask)
        request.prefilled = True
        return self._sample(request, state, out)

    # ------------------------------------------------------------------------------------------------- steps
    def _forward(self, state: dict[str, Any], position_ids: torch.Tensor, **kwargs: Any):
        state["last_position"] = position_ids[..., -1:]
        out = self.model.model(past_key_values=state["cache"], use_cache=True, position_ids=position_ids, **kwargs)
        state["last_hidden"] = out.last_hidden_state[:, -1:]
        return self.model.codec_head(out.last_hidden_state[0, -1])

    def _sample(self, request: StageRequest, state: dict[str, Any], logits: torch.Tensor) -> RunnerOutput | None:
        token = sample_next_token(logits, state["sampling"], state["sampled"], state["generator"],
                                  suppress=self.suppress)
        state["sampled"].append(token)
        if token == self.eos:
            return RunnerOutput(request.request_id, finished=True, finish_reason="stop")
        if len(state["sampled"]) >= state["max_tokens"]:
            return RunnerOutput(request.request_id, finished=True, finish_reason="length")
        return None

    def _text_embedding(self, state: dict[str, Any]) -> torch.Tensor | None:
        """The text this step adds: the next generated token's, then tts_eos, then tts_pad; None: not here yet."""
        index = state["step"] + 1  # the first text embedding went into the prefill
        if index < len(state["text"]):
            return self.model.text_projection(state["text"][index].to(self.device, self.dtype))
        if not state["done"]:
            return None
        return self.tts_eos if index == len(state["text"]) else self.tts_pad

    def _step(self, request: StageRequest) -> RunnerOutput:
        state = request.runner_state
        self._take(request, state)
        text = self._text_embedding(state)
        if text is None:
            return RunnerOutput(request.request_id, needs_input=True)
        token = torch.tensor([[state["sampled"][-1]]], device=self.device)
        last_id_hidden = self.model.get_input_embeddings()(token)
        predictor = self.model.code_predictor
        sample = not state["sampling"].greedy
        extra = {"top_k": 50, "top_p": 0.8} if sample else {}
        if sample:  # the predictor samples from the global generator: seed it from the request's (given a seed)
            torch.manual_seed(int(torch.randint(0, 2**62, (1,), generator=state["generator"])))
        result = predictor.generate(inputs_embeds=torch.cat((state["last_hidden"], last_id_hidden), dim=1),
                                    max_new_tokens=self.groups - 1, do_sample=sample, output_hidden_states=True,
                                    return_dict_in_generate=True, **extra)
        codes = torch.cat((token, result.sequences), dim=-1)[0]  # [groups]
        residual_hiddens = [h[0] for h in result.hidden_states[1:]]
        last_residual = predictor.get_input_embeddings()[-1](result.sequences[..., -1:])
        step_embed = torch.cat([last_id_hidden, *residual_hiddens, last_residual], dim=1).sum(1, keepdim=True)
        step_embed = step_embed + text.view(1, 1, -1)
        state["step"] += 1
        logits = self._forward(state, state["last_position"] + 1, inputs_embeds=step_embed)
        frame = {"frames": codes.cpu().long().numpy()[:, None]}
        finished = self._sample(request, state, logits)
        if finished is not None:
            finished.data, finished.num_units = frame, 1
            return finished
        return RunnerOutput(request.request_id, data=frame, num_units=1)

    @torch.inference_mode()
    def execute(self, batch: list[StageRequest], is_prefill: bool) -> list[RunnerOutput]:
        outputs = []
        for request in batch:
            if not request.prefilled:
                out = self._prefill(request)
                outputs.append(out if out is not None else RunnerOutput(request.request_id))
            else:
                outputs.append(self._step(request))
        return outputs

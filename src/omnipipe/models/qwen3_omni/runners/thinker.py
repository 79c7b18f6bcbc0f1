"""The Qwen3-Omni thinker stage: text, images, audio and video in, text out, and per step what the talker reads.

Each request keeps its own transformers cache and rope positions (4 rows: text, then the three multimodal rows, as
``generate`` builds them); a step runs the thinker once per request of the batch (their positions differ). Logits
are computed for the last position only; hidden states are kept only at the prefill. What the talker needs goes out
as step data: with the first token, the prompt's ids, its layer-0 embeddings and its multimodal positions' hidden
states at the talker's ``accept_hidden_layer`` (and the grids its rope index needs); with every token, that token's
embedding.

Stage options: ``MultimodalThinkerOptions`` (``stage/checkpoint_options.py``). SamplingParams (``stage/sampling.py``):
temperature, top-k, top-p, seed, repetition / presence / frequency penalties (over the generated tokens),
``max_tokens``, ``stop`` (``stage/text_stream.py``: the text ends before a stop string; text that may begin one is
held back until it is settled).
"""

from __future__ import annotations

from typing import Any

import torch

from omnipipe.models.qwen3_omni.thinker_inputs import ThinkerInputBuilder
from omnipipe.models.qwen3_omni.weights.load import load_config, load_part
from omnipipe.stage.checkpoint_options import MultimodalThinkerOptions, checked_options, compile_if
from omnipipe.stage.request import StageRequest
from omnipipe.stage.runner import RunnerOutput, StageRunner
from omnipipe.stage.sampling import TokenSamplingParams, given_params, sample_next_token
from omnipipe.stage.text_stream import TextStream
from omnipipe.util.field_error import FieldError


class QwenOmniThinkerRunner(StageRunner):
    def load(self) -> None:
        self.options, self.directory, dtype = checked_options(self.context, MultimodalThinkerOptions)
        self.device = self.context.device
        self.config = load_config(self.directory)
        self.model = load_part(self.directory, "thinker", self.device, dtype)
        compile_if(self.model.model.language_model, self.options.torch_compile)
        self.inputs = ThinkerInputBuilder(self.directory, self.config)
        self.accept_layer = int(self.config.talker_config.accept_hidden_layer)
        thinker = self.config.thinker_config
        self.mm_token_ids = torch.tensor([thinker.audio_token_id, thinker.image_token_id, thinker.video_token_id])
        self.eos_ids = {int(self.config.im_end_token_id)}
        if self.inputs.tokenizer.pad_token_id is not None:
            self.eos_ids.add(int(self.inputs.tokenizer.pad_token_id))  # <|endoftext|>

    # ------------------------------------------------------------------------------------- per-request state
    def snapshot(self, request: StageRequest) -> Any:
        state = request.runner_state
        if state is None:
            return None
        generator = state["generator"]
        return {"length": state["cache"].get_seq_length(), "generated": list(state["generated"]),
                "generator": None if generator is None else generator.get_state(), "stream": state["stream"].copy(),
                **{key: state[key] for key in ("last_position", "logits")}}

    def restore(self, request: StageRequest, snapshot: Any) -> None:
        if snapshot is None:
            request.runner_state = None
            return
        state = request.runner_state
        state["cache"].crop(snapshot.pop("length"))
        generator = snapshot.pop("generator")
        if generator is not None:
            state["generator"].set_state(generator)
        state.update(snapshot)

    # ------------------------------------------------------------------------------------------------ model
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

    def _forward(self, state: dict[str, Any], position_ids: torch.Tensor, hidden: bool = False, **kwargs: Any):
        """One forward at ``position_ids``; the next step's positions follow the last by one. Returns the last
        position's logits and, with ``hidden``, every layer's hidden states."""
        state["last_position"] = position_ids[..., -1:]
        out = self.model.model(past_key_values=state["cache"], use_cache=True, output_hidden_states=hidden,
                               position_ids=position_ids, **kwargs)
        logits = self.model.lm_head(out.last_hidden_state[0, -1:])[0]
        return logits, out.hidden_states

    def _prefill(self, request: StageRequest) -> dict[str, Any]:
        from transformers import DynamicCache

        items = request.take_all_inputs()
        item = items[0] if items else {}
        try:
            kwargs = self.inputs(self._sample_videos(item))
        except FieldError:
            raise
        except (ValueError, RuntimeError) as exc:
            raise FieldError("prompt.multi_modal_data", f"cannot be processed: {exc}") from None
        kwargs = {k: v.to(self.device) if torch.is_tensor(v) else v for k, v in kwargs.items()}
        for key in ("pixel_values", "pixel_values_videos", "input_features"):
            if key in kwargs:
                kwargs[key] = kwargs[key].to(self.model.dtype)
        ids = kwargs["input_ids"]
        request.num_prompt_tokens = int(ids.shape[1])
        sampling = TokenSamplingParams.from_params(request.params)
        max_tokens = int(given_params(request.params).get("max_tokens", self.options.max_new_tokens))
        state: dict[str, Any] = {"cache": DynamicCache(config=self.model.config.text_config),
                                 "generated": [], "sampling": sampling, "generator": sampling.make_generator(),
                                 "stream": TextStream(self._decode_ids, request.params.get("stop") or []),
                                 "max_tokens": max_tokens}
        position_ids = self.model._prepare_position_ids_for_generation(ids, {**kwargs, "past_key_values": None})
        self.model.model.rope_deltas = None  # positions are passed explicitly; leave nothing on the shared model
        state["logits"], hidden = self._forward(state, position_ids, hidden=True, **kwargs)
        mm = torch.isin(ids[0].cpu(), self.mm_token_ids).to(hidden[0].device)
        handoff: dict[str, Any] = {
            "prompt_ids": ids[0].cpu(),
            "prompt_embed": hidden[0][0].float().cpu(),
            "mm_hidden": hidden[self.accept_layer][0][mm].float().cpu(),
        }
        grids = {k: kwargs[k].cpu() for k in ("image_grid_thw", "video_grid_thw", "video_second_per_grid")
                 if k in kwargs}
        if "feature_attention_mask" in kwargs:
            grids["audio_feature_lengths"] = kwargs["feature_attention_mask"].sum(-1).cpu()
        handoff["grids"] = grids
        state["handoff"] = handoff
        request.runner_state = state
        request.prefilled = True
        return state

    def _decode_ids(self, ids: list[int]) -> str:
        return self.inputs.tokenizer.decode(ids, skip_special_tokens=True)

    @torch.inference_mode()
    def execute(self, batch: list[StageRequest], is_prefill: bool) -> list[RunnerOutput]:
        outputs = []
        for request in batch:
            if is_prefill:
                try:
                    state = self._prefill(request)
                except FieldError as exc:
                    outputs.append(RunnerOutput(request.request_id, finished=True, finish_reason="error",
                                                error=exc.rule, error_field=exc.field))
                    continue
            else:
                state = request.runner_state
                token = torch.tensor([[state["generated"][-1]]], device=self.device)
                state["logits"], _ = self._forward(state, state["last_position"] + 1, input_ids=token)
            token = sample_next_token(state["logits"], state["sampling"], state["generated"], state["generator"])
            state["generated"].append(token)
            embed = self.model.get_input_embeddings()(torch.tensor([token], device=self.device))[0]
            data: dict[str, Any] = {"token": token, "embed": embed.float().cpu()}
            if "handoff" in state:
                data.update(state.pop("handoff"))
            stream: TextStream = state["stream"]
            stopped = token in self.eos_ids  # the end token is no text
            delta, units = ("", 0) if stopped else stream.push(token)
            stopped = stopped or stream.stopped
            done = stopped or len(state["generated"]) >= state["max_tokens"]
            if done:
                more, rest = stream.finish()
                delta, units = delta + more, units + rest
                stopped = stopped or stream.stopped
            outputs.append(RunnerOutput(request.request_id, text_delta=delta, data=data, num_units=units,
                                        finished=done,
                                        finish_reason=("stop" if stopped else "length") if done else None))
        return outputs

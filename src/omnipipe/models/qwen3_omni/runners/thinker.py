"""The Qwen3-Omni thinker stage: text, images, audio and video in, text out, and per step what the talker reads.

Each request keeps its own transformers cache and rope deltas; a step runs the thinker once per request of the batch
(the multimodal rope positions differ per request). What the talker needs goes out as step data: with the first
token, the prompt's ids, its layer-0 embeddings and its multimodal positions' hidden states at the talker's
``accept_hidden_layer`` (and the grids its rope index needs); with every token, that token's embedding.

Stage options: ``model`` (checkpoint directory, required), ``dtype`` (auto: bf16 on CUDA), ``gpu_memory_fraction``,
``torch_compile`` (the text decoder; ``weights/load.py``),
``max_new_tokens`` (when a request gives no ``max_tokens``), ``video_fps`` (2: frames per second sampled from a
video file, and the rate frames given as frames are taken to have), ``video_max_frames`` (64).
"""

from __future__ import annotations

from typing import Any

import torch

from omnipipe.models.qwen3_omni.sampling import Decoding, next_token
from omnipipe.models.qwen3_omni.thinker_inputs import ThinkerInputBuilder
from omnipipe.models.qwen3_omni.weights.load import (
    check_checkpoint,
    load_config,
    load_part,
    maybe_compile,
    prepare_device,
    resolve_dtype,
)
from omnipipe.stage.request import StageRequest
from omnipipe.stage.runner import RunnerOutput, StageRunner
from omnipipe.util.field_error import FieldError

ENCODER_KEYS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "video_second_per_grid",
                "input_features", "feature_attention_mask")


class QwenOmniThinkerRunner(StageRunner):
    def load(self) -> None:
        options = self.context.options
        self.directory = check_checkpoint(options.get("model"), f"stages.{self.context.stage}.options.model")
        self.device = self.context.device
        dtype = resolve_dtype(options.get("dtype"), self.device, f"stages.{self.context.stage}.options.dtype")
        self.config = load_config(self.directory)
        prepare_device(options, self.device, self.context.stage)
        self.model = load_part(self.directory, "thinker", self.device, dtype)
        maybe_compile(self.model.model.language_model, options, self.context.stage)
        self.inputs = ThinkerInputBuilder(self.directory, self.config)
        self.accept_layer = int(self.config.talker_config.accept_hidden_layer)
        thinker = self.config.thinker_config
        self.mm_token_ids = torch.tensor([thinker.audio_token_id, thinker.image_token_id, thinker.video_token_id])
        tokenizer = self.inputs.tokenizer
        self.eos_ids = {int(self.config.im_end_token_id)}
        if tokenizer.pad_token_id is not None:
            self.eos_ids.add(int(tokenizer.pad_token_id))  # <|endoftext|>
        self.max_new_tokens = int(options.get("max_new_tokens", 1024))
        self.video_fps = float(options.get("video_fps", 2.0))
        self.video_max_frames = int(options.get("video_max_frames", 64))

    def _sample_videos(self, item: dict[str, Any]) -> dict[str, Any]:
        """Video files (bytes or a data: URL) sampled at the stage's ``video_fps``; frames given as frames stay."""
        from omnipipe.util.media import load_video

        videos = item.get("videos")
        if not videos:
            return item
        sampled = [load_video(v, f"prompt.multi_modal_data.video[{i}]", fps=self.video_fps,
                              max_frames=self.video_max_frames) if isinstance(v, (bytes, str)) else v
                   for i, v in enumerate(videos)]
        return {**item, "videos": sampled, "video_fps": self.video_fps}

    def snapshot(self, request: StageRequest) -> Any:
        state = request.runner_state
        if state is None:
            return None
        return {"length": state["cache"].get_seq_length(), "generated": list(state["generated"]),
                "text": state["text"], "last_position": state["last_position"], "logits": state["logits"],
                "prefix_offset": state["prefix_offset"], "read_offset": state["read_offset"]}

    def restore(self, request: StageRequest, snapshot: Any) -> None:
        if snapshot is None:
            request.runner_state = None
            return
        state = request.runner_state
        state["cache"].crop(snapshot["length"])
        for key in ("generated", "text", "last_position", "logits", "prefix_offset", "read_offset"):
            state[key] = snapshot[key]

    def _forward(self, state: dict[str, Any], position_ids: torch.Tensor, **kwargs: Any):
        """One forward at ``position_ids`` ([4, 1, n]: text positions, then the three multimodal rope rows, as
        generate builds them); the next step's positions follow the last by one."""
        state["last_position"] = position_ids[..., -1:]
        return self.model(past_key_values=state["cache"], use_cache=True, output_hidden_states=True,
                          position_ids=position_ids, **kwargs)

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
        state: dict[str, Any] = {"cache": DynamicCache(config=self.model.config.text_config),
                                 "generated": [], "text": "", "prefix_offset": 0, "read_offset": 0,
                                 "decoding": Decoding.from_params(request.params, Decoding()),
                                 "max_tokens": int(request.params.get("max_tokens") or self.max_new_tokens)}
        state["generator"] = state["decoding"].generator()
        position_ids = self.model._prepare_position_ids_for_generation(ids, {**kwargs, "past_key_values": None})
        out = self._forward(state, position_ids, **kwargs)
        mm = torch.isin(ids[0].cpu(), self.mm_token_ids)
        hidden = out.hidden_states
        handoff: dict[str, Any] = {
            "prompt_ids": ids[0].cpu(),
            "prompt_embed": hidden[0][0].float().cpu(),
            "mm_hidden": hidden[self.accept_layer][0][mm.to(hidden[0].device)].float().cpu(),
        }
        grids = {k: kwargs[k].cpu() for k in ("image_grid_thw", "video_grid_thw", "video_second_per_grid")
                 if k in kwargs}
        if "feature_attention_mask" in kwargs:
            grids["audio_feature_lengths"] = kwargs["feature_attention_mask"].sum(-1).cpu()
        handoff["grids"] = grids
        state["handoff"] = handoff
        state["logits"] = out.logits[0, -1]
        request.runner_state = state
        request.prefilled = True
        return state

    def _decode_text(self, state: dict[str, Any], final: bool = False) -> str:
        """The text the new token adds. Only the tokens since the last emitted piece are decoded (with the piece
        before them, so byte-level merges across the boundary come out right); a piece ending in a partial UTF-8
        character waits for the next token unless this is the last."""
        decode = self.inputs.tokenizer.decode
        ids, start, read = state["generated"], state["prefix_offset"], state["read_offset"]
        before = decode(ids[start:read], skip_special_tokens=True)
        now = decode(ids[start:], skip_special_tokens=True)
        if (now.endswith("\ufffd") and not final) or len(now) <= len(before):
            return ""
        state["prefix_offset"], state["read_offset"] = read, len(ids)
        delta = now[len(before):]
        state["text"] += delta
        return delta

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
                state["logits"] = self._forward(state, state["last_position"] + 1, input_ids=token).logits[0, -1]
            token = next_token(state["logits"], state["decoding"], state["generated"], None, state["generator"])
            state["generated"].append(token)
            data: dict[str, Any] = {"token": token,
                                    "embed": self.model.get_input_embeddings()(
                                        torch.tensor([token], device=self.device))[0].float().cpu()}
            if "handoff" in state:
                data.update(state.pop("handoff"))
            if token in self.eos_ids:
                outputs.append(RunnerOutput(request.request_id, text_delta=self._decode_text(state, final=True),
                                            data=data, num_units=1, finished=True, finish_reason="stop"))
                continue
            done = len(state["generated"]) >= state["max_tokens"]
            delta = self._decode_text(state, final=done)
            stop = next((s for s in request.params.get("stop") or [] if s and s in state["text"]), None)
            if stop is not None:  # the text ends before the stop string, which is not part of it
                kept = state["text"][: state["text"].index(stop)]
                delta = kept[len(state["text"]) - len(delta):] if len(kept) >= len(state["text"]) - len(delta) else ""
                outputs.append(RunnerOutput(request.request_id, text_delta=delta, data=data, num_units=1,
                                            finished=True, finish_reason="stop"))
                continue
            outputs.append(RunnerOutput(request.request_id, text_delta=delta, data=data,
                                        num_units=1, finished=done, finish_reason="length" if done else None))
        return outputs

    def free(self, request: StageRequest) -> None:
        request.runner_state = None

"""The CSM backbone stage: text (and context clips) in, one frame of Mimi codes (``num_codebooks`` codes, 12.5 a
second) out per step.

A prompt is built on a background thread from the moment it arrives (``prompting.py``: sesame/csm-1b's turns, the
context clips' placeholders counted). At its prefill the text's embeddings are the model's ``embed_text_tokens``;
each context clip is encoded by the checkpoint's Mimi (one call per clip, as transformers' generate does) and its
frames written over its ``<|AUDIO|>`` placeholders as the sum of their codebook embeddings, each ``<|audio_eos|>``
as the embedding of a frame of end codes; then the prompt is fed ``prefill_chunk_tokens`` at a time between the
others' decode steps (``stage/prompt_pieces.py``).

Every decoding request steps in one forward of the backbone over the paged KV cache (``stage/batched_decoder.py``:
each row its own length and 1-D rope position), then every row that has logits samples codebook 0 from ``lm_head``
and the depth decoder writes codebooks 1.. for all of them at once (``modeling/depth_decoder.py``). A frame goes to
the next stage as soon as it is whole (``data["frames"]``: [codebooks, 1]); the next step feeds the sum of its
codes' embeddings.

The end, as transformers' ``generate`` has it: a frame whose codebooks 0 .. K-2 are all ``codebook_eos_token_id``
ends the request, or its ``max_tokens`` frames (the frame ending it counts). ``generate(output_audio=True)`` decodes
the frames before the first one whose K codes are all the end code; the same frames go to Mimi here: the frame that
ends the request is heard only when its last codebook is not the end code.

Prefix caching: a prompt's blocks are hashed by its tokens, a clip's positions by the digest of its samples (or
codes) and their place in it, so a voice heard again (the same context, or the same reference voice) shares its
blocks; when the shared blocks cover a clip, it is not encoded at all.

Stage options: ``CsmBackboneOptions`` (``options.py``). SamplingParams (``stage/sampling.py``): temperature, top-k,
top-p, seed, ``max_tokens`` (frames); the fields left out are the checkpoint's generation config's (sesame/csm-1b:
temperature 0.9, top-k 50), and the depth decoder samples with its ``depth_decoder_*`` settings unless the request is
greedy (temperature 0), when every codebook is. ``extra`` (``CsmBackboneParams``): the speaker, the context clips'
speakers and texts, a reference voice's codes and transcript. CSM's special codes (from Mimi's codebook size up)
are never sampled: Mimi cannot decode them. ``stop`` has no meaning for frames and is refused."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch

from omnipipe.models.csm.modeling.depth_decoder import BatchedDepthDecoder
from omnipipe.models.csm.options import CsmBackboneOptions, CsmBackboneParams
from omnipipe.models.csm.prompting import AUDIO_EOS, CsmPrompt, CsmPrompts, Turn
from omnipipe.models.csm.weights.load import decoding, load_model
from omnipipe.stage.batched_decoder import BatchedDecoderRunner, DecodeState
from omnipipe.stage.checkpoint_options import checked_options, compile_if
from omnipipe.stage.prompt_pieces import PromptPieces
from omnipipe.stage.prompt_processing import BackgroundPrompts
from omnipipe.stage.request import RequestStatus, StageRequest
from omnipipe.stage.runner import RunnerOutput
from omnipipe.stage.sampling import TokenSamplingParams, given_params
from omnipipe.util.field_error import FieldError
from omnipipe.util.options import options_from_dict


@dataclass
class CsmBackboneState(DecodeState):
    """A backbone request (``generated``: each frame's codebook-0 code)."""

    prompt: PromptPieces | None = None  # while its prefill is in pieces
    hidden: torch.Tensor | None = None  # [hidden]: the backbone's last hidden state (the depth decoder's input)
    frame: torch.Tensor | None = None  # [codebooks]: the last frame (the backbone's next input)


def extra_params(params: dict[str, Any]) -> CsmBackboneParams:
    return options_from_dict(CsmBackboneParams, params.get("extra") or {}, "sampling_params.extra")


class CsmBackboneRunner(BatchedDecoderRunner):
    options: CsmBackboneOptions

    def load(self) -> None:
        self.options, directory, dtype = checked_options(self.context, CsmBackboneOptions)
        self.device = self.context.device
        self.model = load_model(directory, self.device, dtype)
        self.config = cast(Any, self.model.config)  # CsmConfig (its ids typed as what they may be given)
        self.backbone: torch.nn.Module = self.model.backbone_model
        self.embed_frames = self.model.backbone_model.embed_tokens  # a frame's codes -> the sum of their embeddings
        compile_if(self.backbone, self.options.torch_compile)
        self.decoding = decoding(directory)
        self.max_frames = self.options.max_new_tokens or self.decoding.max_frames
        self.codebooks = int(self.config.num_codebooks)
        self.codebook_size = int(self.model.codec_model.config.codebook_size)  # Mimi's codes: [0, size)
        self.suppress = list(range(self.codebook_size, int(self.config.vocab_size)))
        self.depth = BatchedDepthDecoder(self.model.depth_decoder, self.decoding.depth, self.suppress)
        self.eos = int(self.config.codebook_eos_token_id)
        self.inputs = CsmPrompts(directory, self.config, self.model.codec_model)
        self.make_kv_cache(self.config, self.options, dtype, self.max_frames, self.backbone)
        self.prompts: BackgroundPrompts[CsmPrompt] = BackgroundPrompts(self._process)

    def close(self) -> None:
        self.prompts.close()

    def validate(self, params: dict[str, Any]) -> str | None:
        if params.get("stop"):
            raise FieldError("sampling_params.stop", "CSM writes audio frames, not text: it takes no stop strings")
        reference = extra_params(params).reference
        if reference is not None:
            codes = reference["codes"]
            if len(codes[0]) != self.codebooks:
                raise FieldError("sampling_params.extra.reference.codes", f"frames of {self.codebooks} codes "
                                 f"expected (the checkpoint's codebooks), got {len(codes[0])}")
            if max(max(frame) for frame in codes) >= self.codebook_size:
                raise FieldError("sampling_params.extra.reference.codes", f"codes must be below "
                                 f"{self.codebook_size} (Mimi's codebook size)")
        return None

    # ------------------------------------------------------------------------------------- inputs, off the loop
    def admit(self, request: StageRequest) -> None:
        self.prompts.start(request)

    def _process(self, request: StageRequest) -> CsmPrompt:
        """A request's turns -> its prompt (ids, and where each heard turn's frames go), on the CPU."""
        item = request.inputs[0] if request.inputs else {}
        extra = extra_params(request.params)
        speaker = extra.speaker or self.options.speaker
        turns: list[Turn] = []
        if extra.reference is not None:
            where = "sampling_params.extra.reference"
            turns.append(Turn(speaker, extra.reference.get("text", ""),
                              codes=torch.tensor(extra.reference["codes"], dtype=torch.long),
                              text_field=f"{where}.text", audio_field=f"{where}.codes"))
        clips = list(item.get("audios") or [])
        context = extra.context
        if context is not None and len(context) != len(clips):
            raise FieldError("sampling_params.extra.context", f"gives {len(context)} turns for {len(clips)} clips: "
                             "one turn (its speaker and text) per clip of prompt.multi_modal_data.audio")
        for index, samples in enumerate(clips):
            turn = context[index] if context is not None else {}
            turns.append(Turn(turn.get("speaker", speaker), turn.get("text", ""),
                              samples=np.asarray(samples, dtype=np.float32),
                              text_field=f"sampling_params.extra.context[{index}].text",
                              audio_field=f"prompt.multi_modal_data.audio[{index}]"))
        return self.inputs(turns, speaker, str(item.get("text") or ""))

    # ------------------------------------------------------------------------------------------------ prefill
    def _prompt_keys(self, prompt: CsmPrompt) -> list[int | bytes]:
        """Each prompt position's prefix-cache key: its token, or for a clip's frame the digest of the clip's
        samples (or codes) and the frame's index in it."""
        keys: list[int | bytes] = list(prompt.input_ids.tolist())
        for start, frames, turn in prompt.audio:
            content = turn.codes.numpy() if turn.codes is not None else turn.samples
            digest = hashlib.blake2b(np.ascontiguousarray(content).tobytes(), digest_size=16)
            digest.update(b"codes" if turn.codes is not None else b"samples")
            media = digest.digest()
            for frame in range(frames):
                keys[start + frame] = media + frame.to_bytes(4, "little")
        return keys

    def _start(self, request: StageRequest, prompt: CsmPrompt) -> RunnerOutput | None:
        """Reserve the request's KV and build its prompt's pieces; an output when it must wait or fail."""
        length = int(prompt.input_ids.shape[0])
        room = self.inputs.max_positions - length
        given = given_params(request.params).get("max_tokens")
        if given is not None and given > room:
            return RunnerOutput.failed(request.request_id, f"{given} frames do not fit after the prompt's {length} "
                                       f"positions: the model has {self.inputs.max_positions}, so at most {room}",
                                       "sampling_params.max_tokens")
        max_tokens = int(given) if given is not None else min(self.max_frames, room)
        waiting = self.reserve(request, length + max_tokens, self._prompt_keys(prompt))
        if waiting is not None:
            return waiting
        self.prompts.forget(request)
        request.take_all_inputs()
        request.num_prompt_tokens = length
        embeds = self._prompt_embeds(prompt, request.num_cached_tokens)
        pieces = PromptPieces(embeds, torch.arange(length, device=self.device)[None])
        if request.num_cached_tokens:
            pieces.skip(request.num_cached_tokens, {})
        sampling = TokenSamplingParams.from_params(request.params, self.decoding.backbone)
        request.runner_state = CsmBackboneState(sampling, sampling.make_generator(), max_tokens, prompt=pieces)
        return None

    def _encode(self, samples: np.ndarray, frames: int) -> torch.Tensor:
        """A clip's Mimi codes [frames, codebooks] (the codec in float32, as it was loaded)."""
        codec = self.model.codec_model
        wave = torch.from_numpy(np.ascontiguousarray(samples, dtype=np.float32)).to(self.device)[None, None]
        codes = codec.encode(wave, num_quantizers=self.codebooks).audio_codes[0]  # [codebooks, frames]
        if codes.shape[-1] < frames:
            raise ValueError(f"Mimi encoded a clip of {len(samples)} samples to {codes.shape[-1]} frames, not the "
                             f"{frames} its placeholders count")
        return codes[:, :frames].T

    def _prompt_embeds(self, prompt: CsmPrompt, cached: int) -> torch.Tensor:
        """The prompt's input embeddings [1, T, D]: its text tokens', each heard turn's frames written over its
        placeholders (a clip encoded unless all its frames lie in the ``cached`` leading tokens, never fed), each
        ``<|audio_eos|>`` a frame of end codes."""
        ids = prompt.input_ids.to(self.device)
        embeds = self.model.embed_text_tokens(ids)[None]
        ends = ids == self.inputs.ids[AUDIO_EOS]
        if bool(ends.any()):
            end_frame = torch.full((1, 1, self.codebooks), self.eos, dtype=torch.long, device=self.device)
            embeds[0, ends] = self.embed_frames(end_frame)[0, 0].to(embeds.dtype)
        for start, frames, turn in prompt.audio:
            if start + frames <= cached:
                continue
            if turn.codes is not None:
                codes = turn.codes.to(self.device)
            else:
                assert turn.samples is not None  # a heard turn has samples or codes
                codes = self._encode(turn.samples, frames)
            embeds[0, start:start + frames] = self.embed_frames(codes[None])[0].to(embeds.dtype)
        return embeds

    def prefill_piece(self, request: StageRequest, budget: int,
                      wait: bool) -> tuple[RunnerOutput | torch.Tensor, int]:
        """Feed the next piece of the request's prompt (at most ``budget`` tokens; its processing waited for if
        ``wait``): codebook 0's logits once the whole prompt is in, else the output to return now; and the tokens
        fed."""
        if request.runner_state is None:
            processed = self.prompts.result(request, wait)
            if isinstance(processed, RunnerOutput):  # still being made, or the caller's input refused
                return processed, 0
            waiting = self._start(request, processed)
            if waiting is not None:
                return waiting, 0
        state: CsmBackboneState = request.runner_state
        pieces = state.prompt
        assert pieces is not None  # set by _start, cleared once the request is prefilled
        out, tokens = self.feed_piece(request, pieces, budget, lambda piece: self.backbone(**piece,
                                                                                           **self.kv.step_inputs()))
        if out is None:
            return RunnerOutput(request.request_id, status=RequestStatus.PREFILLING), tokens
        state.prompt = None
        state.hidden = out.last_hidden_state[0, -1]
        return self.model.lm_head(state.hidden), tokens

    # ------------------------------------------------------------------------------------------------- steps
    def decode(self, rows: list[StageRequest], inputs: list[Any]) -> tuple[torch.Tensor, list[Any]]:
        """One backbone forward for every request of ``rows``: each one's last frame (the sum of its codes'
        embeddings) at its own next position; codebook 0's logits [rows, vocab]."""
        states: list[CsmBackboneState] = [request.runner_state for request in rows]
        frames = torch.stack([cast(torch.Tensor, state.frame) for state in states]).to(self.device)
        self.kv.bind([request.request_id for request in rows], 1)
        out = self.backbone(inputs_embeds=self.embed_frames(frames[:, None]),
                            position_ids=self.kv.positions(), **self.kv.step_inputs())
        hidden = out.last_hidden_state[:, -1]
        for row, state in enumerate(states):
            state.hidden = hidden[row]
        return self.model.lm_head(hidden), [None] * len(rows)

    def emit_all(self, sampled: list[tuple[StageRequest, int, torch.Tensor, Any]]) -> list[RunnerOutput]:
        """Each sampled row's whole frame (the depth decoder over all of them at once) and its output: the frame for
        Mimi, and whether it ends the request."""
        states: list[CsmBackboneState] = [request.runner_state for request, _, _, _ in sampled]
        first = torch.tensor([token for _, token, _, _ in sampled], device=self.device)
        hidden = torch.stack([cast(torch.Tensor, state.hidden) for state in states])
        rows = self.depth.rows([state.sampling.greedy for state in states], [state.generator for state in states])
        frames = self.depth(hidden, first, rows).cpu()
        outputs = []
        for (request, token, _, _), state, frame in zip(sampled, states, frames, strict=True):
            state.generated.append(token)
            state.frame = frame
            ends = bool((frame[:-1] == self.eos).all())
            heard = not bool((frame == self.eos).all())  # generate's output_audio cut
            reason = "stop" if ends else "length" if len(state.generated) >= state.max_tokens else None
            data = {"frames": frame.numpy()[:, None]} if heard else None
            outputs.append(RunnerOutput.decoded(request.request_id, reason, data=data, num_units=int(heard)))
        return outputs

    def free(self, request: StageRequest) -> None:
        self.prompts.forget(request)
        super().free(request)

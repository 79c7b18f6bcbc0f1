"""CSM on a tiny random checkpoint. The backbone stage in-process with the stage's own scheduler and step: greedy
float32 frames equal ``CsmForConditionalGeneration.generate`` (with the processor's attention mask) for text alone,
one and two context clips and a reference voice's codes with and without its transcript; eight requests joining at
different steps (seeded sampled ones among them) equal each stepped alone; the end rule and generate's audio cut; a
clip heard again is served from the prefix cache without being encoded; bad input fails naming its field (a
reference voice too long for the model when it is made). The whole pipeline through ``AsyncOmni``
(backbone -> Mimi, streamed and whole) equals ``generate(output_audio=True)``."""

from __future__ import annotations

import asyncio
import shutil
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from omnipipe import AsyncOmni, SamplingParams
from omnipipe.api.prompt import normalize_prompt
from omnipipe.models.csm.processors import prompt as csm_prompt
from omnipipe.models.csm.reference_voice import clip_codes, reference_codes
from omnipipe.models.csm.runners.backbone import CsmBackboneRunner
from omnipipe.models.csm.weights.tiny import CODEBOOK_SIZE, CODEBOOKS, released_config, tokenizer, write_tiny_checkpoint
from omnipipe.models.registry import get_pipeline
from omnipipe.stage.runner import RunnerContext
from omnipipe.stage.runner_driver import Arrival, DriveResult, ForwardCounter, drive
from omnipipe.stage.sampling import TokenSamplingParams
from omnipipe.util.field_error import FieldError

pytestmark = pytest.mark.slow  # a tiny CSM checkpoint written for the module, run beside transformers' generate

RATE = 24000
FRAMES = 12
AUDIO_BOUND = 1e-5  # streamed Mimi against generate's one decode, of the reference's absmax
TEXT = "hello from sesame."


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("csm") / "ckpt", seed=0)


def runner(checkpoint: Path, **options: Any) -> CsmBackboneRunner:
    loaded = CsmBackboneRunner(RunnerContext("backbone", "cpu", 1, 8, {"model": str(checkpoint), **options}))
    loaded.load()
    return loaded


@pytest.fixture(scope="module")
def backbone(checkpoint: Path) -> CsmBackboneRunner:
    return runner(checkpoint)


def load_model(checkpoint: Path) -> Any:
    from transformers import CsmForConditionalGeneration

    return CsmForConditionalGeneration.from_pretrained(checkpoint, local_files_only=True).eval()


@pytest.fixture(scope="module")
def model(checkpoint: Path) -> Any:
    return load_model(checkpoint)


@pytest.fixture(scope="module")
def processor(checkpoint: Path) -> Any:
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(checkpoint, local_files_only=True)


def clip(seconds: float, seed: int) -> np.ndarray:
    """A tone with a little noise, 24 kHz (the seed picks the pitch and the noise)."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * RATE)) / RATE
    tone = 0.3 * np.sin(2 * np.pi * (150 + 40 * seed) * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))
    return (tone + 0.02 * rng.standard_normal(t.size)).astype(np.float32)


def frames(result: DriveResult, rid: str) -> list[list[int]]:
    assert not result.errors, result.errors
    return [o.data["frames"][:, 0].tolist() for o in result.outputs[rid] if o.data]


def conversation(turns: list[tuple[str, str, np.ndarray | None]]) -> list[dict[str, Any]]:
    """transformers' chat form of (speaker, text, clip or None) turns."""
    out = []
    for speaker, text, audio in turns:
        content: list[dict[str, Any]] = [{"type": "text", "text": text}]
        if audio is not None:
            content.append({"type": "audio", "audio": audio})
        out.append({"role": speaker, "content": content})
    return out


def generated(model: Any, processor: Any, turns: list[tuple[str, str, np.ndarray | None]], max_frames: int,
              output_audio: bool = False) -> Any:
    """The model's own greedy generate, the processor's attention mask passed (without it CSM's pad id, which is
    its audio token's, masks the clips)."""
    inputs = processor.apply_chat_template(conversation(turns), tokenize=True, return_dict=True)
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=max_frames, do_sample=False, depth_decoder_do_sample=False,
                             output_audio=output_audio)
    return out[0].numpy() if output_audio else out[0].tolist()


def greedy(max_frames: int = FRAMES, **extra: Any) -> dict[str, Any]:
    return {"temperature": 0.0, "max_tokens": max_frames, **({"extra": extra} if extra else {})}


CASES = {
    "text alone": ([], {}),
    "one context clip": ([("1", "one two three", clip(2.0, 1))], {}),
    "two context clips": ([("1", "how are you doing today?", clip(1.3, 2)), ("0", "the quick brown fox", clip(0.7, 3))],
                          {}),
}


@pytest.mark.parametrize("case", CASES)
def test_greedy_frames_equal_generate(backbone: CsmBackboneRunner, model: Any, processor: Any, case: str) -> None:
    context, _ = CASES[case]
    item = {"text": TEXT, "audios": [audio for _, _, audio in context]}
    extra = {"context": [{"speaker": speaker, "text": text} for speaker, text, _ in context]} if context else {}
    result = drive(backbone, [Arrival("r", greedy(**extra), [item])])
    want = generated(model, processor, [*context, ("0", TEXT, None)], FRAMES)
    assert frames(result, "r") == want and len(want) == FRAMES
    assert result.outputs["r"][-1].finish_reason == "length"
    # the prompt is the chat template's, token for token
    inputs = processor.apply_chat_template(conversation([*context, ("0", TEXT, None)]), tokenize=True,
                                           return_dict=True)
    prompt = backbone._process(_request(item, greedy(**extra)))
    assert prompt.input_ids.tolist() == inputs["input_ids"][0].tolist()


def _request(item: dict[str, Any], params: dict[str, Any]) -> Any:
    from omnipipe.stage.request import StageRequest

    request = StageRequest("probe", params, emit_final=True, emit_data=True, chunk_targets=[])
    request.inputs.append(item)
    return request


def test_a_reference_voice_is_its_clip_heard_first_with_its_transcript(checkpoint: Path, backbone: CsmBackboneRunner,
                                                                       model: Any, processor: Any) -> None:
    voice = clip(1.5, seed=5)
    codes = clip_codes(checkpoint, voice)
    assert len(codes) == 19 and all(len(frame) == CODEBOOKS for frame in codes)  # ceil(36000 / 1920) frames
    options = {"model": str(checkpoint)}
    plain = reference_codes(options, voice, RATE)
    assert plain == {"codes": codes}
    said = reference_codes(options, voice, RATE, text="one two three")
    assert said == {"codes": codes, "text": "one two three"}
    arrivals = [Arrival("plain", greedy(speaker="1", reference=plain), [{"text": TEXT, "audios": []}]),
                Arrival("said", greedy(speaker="1", reference=said), [{"text": TEXT, "audios": []}])]
    result = drive(backbone, arrivals)
    assert frames(result, "plain") == generated(model, processor, [("1", "", voice), ("1", TEXT, None)], FRAMES)
    with_words = generated(model, processor, [("1", "one two three", voice), ("1", TEXT, None)], FRAMES)
    assert frames(result, "said") == with_words != frames(result, "plain")


def test_a_reference_voice_that_leaves_no_room_is_refused_when_it_is_made(checkpoint: Path) -> None:
    """The tiny model has 256 positions: 20 s of clip (250 frames) leave none for a reply (named ``audio``), a
    transcript past them is named ``text``; 16 s with a short transcript fit."""
    options = {"model": str(checkpoint)}
    with pytest.raises(FieldError) as caught:
        reference_codes(options, clip(20.0, 1), RATE)
    assert caught.value.field == "audio" and "shorter clip" in caught.value.rule
    with pytest.raises(FieldError) as caught:
        reference_codes(options, clip(1.0, 1), RATE, text="say more " * 200)
    assert caught.value.field == "text"
    assert len(reference_codes(options, clip(16.0, 1), RATE, text="one two three")["codes"]) == 200


def processed(backbone: CsmBackboneRunner) -> None:
    """Wait until every prompt admitted so far is built, so a request joins the batch at the step it arrives."""
    done = threading.Event()
    backbone.prompts.run(done.set)
    assert done.wait(60)


def test_eight_requests_joining_at_different_steps_equal_each_stepped_alone(backbone: CsmBackboneRunner) -> None:
    arrivals = []
    for i in range(8):
        audios = [clip(0.5 + 0.3 * i, seed=i)] if i % 2 else []
        extra: dict[str, Any] = {"speaker": str(i % 3)}
        if audios:
            extra["context"] = [{"speaker": "1", "text": f"turn {i}"}]
        params = ({"temperature": 0.9, "top_k": 20, "seed": i, "max_tokens": 16} if i in (3, 6) else
                  greedy(16))
        arrivals.append(Arrival(f"r{i}", {**params, "extra": extra}, [{"text": f"say {i} " * (i + 1),
                                                                        "audios": audios}], step=i))
    alone = drive(backbone, arrivals, per_request=True)
    batched = drive(backbone, arrivals, on_step=lambda _: processed(backbone))
    assert max(len(ids) for prefill, ids, _ in batched.steps if not prefill) == 8  # they did share steps
    for arrival in arrivals:
        rid = arrival.request_id
        assert frames(batched, rid) == frames(alone, rid) and len(frames(alone, rid)) == 16
        assert batched.finished(rid)
    sampled = [code for rid in ("r3", "r6") for frame in frames(batched, rid) for code in frame]
    assert max(sampled) < CODEBOOK_SIZE  # special codes are never sampled: Mimi decodes every frame
    assert frames(batched, "r3") != frames(batched, "r6")
    assert backbone.kv.free_blocks == backbone.kv.num_blocks  # every request gave its blocks back


def test_decoding_follows_the_checkpoints_generation_config(backbone: CsmBackboneRunner) -> None:
    sesame = TokenSamplingParams(temperature=0.9, top_k=50)
    assert backbone.decoding.backbone == sesame and backbone.decoding.depth == sesame
    assert backbone.max_frames == 125
    sampled = drive(backbone, [Arrival("a", {"max_tokens": 6, "seed": 1}, [{"text": TEXT}]),
                               Arrival("b", {"max_tokens": 6, "seed": 1}, [{"text": TEXT}]),
                               Arrival("c", {"max_tokens": 6, "seed": 2}, [{"text": TEXT}])])
    assert frames(sampled, "a") == frames(sampled, "b") != frames(sampled, "c")  # each its own seeded draws


def ending_checkpoint(checkpoint: Path, directory: Path, heard: bool) -> Path:
    """The tiny checkpoint edited so that greedy decoding ends at its third frame: the depth decoder's heads write
    code 0 for codebooks 1..K-2 (and K-1 unless ``heard``), and codebook 0's output row of code 0 is that of the
    code greedy picks third, a little larger (so it wins there, and nowhere before)."""
    model = load_model(checkpoint)
    with torch.no_grad():
        model.depth_decoder.codebooks_head.weight[: -1 if heard else None] = 0.0
    free_running = generated(model, _processor(checkpoint), [("0", TEXT, None)], 3)
    with torch.no_grad():
        model.lm_head.weight[0] = model.lm_head.weight[free_running[2][0]] * 1.001
    model.save_pretrained(directory)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "processor_config.json",
                 "generation_config.json"):
        shutil.copy(checkpoint / name, directory / name)
    return directory


def _processor(checkpoint: Path) -> Any:
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(checkpoint, local_files_only=True)


@pytest.fixture(scope="module")
def ending(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[bool, Path]:
    return {heard: ending_checkpoint(checkpoint, tmp_path_factory.mktemp(f"ending-{heard}"), heard)
            for heard in (True, False)}


@pytest.mark.parametrize("heard", [True, False], ids=["last-codebook-set", "all-end-codes"])
def test_a_frame_of_end_codes_ends_the_request_and_is_heard_as_generate_cuts_its_audio(
        ending: dict[bool, Path], heard: bool) -> None:
    model = load_model(ending[heard])
    want = generated(model, _processor(ending[heard]), [("0", TEXT, None)], FRAMES)
    assert len(want) == 3 and want[-1][:-1] == [0] * (CODEBOOKS - 1) and (want[-1][-1] != 0) == heard
    audio = generated(model, _processor(ending[heard]), [("0", TEXT, None)], FRAMES, output_audio=True)
    heard_frames = len(audio) // 1920
    assert heard_frames == (3 if heard else 2)
    result = drive(runner(ending[heard]), [Arrival("r", greedy(), [{"text": TEXT}])])
    assert frames(result, "r") == want[:heard_frames]
    assert result.outputs["r"][-1].finish_reason == "stop" and len(result.outputs["r"]) == 3


def test_a_clip_heard_again_is_served_from_the_prefix_cache(checkpoint: Path, backbone: CsmBackboneRunner) -> None:
    computed = runner(checkpoint, prefix_caching=False)
    sound = clip(3.0, seed=11)
    context = {"context": [{"speaker": "1", "text": "the same clip"}]}
    cases = [("first", TEXT, sound), ("again", TEXT, sound), ("other text", "another thing", sound),
             ("other clip", TEXT, clip(3.0, seed=12))]
    encoder = ForwardCounter(backbone.model.codec_model.encoder)
    hits, encoded = {}, {}
    try:
        for rid, text, audio in cases:
            before = backbone.kv.prefix_hits
            encoder.reset()
            arrival = Arrival(rid, greedy(8, **context), [{"text": text, "audios": [audio]}])
            got = drive(backbone, [arrival])
            hits[rid], encoded[rid] = backbone.kv.prefix_hits - before, encoder.reset()
            assert frames(got, rid) == frames(drive(computed, [arrival]), rid)
    finally:
        encoder.close()
    block = backbone.kv.block_tokens
    audio_end = len(backbone.inputs.text_ids("1", "the same clip")) + 38 + 1  # 38 frames and <|audio_eos|>
    assert hits["again"] >= audio_end and encoded["again"] == 0  # the clip's blocks all shared: not encoded
    # another text after the same clip: the whole blocks up to where the texts differ shared, the clip's last
    # frames (in a block with the new text) written again from its codes
    ids = [backbone._process(_request({"text": text, "audios": [sound]}, greedy(8, **context))).input_ids.tolist()
           for text in (TEXT, "another thing")]
    same = next(i for i, (a, b) in enumerate(zip(*ids, strict=False)) if a != b)
    assert audio_end <= same < audio_end + block and hits["other text"] == same // block * block
    assert encoded["other text"] == (1 if hits["other text"] < audio_end else 0)
    assert hits["other clip"] < block and encoded["other clip"] == 1


def test_bad_input_is_refused_naming_its_field(backbone: CsmBackboneRunner) -> None:
    def refused(params: dict[str, Any]) -> str:
        with pytest.raises(FieldError) as caught:
            backbone.validate(params)
        return caught.value.field

    assert refused({"stop": ["."]}) == "sampling_params.stop"
    assert refused({"extra": {"speaker": "Ethan"}}) == "sampling_params.extra.speaker"
    assert refused({"extra": {"context": [{"speaker": "1", "words": "hi"}]}}) == "sampling_params.extra.context[0]"
    assert refused({"extra": {"reference": [[1] * CODEBOOKS]}}) == "sampling_params.extra.reference"  # not a dict
    assert refused({"extra": {"reference": {"codes": [[1, 2, 3]]}}}) == "sampling_params.extra.reference.codes"
    assert refused({"extra": {"reference": {"codes": [[CODEBOOK_SIZE] * CODEBOOKS]}}}) == \
        "sampling_params.extra.reference.codes"  # not a Mimi code
    assert refused({"extra": {"reference": {"codes": [[1] * CODEBOOKS], "text": 3}}}) == \
        "sampling_params.extra.reference.text"
    assert refused({"extra": {"reference": {"codes": [[1] * CODEBOOKS], "words": "hi"}}}) == \
        "sampling_params.extra.reference"
    arrivals = [
        Arrival("mismatch", {**greedy(), "extra": {"context": []}}, [{"text": TEXT, "audios": [clip(1.0, 1)]}]),
        # the tiny model has 256 positions: a 21 s clip (263 frames) leaves no room for a reply
        Arrival("long clip", greedy(), [{"text": TEXT, "audios": [clip(0.5, 1), clip(21.0, 2)]}]),
        Arrival("long text", greedy(), [{"text": "say more " * 200}]),
        Arrival("many frames", greedy(250), [{"text": TEXT}]),
        Arrival("fine", greedy(4), [{"text": TEXT}]),
    ]
    result = drive(backbone, arrivals)
    assert result.errors["mismatch"].startswith("sampling_params.extra.context:")
    assert result.errors["long clip"].startswith("prompt.multi_modal_data.audio[1]:")
    assert result.errors["long text"].startswith("prompt:")
    room = backbone.inputs.max_positions - len(backbone.inputs.text_ids("0", TEXT))
    assert result.errors["many frames"].startswith("sampling_params.max_tokens:") and f"at most {room}" in \
        result.errors["many frames"]
    assert "fine" not in result.errors and sum(1 for o in result.outputs["fine"] if o.data) == 4
    pipeline = get_pipeline("csm")
    with pytest.raises(FieldError) as caught:
        normalize_prompt({"prompt": TEXT, "history": [{"role": "user", "content": "hi"}]},
                         pipeline.input_modalities, pipeline.takes_history)
    assert caught.value.field == "prompt.history"
    with pytest.raises(FieldError) as caught:
        csm_prompt({"prompt": TEXT, "multi_modal_data": {"audio": [clip(0.2, i) for i in range(9)]}})
    assert caught.value.field == "prompt.multi_modal_data.audio"


def test_the_released_sizes_have_csm_1bs_parameter_count() -> None:
    """The sizes ``--size released`` writes, counted on the meta device (nothing allocated), the codebook table the
    backbone and the depth decoder share counted once: backbone 1.11B, depth decoder 0.31B, Mimi 79.3M."""
    from transformers import CsmForConditionalGeneration

    with torch.device("meta"):
        model = CsmForConditionalGeneration(released_config(tokenizer()))
    assert sum(param.numel() for param in model.parameters()) == 1_632_100_161
    assert sum(param.numel() for param in model.codec_model.parameters()) == 79_308_609


# ------------------------------------------------------------------------------------ the whole pipeline
def deploy(checkpoint: Path, async_chunk: bool) -> dict[str, Any]:
    return {"async_chunk": async_chunk,
            "edges": {"backbone->mimi": {"options": {"codec_chunk_frames": 7, "initial_codec_chunk_frames": 3}}},
            "stages": {s: {"threads": 1, "options": {"model": str(checkpoint)}} for s in ("backbone", "mimi")}}


async def speak(engine: AsyncOmni, text: str, extra: dict[str, Any], audios: list[np.ndarray]) -> tuple[np.ndarray,
                                                                                                         int]:
    prompt: dict[str, Any] = {"prompt": text}
    if audios:
        prompt["multi_modal_data"] = {"audio": [(audio, RATE) for audio in audios]}
    params = {"backbone": SamplingParams(temperature=0, max_tokens=FRAMES, extra=extra)}
    pieces = [out.audio async for out in engine.generate(prompt, sampling_params=params, output_modalities=["audio"])
              if out.modality == "audio" and out.audio is not None and out.audio.size]
    return (np.concatenate(pieces) if pieces else np.zeros(0, np.float32)), len(pieces)


@pytest.mark.parametrize("async_chunk", [True, False], ids=["streamed", "whole"])
def test_audio_through_the_pipeline_equals_generate_output_audio(checkpoint: Path, model: Any, processor: Any,
                                                                 ending: dict[bool, Path], async_chunk: bool) -> None:
    heard = clip(1.2, seed=4)
    requests = [(TEXT, {}, []), ("the quick brown fox", {"context": [{"speaker": "1", "text": "one two"}]}, [heard])]
    want = [generated(model, processor, [("0", TEXT, None)], FRAMES, output_audio=True),
            generated(model, processor, [("1", "one two", heard), ("0", "the quick brown fox", None)], FRAMES,
                      output_audio=True)]

    async def run(directory: Path, asked: list[tuple[str, dict[str, Any], list[np.ndarray]]]) -> list[Any]:
        async with AsyncOmni("csm", deploy(directory, async_chunk)) as engine:
            return await asyncio.gather(*(speak(engine, *request) for request in asked))

    for (audio, pieces), reference in zip(asyncio.run(run(checkpoint, requests)), want, strict=True):
        assert audio.shape == reference.shape == (FRAMES * 1920,)
        assert np.abs(audio - reference).max() <= AUDIO_BOUND * np.abs(reference).max()
        assert pieces >= (3 if async_chunk else 1)  # streamed in windows, or whole
    # a request that ends on a frame of end codes: that frame is not heard, as generate cuts its audio
    (cut, _), = asyncio.run(run(ending[False], [(TEXT, {}, [])]))
    reference = generated(load_model(ending[False]), _processor(ending[False]), [("0", TEXT, None)], FRAMES,
                          output_audio=True)
    assert cut.shape == reference.shape == (2 * 1920,)
    assert np.abs(cut - reference).max() <= AUDIO_BOUND * np.abs(reference).max()

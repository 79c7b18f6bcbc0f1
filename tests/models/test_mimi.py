"""Mimi streamed: a tiny random ``MimiModel`` (the released geometry, filled codebooks) decoded chunk by chunk equals
one ``MimiModel.decode`` for several chunkings, alone and decoded together with other streams; losing any
carried SEANet state column or the latent context is not exact; the
streaming encoder's codes are bit-equal to one ``encode`` for uneven pieces of samples; the decoder stage, fed
``frames_async_chunk`` windows of two interleaved requests, gives each the whole decode's audio; bad codes and params
are refused by name; a request's state is freed; a CSM and a Moshi checkpoint load their Mimi by their layout."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from omnipipe.chunk.accumulation import FrameChunkOptions
from omnipipe.chunk.context import ChunkContext
from omnipipe.chunk.frame_processors import frames_async_chunk, frames_whole
from omnipipe.models.mimi.modeling.stream import (
    MimiDecodeGeometry,
    MimiDecodeStream,
    MimiEncodeStream,
    decode_together,
    mimi_decode_geometry,
    seanet_state_widths,
)
from omnipipe.models.mimi.runners.decoder import SAMPLE_RATE_HZ, MimiDecoderRunner
from omnipipe.models.mimi.weights.tiny import fill_codebooks, tiny_mimi_config, write_tiny_checkpoint
from omnipipe.stage.request import RequestStatus, StageRequest
from omnipipe.stage.runner import RunnerContext
from omnipipe.util.field_error import FieldError

torch.set_num_threads(1)

FRAMES = 40  # 80 transformer steps: past the tiny sliding window (16) and layers x (window - 1) = 30
CODEBOOK_SIZE = 64
QUANTIZERS = 8
# a streamed float32 decode against the whole decode, over the whole decode's absmax: measured <= 9e-7 on this
# CPU (convolutions take other algorithms at other lengths); a stream one context step short is off by > 1e-2
BOUND = 2e-6
BF16_BOUND = 5e-2  # a bfloat16 stage's stream against the float32 whole decode: measured 2.2e-2
# a structure other than the released one: wider kernels, more and dilated residual layers
OTHER_STRUCTURE = {"kernel_size": 9, "residual_kernel_size": 5, "last_kernel_size": 5, "dilation_growth_rate": 3,
                   "num_residual_layers": 2}


def tiny_model(**structure: Any) -> Any:
    from transformers import MimiConfig, MimiModel

    torch.manual_seed(0)
    model = MimiModel(MimiConfig(**tiny_mimi_config(CODEBOOK_SIZE, QUANTIZERS, **structure))).eval()
    assert fill_codebooks(model, torch.Generator().manual_seed(1)) == QUANTIZERS
    return model


_MODELS: dict[str, Any] = {}


def model_of(structure: dict[str, Any]) -> Any:
    key = repr(sorted(structure.items()))
    if key not in _MODELS:
        _MODELS[key] = tiny_model(**structure)
    return _MODELS[key]


def random_codes(frames: int, seed: int, quantizers: int = QUANTIZERS) -> torch.Tensor:
    return torch.randint(0, CODEBOOK_SIZE, (quantizers, frames), generator=torch.Generator().manual_seed(seed))


def whole_decode(model: Any, codes: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model.decode(codes[None]).audio_values[0, 0]


def relative_error(got: torch.Tensor | np.ndarray, want: torch.Tensor) -> float:
    got = torch.as_tensor(got)
    assert got.shape == want.shape
    return float((got - want).abs().max() / want.abs().max())


def streamed(stream: MimiDecodeStream, codes: torch.Tensor, chunks: list[int]) -> torch.Tensor:
    pieces, done = [], 0
    for size in chunks:
        piece = stream.decode(codes[:, done: done + size])
        assert piece.shape == (min(size, codes.shape[1] - done) * 1920,)
        pieces.append(piece)
        done += size
    assert done == codes.shape[1]
    return torch.cat(pieces)


@pytest.fixture(scope="module")
def model() -> Any:
    return tiny_model()


@pytest.fixture(scope="module")
def codes() -> torch.Tensor:
    return random_codes(FRAMES, seed=2)


@pytest.fixture(scope="module")
def whole(model: Any, codes: torch.Tensor) -> torch.Tensor:
    return whole_decode(model, codes)


def test_geometry_is_read_from_the_modules(model: Any) -> None:
    from transformers import MimiConfig, MimiModel

    with torch.device("meta"):
        released = MimiModel(MimiConfig())
    assert mimi_decode_geometry(released) == MimiDecodeGeometry(2, 960, 1, 8)
    assert mimi_decode_geometry(model) == MimiDecodeGeometry(2, 960, 1, 8)  # the tiny one keeps the kernels
    assert mimi_decode_geometry(model).samples_per_frame == 1920
    with torch.device("meta"):
        other = MimiModel(MimiConfig(**tiny_mimi_config(**OTHER_STRUCTURE)))
    assert mimi_decode_geometry(other).seanet_context_steps == 12
    # the SEANet state: the first k7 convolution's 6 inputs, then per upsampling ratio r (8, 6, 5, 4) the
    # transposed convolution's r-sample tail and the residual block's k3 convolution's 2 inputs (its 1x1 one carries
    # nothing; the shortcut is an identity), the last k3 convolution's 2 inputs
    assert seanet_state_widths(released) == (6, 8, 2, 0, 6, 2, 0, 5, 2, 0, 4, 2, 0, 2)
    assert seanet_state_widths(model) == seanet_state_widths(released)


def test_the_decode_is_whole_frames_and_the_codebooks_matter(model: Any, codes: torch.Tensor,
                                                             whole: torch.Tensor) -> None:
    assert whole.shape == (FRAMES * 1920,)
    other = codes.clone()
    other[1:, 20] = (other[1:, 20] + 1) % CODEBOOK_SIZE  # only the acoustic codes of one frame
    changed = (whole_decode(model, other) - whole).abs().reshape(FRAMES, 1920).amax(1)
    assert float(changed[:20].max()) == 0.0 and float(changed[20]) > 1e-2  # causal, and the codes count


@pytest.mark.parametrize("chunks", [[1] * FRAMES, [3] * 13 + [1], [7] * 5 + [5], [2, 5, 1, 11, 4, 9, 8]],
                         ids=["1", "3", "7", "uneven"])
def test_streamed_decode_equals_the_whole_decode(model: Any, codes: torch.Tensor, whole: torch.Tensor,
                                                 chunks: list[int]) -> None:
    assert relative_error(streamed(MimiDecodeStream(model), codes, chunks), whole) < BOUND


@pytest.mark.parametrize("structure", [{}, OTHER_STRUCTURE], ids=["released", "other"])
def test_the_state_the_modules_give_is_the_least_that_is_exact(structure: dict[str, Any]) -> None:
    """Exact with the upsampling context and the SEANet state the modules give; off with one latent frame less, or
    with the oldest carried column of any one SEANet layer's state lost (zeroed) at a seam."""
    model = model_of(structure)  # built once per structure
    codes = random_codes(24, seed=3)
    whole = whole_decode(model, codes)
    geometry = mimi_decode_geometry(model)
    chunks = [3] * 8

    def error(geometry: MimiDecodeGeometry = geometry, lose: int | None = None) -> float:
        stream = MimiDecodeStream(model, geometry=geometry)
        pieces = [stream.decode(codes[:, :9])]
        if lose is not None:  # the state after frame 9 with one layer's oldest column zeroed
            state = stream.snapshot()
            layers = list(state.seanet)  # type: ignore[attr-defined]
            layers[lose] = layers[lose].clone()
            layers[lose][..., 0] = 0
            stream.restore(dataclasses.replace(state, seanet=tuple(layers)))  # type: ignore[type-var]
        return relative_error(torch.cat([*pieces, streamed(stream, codes[:, 9:], chunks[3:])]), whole)

    widths = seanet_state_widths(model)
    assert error() < BOUND
    assert error(dataclasses.replace(geometry, upsample_context_frames=0)) > 1e-2
    carried = [layer for layer, width in enumerate(widths) if width]
    assert len(carried) == (10 if not structure else 14)  # the 1x1 convolutions carry nothing
    for layer in carried:
        assert error(lose=layer) > 100 * BOUND, f"layer {layer} of widths {widths}"


def test_snapshot_and_restore_undo_a_decode(model: Any, codes: torch.Tensor, whole: torch.Tensor) -> None:
    stream = MimiDecodeStream(model)
    first = stream.decode(codes[:, :9])
    before = stream.snapshot()
    stream.decode(codes[:, 9:14])
    stream.restore(before)
    assert stream.frames_decoded == 9
    rest = stream.decode(codes[:, 9:])
    assert relative_error(torch.cat([first, rest]), whole) < BOUND


def test_streams_decoded_together_equal_their_whole_decodes(model: Any) -> None:
    """Rows at different frames with equal and unequal chunk lengths share a step; a bad row refuses the step before
    any stream changes."""
    codes = [random_codes(12, seed=20 + row) for row in range(3)]
    streams = [MimiDecodeStream(model) for _ in codes]
    got: list[list[torch.Tensor]] = [[streams[0].decode(codes[0][:, :3])], [], []]  # row 0 three frames ahead
    with pytest.raises(FieldError, match="outside"):
        decode_together(streams, [codes[0][:, 3:4], codes[1][:, :1], torch.full((QUANTIZERS, 1), -1)])
    assert [s.frames_decoded for s in streams] == [3, 0, 0]
    while streams[1].frames_decoded < 12:
        sizes = [1 if row != 2 or streams[2].frames_decoded % 4 else 2 for row in range(3)]
        pieces = [c[:, s.frames_decoded: s.frames_decoded + size]
                  for c, s, size in zip(codes, streams, sizes, strict=True)]
        for row, wave in enumerate(decode_together(streams, pieces)):
            got[row].append(wave)
    for row in range(3):
        done = streams[row].frames_decoded
        assert relative_error(torch.cat(got[row]), whole_decode(model, codes[row][:, :done])) < BOUND


def test_fewer_codebooks_decode_as_the_whole_decode_of_them(model: Any, codes: torch.Tensor) -> None:
    few = codes[:4]  # Moshi decodes 8 of the released Mimi's 32 codebooks
    stream = MimiDecodeStream(model, num_codebooks=4)
    assert relative_error(streamed(stream, few, [5] * 8), whole_decode(model, few)) < BOUND


@pytest.mark.parametrize(("bad", "rule"), [
    (random_codes(3, 0, quantizers=QUANTIZERS - 1), "must have 8 codebooks"),
    (torch.full((QUANTIZERS, 2), CODEBOOK_SIZE), "code 64 is outside"),
    (torch.full((QUANTIZERS, 2), -1), "code -1 is outside"),
    (torch.zeros((QUANTIZERS, 2)), "integer codes"),
    (np.zeros((QUANTIZERS, 2), np.float32), "integer codes"),
    (torch.zeros(QUANTIZERS, dtype=torch.int64), "[num_codebooks, frames]"),
], ids=["quantizers", "too-high", "negative", "float", "float-array", "1-d"])
def test_bad_codes_are_refused_by_name_and_leave_the_stream_as_it_was(model: Any, bad: Any, rule: str) -> None:
    stream = MimiDecodeStream(model)
    stream.decode(random_codes(2, 1))
    with pytest.raises(FieldError) as refused:
        stream.decode(bad)
    assert refused.value.field == "codes" and rule in refused.value.rule
    assert stream.frames_decoded == 2
    with pytest.raises(FieldError, match="num_codebooks"):
        MimiDecodeStream(model, num_codebooks=QUANTIZERS + 1)


def speechlike(samples: int, seed: int) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    t = np.arange(samples) / SAMPLE_RATE_HZ
    tone = 0.3 * np.sin(2 * np.pi * 180 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))
    return torch.from_numpy((tone + 0.05 * rng.standard_normal(samples)).astype(np.float32))


@pytest.mark.parametrize("pieces", [[1920] * 12, [1, 1919, 1921, 5000, 333, 4000, 7],
                                    [640] * 36, [23040]], ids=["frames", "uneven", "thirds", "whole"])
def test_streamed_encode_is_bit_equal_to_the_whole_encode(model: Any, pieces: list[int]) -> None:
    audio = speechlike(12 * 1920, seed=4)
    with torch.inference_mode():
        want = model.encode(audio[None, None]).audio_codes[0]
    stream = MimiEncodeStream(model)
    got, done = [], 0
    for size in [*pieces, len(audio)]:  # the last piece takes what is left (nothing, if the pieces add up)
        got.append(stream.encode(audio[done: done + size]))
        assert stream.frames_encoded == (done + min(size, len(audio) - done)) // 1920
        done = min(len(audio), done + size)
    codes = torch.cat(got, -1)
    assert codes.shape == (QUANTIZERS, 12) and stream.pending_samples == 0
    assert torch.equal(codes, want)
    assert len(set(codes.flatten().tolist())) > 10  # filled codebooks: the codes are not all one


def test_flush_encodes_the_rest_padded_to_a_whole_frame(model: Any) -> None:
    audio = speechlike(5 * 1920 + 700, seed=5)
    padded = torch.cat([audio, torch.zeros(1920 - 700)])
    with torch.inference_mode():
        want = model.encode(padded[None, None], num_quantizers=4).audio_codes[0]
    stream = MimiEncodeStream(model, num_codebooks=4)
    codes = torch.cat([stream.encode(audio.numpy()), stream.flush()], -1)
    assert torch.equal(codes, want) and codes.shape == (4, 6)
    assert stream.flush().shape == (4, 0)
    with pytest.raises(FieldError, match="samples"):
        stream.encode(torch.zeros((1, 100)))


# --- the decoder stage ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("mimi") / "ckpt", seed=0,
                                 codebook_size=CODEBOOK_SIZE, num_quantizers=QUANTIZERS)


def load_runner(checkpoint: Path, **options: Any) -> MimiDecoderRunner:
    runner = MimiDecoderRunner(RunnerContext("decoder", "cpu", 1, 8, {"model": str(checkpoint), "dtype": "float32",
                                                                      **options}))
    runner.load()
    return runner


@pytest.fixture(scope="module")
def runner(checkpoint: Path) -> MimiDecoderRunner:
    return load_runner(checkpoint)


def edge_chunks(codes: torch.Tensor, options: FrameChunkOptions) -> list[dict[str, Any]]:
    """The chunks ``frames_async_chunk`` cuts of an AR stage's output of one frame a step."""
    state: dict[str, Any] = {}
    context = ChunkContext(options, active_requests=1, max_num_seqs=8)
    chunks = []
    for frame in range(codes.shape[1]):
        chunks += frames_async_chunk(state, {"frames": codes[:, frame: frame + 1].numpy()},
                                     frame == codes.shape[1] - 1, context)
    return chunks


def run_interleaved(runner: MimiDecoderRunner, chunks: dict[str, list[dict[str, Any]]],
                    params: dict[str, dict[str, Any]] | None = None) -> dict[str, list[Any]]:
    """Step the runner as a generation stage does: every request with a chunk left gives one to the step, the
    second request joining a step later; the outputs per request. Each request is freed after its last chunk."""
    requests = {name: StageRequest(name, (params or {}).get(name, {}), True, False, []) for name in chunks}
    left = {name: list(pieces) for name, pieces in chunks.items()}
    outputs: dict[str, list[Any]] = {name: [] for name in chunks}
    for step in range(1000):
        batch = []
        for join, (name, request) in enumerate(requests.items()):
            if join <= step and left[name]:
                request.inputs.append(left[name].pop(0))
                batch.append(request)
        if not batch:
            break
        for request, output in zip(batch, runner.execute(batch), strict=True):
            outputs[request.request_id].append(output)
            if not left[request.request_id] or output.status is RequestStatus.FAILED:
                left[request.request_id] = []
                runner.free(request)
                assert request.runner_state is None
    return outputs


@pytest.mark.parametrize("left_context", [0, 8])
def test_the_stage_streams_two_interleaved_requests_as_their_whole_decodes(
        runner: MimiDecoderRunner, left_context: int) -> None:
    options = FrameChunkOptions(codec_chunk_frames=5, left_context_frames=left_context, initial_codec_chunk_frames=2,
                                right_context_frames=1 if left_context else 0)
    codes = {"a": random_codes(23, seed=6), "b": random_codes(17, seed=7)}
    chunks = {name: edge_chunks(c, options) for name, c in codes.items()}
    assert [c["start_frame"] for c in chunks["a"]] == [0, 2, 7, 12, 17, 22]
    outputs = run_interleaved(runner, chunks)
    for name, c in codes.items():
        assert all(o.status is RequestStatus.RUNNING for o in outputs[name])
        assert sum(o.num_units for o in outputs[name]) == c.shape[1]
        assert sum(o.playback_s for o in outputs[name]) == pytest.approx(c.shape[1] / 12.5)
        audio = np.concatenate([o.audio for o in outputs[name]])
        assert audio.dtype == np.float32
        assert relative_error(audio, whole_decode(runner.model, c)) < BOUND


def test_the_stage_decodes_a_whole_edge_chunk(runner: MimiDecoderRunner) -> None:
    codes = random_codes(9, seed=8)
    (chunk,) = frames_whole([{"frames": codes[:, :4].numpy()}, {"frames": codes[:, 4:].numpy()}])
    (output,) = run_interleaved(runner, {"a": [chunk]})["a"]
    assert relative_error(output.audio, whole_decode(runner.model, codes)) < BOUND


def test_bad_chunks_fail_their_request_alone_naming_the_field(runner: MimiDecoderRunner) -> None:
    good = random_codes(6, seed=9)
    high = good.clone()
    high[3, 2] = CODEBOOK_SIZE
    cases = {
        "good": [{"frames": good.numpy(), "context_frames": 0, "start_frame": 0}],
        "out-of-range": [{"frames": high.numpy(), "context_frames": 0, "start_frame": 0}],
        "codebooks": [{"frames": good[:5].numpy(), "context_frames": 0, "start_frame": 0}],
        "gap": [{"frames": good[:, :2].numpy(), "context_frames": 0, "start_frame": 0},
                {"frames": good[:, 4:].numpy(), "context_frames": 0, "start_frame": 4}],
        "context": [{"frames": good.numpy(), "context_frames": 2, "start_frame": 1}],
        "missing": [{"frames": good.numpy(), "context_frames": 0}],
    }
    outputs = run_interleaved(runner, cases)
    (ok,) = outputs["good"]
    assert ok.status is RequestStatus.RUNNING and ok.audio.shape == (6 * 1920,)
    expected = {"out-of-range": ("frames", "code 64 is outside"), "codebooks": ("frames", "must have 8 codebooks"),
                "gap": ("start_frame", "frames 2..3 are missing"), "context": ("context_frames", "do not exist"),
                "missing": ("start_frame", "missing from the chunk")}
    for name, (field, rule) in expected.items():
        failed = outputs[name][-1]
        assert failed.status is RequestStatus.FAILED and failed.error_field == field and rule in failed.error


def test_context_frames_already_decoded_are_skipped_and_a_repeat_adds_nothing(runner: MimiDecoderRunner) -> None:
    codes = random_codes(10, seed=10)
    chunks = [{"frames": codes[:, :6].numpy(), "context_frames": 0, "start_frame": 0},
              {"frames": codes[:, 2:6].numpy(), "context_frames": 4, "start_frame": 6},  # context only: nothing new
              {"frames": codes[:, 1:].numpy(), "context_frames": 5, "start_frame": 6}]
    outputs = run_interleaved(runner, {"a": chunks})["a"]
    assert [o.num_units for o in outputs] == [6, 0, 4]
    audio = np.concatenate([o.audio for o in outputs])
    assert relative_error(audio, whole_decode(runner.model, codes)) < BOUND


def test_sampling_params_are_refused_by_name(runner: MimiDecoderRunner) -> None:
    assert runner.validate({}) is None
    with pytest.raises(FieldError) as refused:
        runner.validate({"temperature": 0.7})
    assert refused.value.field == "sampling_params" and "temperature" in refused.value.rule


def test_a_failed_step_is_undone_by_restore(runner: MimiDecoderRunner) -> None:
    codes = random_codes(8, seed=11)
    request = StageRequest("r", {}, True, False, [])
    request.inputs.append({"frames": codes[:, :3].numpy(), "context_frames": 0, "start_frame": 0})
    assert runner.snapshot(request) is None
    (first,) = runner.execute([request])
    snapshot = runner.snapshot(request)
    request.inputs.append({"frames": codes[:, 3:].numpy(), "context_frames": 0, "start_frame": 3})
    runner.execute([request])
    runner.restore(request, snapshot)  # as the stage does before retrying the step's requests one by one
    request.inputs.append({"frames": codes[:, 3:].numpy(), "context_frames": 0, "start_frame": 3})
    (rest,) = runner.execute([request])
    audio = np.concatenate([first.audio, rest.audio])
    assert relative_error(audio, whole_decode(runner.model, codes)) < BOUND
    runner.free(request)
    assert request.runner_state is None


def test_the_stage_loads_the_decoder_alone(runner: MimiDecoderRunner) -> None:
    assert runner.model.encoder is None and runner.model.decoder is not None
    assert runner.num_codebooks == QUANTIZERS
    runner.warmup()


def test_a_bfloat16_stage_decodes_near_the_float32_decode(checkpoint: Path) -> None:
    bf16 = load_runner(checkpoint, dtype="bfloat16")
    assert next(bf16.model.parameters()).dtype == torch.bfloat16
    codes = random_codes(12, seed=13)
    chunks = [{"frames": codes[:, i: i + 4].numpy(), "context_frames": 0, "start_frame": i} for i in range(0, 12, 4)]
    audio = np.concatenate([o.audio for o in run_interleaved(bf16, {"a": chunks})["a"]])
    assert audio.dtype == np.float32
    assert relative_error(audio, whole_decode(load_runner(checkpoint).model, codes)) < BF16_BOUND


def test_options_are_checked_by_name(checkpoint: Path) -> None:
    with pytest.raises(FieldError, match="num_codebooks"):
        load_runner(checkpoint, num_codebooks=QUANTIZERS + 1)
    with pytest.raises(FieldError, match="weights_prefix"):
        load_runner(checkpoint, weights_prefix=3)
    with pytest.raises(FieldError, match="unknown|speaker"):
        load_runner(checkpoint, speaker="x")


@pytest.mark.parametrize("family", ["csm", "moshi"])
def test_a_csm_or_moshi_checkpoint_loads_its_mimi_by_layout(tmp_path: Path, family: str) -> None:
    from transformers import CsmConfig, CsmForConditionalGeneration, MoshiConfig, MoshiForConditionalGeneration

    torch.manual_seed(0)
    if family == "csm":
        config = CsmConfig(num_codebooks=4, vocab_size=67, text_vocab_size=128, hidden_size=32, intermediate_size=64,
                           num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                           depth_decoder_config={"num_codebooks": 4, "backbone_hidden_size": 32, "vocab_size": 67,
                                                 "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                                                 "num_attention_heads": 2, "num_key_value_heads": 1,
                                                 "max_position_embeddings": 5},
                           codec_config=tiny_mimi_config(codebook_size=128, num_quantizers=QUANTIZERS))
        model: Any = CsmForConditionalGeneration(config)
        codec = model.codec_model
    else:
        config = MoshiConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, ffn_dim=64,
                             num_codebooks=4, audio_encoder_config=tiny_mimi_config(num_quantizers=QUANTIZERS),
                             depth_decoder_config={"hidden_size": 16, "num_hidden_layers": 1,
                                                   "num_attention_heads": 2, "ffn_dim": 32,
                                                   "max_position_embeddings": 5, "sliding_window": 4})
        model = MoshiForConditionalGeneration(config)
        codec = model.audio_encoder
    assert fill_codebooks(model, torch.Generator().manual_seed(1)) == QUANTIZERS
    model.save_pretrained(tmp_path)
    runner = load_runner(tmp_path)
    assert runner.num_codebooks == 4  # the family's codebooks per frame, fewer than Mimi's quantizers
    codes = random_codes(7, seed=12, quantizers=4)
    with torch.inference_mode():
        want = codec.eval().decode(codes[None]).audio_values[0, 0]
    chunks = [{"frames": codes[:, :3].numpy(), "context_frames": 0, "start_frame": 0},
              {"frames": codes[:, 1:].numpy(), "context_frames": 2, "start_frame": 3}]
    outputs = run_interleaved(runner, {"a": chunks})["a"]
    assert relative_error(np.concatenate([o.audio for o in outputs]), want) < BOUND
    prefix = {"csm": "codec_model.", "moshi": "audio_encoder."}[family]
    key = {"csm": "codec_config", "moshi": "audio_encoder_config"}[family]
    explicit = load_runner(tmp_path, weights_prefix=prefix, config_key=key, num_codebooks=QUANTIZERS)
    assert explicit.num_codebooks == QUANTIZERS

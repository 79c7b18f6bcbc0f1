"""The embedded default family: whisper (speech in) -> Qwen2.5 0.5B Instruct or Gemma 3 270M (thinker) -> Piper VITS
(talker) -> Piper decoder.

Three pipelines share the stages: ``default`` (text or speech in, text and speech out), ``tts`` (text in, speech
out) and ``asr`` (speech in, text out).
"""

from dataclasses import replace
from typing import Any

from omnipipe.config.pipeline_spec import EdgeSpec, PipelineSpec, ServingTraits, StageSpec
from omnipipe.models.default.attachments import MAX_IMAGES

_P = "omnipipe.models.default"
VOICE_SAMPLE_RATE_HZ = 22_050  # the packaged "joe" voice; the code2wav runner checks it at load
VOICE_HOP_SAMPLES = 256  # audio samples per latent frame of the Piper decoder

# whisper decodes autoregressively, a segment per step (so a transcript streams and an abort stops it early)
ENCODER = StageSpec("encoder", "ar", f"{_P}.runners.encoder:WhisperEncoderRunner",
                    extra_params=f"{_P}.processors:TranscriptionParams")
# the thinker model (deploy stages.thinker.options.model): qwen2.5-coder-0.5b-instruct, or the smaller gemma3-270m; its
# projections in int8 with split activations (options.weights: int8-split; int8: 7-bit activations, float32: the
# converted checkpoint as it is). Measured on the 2-core box (docs/benchmarks.md, 2026-11-28): int8-split gives
# float32's answers on omnipipe bench quality (26/30, none lost; int8 24/30, "Mars" for the largest planet) and
# decodes one request at ~90% of int8's rate, eight at 82-87% (60-70% on AVX2 kernels); 4-5x float32's
THINKER = StageSpec("thinker", "ar", f"{_P}.runners.thinker:ThinkerRunner", final_output="text",
                    default_options={"model": "qwen2.5-coder-0.5b-instruct", "weights": "int8-split"})
TALKER = StageSpec("talker", "generation", f"{_P}.runners.talker:PiperTalkerRunner",
                   extra_params=f"{_P}.processors:PiperTalkerParams")
CODE2WAV = StageSpec("code2wav", "generation", f"{_P}.runners.code2wav:PiperCode2WavRunner", final_output="audio",
                     sample_rate_hz=VOICE_SAMPLE_RATE_HZ)

ENCODER_TO_THINKER = EdgeSpec("encoder", "thinker", f"{_P}.processors.encoder2thinker")
THINKER_TO_TALKER = EdgeSpec("thinker", "talker", f"{_P}.processors.thinker2talker",
                             f"{_P}.processors.thinker2talker_async_chunk",
                             options=f"{_P}.processors:SpokenPieceOptions")
TALKER_TO_CODE2WAV = EdgeSpec("talker", "code2wav", "omnipipe.chunk.frame_processors.frames_whole",
                              "omnipipe.chunk.frame_processors.frames_async_chunk",
                              options="omnipipe.chunk.accumulation:FrameChunkOptions")

# One torch/ONNX thread a stage. Measured on the 2-core box, a thinker decode step of 8 requests: quiet, 1 thread
# 472 ms vs 2 threads 492 ms (batch 1: 131 vs 137 ms); beside two busy processes (the talker and vocoder under
# load), 1 thread 2.2 s vs 2 threads 6.8 s median (12 s max: OpenMP threads spinning on cores others hold), which
# under a soak made steps long enough for the watchdog to kill a working thinker. The decoder needs about 10 latent
# frames of context on each side of a seam to match a whole decode (measured: max abs diff 1.3e-6 at 10/10).
# The talker makes a whole piece's frames at once, so the first chunk's audio is all the listener has until the
# vocoder's next step: 5 frames (58 ms, what "auto" picks when quiet) ran dry right after it at 4 sessions in
# ``bench voice`` (0.25-0.42 underruns a stream); 10 frames (116 ms) did not, at the same first-audio latency.
_FRAME_EDGE = {"options": {"codec_chunk_frames": 25, "left_context_frames": 10, "right_context_frames": 10,
                          "initial_codec_chunk_frames": 10,
                          "frame_rate_hz": VOICE_SAMPLE_RATE_HZ / VOICE_HOP_SAMPLES}}
# The encoder transcribes a whole clip and the talker speaks a whole piece in one step (seconds for a long one on a
# busy CPU): their stall bounds are wider than the per-token stages'.
_LONG_STEPS = {"stall_report_s": 15.0, "stall_restart_s": 120.0}
_DEPLOY: dict[str, Any] = {
    "edges": {"talker->code2wav": _FRAME_EDGE},
    "stages": {
        "encoder": {"threads": 1, "max_num_seqs": 4, **_LONG_STEPS},
        "thinker": {"threads": 1, "max_num_seqs": 8},
        "talker": {"threads": 1, "max_num_seqs": 8, **_LONG_STEPS},
        "code2wav": {"threads": 1, "max_num_seqs": 16},
    },
}

_VOICES = f"{_P}.weights.voice:list_voices"
_WEIGHTS = {"prepare_weights": f"{_P}.weights.prepare.prepare_all", "weights_status": f"{_P}.weights.prepare.status"}
_SPEECH_WEIGHTS: dict[str, Any] = {"prepare_weights": f"{_P}.weights.prepare.prepare_speech",
                   "weights_status": f"{_P}.weights.prepare.speech_status"}

DEFAULT = PipelineSpec(
    name="default",
    description="whisper tiny.en -> Qwen2.5 0.5B Instruct (or Gemma 3 270M) -> Piper VITS (joe) -> Piper decoder; "
                "text (with attached images) or speech in, text and speech out",
    stages=(ENCODER, THINKER, TALKER, CODE2WAV),
    edges=(ENCODER_TO_THINKER, THINKER_TO_TALKER, TALKER_TO_CODE2WAV),
    prompt_processor=f"{_P}.processors.default_prompt",
    input_modalities=("text", "audio", "image"),
    comprehension_stage="thinker",
    model_stages=("thinker",),
    takes_history=True,
    constrained_decoding=True,
    takes_tools=True,
    default_deploy=_DEPLOY,
    serving=ServingTraits(speech_pipeline="tts", transcription_pipeline="asr", live_transcription=True,
                          voices=_VOICES, speed_stage="talker", max_images=MAX_IMAGES),
    **_WEIGHTS,
)

TTS = PipelineSpec(
    name="tts",
    description="Piper VITS (joe) -> Piper decoder; text in, speech out",
    stages=(TALKER, CODE2WAV),
    edges=(TALKER_TO_CODE2WAV,),
    prompt_processor=f"{_P}.processors.tts_prompt",
    input_modalities=("text",),
    comprehension_stage="talker",
    default_deploy={"edges": {"talker->code2wav": _FRAME_EDGE},
                    "stages": {k: v for k, v in _DEPLOY["stages"].items() if k in ("talker", "code2wav")}},
    serving=ServingTraits(voices=_VOICES, speed_stage="talker"),
    **_SPEECH_WEIGHTS,
)

ASR = PipelineSpec(
    name="asr",
    description="whisper tiny.en; speech in, text out",
    stages=(replace(ENCODER, final_output="text"),),
    edges=(),
    prompt_processor=f"{_P}.processors.asr_prompt",
    input_modalities=("audio",),
    comprehension_stage="encoder",
    # 1 thread: a realtime session's transcript pass (a fitted window) took 140-160 ms with 1 thread, 170-210 ms with 2;
    # a whole 30 s window 600 ms with 1, 550 ms with 2 (measured through AsyncOmni("asr") on the 2-core box)
    default_deploy={"stages": {"encoder": {"threads": 1, "max_num_seqs": 4, **_LONG_STEPS}}},
    serving=ServingTraits(chat=False),  # it writes down what it hears: /v1/audio/transcriptions alone
    **_SPEECH_WEIGHTS,
)

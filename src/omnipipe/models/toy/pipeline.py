"""The toy thinker -> talker -> code2wav pipeline."""

from omnipipe.config.pipeline_spec import EdgeSpec, PipelineSpec, ServingTraits, StageSpec
from omnipipe.models.toy.runners.vocoder import SAMPLE_RATE_HZ

_P = "omnipipe.models.toy"

PIPELINE = PipelineSpec(
    name="toy",
    description="deterministic test stages: copy-upper thinker, char->frames talker, causal conv vocoder",
    stages=(
        StageSpec("thinker", "ar", f"{_P}.runners.thinker:ToyThinkerRunner", final_output="text",
                  extra_params=f"{_P}.processors:ToyThinkerParams"),
        StageSpec("talker", "generation", f"{_P}.runners.talker:ToyTalkerRunner",
                  extra_params=f"{_P}.processors:ToyTalkerParams"),
        StageSpec("code2wav", "generation", f"{_P}.runners.vocoder:ToyVocoderRunner", final_output="audio",
                  sample_rate_hz=SAMPLE_RATE_HZ),
    ),
    edges=(
        EdgeSpec("thinker", "talker", f"{_P}.processors.thinker2talker", f"{_P}.processors.thinker2talker_async_chunk"),
        EdgeSpec("talker", "code2wav", "omnipipe.chunk.frame_processors.frames_whole",
                 "omnipipe.chunk.frame_processors.frames_async_chunk",
                 options="omnipipe.chunk.accumulation:FrameChunkOptions"),
    ),
    prompt_processor=f"{_P}.processors.text_prompt",
    input_modalities=("text",),
    comprehension_stage="thinker",
    default_deploy={"edges": {"talker->code2wav": {"options": {"codec_chunk_frames": 8, "left_context_frames": 2}}}},
    serving=ServingTraits(speech_pipeline="toy_tts", speed_stage="talker"),
)

TTS_PIPELINE = PipelineSpec(
    name="toy_tts",
    description="toy talker -> code2wav",
    stages=tuple(s for s in PIPELINE.stages if s.name != "thinker"),
    edges=tuple(e for e in PIPELINE.edges if e.source != "thinker"),
    prompt_processor=f"{_P}.processors.tts_prompt",
    input_modalities=("text",),
    default_deploy=dict(PIPELINE.default_deploy),
    serving=ServingTraits(speed_stage="talker"),
)

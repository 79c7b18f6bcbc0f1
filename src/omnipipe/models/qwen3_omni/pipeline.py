"""The ``qwen3_omni`` pipeline: thinker -> talker -> code2wav on a Qwen3-Omni checkpoint (the deploy file's
``stages.<name>.options.model``, or ``--model DIR``)."""

from omnipipe.config.pipeline_spec import EdgeSpec, PipelineSpec, ServingTraits, StageSpec
from omnipipe.models.qwen3_omni.runners.code2wav import SAMPLE_RATE_HZ

_P = "omnipipe.models.qwen3_omni"
_FRAMES = "omnipipe.chunk.frame_processors"
FRAME_RATE_HZ = 12.5  # codec frames per second of audio (1920 samples each at 24 kHz)

PIPELINE = PipelineSpec(
    name="qwen3_omni",
    description="Qwen3-Omni: MoE thinker (text, image, audio, video in) -> talker with code predictor -> code2wav",
    stages=(
        StageSpec("thinker", "ar", f"{_P}.runners.thinker:Qwen3ThinkerRunner", final_output="text"),
        StageSpec("talker", "ar", f"{_P}.runners.talker:Qwen3TalkerRunner",
                  extra_params=f"{_P}.options:Qwen3TalkerParams"),
        StageSpec("code2wav", "generation", f"{_P}.runners.code2wav:Qwen3Code2WavRunner", final_output="audio",
                  sample_rate_hz=SAMPLE_RATE_HZ),
    ),
    edges=(
        EdgeSpec("thinker", "talker", f"{_P}.handoff.thinker2talker", f"{_P}.handoff.thinker2talker_async_chunk"),
        EdgeSpec("talker", "code2wav", f"{_FRAMES}.frames_whole", f"{_FRAMES}.frames_async_chunk",
                 options="omnipipe.chunk.accumulation:FrameChunkOptions"),
    ),
    prompt_processor=f"{_P}.processors.prompt",
    input_modalities=("text", "image", "audio", "video"),
    comprehension_stage="thinker",
    takes_history=True,
    takes_tools=True,
    constrained_decoding=True,
    model_stages=("thinker", "talker", "code2wav"),
    weights_status=f"{_P}.weights.load:weights_status",
    # the server's voices: the checkpoint's speakers, each request's going to the talker
    serving=ServingTraits(voices=f"{_P}.weights.load:list_speakers", voice_param=("talker", "speaker"),
                          video_stage="thinker"),
    # 72 frames of left context: the code2wav's sliding window (0.01% of absmax at the seams on the released
    # config); exactness needs the context the stage logs at load (578 frames there: a 25-frame window then decodes
    # 24x its frames)
    default_deploy={"edges": {"talker->code2wav": {"options": {"codec_chunk_frames": 25,
                                                                "left_context_frames": 72,
                                                                "frame_rate_hz": FRAME_RATE_HZ}}}},
)

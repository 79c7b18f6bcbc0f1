"""The ``moshi`` pipeline: duplex -> mimi on a Moshi checkpoint (the deploy file's ``stages.<name>.options.model``,
or ``--model DIR``; the Mimi stage reads the same directory). The user's audio in, live (a stream appended to while
the session runs) or as a clip; Moshi's inner-monologue text and its 24 kHz speech out, a frame of each per 80 ms of
the user's audio.

A session: start it with ``AsyncOmni.generate({"multi_modal_data": {"audio": [{"stream": id}]}})`` (the stream may
be appended to before or after), append the user's audio with ``AsyncOmni.append_audio(id, pcm16k)`` (float32 mono
at 16 kHz, any piece sizes), read text deltas (stage ``duplex``) and audio chunks (stage ``mimi``) from the
``generate`` iterator as they come, and end it with ``AsyncOmni.drop_audio_stream(id)`` (or ``end_session`` of the
session the stream was appended under, or ``abort``); ``SamplingParams(max_tokens=N)`` caps it at N user frames."""

from omnipipe.config.pipeline_spec import EdgeSpec, PipelineSpec, ServingTraits, StageSpec

_P = "omnipipe.models.moshi"
_FRAMES = "omnipipe.chunk.frame_processors"
SAMPLE_RATE_HZ = 24000
FRAME_RATE_HZ = 12.5  # Mimi frames a second (1920 samples each): one duplex step a frame

PIPELINE = PipelineSpec(
    name="moshi",
    description="Moshi (kmhf/hf-moshiko): full-duplex speech to speech; per 80 ms of the user's audio, a text token "
                "and a frame of Mimi codes -> Mimi",
    stages=(
        StageSpec("duplex", "ar", f"{_P}.runners.duplex:MoshiDuplexRunner", final_output="text"),
        StageSpec("mimi", "generation", "omnipipe.models.mimi.runners.decoder:MimiDecoderRunner",
                  final_output="audio", sample_rate_hz=SAMPLE_RATE_HZ),
    ),
    edges=(
        EdgeSpec("duplex", "mimi", f"{_FRAMES}.frames_whole", f"{_FRAMES}.frames_async_chunk",
                 options="omnipipe.chunk.accumulation:FrameChunkOptions"),
    ),
    prompt_processor=f"{_P}.processors.prompt",
    input_modalities=("audio",),
    comprehension_stage="duplex",
    model_stages=("duplex", "mimi"),
    weights_status=f"{_P}.weights.load:weights_status",
    serving=ServingTraits(duplex=True),
    # every frame decoded as it comes (a conversation's latency); Mimi's stream carries its own context
    default_deploy={"edges": {"duplex->mimi": {"options": {"codec_chunk_frames": 1, "initial_codec_chunk_frames": 1,
                                                            "left_context_frames": 0,
                                                            "frame_rate_hz": FRAME_RATE_HZ}}}},
)

"""The ``csm`` pipeline: backbone (with its depth decoder) -> mimi on a CSM checkpoint (the deploy file's
``stages.<name>.options.model``, or ``--model DIR``). Text (and context clips) in, 24 kHz audio out; it serves
``/v1/audio/speech`` itself, its voices the speaker ids ``0``.. (``weights/load.py``), and a voice made from an
uploaded clip and its transcript (``reference_voice.py``) as a turn the backbone hears first. It says the text it is
given and answers nothing, so it serves no chat (``ServingTraits.chat``: chat completions, responses and realtime
sessions are refused naming ``model``)."""

from omnipipe.config.pipeline_spec import EdgeSpec, PipelineSpec, ServingTraits, StageSpec

_P = "omnipipe.models.csm"
_FRAMES = "omnipipe.chunk.frame_processors"
SAMPLE_RATE_HZ = 24000
FRAME_RATE_HZ = 12.5  # frames per second of audio (1920 samples each)

PIPELINE = PipelineSpec(
    name="csm",
    description="CSM (sesame/csm-1b): Llama backbone with a depth decoder writing Mimi codes -> Mimi; text in, "
                "speech out",
    stages=(
        StageSpec("backbone", "ar", f"{_P}.runners.backbone:CsmBackboneRunner",
                  extra_params=f"{_P}.options:CsmBackboneParams"),
        StageSpec("mimi", "generation", "omnipipe.models.mimi.runners.decoder:MimiDecoderRunner",
                  final_output="audio", sample_rate_hz=SAMPLE_RATE_HZ),
    ),
    edges=(
        EdgeSpec("backbone", "mimi", f"{_FRAMES}.frames_whole", f"{_FRAMES}.frames_async_chunk",
                 options="omnipipe.chunk.accumulation:FrameChunkOptions"),
    ),
    prompt_processor=f"{_P}.processors.prompt",
    input_modalities=("text", "audio"),
    comprehension_stage="backbone",
    model_stages=("backbone", "mimi"),
    weights_status=f"{_P}.weights.load:weights_status",
    # the speech endpoint is this pipeline's own (its context clips make it more than text -> audio); a voice is a
    # speaker id given to the backbone, a voice made from a clip its codes (and transcript) heard before the text
    serving=ServingTraits(speech_pipeline="csm", voices=f"{_P}.weights.load:list_speakers",
                          voice_param=("backbone", "speaker"), reference_voice=f"{_P}.reference_voice:reference_codes",
                          reference_param=("backbone", "reference"), reference_text=True, chat=False),
    # Mimi's stream carries its own context (exact without any); small first windows for the first audio
    default_deploy={"edges": {"backbone->mimi": {"options": {"codec_chunk_frames": 12, "left_context_frames": 0,
                                                              "frame_rate_hz": FRAME_RATE_HZ}}}},
)

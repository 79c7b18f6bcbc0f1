"""The Voxtral pipelines, one stage each (``thinker``) on a Voxtral checkpoint (the deploy file's
``stages.thinker.options.model``, or ``--model DIR``): ``voxtral`` answers a question about audio (text and audio
in, text out) and serves ``/v1/audio/transcriptions`` with ``voxtral_transcribe`` (one clip in, its transcript out:
Voxtral's transcription prompt), a second engine on the same checkpoint started on the first transcription."""

from omnipipe.config.pipeline_spec import PipelineSpec, ServingTraits, StageSpec

_P = "omnipipe.models.voxtral"
THINKER = StageSpec("thinker", "ar", f"{_P}.runners.thinker:VoxtralThinkerRunner", final_output="text")
_WEIGHTS = f"{_P}.weights.load:weights_status"

PIPELINE = PipelineSpec(
    name="voxtral",
    description="Voxtral: Whisper-style audio encoder per 30 s window -> Llama thinker; text and audio in, text out",
    stages=(THINKER,),
    edges=(),
    prompt_processor=f"{_P}.processors.prompt",
    input_modalities=("text", "audio"),
    comprehension_stage="thinker",
    takes_history=True,
    model_stages=("thinker",),
    weights_status=_WEIGHTS,
    serving=ServingTraits(transcription_pipeline="voxtral_transcribe"),
)

TRANSCRIBE_PIPELINE = PipelineSpec(
    name="voxtral_transcribe",
    description="Voxtral's transcription mode: one clip in, its transcript out",
    stages=(THINKER,),
    edges=(),
    prompt_processor=f"{_P}.processors.transcription_prompt",
    input_modalities=("audio",),
    comprehension_stage="thinker",
    model_stages=("thinker",),
    weights_status=_WEIGHTS,
)

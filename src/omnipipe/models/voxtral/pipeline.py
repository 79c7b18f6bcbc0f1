"""The Voxtral pipelines, one stage each (``thinker``) on a Voxtral checkpoint (the deploy file's
``stages.thinker.options.model``, or ``--model DIR``): ``voxtral`` answers a question about audio (text and audio
in, text out) and serves ``/v1/audio/transcriptions`` with ``voxtral_transcribe`` (one clip in, its transcript out:
Voxtral's transcription prompt, in the language the request names or the one the model hears), a second engine on
the same checkpoint started on the first transcription."""

from dataclasses import replace

from omnipipe.config.pipeline_spec import PipelineSpec, ServingTraits, StageSpec

_P = "omnipipe.models.voxtral"
# the languages Voxtral-Mini-3B-2507 was released for (its model card), ISO 639-1: a transcription may name one (its
# prompt then carries ``lang:xx``) or leave the model to hear it
LANGUAGES = ("en", "es", "fr", "pt", "hi", "de", "nl", "it")
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
    stages=(replace(THINKER, extra_params=f"{_P}.options:VoxtralTranscriptionParams"),),
    edges=(),
    prompt_processor=f"{_P}.processors.transcription_prompt",
    input_modalities=("audio",),
    comprehension_stage="thinker",
    model_stages=("thinker",),
    weights_status=_WEIGHTS,
    # the encoder's 1500 frames per 30 s window, stacked four by four: 375 tokens a window
    serving=ServingTraits(transcription_languages=LANGUAGES, language_param=("thinker", "language"),
                          audio_tokens_per_s=12.5, chat=False),
)

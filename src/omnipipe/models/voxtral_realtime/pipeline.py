"""The ``voxtral_realtime`` pipeline: one stage (``transcriber``) on a Voxtral Realtime checkpoint (the deploy
file's ``stages.transcriber.options.model``, or ``--model DIR``), one clip in, its transcript out; being audio in
and text out, it serves ``/v1/audio/transcriptions`` itself.

Live: start a session with ``AsyncOmni.generate({"multi_modal_data": {"audio": [{"stream": id}]}})`` (the stream
may be appended to before or after), append the user's audio with ``AsyncOmni.append_audio(id, pcm16k)`` (float32
mono at 16 kHz, any piece sizes), read the transcript's text deltas as they come (the first once the clip's first
560 ms are heard, then one token a 80 ms heard, 480 ms behind), and end it with ``AsyncOmni.drop_audio_stream(id)``
(or ``end_session``): the transcript then ends as the whole clip's does. A ``/v1/realtime`` session on it is a
transcription session, each committed turn one such request (``server/routes/realtime/transcription_session.py``)."""

from omnipipe.config.pipeline_spec import PipelineSpec, ServingTraits, StageSpec

_P = "omnipipe.models.voxtral_realtime"
# the languages Voxtral-Mini-4B-Realtime-2602 was released for (its model card), ISO 639-1; its prompt names none
# (the model hears it), so a request's language is only checked against these
LANGUAGES = ("en", "fr", "es", "de", "ru", "zh", "ja", "it", "pt", "nl", "ar", "hi", "ko")
TRANSCRIBER = StageSpec("transcriber", "ar", f"{_P}.runners.transcriber:VoxtralRealtimeRunner", final_output="text")

PIPELINE = PipelineSpec(
    name="voxtral_realtime",
    description="Voxtral Realtime: causal streaming audio encoder -> Mistral-like LM, one text token per 80 ms; "
                "audio in, its transcript out",
    stages=(TRANSCRIBER,),
    edges=(),
    prompt_processor=f"{_P}.processors.transcription_prompt",
    input_modalities=("audio",),
    comprehension_stage="transcriber",
    model_stages=("transcriber",),
    weights_status=f"{_P}.weights.load:weights_status",
    # one audio token per 80 ms at every position
    serving=ServingTraits(transcription_languages=LANGUAGES, audio_tokens_per_s=12.5, chat=False,
                          live_transcriber=True),
)

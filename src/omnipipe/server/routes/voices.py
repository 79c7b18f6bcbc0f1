"""The voices of the speaking models: ``GET /v1/audio/voices`` lists them (with the OpenAI voice names that select
each); ``POST /v1/audio/voices`` (multipart: ``name``, ``audio``: a 1 to 30 s clip in wav, mp3, flac or ogg,
``base_voice``, ``model`` and ``text`` optional) makes a voice from a clip, for a family whose speaking stages take a
speaker reference (``ServingTraits.reference_voice``; kept by ``server/voice_registry.py``); ``text`` is what the clip
says (named as ElevenLabs' and Fish Audio's cloning APIs name it; OpenAI's has none), heard with the clip by a family
that takes it (``ServingTraits.reference_text``: CSM) and refused with a 400 naming ``text`` by one that cannot;
``DELETE
/v1/audio/voices/{name}`` removes one. A voice made from a clip is selected as any other, by name (``voice`` of
``/v1/audio/speech``, ``audio.voice`` of chat, ``session.voice`` of a realtime session). For a family whose voices are
fixed an upload is refused with a 400 naming ``audio``, never kept and ignored.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, File, Form, Query, Request, Response, UploadFile

from omnipipe.config.pipeline_spec import PipelineSpec
from omnipipe.protocol.openai import ErrorResponse, VoiceCard, VoiceDeleted, VoiceList
from omnipipe.protocol.worker import VOICES_PATH
from omnipipe.server.engines import EnginePool
from omnipipe.server.errors import APIError, invalid
from omnipipe.server.voice_registry import VoiceExistsError, valid_name
from omnipipe.util.field_error import FieldError

FORM_FIELDS = ("name", "audio", "base_voice", "model", "text")
_ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorResponse} for code in (400, 401, 404, 409, 413)}
router = APIRouter()


def _speaking_model(pool: EnginePool, model: str | None) -> tuple[str, PipelineSpec]:
    """The speaking model named ``model`` (its id or pipeline name), or the first one when None; else a 404."""
    speaking = pool.audio_model_pipelines()
    for model_id, pipeline in speaking:
        if model is None or model_id == model or pipeline.name == model:
            return model_id, pipeline
    raise APIError(404, f"model: {model!r} does not exist or does not speak (speaking models: "
                   f"{', '.join(m for m, _ in speaking) or 'none'})", param="model", code="model_not_found")


@router.get(VOICES_PATH, response_model=VoiceList, responses={404: {"model": ErrorResponse}})
async def list_voices(request: Request, model: str | None = Query(None, min_length=1)) -> VoiceList:
    """The voices of ``model``, or of every model that speaks (``voices``: those of the model ``/v1/audio/speech``
    uses by default, the main one when it speaks; ``models``: each speaking model's)."""
    pool: EnginePool = request.app.state.pool
    if model is not None:
        model_id, pipeline = _speaking_model(pool, model)
        return VoiceList(voices=pool.voice_cards(pipeline), model=model_id)
    models = {model_id: pool.voice_cards(pipeline) for model_id, pipeline in pool.audio_model_pipelines()}
    first = next(iter(models.values()), [])
    return VoiceList(voices=first, models=models)


def _base_voice(pool: EnginePool, pipeline: PipelineSpec, base_voice: str | None) -> str:
    """The family voice a new voice builds on: ``base_voice`` (a name or an OpenAI alias), or the family's first."""
    own = [v for v in pool.slots[pipeline.name].voices() if v != "default"]
    if not own:
        raise invalid(f"base_voice: model {pipeline.name!r} lists no voice to build on", "base_voice")
    if base_voice is None:
        return own[0]
    chosen = pool.check_voice(base_voice, pipeline, "base_voice")
    if chosen == "default":
        return own[0]
    if chosen not in own:
        raise invalid(f"base_voice: {chosen!r} is itself made from a clip; build on one of {', '.join(own)}",
                      "base_voice", code="invalid_voice")
    return str(chosen)


def _check_name_is_free(pool: EnginePool, pipeline: PipelineSpec, name: str) -> None:
    """A new voice's name must not be one of the family's voices or an alias of one."""
    taken = [*pool.slots[pipeline.name].voices(), *pool.voice_aliases(pipeline)]
    clash = next((t for t in taken if t.casefold() == name.casefold()), None)
    if clash is not None:
        raise invalid(f"name: {clash!r} already names a voice of model {pipeline.name!r}", "name",
                      code="voice_exists")


async def _refuse_unknown_fields(request: Request) -> None:
    form = await request.form()  # already parsed for the declared fields: this reads the cache
    for key in form:
        if key not in FORM_FIELDS:
            raise invalid(f"{key}: not a field of a voice upload (fields: {', '.join(FORM_FIELDS)})", key,
                          code="unsupported_parameter")


@router.post(VOICES_PATH, status_code=201, response_model=VoiceCard, responses={200: {"model": VoiceCard}, **_ERRORS})
async def create_voice(
    request: Request,
    response: Response,
    name: Annotated[str, Form(description="the new voice's name")],
    audio: Annotated[UploadFile, File(description="1 to 30 s of the voice (wav, mp3, flac, ogg)")],
    base_voice: Annotated[str | None, Form(description="the model's voice it builds on (default: its first)")] = None,
    model: Annotated[str | None, Form(description="the speaking model (default: the first)")] = None,
    text: Annotated[str | None, Form(description="what the clip says, for a model that hears a clip with its words "
                                     "(CSM)")] = None,
) -> VoiceCard:
    """A voice made from ``audio`` (and ``text``, what it says): 201 with its card; 200 with the card kept when the
    same name, clip, base voice and transcript are registered already (a gateway forwards an upload to every
    worker)."""
    pool: EnginePool = request.app.state.pool
    await _refuse_unknown_fields(request)
    model_id, pipeline = _speaking_model(pool, model)
    registry = pool.voice_registry(pipeline)
    if registry is None:
        raise invalid(f"audio: model {model_id!r} cannot take a reference voice: its voices are fixed "
                      f"({', '.join(pool.voices(pipeline))})", "audio", code="unsupported_reference_voice")
    try:
        name = valid_name(name)
    except FieldError as exc:
        raise invalid(f"{exc.field}: {exc.rule}", exc.field) from None
    if text is not None and text.strip() and not pipeline.serving.reference_text:
        raise invalid(f"text: model {model_id!r} hears a reference clip without its words: leave the transcript out",
                      "text", code="unsupported_parameter")
    _check_name_is_free(pool, pipeline, name)
    base = _base_voice(pool, pipeline, base_voice)
    clip = await audio.read()
    try:
        voice, created = await asyncio.to_thread(registry.add, name, clip, base, text)
    except FieldError as exc:
        code = "invalid_audio" if exc.field == "audio" else "invalid_value"
        raise invalid(f"{exc.field}: {exc.rule}", exc.field, code=code) from None
    except VoiceExistsError as exc:
        raise APIError(409, f"name: {exc}", param="name", code="voice_exists") from None
    response.status_code = 201 if created else 200
    return VoiceCard(id=voice.name, name=voice.name, base_voice=voice.base_voice)


@router.delete(VOICES_PATH + "/{name}", response_model=VoiceDeleted, responses=_ERRORS)
async def delete_voice(request: Request, name: str, model: str | None = Query(None, min_length=1)) -> VoiceDeleted:
    """Remove a voice made from a clip (a family's own voices cannot be removed)."""
    pool: EnginePool = request.app.state.pool
    model_id, pipeline = _speaking_model(pool, model)
    registry = pool.voice_registry(pipeline)
    removed = registry.delete(name) if registry is not None else None
    if removed is None:
        made = ", ".join(v.name for v in pool.registered_voices(pipeline)) or "none"
        raise APIError(404, f"name: model {model_id!r} has no voice {name!r} made from a clip (those made from clips: "
                       f"{made})", param="name", code="voice_not_found")
    return VoiceDeleted(id=removed.name)

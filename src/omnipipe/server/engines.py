"""The engines one server runs: its main pipeline, started with the server, and the pipelines the audio endpoints
need (speech: text -> audio; transcription: audio -> text), started on their first request, or with the server for
the endpoints ``ServerConfig.preload_companions`` names (``omnipipe worker``: transcription, so the voice page shows
what was heard from the first turn on; ``/health`` says ready only once those are loaded too).

Each engine runs its own stage processes, so a lazily started companion adds processes (and their threads) to
the ones the main pipeline already uses (on the default family, ``/v1/audio/speech`` adds a talker and a vocoder
process, ``/v1/audio/transcriptions`` an encoder process). Which pipelines serve those endpoints, and which voices
exist, are the family's serving traits (``PipelineSpec.serving``): this module names no family. A deploy file
given to the server applies to the companions too, restricted to the stages and edges they have. A family whose
speaking stages take a speaker reference also has the voices made from uploaded clips (``voice_registry.py``, kept
under the cache directory's ``voices/{pipeline}``: ``$OMNIPIPE_CACHE`` or the user's).
"""

from __future__ import annotations

import asyncio
import copy
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from omnipipe.api.async_omni import AsyncOmni
from omnipipe.api.sampling_params import SamplingParams
from omnipipe.config.deploy_config import load_deploy
from omnipipe.config.pipeline_spec import PipelineSpec
from omnipipe.models.registry import get_pipeline
from omnipipe.protocol.openai import OPENAI_VOICES, Voice, VoiceCard, voice_name
from omnipipe.protocol.worker import DEFAULT_MAX_BODY_BYTES
from omnipipe.server.errors import APIError, unavailable
from omnipipe.server.voice_registry import ReferenceVoice, VoiceRegistry
from omnipipe.util.cache import cache_root
from omnipipe.util.dotted import resolve
from omnipipe.util.field_error import FieldError

logger = logging.getLogger(__name__)

SlotStatus = Literal["idle", "loading", "ready", "failed"]


@dataclass
class ServerConfig:
    pipeline: str = "default"
    deploy: str | Path | dict[str, Any] | None = None
    host: str = "127.0.0.1"
    port: int = 8091
    api_key: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    served_model_name: str | None = None  # the model id /v1/models lists (default: the pipeline's name)
    # further names every endpoint accepts as ``model`` (vLLM's extra --served-model-name values: tts-1, whisper-1)
    model_aliases: tuple[str, ...] = ()
    cors_origins: tuple[str, ...] = ()  # browser origins allowed to call the API ("*": any); none: no CORS headers
    cors_methods: tuple[str, ...] = ("*",)
    cors_headers: tuple[str, ...] = ("*",)
    cors_credentials: bool = False
    log_level: str = "WARNING"
    companions: dict[str, str] | None = field(default=None)  # endpoint -> pipeline; None: the family's traits
    capacity: int | None = None  # sessions at once (HTTP model requests + realtime sockets); None: unlimited
    pause_timeout_s: float = 300.0  # a realtime session paused longer than this is closed
    # a realtime session in which nobody spoke, typed or was answered for this long is closed (warned
    # IDLE_WARNING_S before), so that an open page nobody uses gives its worker slot back; None: never
    idle_timeout_s: float | None = None
    exit_on_engine_failure: bool = True  # serve: stop when the main pipeline fails to start; worker: report it
    # endpoints whose companion pipeline starts with the server rather than on first use (the worker starts
    # transcription's: the voice page shows what was heard from the first turn on)
    preload_companions: tuple[str, ...] = ()
    # OpenAI voice name -> voice, over the pipelines' own mapping (``ServingTraits.voice_aliases``) and the default
    # (every OpenAI voice name -> "default"); a target a pipeline lacks is refused when a request uses the alias
    voice_aliases: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.capacity is not None and (isinstance(self.capacity, bool) or not isinstance(self.capacity, int)
                                          or self.capacity < 1):
            raise FieldError("capacity", f"must be an integer >= 1 or None, got {self.capacity!r}")
        if not (isinstance(self.pause_timeout_s, (int, float)) and 0 < self.pause_timeout_s < float("inf")):
            raise FieldError("pause_timeout_s", f"must be a number > 0, got {self.pause_timeout_s!r}")
        if self.idle_timeout_s is not None and not (isinstance(self.idle_timeout_s, (int, float))
                                                    and 0 < self.idle_timeout_s < float("inf")):
            raise FieldError("idle_timeout_s", f"must be a number > 0 or None, got {self.idle_timeout_s!r}")
        unknown = [e for e in self.preload_companions if e not in ("speech", "transcription")]
        if unknown:
            raise FieldError("preload_companions", f"endpoints are speech and transcription, got {unknown[0]!r}")


def _deploy_for(source: str | Path | dict[str, Any] | None, pipeline: PipelineSpec) -> dict[str, Any] | None:
    """The server's deploy settings restricted to ``pipeline``'s stages and edges."""
    if source is None:
        return None
    raw = copy.deepcopy(source) if isinstance(source, dict) else yaml.safe_load(Path(source).read_text()) or {}
    if not isinstance(raw, dict):
        return None
    names = set(pipeline.stage_names)
    edges = {e.name for e in pipeline.edges}
    if isinstance(raw.get("stages"), dict):
        raw["stages"] = {k: v for k, v in raw["stages"].items() if k in names}
    if isinstance(raw.get("edges"), dict):
        raw["edges"] = {k: v for k, v in raw["edges"].items() if k in edges}
    return raw


class RegisteredVoice(str):
    """A voice made from a clip, as ``EnginePool.check_voice`` returns it: its name, with the family voice it builds
    on (``base_voice``) and what its reference stage takes (``reference``)."""

    base_voice: str
    reference: Any

    def __new__(cls, name: str, base_voice: str, reference: Any) -> RegisteredVoice:
        voice = super().__new__(cls, name)
        voice.base_voice, voice.reference = base_voice, reference
        return voice


def _given_to_stage(params: dict[str, SamplingParams], pipeline: PipelineSpec, target: tuple[str, str], value: Any,
                    voice: str, param: str) -> dict[str, SamplingParams]:
    """``params`` with ``value`` as ``extra[key]`` of ``target``'s stage; a different value already there is a 400
    naming ``param``."""
    stage, key = target
    stage_params = params.get(stage) or SamplingParams()
    asked = stage_params.extra.get(key)
    if asked is not None and asked != value:
        shown = asked if isinstance(asked, str) else "(another value)"
        raise APIError(400, f"{param}: voice {voice!r} conflicts with sampling_params.{stage}.extra.{key} "
                       f"{shown}", param=param, code="invalid_voice")
    stage_params.extra = {**stage_params.extra, key: value}
    try:
        stage_params.check_extra(pipeline.stage_extra_schema(stage))
    except FieldError as exc:
        raise APIError(400, f"{param}: {exc.rule}", param=param, code="invalid_voice") from None
    return {**params, stage: stage_params}


def with_voice(params: dict[str, SamplingParams], voice: str, pipeline: PipelineSpec,
               param: str) -> dict[str, SamplingParams]:
    """``params`` with ``voice`` (one ``EnginePool.check_voice`` returned) given to the stage that takes it
    (``ServingTraits.voice_param``); ``default`` leaves the stage's own. A voice made from a clip gives its base voice
    there and its reference to the reference stage (``ServingTraits.reference_param``). A different voice already
    asked for in those stages' ``extra`` is a 400 naming ``param``."""
    traits = pipeline.serving
    if voice == "default" or traits.voice_param is None:
        return params
    if isinstance(voice, RegisteredVoice) and traits.reference_param is not None:
        params = _given_to_stage(params, pipeline, traits.voice_param, voice.base_voice, voice, param)
        return _given_to_stage(params, pipeline, traits.reference_param, voice.reference, voice, param)
    return _given_to_stage(params, pipeline, traits.voice_param, str(voice), voice, param)


class EngineSlot:
    """One pipeline's AsyncOmni, started once (by the server or by the first request that needs it)."""

    def __init__(self, pipeline: PipelineSpec, deploy: Any, log_level: str) -> None:
        self.pipeline = pipeline
        self.deploy = deploy
        self.log_level = log_level
        self.status: SlotStatus = "idle"
        self.error: str | None = None
        self.engine: AsyncOmni | None = None
        self._task: asyncio.Task[AsyncOmni] | None = None
        self._voices: list[str] | None = None

    def stage_options(self, stage: str) -> dict[str, Any]:
        """The options of ``stage`` as deployed."""
        deploy = self.engine.deploy if self.engine is not None else load_deploy(self.deploy, self.pipeline)
        return dict(deploy.stages[stage].options)

    def voices(self) -> list[str]:
        """``default`` plus the voices of the pipeline's family (``ServingTraits.voices``), read once: given the
        options of the stage the voice goes to, as deployed (a checkpoint family lists its checkpoint's voices). Voices
        that cannot be read (a bad checkpoint, which its stage reports when it loads) leave ``default`` alone."""
        if self._voices is None:
            traits = self.pipeline.serving
            found: list[str] = []
            if traits.voices is not None:
                try:
                    options = self.stage_options(traits.voice_param[0]) if traits.voice_param is not None else {}
                    found = list(resolve(traits.voices)(options))
                except Exception as exc:  # noqa: BLE001 - logged once; the voice list is then default alone
                    logger.warning("pipeline %s: cannot list its voices: %s", self.name, exc)
            self._voices = ["default", *(v for v in found if v != "default")]
        return self._voices

    @property
    def name(self) -> str:
        return self.pipeline.name

    def start_in_background(self) -> asyncio.Task[AsyncOmni]:
        if self._task is None:
            self.status = "loading"
            self._task = asyncio.create_task(self._start(), name=f"omnipipe-start-{self.name}")
        return self._task

    async def _start(self) -> AsyncOmni:
        try:
            engine = AsyncOmni(self.pipeline, self.deploy, log_level=self.log_level)
            self.engine = engine
            await engine.start()
        except Exception as exc:
            self.status, self.error = "failed", f"{type(exc).__name__}: {exc}"
            logger.error("pipeline %s failed to start: %s", self.name, self.error)
            raise
        self.status = "ready"
        logger.info("pipeline %s is ready", self.name)
        return engine

    def ready_engine(self) -> AsyncOmni:
        """The engine if it has loaded, else a 503 saying why not."""
        if self.status == "ready" and self.engine is not None:
            return self.engine
        if self.status == "failed":
            raise unavailable(f"pipeline {self.name!r} failed to start: {self.error}", code="engine_failed")
        raise unavailable(f"pipeline {self.name!r} is loading; retry shortly", code="engine_loading")

    async def wait_engine(self) -> AsyncOmni:
        """Start the engine if needed and wait for it (used by lazily started companions)."""
        task = self.start_in_background()
        try:
            return await asyncio.shield(task)
        except APIError:
            raise
        except Exception:  # noqa: BLE001 - the slot recorded it
            return self.ready_engine()  # raises the 503 naming the failure

    async def shutdown(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()  # still loading: stop the stages now, not once they have loaded
            await asyncio.gather(self._task, return_exceptions=True)
        if self.engine is not None:
            await self.engine.shutdown()


class EnginePool:
    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        main = get_pipeline(config.pipeline)
        self.main = EngineSlot(main, config.deploy, config.log_level)
        self.slots: dict[str, EngineSlot] = {main.name: self.main}
        self._registries: dict[str, VoiceRegistry] = {}
        traits = main.serving
        family = {"speech": traits.speech_pipeline, "transcription": traits.transcription_pipeline}
        companions = ({k: v for k, v in family.items() if v} if config.companions is None else config.companions)
        self.endpoint_pipelines: dict[str, str | None] = {
            "chat": main.name if traits.chat and ("text" in main.output_modalities or
                                                  "audio" in main.output_modalities) else None,
            "speech": main.name if self._is_speech(main) else companions.get("speech"),
            "transcription": main.name if self._is_transcription(main) else companions.get("transcription"),
            "images": main.name if "image" in main.output_modalities else None,
        }
        for endpoint in ("speech", "transcription"):
            name = self.endpoint_pipelines[endpoint]
            if name is not None and name not in self.slots:
                pipeline = get_pipeline(name)
                self.slots[name] = EngineSlot(pipeline, _deploy_for(config.deploy, pipeline), config.log_level)

    def companions(self) -> dict[str, EngineSlot]:
        """Endpoint -> the companion slot serving it (endpoints the main pipeline serves itself left out)."""
        return {endpoint: self.slots[name] for endpoint, name in self.endpoint_pipelines.items()
                if name is not None and name != self.main.name}

    def preloaded(self) -> dict[str, EngineSlot]:
        """The companions started with the server (``ServerConfig.preload_companions`` that this pipeline has)."""
        companions = self.companions()
        return {endpoint: companions[endpoint] for endpoint in self.config.preload_companions if endpoint in companions}

    def start_preloaded(self) -> None:
        """Start the companions the config asks to preload (those this pipeline has), beside the main one."""
        for slot in self.preloaded().values():
            task = slot.start_in_background()
            # a failure is recorded in the slot and answered on use (503 naming it); nobody awaits this task
            task.add_done_callback(lambda done: done.cancelled() or done.exception())

    def preloading(self) -> bool:
        """Whether a preloaded companion is still loading (the server reports itself loading until none is)."""
        return any(slot.status in ("idle", "loading") for slot in self.preloaded().values())

    @staticmethod
    def _is_speech(pipeline: PipelineSpec) -> bool:
        return pipeline.input_modalities == ("text",) and pipeline.output_modalities == ["audio"]

    @staticmethod
    def _is_transcription(pipeline: PipelineSpec) -> bool:
        return pipeline.input_modalities == ("audio",) and pipeline.output_modalities == ["text"]

    @property
    def model_name(self) -> str:
        return self.config.served_model_name or self.main.name

    def model_ids(self) -> list[str]:
        return [self.model_name, *(name for name in self.slots if name != self.main.name)]

    def model_pipelines(self) -> list[tuple[str, PipelineSpec]]:
        """Each model id ``/v1/models`` lists, with the pipeline that serves it."""
        return [(self.model_name, self.main.pipeline),
                *((name, slot.pipeline) for name, slot in self.slots.items() if name != self.main.name)]

    def check_model(self, model: str, endpoint: str) -> None:
        """``model`` must be the served model or the pipeline that serves ``endpoint``."""
        accepted = {self.model_name, self.main.name, self.endpoint_pipelines.get(endpoint),
                    *self.config.model_aliases} - {None}
        if model not in accepted:
            raise APIError(404, f"model: {model!r} does not exist or is not served for this endpoint "
                           f"(use {', '.join(sorted(str(a) for a in accepted))})", param="model",
                           code="model_not_found")

    async def engine_for(self, endpoint: str) -> tuple[AsyncOmni, PipelineSpec]:
        name = self.endpoint_pipelines.get(endpoint)
        if name is None:
            main = self.main.pipeline
            served = [name for name, pipeline in self.endpoint_pipelines.items() if pipeline is not None]
            raise APIError(404, f"model: {self.model_name!r} has no pipeline for the {endpoint} endpoint (pipeline "
                           f"{main.name!r} takes {', '.join(main.input_modalities)} and gives "
                           f"{', '.join(main.output_modalities) or 'nothing'}; it serves "
                           f"{', '.join(served) or 'no endpoint'})", param="model", code="endpoint_not_available")
        slot = self.slots[name]
        if slot is self.main:
            return slot.ready_engine(), slot.pipeline
        self.main.ready_engine()  # the server answers nothing before its main pipeline is up
        return await slot.wait_engine(), slot.pipeline

    def voice_registry(self, pipeline: PipelineSpec) -> VoiceRegistry | None:
        """The voices made from clips for ``pipeline``; None when its family cannot take a speaker reference."""
        traits = pipeline.serving
        if traits.reference_voice is None or traits.reference_param is None:
            return None
        if pipeline.name not in self._registries:
            slot = self.slots[pipeline.name]
            stage = traits.reference_param[0]
            self._registries[pipeline.name] = VoiceRegistry(cache_root() / "voices" / pipeline.name,
                                                            traits.reference_voice, lambda: slot.stage_options(stage))
        return self._registries[pipeline.name]

    def registered_voices(self, pipeline: PipelineSpec) -> list[ReferenceVoice]:
        """The voices made from clips for ``pipeline`` whose base voice it has."""
        registry = self.voice_registry(pipeline)
        if registry is None:
            return []
        own = set(self.slots[pipeline.name].voices())
        return [voice for voice in registry.voices() if voice.base_voice in own]

    def voices(self, pipeline: PipelineSpec) -> list[str]:
        """``default``, the voices of the pipeline's family (``EngineSlot.voices``), then those made from clips."""
        return self._voices(pipeline)[0]

    def _voices(self, pipeline: PipelineSpec) -> tuple[list[str], list[ReferenceVoice]]:
        """``voices`` and, among them, those made from clips: the registry read once."""
        registered = self.registered_voices(pipeline)
        return [*self.slots[pipeline.name].voices(), *(v.name for v in registered)], registered

    def voice_aliases(self, pipeline: PipelineSpec, voices: list[str] | None = None) -> dict[str, str]:
        """OpenAI voice name -> the pipeline's voice: every name to ``default``, then the family's mapping, then the
        server's (``ServerConfig.voice_aliases``); aliases naming a voice the pipeline lacks (``voices``, when the
        caller has them) are left out."""
        aliases = {name: "default" for name in OPENAI_VOICES}
        aliases.update(dict(pipeline.serving.voice_aliases))
        aliases.update(self.config.voice_aliases)
        known = set(self.voices(pipeline) if voices is None else voices)
        return {alias: voice for alias, voice in aliases.items() if voice in known and alias not in known}

    def voice_cards(self, pipeline: PipelineSpec) -> list[VoiceCard]:
        voices, registered = self._voices(pipeline)
        aliases = self.voice_aliases(pipeline, voices)
        bases = {voice.name: voice.base_voice for voice in registered}
        return [VoiceCard(id=voice, name=voice, aliases=sorted(a for a, v in aliases.items() if v == voice),
                          base_voice=bases.get(voice)) for voice in voices]

    def audio_model_pipelines(self) -> list[tuple[str, PipelineSpec]]:
        """The model ids whose pipelines speak, with their pipelines."""
        return [(model, pipeline) for model, pipeline in self.model_pipelines()
                if "audio" in pipeline.output_modalities]

    def check_voice(self, voice: Voice, pipeline: PipelineSpec, param: str) -> str:
        """The pipeline voice that ``voice`` (a name, an OpenAI alias or ``{"id": ...}``; any case) selects; else a
        400 naming ``param`` and listing the valid names."""
        name = voice_name(voice).casefold()
        voices, kept = self._voices(pipeline)
        aliases = self.voice_aliases(pipeline, voices)
        match = next((v for v in voices if v.casefold() == name), None)
        registry = self.voice_registry(pipeline)
        registered = next((v for v in kept if v.name == match), None)
        if registry is not None and registered is not None:
            try:
                return RegisteredVoice(registered.name, registered.base_voice, registry.reference(registered))
            except (OSError, FieldError) as exc:  # removed meanwhile, or its clip damaged on disk
                raise APIError(400, f"{param}: voice {registered.name!r} cannot be read ({exc}); register it again",
                               param=param, code="invalid_voice") from None
        if match is not None:
            return match
        alias = next((a for a in aliases if a.casefold() == name), None)
        if alias is not None:
            return aliases[alias]
        raise APIError(400, f"{param}: unknown voice {name!r} (voices: {', '.join(voices)}; aliases: "
                       f"{', '.join(aliases) or 'none'})", param=param, code="invalid_voice")

    async def debug_states(self) -> dict[str, dict[str, Any]]:
        """Per pipeline: its status, what its engine holds (``state``) and its liveness (``health``)."""
        out: dict[str, dict[str, Any]] = {}
        for name, slot in self.slots.items():
            state = health = None
            error = slot.error
            if slot.status == "ready" and slot.engine is not None:
                engine_health = slot.engine.health()
                health = engine_health.to_dict() if engine_health is not None else None
                try:
                    state = await slot.engine.debug_state()
                except TimeoutError:
                    error = "the engine did not answer the state query (its loop is not running)"
            out[name] = {"status": slot.status, "error": error, "state": state, "health": health}
        return out

    def kill_now(self) -> None:
        """Kill every engine's stage processes at once (a second Ctrl-C); safe from a signal handler."""
        for slot in self.slots.values():
            if slot.engine is not None:
                slot.engine.kill_now()

    async def shutdown(self) -> None:
        await asyncio.gather(*(slot.shutdown() for slot in self.slots.values()), return_exceptions=True)

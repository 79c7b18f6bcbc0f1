"""A model family's topology, written in code: its stages, which feeds which, and the glue functions.

Glue functions are named by dotted path (``package.module.function``) so the model-specific handoff of a family
is visible in one file:

- ``prompt_processor(prompt: dict) -> EntryInput``: runs in the engine (main process) and decides where a
  request enters and with what input.
- an edge's ``input_processor(outputs: list[dict]) -> list[dict]``: the whole upstream output (its step data,
  in order) -> the downstream stage's input chunks. Runs in the orchestrator when the edge does not stream.
- an edge's ``chunk_processor(state: dict, output: dict, is_last: bool, ctx: ChunkContext) -> list[dict]``: runs
  in the producing stage after every step when async chunk is on; returns the chunks ready to ship now.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

from omnipipe.util.dotted import resolve_class
from omnipipe.util.field_error import FieldError

StageKind = Literal["ar", "generation", "encoder", "diffusion"]
STAGE_KINDS = ("ar", "generation", "encoder", "diffusion")
MODALITIES = ("text", "audio", "image")


class PipelineSpecError(ValueError):
    """The topology itself is inconsistent (a developer error in a model family)."""


@dataclass(frozen=True)
class StageSpec:
    name: str
    kind: StageKind
    runner: str  # dotted path of a StageRunner subclass
    final_output: str | None = None  # modality this stage delivers to the user, if any
    default_options: dict[str, Any] = field(default_factory=dict)
    sample_rate_hz: int | None = None  # for audio-producing stages
    # dotted path of the dataclass of the knobs this stage reads from ``SamplingParams.extra`` (e.g. the talker's
    # speed), checked at the API and by the stage on arrival; None: the stage takes none
    extra_params: str | None = None


@dataclass(frozen=True)
class EdgeSpec:
    source: str
    target: str
    input_processor: str
    chunk_processor: str | None = None
    # dotted path of the dataclass that holds this edge's options (deploy ``edges.NAME.options`` and per-request
    # ``edge_options``), e.g. the frame edge's chunk sizes; None: the edge takes no options
    options: str | None = None

    @property
    def name(self) -> str:
        return f"{self.source}->{self.target}"


@dataclass(frozen=True)
class EntryInput:
    """Where a request enters the pipeline and what the entry stage receives."""

    stage: str
    data: dict[str, Any]


@dataclass(frozen=True)
class ServingTraits:
    """What a server needs to know about a family without naming it."""

    speech_pipeline: str | None = None  # serves /v1/audio/speech beside this pipeline (text -> audio)
    transcription_pipeline: str | None = None  # serves /v1/audio/transcriptions (audio -> text)
    # the transcription pipeline decodes a short clip in a fitted window (``SamplingParams.extra`` ``fitted_window``)
    # and this pipeline answers a spoken question from its transcript: a realtime session transcribes the turn itself
    # as it ends and sends its words (``server/routes/realtime/live_transcript.py``)
    live_transcription: bool = False
    # dotted path: (options of the voice stage: dict) -> list[str], the family's voices besides "default" (a
    # checkpoint family reads them from the checkpoint the stage options name)
    voices: str | None = None
    # (stage, extra key): a request's voice goes to that stage's ``SamplingParams.extra[key]``; None: the pipeline
    # speaks with the one voice its stages load
    voice_param: tuple[str, str] | None = None
    speed_stage: str | None = None  # the stage whose ``extra["speed"]`` changes the speaking rate
    # OpenAI voice names (alloy, ash, ...) -> this family's voices, over the server's default (each to "default")
    voice_aliases: tuple[tuple[str, str], ...] = ()
    takes_instructions: bool = False  # speech can follow ``instructions`` (tone, accent); else they are refused
    # the stage whose options ``video_fps`` / ``video_max_frames`` say at what rate and how many of a realtime turn's
    # camera frames go to a family that takes video (``server/routes/realtime/frames.py``)
    video_stage: str | None = None
    max_images: int | None = None  # the images one question takes (camera frames given as images are cut to it)
    # dotted path: (options of the reference stage: dict, clip: float32 mono samples, their rate in Hz) -> what that
    # stage's ``extra[key]`` takes to speak like the clip; None: the family's voices are fixed (an uploaded
    # reference voice is refused)
    reference_voice: str | None = None
    reference_param: tuple[str, str] | None = None  # (stage, extra key) a reference voice's value goes to
    # the reference hook also takes what the clip says (keyword ``text``: the upload's transcript) and the family
    # hears the clip with it; else a transcript given with an upload is refused (a 400 naming ``text``)
    reference_text: bool = False
    # the pipeline answers a conversation (``/v1/chat/completions``, ``/v1/responses``, realtime sessions); False: it
    # only says the text it is given (CSM) or writes down what it hears (a transcription pipeline) and serves that
    # endpoint alone, the others refused naming ``model``
    chat: bool = True
    # a full-duplex family (Moshi): a request is a live session hearing an audio stream (``AsyncOmni.append_audio``)
    # while it speaks, until the stream is dropped; its text and audio stream out as the user's audio comes in
    duplex: bool = False
    # a transcription pipeline that transcribes live (Voxtral Realtime): a request hears an audio stream
    # (``AsyncOmni.append_audio``) and streams its text as the audio comes, until the stream is dropped; its realtime
    # sessions are transcription sessions (``server/routes/realtime/transcription_session.py``)
    live_transcriber: bool = False
    # a transcription pipeline's ``language`` (ISO 639-1 codes; ``/v1/audio/transcriptions``): those it takes, and the
    # (stage, extra key) a given one goes to; None there: it transcribes its one language without being told (the
    # default, whisper tiny.en: English)
    transcription_languages: tuple[str, ...] = ("en",)
    language_param: tuple[str, str] | None = None
    # a transcription pipeline's audio tokens per second of input, its usage's input tokens (the default: whisper's
    # encoder, 1500 positions per 30 s window)
    audio_tokens_per_s: float = 50.0


@dataclass(frozen=True)
class PipelineSpec:
    name: str
    description: str
    stages: tuple[StageSpec, ...]
    edges: tuple[EdgeSpec, ...]
    prompt_processor: str
    input_modalities: tuple[str, ...]
    default_deploy: dict[str, Any] = field(default_factory=dict)
    comprehension_stage: str | None = None  # receives SamplingParams given without a stage name
    model_stages: tuple[str, ...] = ()  # the stages whose deploy option ``model`` the CLI's ``--model`` sets
    takes_history: bool = False  # the prompt processor reads a prompt's "history" (earlier turns, instructions)
    # the prompt processor hands a prompt's "tools" to a thinker that renders them and may call them (its stage
    # refuses them, naming ``prompt.tools``, when its model has no tool-call format)
    takes_tools: bool = False
    # the comprehension stage decodes under a grammar (``response_format``) and reports its tokens' logprobs
    constrained_decoding: bool = False
    prepare_weights: str | None = None  # dotted path: (progress: bool) -> None, idempotent
    weights_status: str | None = None  # dotted path: () -> (ready: bool, detail: str)
    serving: ServingTraits = field(default_factory=ServingTraits)

    def __post_init__(self) -> None:
        names = [s.name for s in self.stages]
        for name in names:
            if not re.fullmatch(r"[A-Za-z0-9_]+", name):
                raise PipelineSpecError(f"pipeline {self.name}: stage name {name!r} must match [A-Za-z0-9_]+")
        if len(set(names)) != len(names):
            raise PipelineSpecError(f"pipeline {self.name}: duplicate stage names in {names}")
        for stage in self.stages:
            if stage.kind not in STAGE_KINDS:
                raise PipelineSpecError(f"pipeline {self.name}: stage {stage.name} has unknown kind {stage.kind!r}")
            if stage.final_output is not None and stage.final_output not in MODALITIES:
                raise PipelineSpecError(f"pipeline {self.name}: stage {stage.name} outputs unknown "
                                        f"{stage.final_output!r}")
        for edge in self.edges:
            for end in (edge.source, edge.target):
                if end not in names:
                    raise PipelineSpecError(f"pipeline {self.name}: edge {edge.name} names unknown stage {end!r}")
        if self.serving.speed_stage is not None and self.serving.speed_stage not in names:
            raise PipelineSpecError(f"pipeline {self.name}: speed stage {self.serving.speed_stage!r} unknown")
        language = self.serving.language_param
        if language is not None and language[0] not in names:
            raise PipelineSpecError(f"pipeline {self.name}: language stage {language[0]!r} unknown")
        if self.comprehension_stage is not None and self.comprehension_stage not in names:
            raise PipelineSpecError(f"pipeline {self.name}: comprehension stage {self.comprehension_stage!r} unknown")
        for model_stage in self.model_stages:
            if model_stage not in names:
                raise PipelineSpecError(f"pipeline {self.name}: model stage {model_stage!r} unknown")
        self._check_acyclic()

    def _check_acyclic(self) -> None:
        state: dict[str, int] = {}

        def visit(name: str) -> None:
            if state.get(name) == 1:
                raise PipelineSpecError(f"pipeline {self.name}: edges form a cycle through {name}")
            if state.get(name) == 2:
                return
            state[name] = 1
            for edge in self.edges_from(name):
                visit(edge.target)
            state[name] = 2

        for stage in self.stages:
            visit(stage.name)

    # ------------------------------------------------------------------ queries
    def stage(self, name: str) -> StageSpec:
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise KeyError(name)

    @property
    def stage_names(self) -> list[str]:
        return [s.name for s in self.stages]

    def edges_from(self, name: str) -> list[EdgeSpec]:
        return [e for e in self.edges if e.source == name]

    def edges_into(self, name: str) -> list[EdgeSpec]:
        return [e for e in self.edges if e.target == name]

    def edge(self, source: str, target: str) -> EdgeSpec:
        for edge in self.edges:
            if edge.source == source and edge.target == target:
                return edge
        raise KeyError(f"{source}->{target}")

    @property
    def output_modalities(self) -> list[str]:
        return sorted({s.final_output for s in self.stages if s.final_output})

    def check_output_modalities(self, value: Any, field: str = "output_modalities",
                                with_transcript: bool = False) -> list[str]:
        """``value`` as a list of modalities this pipeline produces, duplicates dropped, or a FieldError.

        ``with_transcript``: asking for audio also brings the text it speaks, where the pipeline writes text (the
        OpenAI endpoints always return the transcript of a spoken answer).
        """
        if not isinstance(value, (list, tuple)) or not value or not all(isinstance(m, str) for m in value):
            raise FieldError(field, f"must be a non-empty list such as ['text', 'audio'], got {value!r}")
        modalities = list(dict.fromkeys(value))
        for modality in modalities:
            if modality not in self.output_modalities:
                raise FieldError(field, f"{modality!r} is not produced by pipeline {self.name!r} "
                                 f"(it produces {', '.join(self.output_modalities)})")
        if with_transcript and "audio" in modalities and "text" in self.output_modalities and "text" not in modalities:
            modalities.insert(0, "text")
        return modalities

    def transcription_extras(self, extra: dict[str, Any], language: str | None) -> dict[str, dict[str, Any]]:
        """A transcription's ``SamplingParams.extra`` by stage: ``extra`` (if any) for the comprehension stage, and
        ``language`` for the stage that takes it (``ServingTraits.language_param``; a pipeline that takes none is
        not told)."""
        extras = {self.comprehension_stage or self.stages[0].name: dict(extra)} if extra else {}
        target = self.serving.language_param
        if language is not None and target is not None:
            extras[target[0]] = {**extras.get(target[0], {}), target[1]: language}
        return extras

    def edge_options_schema(self, edge: EdgeSpec) -> type | None:
        """The dataclass of ``edge``'s options, or None when it takes none."""
        return resolve_class(edge.options) if edge.options else None

    def stage_extra_schema(self, name: str) -> type | None:
        """The dataclass of stage ``name``'s ``SamplingParams.extra`` knobs, or None when it takes none."""
        spec = self.stage(name)
        return resolve_class(spec.extra_params) if spec.extra_params else None

    def edges_with_option(self, option: str) -> list[EdgeSpec]:
        """The edges whose options include ``option`` (a per-request knob the server maps onto every such edge)."""
        out = []
        for edge in self.edges:
            schema = self.edge_options_schema(edge)
            if schema is not None and option in getattr(schema, "__dataclass_fields__", {}):
                out.append(edge)
        return out

    def plan(self, entry: str, modalities: list[str]) -> list[str]:
        """The stages a request entering at ``entry`` needs to produce ``modalities``, in topological order."""
        reachable = self._reachable(entry)
        needed: set[str] = set()
        for modality in modalities:
            producers = [s.name for s in self.stages if s.final_output == modality and s.name in reachable]
            if not producers:
                raise FieldError("output_modalities", f"pipeline {self.name!r} cannot produce {modality!r} from "
                                 f"this input (it produces {', '.join(self.output_modalities)})")
            for producer in producers:
                needed |= self._path(entry, producer)
        return [name for name in self._topological_order() if name in needed]

    def _reachable(self, start: str) -> set[str]:
        seen, todo = {start}, [start]
        while todo:
            for edge in self.edges_from(todo.pop()):
                if edge.target not in seen:
                    seen.add(edge.target)
                    todo.append(edge.target)
        return seen

    def _path(self, start: str, goal: str) -> set[str]:
        return {name for name in self._reachable(start) if goal in self._reachable(name)}

    def _topological_order(self) -> list[str]:
        order: list[str] = []
        indegree = {s.name: len(self.edges_into(s.name)) for s in self.stages}
        ready = [name for name in self.stage_names if indegree[name] == 0]
        while ready:
            name = ready.pop(0)
            order.append(name)
            for edge in self.edges_from(name):
                indegree[edge.target] -= 1
                if indegree[edge.target] == 0:
                    ready.append(edge.target)
        return order

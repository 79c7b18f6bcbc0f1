"""The toy talker -> code2wav pipeline (text in, audio out)."""


from omnipipe.config.pipeline_spec import PipelineSpec
from omnipipe.models.toy.pipeline import PIPELINE as _FULL

PIPELINE = PipelineSpec(
    name="toy_tts",
    description="toy talker -> code2wav",
    stages=tuple(s for s in _FULL.stages if s.name != "thinker"),
    edges=tuple(e for e in _FULL.edges if e.source != "thinker"),
    prompt_processor="omnipipe.models.toy.processors.tts_prompt",
    input_modalities=("text",),
    default_deploy=dict(_FULL.default_deploy),
)

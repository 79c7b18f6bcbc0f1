"""The image family: a diffusion stage on diffusers, and the digits model the project trains itself.

Two pipelines:

- ``image``: a prompt ("draw a seven") -> the diffusion stage. With the default model (``digits``: a small DDPM
  trained on scikit-learn's 8x8 handwritten digits, see ``weights/digits.py``) the prompt processor maps the text to
  the digit to draw and refuses anything else. A diffusers checkpoint directory given as the stage option ``model``
  (``--model PATH``) gets the prompt as text (text-to-image) or as a class name (DiT).
- ``think-and-draw``: understanding -> generation. The default family's thinker answers the request ("draw the
  number of legs a spider has": "A spider has eight legs."); its answer conditions the diffusion stage, which draws
  the digit the answer names. The text streams back first, then the image.
"""

from omnipipe.config.pipeline_spec import EdgeSpec, PipelineSpec, StageSpec

_P = "omnipipe.models.image"
# borrowed by dotted path from the default family: the thinker, and the weights it needs
_THINKER_RUNNER = "omnipipe.models.default.runners.thinker:ThinkerRunner"

# the digits model's sampler, measured as the share of 200 samples a classifier reads as the asked digit: DDIM 25 steps
# with guidance 2.0: 100% (1.5: 99%, 1.0: 94-96%, 3.0: 90%; 50 steps: 92-96%; DPM-Solver++ 25 steps: 90%)
DIFFUSION = StageSpec(
    "diffusion", "diffusion", f"{_P}.runners.diffusion:DiffusersRunner", final_output="image",
    extra_params=f"{_P}.processors:DiffusionParams",
    default_options={"model": "digits", "scheduler": "ddim", "steps": 25, "guidance_scale": 2.0},
)
THINKER = StageSpec("thinker", "ar", _THINKER_RUNNER, final_output="text",
                    default_options={"model": "qwen2.5-coder-0.5b-instruct"})

# 8x8 images: a denoising step of 16 requests is a few milliseconds, so one stage holds many at once
_DIFFUSION_DEPLOY = {"threads": 1, "max_num_seqs": 16}

IMAGE = PipelineSpec(
    name="image",
    description="a diffusion model on diffusers (default: digits, a small DDPM trained here on 8x8 handwritten "
                "digits); a prompt in, an image out",
    stages=(DIFFUSION,),
    edges=(),
    prompt_processor=f"{_P}.processors.image_prompt",
    input_modalities=("text",),
    comprehension_stage="diffusion",
    model_stages=("diffusion",),
    default_deploy={"stages": {"diffusion": _DIFFUSION_DEPLOY}},
    prepare_weights=f"{_P}.weights.prepare.prepare_image",
    weights_status=f"{_P}.weights.prepare.image_status",
)

THINK_AND_DRAW = PipelineSpec(
    name="think-and-draw",
    description="the default thinker answers, the digits diffusion model draws the digit its answer names; "
                "text in, text and an image out",
    stages=(THINKER, DIFFUSION),
    edges=(EdgeSpec("thinker", "diffusion", f"{_P}.processors.thinker2diffusion"),),
    prompt_processor=f"{_P}.processors.think_and_draw_prompt",
    input_modalities=("text",),
    comprehension_stage="thinker",
    model_stages=("diffusion",),
    takes_history=True,
    default_deploy={"stages": {"thinker": {"threads": 1, "max_num_seqs": 8}, "diffusion": _DIFFUSION_DEPLOY}},
    prepare_weights=f"{_P}.weights.prepare.prepare_think_and_draw",
    weights_status=f"{_P}.weights.prepare.think_and_draw_status",
)

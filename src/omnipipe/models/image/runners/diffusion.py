"""A diffusion stage on Hugging Face diffusers: one denoising step per call for every request of the batch.

The runner loads a diffusers checkpoint directory (``model_index.json``) and uses diffusers' model classes,
schedulers, VAE and ``randn_tensor``; the denoising loop is its own, so that requests at different steps share one
model forward (step-level continuous batching). Three layouts are recognised from ``model_index.json``:

- ``UNet2DModel`` in pixel space (the DDPMPipeline / DDIMPipeline layout), unconditional or class-conditional
  (``num_class_embeds``). An ``omnipipe.json`` beside it may name the classes and the null class that
  classifier-free guidance conditions on (the project's ``digits`` model: classes "0".."9", null class 10).
- DiT (DiTPipeline layout): a class-conditional ``DiTTransformer2DModel`` / ``Transformer2DModel`` and an
  ``AutoencoderKL``; the null class is ``num_embeds_ada_norm``; ``id2label`` in ``model_index.json`` names classes.
- Stable Diffusion (StableDiffusionPipeline layout): ``UNet2DConditionModel``, ``AutoencoderKL`` and a CLIP text
  encoder and tokenizer; classifier-free guidance against the negative (by default empty) prompt.

Deploy options (``stages.<name>.options``): ``model`` (a checkpoint directory, or ``digits``: the project's own
model in the user cache), ``scheduler`` (``ddpm``, ``ddim``, ``dpm-solver``, ``euler``, or none: the checkpoint's
own), ``steps`` and ``guidance_scale`` (defaults for requests that give none; the scale defaults to the diffusers
pipeline's own: 1 for a pixel UNet, 4 for DiT, 7.5 for Stable Diffusion), ``dtype`` (``float32``; ``bfloat16`` or
``float16`` on cuda only). ``batching`` and ``warmup`` belong to the scheduler and the stage loop.

A request's input (its last input dict): ``{}`` for an unconditional model; ``{"class_label": int}`` or
``{"prompt": "<class name>"}`` for a class-conditional one; ``{"prompt": str, "negative_prompt": str | None}``
for a text-conditional one. Each request keeps its own scheduler (some keep per-loop history), its own seeded CPU
generator and its latents, drawn exactly as the diffusers pipeline draws them for the same seed, so a request's
image depends neither on who shares its batch nor on the device (up to float rounding).
"""

from __future__ import annotations

import copy
import importlib
import inspect
import json
import numbers
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from omnipipe.models.image.processors import DiffusionParams, class_named
from omnipipe.stage.request import RequestStatus, StageRequest
from omnipipe.stage.runner import RunnerOutput, StageRunner
from omnipipe.util.field_error import FieldError
from omnipipe.util.image import enlarge
from omnipipe.util.options import options_from_dict

SCHEDULERS = {"ddpm": "DDPMScheduler", "ddim": "DDIMScheduler", "dpm-solver": "DPMSolverMultistepScheduler",
              "euler": "EulerDiscreteScheduler"}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
STAGE_OPTIONS = ("batching", "warmup")  # read by the scheduler and the stage loop, not by the runner
DIGITS = "digits"

PIXEL, DIT, TEXT = "pixel", "dit", "text"  # the model layouts
DEFAULT_GUIDANCE = {PIXEL: 1.0, DIT: 4.0, TEXT: 7.5}  # as the diffusers pipelines default


@dataclass(frozen=True)
class DiffusersOptions:
    """The stage's deploy options the runner reads (see the module docstring)."""

    model: str | None = None
    scheduler: str | None = None
    steps: int = 50
    guidance_scale: float | None = None
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise FieldError("model", "required: a diffusers checkpoint directory, or 'digits'")
        if self.scheduler is not None and self.scheduler not in SCHEDULERS:
            raise FieldError("scheduler", f"must be one of {', '.join(SCHEDULERS)} or null, got {self.scheduler!r}")
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or not 1 <= self.steps <= 1000:
            raise FieldError("steps", f"must be an integer in [1, 1000], got {self.steps!r}")
        scale = self.guidance_scale
        if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))
                                  or not 0 <= scale <= 50):
            raise FieldError("guidance_scale", f"must be a number in [0, 50], got {scale!r}")
        if self.dtype not in DTYPES:
            raise FieldError("dtype", f"must be one of {', '.join(DTYPES)}, got {self.dtype!r}")


@dataclass
class _Denoising:
    """One request's denoising loop."""

    scheduler: Any  # its own instance: multistep schedulers keep history
    generator: torch.Generator  # CPU, seeded from the request's seed
    latents: torch.Tensor  # (1, C, h, w) on the device
    cond: torch.Tensor | None  # (1,) class label or (1, L, D) text embeddings; None: unconditional
    uncond: torch.Tensor | None  # the null conditioning; set only when guiding (guidance_scale > 1)
    guidance_scale: float
    steps: int  # model calls: the scheduler's timesteps
    preview_every: int
    progress: bool
    size: tuple[int, int]  # (width, height) of the images returned: drawn, or enlarged to
    step: int = 0  # steps done


def _to_uint8(images: np.ndarray) -> list[np.ndarray]:
    """(B, H, W, C) floats in [0, 1] -> one uint8 H x W x C image each."""
    return [np.ascontiguousarray(np.round(image * 255.0).astype(np.uint8)) for image in images]


def _resolve_model(name: str) -> Path:
    if name == DIGITS:
        hint = "run `omnipipe download --pipeline image` to fetch it"
        try:
            from omnipipe.models.image.weights.digits import digits_dir
            path = Path(digits_dir())
        except (ImportError, FileNotFoundError) as exc:
            raise RuntimeError(f"options.model: the digits model is not available ({exc}); {hint}") from exc
        if not (path / "model_index.json").is_file():
            raise RuntimeError(f"options.model: the digits model is not in the cache ({path}); {hint}")
        return path
    path = Path(name).expanduser()
    if not (path / "model_index.json").is_file():
        raise RuntimeError(f"options.model: {name!r} is not a diffusers checkpoint directory (no model_index.json)")
    return path


class DiffusersRunner(StageRunner):
    # ------------------------------------------------------------------ loading
    def load(self) -> None:
        raw = {k: v for k, v in self.context.options.items() if k not in STAGE_OPTIONS}
        options = options_from_dict(DiffusersOptions, raw, "options")
        self.options = options
        self.device = torch.device(self.context.device)
        self.dtype = DTYPES[options.dtype]
        if self.device.type == "cpu" and self.dtype != torch.float32:
            raise FieldError("options.dtype", f"{options.dtype} runs on cuda only; use float32 on cpu")
        assert options.model is not None  # DiffusersOptions refuses a missing model
        self.path = _resolve_model(options.model)
        index = json.loads((self.path / "model_index.json").read_text())
        components = {k: v for k, v in index.items() if isinstance(v, list) and len(v) == 2 and v[0] is not None}

        self.vae = self.text_encoder = self.tokenizer = None
        self.labels: dict[str, int] = {}  # class name -> class id
        self.class_names: list[str] = []  # omnipipe.json's classes by id: a prompt may name one in a phrase
        self.null_class: int | None = None
        self.num_classes = 0
        if "transformer" in components:
            self.kind = DIT
            self.denoiser = self._load_component(components, "transformer")
            self.vae = self._load_component(components, "vae")
            config = self.denoiser.config
            self.num_classes = int(config.num_embeds_ada_norm)
            self.null_class = self.num_classes  # as DiTPipeline: the embedding table's extra (dropout) row
            for key, value in (index.get("id2label") or {}).items():
                for label in str(value).split(","):
                    self.labels[label.strip()] = int(key)
        elif "unet" in components and components["unet"][1] == "UNet2DConditionModel":
            self.kind = TEXT
            for part in ("text_encoder", "tokenizer"):
                if part not in components:
                    raise RuntimeError(f"options.model: {self.path} has a UNet2DConditionModel but no {part}")
            self.denoiser = self._load_component(components, "unet")
            self.vae = self._load_component(components, "vae")
            self.text_encoder = self._load_component(components, "text_encoder")
            self.tokenizer = self._load_component(components, "tokenizer")
        elif "unet" in components and components["unet"][1] == "UNet2DModel":
            if any(part in components for part in ("vae", "vqvae")):
                raise RuntimeError(f"options.model: {self.path}: latent UNet2DModel checkpoints are not supported")
            self.kind = PIXEL
            self.denoiser = self._load_component(components, "unet")
            config = self.denoiser.config
            if config.class_embed_type is not None:
                raise RuntimeError(f"options.model: {self.path}: class_embed_type {config.class_embed_type!r} "
                                   "is not supported (only num_class_embeds)")
            if config.num_class_embeds:
                self._read_classes(int(config.num_class_embeds))
        else:
            found = ", ".join(f"{k}: {v[1]}" for k, v in components.items())
            raise RuntimeError(f"options.model: {self.path}: unsupported pipeline layout ({found})")

        scheduler_config = json.loads((self.path / "scheduler" / "scheduler_config.json").read_text())
        if self.kind == TEXT:  # StableDiffusionPipeline's fixes of outdated checkpoints' scheduler configs
            if scheduler_config.get("steps_offset", 1) != 1:
                scheduler_config["steps_offset"] = 1
            if scheduler_config.get("clip_sample", False) is True:
                scheduler_config["clip_sample"] = False
        import diffusers

        name = SCHEDULERS[options.scheduler] if options.scheduler else scheduler_config["_class_name"]
        self.scheduler_template = getattr(diffusers, name).from_config(scheduler_config)
        self.num_train_timesteps = int(self.scheduler_template.config.num_train_timesteps)
        step_parameters = inspect.signature(self.scheduler_template.step).parameters
        self.step_takes_generator = "generator" in step_parameters  # not PNDM's, for one

        self.latent_channels = int(self.denoiser.config.in_channels)
        self.vae_scale_factor = 2 ** (len(self.vae.config.block_out_channels) - 1) if self.vae is not None else 1
        self.guidance_default = (options.guidance_scale if options.guidance_scale is not None
                                 else DEFAULT_GUIDANCE[self.kind])
        self.empty_embeds = self._encode_text("") if self.kind == TEXT else None

    def _load_component(self, components: dict[str, list[str]], name: str) -> Any:
        if name not in components:
            raise RuntimeError(f"options.model: {self.path} has no {name}")
        library, class_name = components[name]
        cls = getattr(importlib.import_module(library), class_name)
        folder = str(self.path / name)
        if name == "tokenizer":
            return cls.from_pretrained(folder)
        if library == "transformers":
            model = cls.from_pretrained(folder, dtype=self.dtype)
        else:
            model = cls.from_pretrained(folder, torch_dtype=self.dtype)
        return model.to(self.device).eval().requires_grad_(False)

    def _read_classes(self, num_class_embeds: int) -> None:
        """A class-conditional pixel UNet: the classes and the null class from ``omnipipe.json`` when present."""
        meta_path = self.path / "omnipipe.json"
        meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
        null = meta.get("null_class")
        if null is not None and not 0 <= int(null) < num_class_embeds:
            raise RuntimeError(f"{meta_path}: null_class {null} is outside the model's {num_class_embeds} classes")
        self.null_class = None if null is None else int(null)
        names = list(meta.get("classes") or [])
        self.num_classes = len(names) if names else num_class_embeds - (1 if self.null_class is not None else 0)
        self.labels = {str(label): i for i, label in enumerate(names)}
        self.class_names = [str(label) for label in names]

    @property
    def can_guide(self) -> bool:
        return self.kind == TEXT or self.null_class is not None

    @property
    def native_size(self) -> tuple[int, int]:
        """(height, width) in pixels the model draws by default."""
        size = self.denoiser.config.sample_size
        height, width = (size, size) if isinstance(size, int) else tuple(size)
        return height * self.vae_scale_factor, width * self.vae_scale_factor

    # ------------------------------------------------------------------ requests
    def _params(self, params: dict[str, Any]) -> DiffusionParams:
        return options_from_dict(DiffusionParams, params.get("extra") or {}, "sampling_params.extra")

    def validate(self, params: dict[str, Any]) -> str | None:
        """The request's knobs against this model; a FieldError names the caller's field (a 400)."""
        extra = self._params(params)
        steps = extra.steps or self.options.steps

        def refuse(name: str, rule: str) -> FieldError:
            return FieldError(f"sampling_params.extra.{name}", rule)

        if steps > self.num_train_timesteps:
            raise refuse("steps", f"the model was trained with {self.num_train_timesteps} steps; got {steps}")
        if extra.guidance_scale is not None and extra.guidance_scale > 1 and not self.can_guide:
            raise refuse("guidance_scale", "this model has no null condition for classifier-free guidance; use 1 or "
                         f"less, got {extra.guidance_scale}")
        height, width = self.native_size
        if self.kind != TEXT:  # drawn at its own size; a whole multiple of it is enlarged with crisp pixels
            for name, value, native in (("width", extra.width, width), ("height", extra.height, height)):
                if value is not None and value % native:
                    raise refuse(name, f"this model draws {width}x{height} images; ask for that size or a whole "
                                 f"multiple of it (e.g. {width * 32}x{height * 32}), got {value}")
            return None
        for name, value in (("width", extra.width), ("height", extra.height)):
            if value is not None and value % self.vae_scale_factor:
                raise refuse(name, f"must be a multiple of {self.vae_scale_factor}, got {value}")
        return None

    def _start(self, request: StageRequest) -> _Denoising | RunnerOutput:
        items = request.take_all_inputs()
        inputs = items[-1] if items else {}
        extra = self._params(request.params)
        scale = extra.guidance_scale if extra.guidance_scale is not None else self.guidance_default
        guide = scale > 1 and self.can_guide
        try:
            cond, uncond = self._conditioning(inputs, guide)
        except FieldError as exc:
            return RunnerOutput.failed(request.request_id, f"{exc.field}: {exc.rule}", error_field=exc.field)

        steps = extra.steps or self.options.steps
        scheduler = copy.deepcopy(self.scheduler_template)
        scheduler.set_timesteps(steps, device=self.device)
        generator = torch.Generator("cpu")
        seed = request.params.get("seed")
        if seed is None:
            generator.seed()
        else:
            generator.manual_seed(int(seed))
        native_h, native_w = self.native_size
        height, width = extra.height or native_h, extra.width or native_w
        shown = (width, height)
        if self.kind != TEXT:  # drawn at its own size, enlarged to the asked one
            height, width = native_h, native_w
        shape = (1, self.latent_channels, height // self.vae_scale_factor, width // self.vae_scale_factor)
        from diffusers.utils.torch_utils import randn_tensor

        latents = randn_tensor(shape, generator=generator, device=self.device, dtype=self.denoiser.dtype)
        latents = latents * scheduler.init_noise_sigma
        # the model runs once per timestep, which some schedulers repeat (PNDM: steps + 1; Heun: 2 * steps - 1)
        return _Denoising(scheduler, generator, latents, cond, uncond if guide else None, float(scale),
                          len(scheduler.timesteps), extra.preview_every, extra.progress, shown)

    def _conditioning(self, inputs: dict[str, Any], guide: bool) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """What the model is conditioned on, and the null conditioning when it is guided; a FieldError names an
        input this model cannot take."""
        prompt = inputs.get("prompt")
        negative = inputs.get("negative_prompt")
        label = inputs.get("class_label")
        if prompt is not None and not isinstance(prompt, str):
            raise FieldError("prompt", f"must be a string, got {type(prompt).__name__}")
        if negative is not None and not isinstance(negative, str):
            raise FieldError("negative_prompt", f"must be a string, got {type(negative).__name__}")
        if self.kind == TEXT:
            if label is not None:
                raise FieldError("class_label", "this model is conditioned on text; send a prompt")
            cond = self._encode_text(prompt or "")
            uncond = (self.empty_embeds if not negative else self._encode_text(negative)) if guide else None
            return cond, uncond
        if self.num_classes:
            return self._class_conditioning(prompt, negative, label, guide)
        for field, value in (("prompt", prompt), ("negative_prompt", negative), ("class_label", label)):
            if value not in (None, ""):
                raise FieldError(field, "this model is unconditional; it takes no input")
        return None, None

    def _class_conditioning(self, prompt: str | None, negative: str | None, label: Any,
                            guide: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A class-conditioned model's class (a ``class_label``, or a prompt naming one) and its null class."""
        if negative:
            raise FieldError("negative_prompt", "this model is conditioned on a class; it takes no negative prompt")
        if label is not None and prompt:
            raise FieldError("prompt", "give a class_label or a prompt naming a class, not both")
        if prompt:
            label = class_named(prompt, self.labels, self.class_names)
        if label is None:
            raise FieldError("class_label", "required: this model draws a class (send class_label or a prompt)")
        if isinstance(label, bool) or not isinstance(label, numbers.Integral) \
                or not 0 <= int(label) < self.num_classes or int(label) == self.null_class:
            raise FieldError("class_label", f"must be an integer in [0, {self.num_classes}), got {label!r}")
        cond = torch.tensor([int(label)], device=self.device)
        uncond = torch.tensor([self.null_class], device=self.device) if guide else None
        return cond, uncond

    def _encode_text(self, text: str) -> torch.Tensor:
        """(1, L, D) CLIP embeddings of ``text``, as StableDiffusionPipeline.encode_prompt computes them."""
        assert self.tokenizer is not None and self.text_encoder is not None
        tokens = self.tokenizer([text], padding="max_length", max_length=self.tokenizer.model_max_length,
                                truncation=True, return_tensors="pt")
        mask = None
        if getattr(self.text_encoder.config, "use_attention_mask", False):
            mask = tokens.attention_mask.to(self.device)
        with torch.inference_mode():
            embeds = self.text_encoder(tokens.input_ids.to(self.device), attention_mask=mask)[0]
        return embeds.to(dtype=self.denoiser.dtype, device=self.device)

    # ------------------------------------------------------------------ stepping
    def _forward(self, latents: torch.Tensor, timesteps: torch.Tensor, cond: torch.Tensor | None) -> torch.Tensor:
        if self.kind == TEXT:
            return self.denoiser(latents, timesteps, encoder_hidden_states=cond).sample
        if self.kind == DIT:
            return self.denoiser(latents, timestep=timesteps, class_labels=cond).sample
        return self.denoiser(latents, timesteps, class_labels=cond).sample

    def _guided(self, state: _Denoising, out: torch.Tensor, null: torch.Tensor | None) -> torch.Tensor:
        """The model output the scheduler steps on: classifier-free guidance applied (DiT: to the noise channels,
        its learned-sigma channels dropped, as DiTPipeline does)."""
        if self.kind == DIT:
            channels = self.latent_channels
            eps, rest = out[:, :channels], out[:, channels:]
            if null is not None:
                uncond = null[:, :channels]
                eps = uncond + state.guidance_scale * (eps - uncond)
            if self.denoiser.config.out_channels // 2 == channels:
                return eps
            return torch.cat([eps, rest], dim=1)
        if null is None:
            return out
        return null + state.guidance_scale * (out - null)

    def _step_group(self, states: list[_Denoising]) -> list[Any]:
        """One model forward for ``states`` (same latent shape), then each request's scheduler step."""
        inputs, timesteps = [], []
        for state in states:
            t = state.scheduler.timesteps[state.step]
            inputs.append(state.scheduler.scale_model_input(state.latents, t))
            timesteps.append(t.reshape(()))
        guided = [i for i, state in enumerate(states) if state.uncond is not None]
        latents = torch.cat(inputs + [inputs[i] for i in guided])
        t_all = torch.stack(timesteps + [timesteps[i] for i in guided]).to(self.device)
        cond = None
        if states[0].cond is not None:
            # a conditioned model: every request has its cond, and a guided one (``guided``) its uncond
            cond = torch.cat(cast("list[torch.Tensor]", [s.cond for s in states] + [states[i].uncond for i in guided]))
        out = self._forward(latents, t_all, cond)
        nulls: dict[int, torch.Tensor] = {i: out[len(states) + k: len(states) + k + 1] for k, i in enumerate(guided)}
        results = []
        for i, state in enumerate(states):
            model_output = self._guided(state, out[i: i + 1], nulls.get(i))
            t = state.scheduler.timesteps[state.step]
            kwargs = {"generator": state.generator} if self.step_takes_generator else {}
            result = state.scheduler.step(model_output, t, state.latents, **kwargs)
            state.latents = result.prev_sample
            state.step += 1
            results.append(result)
        return results

    def _decode(self, latents: torch.Tensor) -> np.ndarray:
        """(B, C, h, w) latents (or pixels) -> (B, H, W, C) float32 in [0, 1]."""
        images = latents
        if self.vae is not None:
            config = self.vae.config
            latents = latents / config.scaling_factor
            if getattr(config, "shift_factor", None) is not None:
                latents = latents + config.shift_factor
            images = self.vae.decode(latents.to(self.vae.dtype)).sample
        images = (images / 2 + 0.5).clamp(0, 1)
        return images.permute(0, 2, 3, 1).float().cpu().numpy()

    @torch.inference_mode()
    def execute(self, batch: list[StageRequest]) -> list[RunnerOutput]:
        outputs: dict[int, RunnerOutput] = {}
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, request in enumerate(batch):
            if request.runner_state is None:
                started = self._start(request)
                if isinstance(started, RunnerOutput):
                    outputs[i] = started
                    continue
                request.runner_state = started
            groups.setdefault(tuple(request.runner_state.latents.shape), []).append(i)
        to_decode: dict[tuple[int, ...], list[tuple[int, torch.Tensor]]] = {}
        for members in groups.values():
            states = [batch[i].runner_state for i in members]
            for i, state, result in zip(members, states, self._step_group(states), strict=True):
                if state.step == state.steps:
                    to_decode.setdefault(tuple(state.latents.shape), []).append((i, state.latents))
                    continue
                progress = {"step": state.step, "steps": state.steps}
                if state.preview_every and state.step % state.preview_every == 0:
                    preview = getattr(result, "pred_original_sample", None)
                    preview = state.latents if preview is None else preview
                    to_decode.setdefault(tuple(preview.shape), []).append((i, preview))
                    outputs[i] = RunnerOutput(batch[i].request_id, progress=progress, num_units=1)
                else:
                    outputs[i] = RunnerOutput(batch[i].request_id, progress=progress if state.progress else None,
                                              num_units=1)
        for items in to_decode.values():
            images = _to_uint8(self._decode(torch.cat([latents for _, latents in items])))
            for (i, _), image in zip(items, images, strict=True):
                image = enlarge(image, *batch[i].runner_state.size)
                if i in outputs:  # a preview
                    outputs[i].image = image
                else:
                    outputs[i] = RunnerOutput(batch[i].request_id, image=image, status=RequestStatus.FINISHED,
                                              num_units=1)
        return [outputs[i] for i in range(len(batch))]

    # ------------------------------------------------------------------ the rest
    @torch.inference_mode()
    def warmup(self) -> None:
        height, width = self.native_size
        shape = (1, self.latent_channels, height // self.vae_scale_factor, width // self.vae_scale_factor)
        latents = torch.zeros(shape, device=self.device, dtype=self.denoiser.dtype)
        t = torch.tensor([self.num_train_timesteps - 1], device=self.device)
        cond = None
        if self.kind == TEXT:
            cond = self.empty_embeds
        elif self.num_classes:
            cond = torch.zeros(1, dtype=torch.long, device=self.device)
        self._forward(latents, t, cond)
        self._decode(latents)

    def snapshot(self, request: StageRequest) -> Any:
        state: _Denoising | None = request.runner_state
        if state is None:  # not started: restore frees whatever a failed step built
            return None
        return state.latents.clone(), _scheduler_state(state.scheduler), state.generator.get_state(), state.step

    def restore(self, request: StageRequest, snapshot: Any) -> None:
        if snapshot is None:
            self.free(request)
            return
        state: _Denoising = request.runner_state
        state.latents, scheduler_state, rng, state.step = snapshot
        vars(state.scheduler).clear()
        vars(state.scheduler).update(_scheduler_state(scheduler_state))
        state.generator.set_state(rng)


def _scheduler_state(scheduler_or_state: Any) -> dict[str, Any]:
    """A copy of a diffusers scheduler's attributes that a step cannot change: a step rebinds its attributes
    (step index, last sample, tensors) and edits its lists in place (DPM-Solver's, UniPC's and LMS's history of
    model outputs), never a tensor in place; so a shallow copy with the lists copied restores it, at a fiftieth of
    ``copy.deepcopy``'s cost (which the stage would pay for every request of every batched step)."""
    attributes = scheduler_or_state if isinstance(scheduler_or_state, dict) else vars(scheduler_or_state)
    return {k: list(v) if isinstance(v, list) else v for k, v in attributes.items()}

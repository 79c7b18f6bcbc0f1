"""The diffusers runner on tiny random checkpoints (CPU, offline): its images against the diffusers pipelines' own
for the same seed and scheduler, step-level batching that changes no request's result, previews and progress,
and the errors a bad deploy option or input gets."""

from __future__ import annotations

import json
import sys
import types
from collections import deque
from pathlib import Path

import diffusers
import numpy as np
import pytest
import torch

from omnipipe.models.image.runners.diffusion import DiffusersRunner
from omnipipe.stage.request import StageRequest
from omnipipe.stage.runner import RunnerContext, RunnerOutput
from omnipipe.stage.schedulers.diffusion import DiffusionScheduler
from omnipipe.util.field_error import FieldError

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning:diffusers"),  # its own numpy 2 calls
              pytest.mark.filterwarnings("ignore::FutureWarning:diffusers")]
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _one_thread():
    """One torch thread for each test here, whatever an earlier module set: with two, a batched step's reductions
    split differently from a lone request's, and batched vs alone drifts past TOL."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


TOL = 1e-4  # floats, against the diffusers pipelines (and batched against alone: batched_tol)


def batched_tol(latents: torch.Tensor) -> float:
    """The bound on batched vs alone final latents. A batch of another shape runs other kernel blocks, which round
    differently at every step; float32 holds a latent of magnitude M only to ``ulp(M)``. ddim's latents stay near 1
    (measured up to 2.8e-5 apart across MKL's AVX512 and AVX2 kernels: TOL holds them with a margin of 3.5), but
    dpm-solver's reach |x| ~ 200 on these random models, where one ulp is 1.5e-5: there they were up to 5 ulp of
    the largest latent apart here (7.6e-5) and 1.07e-4 on another CPU. So TOL plus 32 ulp of the largest latent."""
    largest = np.float32(latents.abs().max().item())
    return TOL + 32 * float(np.spacing(largest))


# ---------------------------------------------------------------------------------------------- tiny checkpoints
def _tiny_unet(in_channels: int = 3, num_class_embeds: int | None = None):
    torch.manual_seed(0)
    return diffusers.UNet2DModel(
        sample_size=8, in_channels=in_channels, out_channels=in_channels, layers_per_block=1,
        block_out_channels=(8, 16), norm_num_groups=4, num_class_embeds=num_class_embeds,
        down_block_types=("DownBlock2D", "AttnDownBlock2D"), up_block_types=("AttnUpBlock2D", "UpBlock2D"))


def _tiny_vae():
    torch.manual_seed(0)
    return diffusers.AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(8, 16), norm_num_groups=4,
        layers_per_block=1, down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2)


@pytest.fixture(scope="module")
def unet_dir(tmp_path_factory) -> Path:
    """An unconditional pixel UNet2DModel (3 x 8 x 8) with a DDPM scheduler: the DDPMPipeline layout."""
    path = tmp_path_factory.mktemp("unet")
    scheduler = diffusers.DDPMScheduler(num_train_timesteps=1000)
    diffusers.DDPMPipeline(unet=_tiny_unet(), scheduler=scheduler).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def digits_like_dir(tmp_path_factory) -> Path:
    """A class-conditional pixel UNet like the project's digits model: 1 x 8 x 8, 11 class embeddings of which the
    last is the null class, named in omnipipe.json."""
    path = tmp_path_factory.mktemp("digits")
    scheduler = diffusers.DDPMScheduler(num_train_timesteps=1000)
    diffusers.DDPMPipeline(unet=_tiny_unet(1, 11), scheduler=scheduler).save_pretrained(path)
    (path / "omnipipe.json").write_text(json.dumps({"classes": [str(d) for d in range(10)], "null_class": 10}))
    return path


@pytest.fixture(scope="module")
def dit_dir(tmp_path_factory) -> Path:
    """A tiny DiT (4 x 4 latents, learned sigma) with a tiny VAE (8 x 8 images) and two named classes."""
    path = tmp_path_factory.mktemp("dit")
    torch.manual_seed(0)
    transformer = diffusers.DiTTransformer2DModel(
        sample_size=4, patch_size=2, in_channels=4, out_channels=8, num_layers=1, num_attention_heads=2,
        attention_head_dim=4, num_embeds_ada_norm=1000, norm_type="ada_norm_zero", norm_elementwise_affine=False,
        activation_fn="gelu-approximate")
    with torch.no_grad():  # the zero-initialised modulation would make a trivial model
        for p in transformer.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    scheduler = diffusers.DDIMScheduler(num_train_timesteps=1000)
    diffusers.DiTPipeline(transformer=transformer, vae=_tiny_vae(), scheduler=scheduler).save_pretrained(path)
    index = json.loads((path / "model_index.json").read_text())
    index["id2label"] = {"0": "tench, Tinca tinca", "1": "goldfish", "7": "cock"}
    (path / "model_index.json").write_text(json.dumps(index))
    return path


VOCAB_LETTERS = "abcdefghijklmnopqrstuvwxyz"


@pytest.fixture(scope="module")
def sd_dir(tmp_path_factory) -> Path:
    """A tiny Stable Diffusion: UNet2DConditionModel, VAE, one-layer CLIP text encoder, a letters-only tokenizer."""
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    path = tmp_path_factory.mktemp("sd")
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for letter in VOCAB_LETTERS:
        vocab[letter] = len(vocab)
        vocab[letter + "</w>"] = len(vocab)
    merges = [("c", "a"), ("ca", "t</w>"), ("d", "o"), ("do", "g</w>")]
    for merged in ("ca", "cat</w>", "do", "dog</w>"):
        vocab[merged] = len(vocab)
    tokenizer = CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=12)
    torch.manual_seed(0)
    text_encoder = CLIPTextModel(CLIPTextConfig(
        bos_token_id=0, eos_token_id=1, pad_token_id=1, hidden_size=8, intermediate_size=16, num_attention_heads=2,
        num_hidden_layers=1, vocab_size=len(vocab), max_position_embeddings=12, projection_dim=8))
    torch.manual_seed(0)
    unet = diffusers.UNet2DConditionModel(
        sample_size=4, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(8, 16),
        norm_num_groups=4, cross_attention_dim=8, attention_head_dim=2,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"))
    scheduler = diffusers.PNDMScheduler(num_train_timesteps=1000, skip_prk_steps=True)
    pipe = diffusers.StableDiffusionPipeline(
        vae=_tiny_vae(), text_encoder=text_encoder, tokenizer=tokenizer, unet=unet, scheduler=scheduler,
        safety_checker=None, feature_extractor=None, requires_safety_checker=False)
    pipe.save_pretrained(path)
    return path


# ---------------------------------------------------------------------------------------------- driving the runner
def make_runner(model: Path | str, **options) -> DiffusersRunner:
    runner = DiffusersRunner(RunnerContext(stage="diffusion", device="cpu", threads=1, max_num_seqs=8,
                                           options={"model": str(model), **options}))
    runner.load()
    return runner


def make_request(rid: str, seed: int | None = 0, inputs: dict | None = None, **extra) -> StageRequest:
    return StageRequest(rid, {"seed": seed, "extra": extra}, emit_final=True, emit_data=False, chunk_targets=[],
                        inputs=deque([inputs or {}]), input_finished=True)


def drive(runner: DiffusersRunner, arrivals: dict[int, list[StageRequest]], max_num_seqs: int = 8):
    """Run the stage loop's part: requests in ``arrivals[k]`` arrive before call k. Return each request's outputs
    and its final latents (taken just before the runner frees it)."""
    scheduler = DiffusionScheduler(max_num_seqs)
    outputs: dict[str, list[RunnerOutput]] = {}
    latents: dict[str, torch.Tensor] = {}
    k = 0
    while True:
        for request in arrivals.get(k, []):
            assert runner.validate(request.params) is None
            scheduler.add(request)
        if not scheduler.has_work():
            if any(a > k for a in arrivals):
                k += 1
                continue
            return outputs, latents
        batch, is_prefill = scheduler.schedule()
        for request, output in zip(batch, runner.execute(batch), strict=True):
            outputs.setdefault(request.request_id, []).append(output)
            if output.error is not None:
                scheduler.remove(request.request_id)
                runner.free(request)
            elif scheduler.postprocess(request, output):
                latents[request.request_id] = request.runner_state.latents.clone()
                runner.free(request)
                assert request.runner_state is None
        k += 1


def run_one(runner: DiffusersRunner, request: StageRequest):
    outputs, latents = drive(runner, {0: [request]})
    return outputs[request.request_id], latents[request.request_id]


def pixels(latents: torch.Tensor) -> np.ndarray:
    """A pixel model's final latents as the pipelines' output_type="np" image."""
    return (latents / 2 + 0.5).clamp(0, 1).permute(0, 2, 3, 1).numpy()


def assert_uint8_matches(image: np.ndarray, reference: np.ndarray) -> None:
    """``image`` (uint8 H x W x C) is ``reference`` (floats in [0, 1], H x W x C) within one level."""
    assert image.dtype == np.uint8 and image.shape == reference.shape
    assert np.abs(image.astype(int) - np.round(reference * 255).astype(int)).max() <= 1


# ---------------------------------------------------------------------------------------------- against diffusers
@pytest.mark.parametrize("scheduler, pipeline", [("ddpm", "DDPMPipeline"), ("ddim", "DDIMPipeline")])
def test_pixel_unet_matches_the_diffusers_pipeline(unet_dir, scheduler, pipeline) -> None:
    runner = make_runner(unet_dir, scheduler=scheduler)
    outputs, latents = run_one(runner, make_request("a", seed=7, steps=6))
    pipe = getattr(diffusers, pipeline).from_pretrained(unet_dir)
    if scheduler == "ddim":
        pipe.scheduler = diffusers.DDIMScheduler.from_config(pipe.scheduler.config)
    reference = pipe(generator=torch.Generator("cpu").manual_seed(7), num_inference_steps=6, output_type="np").images
    diff = np.abs(pixels(latents) - reference).max()
    print(f"{pipeline}: max abs diff {diff:.3g}")
    assert diff < TOL
    assert [o.finished for o in outputs] == [False] * 5 + [True]
    assert all(o.num_units == 1 for o in outputs)
    assert_uint8_matches(outputs[-1].image, reference[0])


@pytest.mark.parametrize("scheduler", ["ddim", "dpm-solver"])
def test_dit_matches_the_diffusers_pipeline(dit_dir, scheduler) -> None:
    runner = make_runner(dit_dir, scheduler=scheduler)
    outputs, latents = run_one(runner, make_request("a", seed=3, inputs={"class_label": 7}, steps=5))
    pipe = diffusers.DiTPipeline.from_pretrained(dit_dir)
    pipe.scheduler = runner.scheduler_template.__class__.from_config(pipe.scheduler.config)
    reference = pipe(class_labels=[7], guidance_scale=4.0, generator=torch.Generator("cpu").manual_seed(3),
                     num_inference_steps=5, output_type="np").images
    image = runner._decode(latents)
    diff = np.abs(image - reference).max()
    print(f"DiTPipeline ({scheduler}): max abs diff {diff:.3g}")
    assert diff < TOL
    assert outputs[-1].image.shape == (8, 8, 3)
    assert_uint8_matches(outputs[-1].image, reference[0])
    # the prompt names the class through id2label, as DiTPipeline.get_label_ids does
    _, named = run_one(runner, make_request("b", seed=3, inputs={"prompt": "cock"}, steps=5))
    assert torch.equal(named, latents)
    assert pipe.get_label_ids(["Tinca tinca"]) == [0]
    _, tinca = run_one(runner, make_request("c", seed=3, inputs={"prompt": "Tinca tinca"}, steps=5))
    _, zero = run_one(runner, make_request("d", seed=3, inputs={"class_label": 0}, steps=5))
    assert torch.equal(tinca, zero)


def test_dit_without_guidance_matches_the_pipeline(dit_dir) -> None:
    runner = make_runner(dit_dir, scheduler="ddim", guidance_scale=1.0)
    _, latents = run_one(runner, make_request("a", seed=5, inputs={"class_label": 1}, steps=4))
    pipe = diffusers.DiTPipeline.from_pretrained(dit_dir)
    reference = pipe(class_labels=[1], guidance_scale=1.0, generator=torch.Generator("cpu").manual_seed(5),
                     num_inference_steps=4, output_type="np").images
    assert np.abs(runner._decode(latents) - reference).max() < TOL


@pytest.mark.parametrize("scheduler", ["ddim", "euler", None])  # None: the checkpoint's own (PNDM)
def test_stable_diffusion_matches_the_diffusers_pipeline(sd_dir, scheduler) -> None:
    runner = make_runner(sd_dir, scheduler=scheduler)
    pipe = diffusers.StableDiffusionPipeline.from_pretrained(sd_dir, safety_checker=None)
    pipe.scheduler = runner.scheduler_template.__class__.from_config(pipe.scheduler.config)
    pipe.set_progress_bar_config(disable=True)
    for inputs in ({"prompt": "a cat"}, {"prompt": "a dog", "negative_prompt": "cat"}):
        _, latents = run_one(runner, make_request("a", seed=11, inputs=inputs, steps=4))
        reference = pipe(**inputs, height=8, width=8, guidance_scale=7.5, num_inference_steps=4,
                         generator=torch.Generator("cpu").manual_seed(11), output_type="np").images
        diff = np.abs(runner._decode(latents) - reference).max()
        print(f"StableDiffusionPipeline ({scheduler}, {inputs}): max abs diff {diff:.3g}")
        assert diff < TOL
    # another size: 16 x 8 pixels (8 x 4 latents)
    request = make_request("b", seed=2, inputs={"prompt": "cat"}, steps=3, width=16, height=8)
    outputs, latents = run_one(runner, request)
    reference = pipe(prompt="cat", height=8, width=16, num_inference_steps=3,
                     generator=torch.Generator("cpu").manual_seed(2), output_type="np").images
    assert outputs[-1].image.shape == (8, 16, 3)
    assert np.abs(runner._decode(latents) - reference).max() < TOL


# ---------------------------------------------------------------------------------------------- step-level batching
def _mixed_requests(inputs_for) -> tuple[dict[int, list[StageRequest]], dict[str, StageRequest]]:
    arrivals: dict[int, list[StageRequest]] = {}
    alone: dict[str, StageRequest] = {}
    for i in range(8):
        steps, seed, at = 3 + (i * 5) % 7, 100 + i, (i * 3) % 10
        rid = f"r{i}"
        extra = {"steps": steps, "guidance_scale": 1.0 if i % 3 == 0 else 2.5}
        arrivals.setdefault(at, []).append(make_request(rid, seed, inputs_for(i), **extra))
        alone[rid] = make_request(rid, seed, inputs_for(i), **extra)
    return arrivals, alone


@pytest.mark.parametrize("scheduler", ["ddim", "dpm-solver"])
@pytest.mark.parametrize("model", ["unet", "digits", "dit"])
def test_a_request_gets_the_same_image_whoever_shares_its_batch(request, model, scheduler) -> None:
    path = request.getfixturevalue({"unet": "unet_dir", "digits": "digits_like_dir", "dit": "dit_dir"}[model])
    runner = make_runner(path, scheduler=scheduler)
    inputs_for = (lambda i: {}) if model == "unet" else (lambda i: {"class_label": i % 10})
    if model == "unet":  # no guidance for an unconditional model
        runner.guidance_default = 1.0
        arrivals, alone = _mixed_requests(inputs_for)
        for reqs in [*arrivals.values(), [*alone.values()]]:
            for r in reqs:
                r.params["extra"].pop("guidance_scale")
    else:
        arrivals, alone = _mixed_requests(inputs_for)
    outputs, batched = drive(runner, arrivals, max_num_seqs=6)
    sizes = []
    for rid, single in alone.items():
        single_outputs, single_latents = run_one(runner, single)
        diff = (batched[rid] - single_latents).abs().max().item()
        sizes.append(diff)
        assert diff < batched_tol(single_latents), (rid, diff, batched_tol(single_latents))
        assert np.abs(outputs[rid][-1].image.astype(int) - single_outputs[-1].image.astype(int)).max() <= 1
        assert len(outputs[rid]) == single.params["extra"]["steps"]
    print(f"{model}/{scheduler}: batched vs alone max abs diff {max(sizes):.3g}")


def test_a_failed_batched_step_is_retried_from_its_snapshot(digits_like_dir) -> None:
    runner = make_runner(digits_like_dir, scheduler="dpm-solver")
    a, b = (make_request(r, 1, {"class_label": 3}, steps=4, guidance_scale=2.0) for r in "ab")
    runner.execute([a, b])
    snapshots = [runner.snapshot(r) for r in (a, b)]
    runner.execute([a, b])  # the step that "failed"
    for r, snap in zip((a, b), snapshots, strict=True):
        runner.restore(r, snap)
        assert r.runner_state.step == 1
    outputs, latents = drive(runner, {0: [a]})
    _, reference = run_one(runner, make_request("ref", 1, {"class_label": 3}, steps=4, guidance_scale=2.0))
    assert (latents["a"] - reference).abs().max().item() < batched_tol(reference)  # it ran batched with b
    # a request not started yet snapshots to None, and restoring it frees what the step built
    c = make_request("c", 1, {"class_label": 3})
    assert runner.snapshot(c) is None
    runner.execute([c])
    runner.restore(c, None)
    assert c.runner_state is None


def test_seeds_and_classes_matter_and_no_seed_draws_a_random_one(digits_like_dir) -> None:
    runner = make_runner(digits_like_dir, scheduler="ddim", steps=3)
    _, a = run_one(runner, make_request("a", 1, {"class_label": 3}))
    _, b = run_one(runner, make_request("b", 2, {"class_label": 3}))
    _, c = run_one(runner, make_request("c", 1, {"prompt": "4"}))
    _, d = run_one(runner, make_request("d", None, {"class_label": 3}))
    _, e = run_one(runner, make_request("e", None, {"class_label": 3}))
    assert not torch.equal(a, b) and not torch.equal(a, c) and not torch.equal(d, e)
    outputs, _ = run_one(runner, make_request("f", 1, {"class_label": 3}))
    assert outputs[-1].image.shape == (8, 8, 1) and outputs[-1].image.dtype == np.uint8


# ---------------------------------------------------------------------------------------------- previews, progress
def test_previews_every_k_steps_and_progress(unet_dir, dit_dir) -> None:
    runner = make_runner(unet_dir, scheduler="ddim")
    outputs, _ = run_one(runner, make_request("a", 0, steps=6, preview_every=2))
    images = [o for o in outputs if o.image is not None]
    assert len(images) == 3 and images[-1].finished and images[-1].progress is None
    assert [o.progress for o in images[:2]] == [{"step": 2, "steps": 6}, {"step": 4, "steps": 6}]
    assert [o.progress for o in outputs if o.image is None] == [None] * 3
    assert all(o.image.shape == (8, 8, 3) and o.image.dtype == np.uint8 for o in images)

    outputs, _ = run_one(runner, make_request("b", 0, steps=4, progress=True))
    assert [o.progress for o in outputs[:3]] == [{"step": i, "steps": 4} for i in (1, 2, 3)]
    assert [o.image is None for o in outputs] == [True, True, True, False]

    # a latent model's preview is decoded by the VAE; DPM-Solver returns no x0 estimate: the latents are shown
    runner = make_runner(dit_dir, scheduler="dpm-solver")
    outputs, _ = run_one(runner, make_request("c", 0, {"class_label": 1}, steps=3, preview_every=1))
    assert [o.image.shape for o in outputs] == [(8, 8, 3)] * 3
    assert [o.progress for o in outputs] == [{"step": 1, "steps": 3}, {"step": 2, "steps": 3}, None]


# ---------------------------------------------------------------------------------------------- errors
def test_unknown_or_bad_deploy_options_are_refused(unet_dir, tmp_path) -> None:
    with pytest.raises(FieldError, match="options.sampler: unknown option"):
        make_runner(unet_dir, sampler="ddim")
    with pytest.raises(FieldError, match="options.scheduler"):
        make_runner(unet_dir, scheduler="lms")
    with pytest.raises(FieldError, match="options.dtype"):
        make_runner(unet_dir, dtype="bfloat16")
    with pytest.raises(RuntimeError, match="model_index.json"):
        make_runner(tmp_path)
    make_runner(unet_dir, batching="request", warmup=False).warmup()  # the stage loop's options pass


def test_the_digits_name_resolves_through_the_weights_module(monkeypatch, digits_like_dir, tmp_path) -> None:
    module = types.ModuleType("omnipipe.models.image.weights.digits")
    module.digits_dir = lambda: tmp_path / "missing"
    monkeypatch.setitem(sys.modules, "omnipipe.models.image.weights.digits", module)
    with pytest.raises(RuntimeError, match="omnipipe download --pipeline image"):
        make_runner("digits")
    module.digits_dir = lambda: digits_like_dir
    runner = make_runner("digits", scheduler="ddim", steps=2, guidance_scale=3.0)
    runner.warmup()
    outputs, _ = run_one(runner, make_request("a", 0, {"class_label": 9}))
    assert outputs[-1].image.shape == (8, 8, 1)


def _error(runner: DiffusersRunner, inputs: dict, **extra) -> RunnerOutput:
    outputs, _ = drive(runner, {0: [make_request("bad", 0, inputs, **extra)]})
    (output,) = outputs["bad"]
    assert output.error is not None
    return output


def test_inputs_a_model_cannot_take_fail_that_request_alone(unet_dir, digits_like_dir, dit_dir, sd_dir) -> None:
    unet = make_runner(unet_dir)
    output = _error(unet, {"prompt": "a cat"})
    assert output.error_field == "prompt" and "unconditional" in output.error
    assert _error(unet, {"class_label": 1}).error_field == "class_label"

    digits = make_runner(digits_like_dir, steps=2)
    for label in (10, -1, 11, 2.5, True, "3"):
        output = _error(digits, {"class_label": label})
        assert output.error_field == "class_label" and "[0, 10)" in output.error
    assert _error(digits, {}).error_field == "class_label"
    output = _error(digits, {"prompt": "a cat"})
    assert output.error_field == "prompt" and "the digits 0-9" in output.error
    assert _error(digits, {"prompt": "a three and a four"}).error_field == "prompt"

    dit = make_runner(dit_dir, steps=2)
    output = _error(dit, {"prompt": "platypus"})
    assert output.error_field == "prompt" and "platypus" in output.error and "goldfish" in output.error
    assert _error(dit, {"class_label": 1000}).error_field == "class_label"
    assert _error(dit, {"class_label": 1, "negative_prompt": "fish"}).error_field == "negative_prompt"

    sd = make_runner(sd_dir, steps=2)
    assert _error(sd, {"class_label": 1}).error_field == "class_label"

    # the rest of the batch goes on
    good, bad = make_request("good", 0, {"class_label": 1}), make_request("bad", 0, {"class_label": 99})
    outputs, latents = drive(digits, {0: [good, bad]})
    assert outputs["bad"][0].error_field == "class_label" and outputs["good"][-1].finished


def test_validate_refuses_params_the_model_cannot_draw(unet_dir, dit_dir, sd_dir) -> None:
    unet, dit, sd = make_runner(unet_dir), make_runner(dit_dir), make_runner(sd_dir)

    def refused(runner: DiffusersRunner, extra: dict) -> FieldError:
        with pytest.raises(FieldError) as caught:
            runner.validate({"extra": extra})
        return caught.value

    assert unet.validate({"extra": {"width": 8, "height": 8}}) is None
    assert unet.validate({"extra": {"width": 32, "height": 16}}) is None  # whole multiples: enlarged
    error = refused(unet, {"width": 12})
    assert error.field == "sampling_params.extra.width" and "8x8" in error.rule
    assert refused(dit, {"height": 13}).field == "sampling_params.extra.height"
    assert refused(unet, {"guidance_scale": 3.0}).field == "sampling_params.extra.guidance_scale"
    assert unet.validate({"extra": {"guidance_scale": 1.0}}) is None
    assert refused(unet, {"steps": 0}).field == "sampling_params.extra.steps"
    assert refused(unet, {"bogus": 1}).field == "sampling_params.extra.bogus"
    assert sd.validate({"extra": {"width": 16, "height": 24}}) is None
    assert "multiple of 2" in refused(sd, {"width": 9}).rule


def test_a_whole_multiple_of_the_model_size_is_enlarged_with_crisp_pixels(unet_dir) -> None:
    runner = make_runner(unet_dir, steps=2)
    small, _ = drive(runner, {0: [make_request("small", 0, {})]})
    big, _ = drive(runner, {0: [make_request("big", 0, {}, width=32, height=16)]})
    image, enlarged = small["small"][-1].image, big["big"][-1].image
    assert enlarged.shape[:2] == (16, 32)
    np.testing.assert_array_equal(enlarged[::2, ::4], image)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_draws_what_cpu_draws_for_the_same_seed(dit_dir) -> None:
    """The generator is a CPU one on every device, so a seed gives one image wherever it runs (float32); in
    bfloat16 the image is the one diffusers' own DiTPipeline draws in bfloat16 on the same device (a random tiny
    DiT amplifies rounding, so bfloat16 is not held to float32's image)."""
    cpu = make_runner(dit_dir, scheduler="dpm-solver")
    _, reference = run_one(cpu, make_request("a", 4, {"class_label": 2}, steps=5))
    for dtype in ("float32", "bfloat16"):
        runner = DiffusersRunner(RunnerContext(stage="diffusion", device="cuda", threads=1, max_num_seqs=8,
                                               options={"model": str(dit_dir), "scheduler": "dpm-solver",
                                                        "dtype": dtype}))
        runner.load()
        runner.warmup()
        outputs, latents = run_one(runner, make_request("a", 4, {"class_label": 2}, steps=5))
        assert outputs[-1].image.shape == (8, 8, 3) and outputs[-1].image.dtype == np.uint8
        if dtype == "float32":
            assert (latents.float().cpu() - reference).abs().max().item() < 1e-3
            continue
        pipe = diffusers.DiTPipeline.from_pretrained(dit_dir, torch_dtype=torch.bfloat16).to("cuda")
        pipe.scheduler = runner.scheduler_template.__class__.from_config(pipe.scheduler.config)
        expected = pipe(class_labels=[2], guidance_scale=4.0, generator=torch.Generator("cpu").manual_seed(4),
                        num_inference_steps=5, output_type="np").images
        diff = np.abs(runner._decode(latents) - expected).max()
        print(f"bfloat16 on cuda against DiTPipeline in bfloat16: max abs diff {diff:.3g}")
        assert diff < 0.05

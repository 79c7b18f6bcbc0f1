"""Tests of the image family's digits model: the judge on real digits, the training cache (retrain only when the
recipe changes, never leave half a directory), the saved diffusers layout, and generated digits of the asked class
with a plain DDIM + classifier-free-guidance sampler."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

pytest.importorskip("sklearn")

from omnipipe.models.image import judge  # noqa: E402
from omnipipe.models.image.weights import digits  # noqa: E402
from omnipipe.models.preparation import ModelPreparationError  # noqa: E402

# The family's recommended sampling defaults: DDIM, 25 steps, guidance 2.0 (trailing timestep spacing, from the
# saved scheduler config). Measured as the share judged to be the asked digit, over 200 samples and five seeds of 50:
# guidance 2.0: 100% and 96-100%; 1.5: 99% and 98-100%; 1.0 (no guidance): 94-96%; 2.5: 94-96%; 3.0: 90%.
# 50 DDIM steps at 2.0: 92-96%; DPM-Solver++ 25 steps: 90%; DDPM 1000 steps: 100% but 150x slower.
SAMPLER_STEPS = 25
GUIDANCE_SCALE = 2.0


def sample_digits(
    model_dir: Path,
    classes: list[int],
    steps: int = SAMPLER_STEPS,
    guidance_scale: float = GUIDANCE_SCALE,
    seed: int = 0,
) -> np.ndarray:
    """Draw one digit per entry of ``classes``: uint8 (N, 8, 8), bright ink on a dark background."""
    import torch
    from diffusers import DDIMScheduler, UNet2DModel

    threads = torch.get_num_threads()
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    try:
        unet = UNet2DModel.from_pretrained(str(model_dir / "unet")).eval()
        scheduler = DDIMScheduler.from_config(DDIMScheduler.load_config(str(model_dir / "scheduler")))
        scheduler.set_timesteps(steps)
        generator = torch.Generator().manual_seed(seed)
        labels = torch.tensor(classes, dtype=torch.long)
        both = torch.cat([labels, torch.full_like(labels, digits.NULL_CLASS)])
        x = torch.randn((len(classes), 1, digits.SAMPLE_SIZE, digits.SAMPLE_SIZE), generator=generator)
        x = x * scheduler.init_noise_sigma
        with torch.no_grad():
            for t in scheduler.timesteps:
                model_in = scheduler.scale_model_input(torch.cat([x, x]), t)
                cond, uncond = unet(model_in, t, class_labels=both).sample.chunk(2)
                x = scheduler.step(uncond + guidance_scale * (cond - uncond), t, x, generator=generator).prev_sample
        return np.rint((x.clamp(-1, 1)[:, 0].numpy() + 1) / 2 * 255).astype(np.uint8)
    finally:
        torch.set_num_threads(threads)


# --- the judge ---------------------------------------------------------------


def test_judge_recognises_held_out_real_digits() -> None:
    _, _, images, labels = judge.split()
    assert images.dtype == np.uint8 and images.shape[1:] == (8, 8) and len(images) == 359
    accuracy = float((judge.recognise(images) == labels).mean())
    assert accuracy >= 0.98, accuracy  # 0.994 measured


def test_judge_accepts_upscaled_and_channel_images() -> None:
    _, _, images, labels = judge.split()
    images, labels = images[:40], labels[:40]
    expected = judge.recognise(images)
    upscaled = np.kron(images, np.ones((32, 32), dtype=np.uint8))  # nearest 8x8 -> 256x256
    assert upscaled.shape == (40, 256, 256)
    np.testing.assert_array_equal(judge.recognise(upscaled), expected)
    np.testing.assert_array_equal(judge.recognise(list(upscaled[..., None])), expected)
    rgb = np.repeat(images[..., None], 3, axis=-1)
    np.testing.assert_array_equal(judge.recognise(rgb), expected)
    assert judge.recognise(images[0]).tolist() == [expected[0]]
    assert judge.recognise([]).shape == (0,)


def test_judge_convention_is_bright_ink() -> None:
    _, _, images, labels = judge.split()
    assert images[:, 0, 0].max() < 64  # sklearn's corners are background: dark
    inverted = 255 - images[:100]
    assert float((judge.recognise(inverted) == labels[:100]).mean()) < 0.5


# --- the cache ---------------------------------------------------------------


def _fake_train(calls: list[Path], version: int | None = None):
    def train(out_dir: Path, progress: bool) -> None:
        calls.append(out_dir)
        out_dir.mkdir(parents=True)
        info = {"training_version": digits.TRAINING_VERSION if version is None else version, "parameters": 123}
        (out_dir / "omnipipe.json").write_text(json.dumps(info))

    return train


def _failing_train(out_dir: Path, progress: bool) -> None:
    out_dir.mkdir(parents=True)
    (out_dir / "unet").mkdir()
    raise RuntimeError("interrupted")


def test_prepare_trains_once_and_retrains_on_a_new_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMNIPIPE_CACHE", str(tmp_path))
    ready, line = digits.digits_status()
    assert not ready and "not trained yet" in line and "omnipipe download --pipeline image" in line

    calls: list[Path] = []
    monkeypatch.setattr(digits, "train_digits", _fake_train(calls))
    assert digits.prepare_digits(progress=False) == tmp_path / "digits-ddpm" == digits.digits_dir()
    assert len(calls) == 1 and calls[0].parent == tmp_path and calls[0].name.startswith("digits-ddpm.staging-")
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix != ".lock") == ["digits-ddpm"]
    ready, line = digits.digits_status()
    assert ready and line.startswith("digits-ddpm: trained") and str(tmp_path / "digits-ddpm") in line

    monkeypatch.setattr(digits, "train_digits", _failing_train)  # the cache is current: no training
    assert digits.prepare_digits(progress=False) == tmp_path / "digits-ddpm"

    monkeypatch.setattr(digits, "TRAINING_VERSION", digits.TRAINING_VERSION + 1)
    ready, line = digits.digits_status()
    assert not ready and "older recipe" in line
    monkeypatch.setattr(digits, "train_digits", _fake_train(calls))
    digits.prepare_digits(progress=False)
    assert len(calls) == 2
    info = json.loads((tmp_path / "digits-ddpm" / "omnipipe.json").read_text())
    assert info["training_version"] == digits.TRAINING_VERSION
    assert digits.digits_status()[0]


def test_failed_training_leaves_no_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMNIPIPE_CACHE", str(tmp_path))
    monkeypatch.setattr(digits, "train_digits", _failing_train)
    with pytest.raises(ModelPreparationError, match="interrupted"):
        digits.prepare_digits(progress=False)
    assert [p.name for p in tmp_path.iterdir() if p.suffix != ".lock"] == []

    # A training that finishes without a current omnipipe.json is not a model either.
    monkeypatch.setattr(digits, "train_digits", _fake_train([], version=digits.TRAINING_VERSION - 1))
    with pytest.raises(ModelPreparationError):
        digits.prepare_digits(progress=False)
    assert [p.name for p in tmp_path.iterdir() if p.suffix != ".lock"] == []
    assert not digits.digits_status()[0]


def test_failed_retraining_keeps_the_old_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMNIPIPE_CACHE", str(tmp_path))
    monkeypatch.setattr(digits, "train_digits", _fake_train([]))
    digits.prepare_digits(progress=False)
    monkeypatch.setattr(digits, "TRAINING_VERSION", digits.TRAINING_VERSION + 1)
    monkeypatch.setattr(digits, "train_digits", _failing_train)
    with pytest.raises(ModelPreparationError):
        digits.prepare_digits(progress=False)
    assert [p.name for p in tmp_path.iterdir() if p.suffix != ".lock"] == ["digits-ddpm"]
    assert (tmp_path / "digits-ddpm" / "omnipipe.json").is_file()


def test_a_few_training_steps_write_a_deterministic_diffusers_directory(tmp_path: Path) -> None:
    """Three real training steps (seconds): the layout diffusers reads, and the same weights twice."""
    pytest.importorskip("diffusers")
    import torch
    from diffusers import DDIMScheduler, DDPMScheduler, UNet2DModel
    from safetensors.torch import load_file

    threads = torch.get_num_threads()
    for name in ("a", "b"):
        digits.train_digits(tmp_path / name, progress=False, steps=3)
    assert torch.get_num_threads() == threads
    out = tmp_path / "a"
    index = json.loads((out / "model_index.json").read_text())
    assert index["_class_name"] == "DDPMPipeline"
    assert index["unet"] == ["diffusers", "UNet2DModel"] and index["scheduler"] == ["diffusers", "DDPMScheduler"]
    info = json.loads((out / "omnipipe.json").read_text())
    assert info["kind"] == "class-conditional" and info["classes"] == [str(k) for k in range(10)]
    assert info["null_class"] == 10 and info["dataset"] == "sklearn digits 8x8"
    assert info["training_version"] == digits.TRAINING_VERSION and info["steps"] == 3 and info["seed"] == 0
    assert info["train_seconds"] > 0
    unet = UNet2DModel.from_pretrained(str(out / "unet"))
    assert unet.config.num_class_embeds == 11 and unet.config.sample_size == 8
    assert 300_000 <= sum(p.numel() for p in unet.parameters()) <= 1_000_000
    assert (out / "unet" / "diffusion_pytorch_model.safetensors").is_file()
    scheduler = DDPMScheduler.from_pretrained(str(out / "scheduler"))
    assert scheduler.config.num_train_timesteps == 1000 and scheduler.config.prediction_type == "epsilon"
    assert DDIMScheduler.from_config(scheduler.config).config.beta_schedule == "squaredcos_cap_v2"
    first = load_file(str(out / "unet" / "diffusion_pytorch_model.safetensors"))
    second = load_file(str(tmp_path / "b" / "unet" / "diffusion_pytorch_model.safetensors"))
    assert first.keys() == second.keys()
    assert all(torch.equal(first[key], second[key]) for key in first)


# --- the trained model (trains once per machine into the cache) --------------


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return digits.prepare_digits(progress=False)


@pytest.mark.models
def test_trained_model_is_cached_and_described(model_dir: Path) -> None:
    ready, line = digits.digits_status()
    assert ready and "M params" in line
    info = json.loads((model_dir / "omnipipe.json").read_text())
    assert info["training_version"] == digits.TRAINING_VERSION and info["steps"] == digits.STEPS
    assert 300_000 <= info["parameters"] <= 1_000_000


@pytest.mark.models
def test_generated_digits_are_the_asked_class(model_dir: Path) -> None:
    classes = [k for k in range(10) for _ in range(5)]
    images = sample_digits(model_dir, classes)
    assert images.shape == (50, 8, 8) and images.dtype == np.uint8
    assert images[:, [0, 0, 7, 7], [0, 7, 0, 7]].mean() < 48  # the corners are background: dark
    recognised = judge.recognise(images)
    accuracy = float((recognised == np.array(classes)).mean())
    assert accuracy >= 0.9, (accuracy, recognised.tolist())

"""Train and cache the image family's digits model: a small class-conditional DDPM.

No text-to-image weights ship in a package omnipipe can depend on, so the family trains its own model on data
that does ship: scikit-learn's 1797 handwritten digits (8x8 pixels, values 0..16). The result is a 0.65M-parameter
diffusers ``UNet2DModel`` (epsilon prediction, ``DDPMScheduler`` with 1000 cosine-schedule timesteps) trained in
about a minute and a half on two CPU cores. It draws 8x8 digits 0-9 and nothing else: class ``k`` is the digit
``k`` and class 10 is the null class for classifier-free guidance (10% of the training labels are dropped to it).

Pixel convention, shared with :mod:`omnipipe.models.image.judge`: the model works in [-1, 1] with -1 the
background and +1 the ink (``x / 16 * 2 - 1`` of the sklearn values); as uint8 images that is ``(x + 1) / 2 * 255``,
bright ink on a dark background.

The trained model lives in ``<cache>/digits-ddpm/`` as a directory diffusers can read (``unet/``, ``scheduler/``,
``model_index.json``) plus ``omnipipe.json`` describing the training. It is retrained only when missing or when
:data:`TRAINING_VERSION` changes.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path

from omnipipe.models.preparation import ModelPreparationError
from omnipipe.util.cache import cache_root, file_lock

__all__ = [
    "DIGITS_DIR_NAME",
    "NULL_CLASS",
    "TRAINING_VERSION",
    "digits_dir",
    "digits_status",
    "prepare_digits",
    "train_digits",
]

logger = logging.getLogger(__name__)

DIGITS_DIR_NAME = "digits-ddpm"
INFO_FILE_NAME = "omnipipe.json"
TRAINING_VERSION = 1  # bump when the architecture, the data or the recipe changes: caches then retrain
NUM_CLASSES = 10
NULL_CLASS = 10
SAMPLE_SIZE = 8
TRAIN_TIMESTEPS = 1000
BETA_SCHEDULE = "squaredcos_cap_v2"

SEED = 0
STEPS = 500
BATCH_SIZE = 64
LEARNING_RATE = 2e-3
WARMUP_STEPS = 50
EMA_DECAY = 0.995
LABEL_DROPOUT = 0.1
_EXPECTED_SECONDS = 90  # on two cores; shown in the status line while untrained


def digits_dir() -> Path:
    """Directory holding the trained digits model (may not exist yet)."""
    return cache_root() / DIGITS_DIR_NAME


def _read_info(directory: Path) -> dict | None:
    try:
        info = json.loads((directory / INFO_FILE_NAME).read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def _is_current(directory: Path) -> bool:
    info = _read_info(directory)
    return info is not None and info.get("training_version") == TRAINING_VERSION


def digits_status() -> tuple[bool, str]:
    """(ready, one line for people): whether the trained model is cached and current."""
    directory = digits_dir()
    info = _read_info(directory)
    shown = _display_path(directory)
    retrain = f"`omnipipe download --pipeline image` trains it (~{_EXPECTED_SECONDS} s)"
    if info is None:
        return False, f"digits-ddpm: not trained yet: {retrain}"
    if info.get("training_version") != TRAINING_VERSION:
        return False, (
            f"digits-ddpm: trained by an older recipe (version {info.get('training_version')}, now {TRAINING_VERSION}),"
            f" {retrain} again"
        )
    params = info.get("parameters")
    size = f", {params / 1e6:.1f}M params" if isinstance(params, int) else ""
    return True, f"digits-ddpm: trained{size} ({shown})"


def _display_path(path: Path) -> str:
    home = str(Path.home())
    text = str(path)
    return "~" + text[len(home):] if home not in ("", "/") and text.startswith(home + os.sep) else text


def prepare_digits(progress: bool = True) -> Path:
    """Make sure the trained digits model is in the cache and return its directory.

    Trains (about a minute and a half) only when the directory is missing or was written by another
    :data:`TRAINING_VERSION`. Safe to call from several processes at once: a file lock serialises training.
    """
    directory = digits_dir()
    if _is_current(directory):
        return directory
    with file_lock(directory.with_name(directory.name + ".lock")):
        if _is_current(directory):
            return directory
        for staging in directory.parent.glob(f"{directory.name}.staging-*"):
            shutil.rmtree(staging, ignore_errors=True)
        staging = directory.with_name(f"{directory.name}.staging-{os.getpid()}")
        logger.info("Training the digits diffusion model into %s (one-time, ~%d s)", directory, _EXPECTED_SECONDS)
        try:
            train_digits(staging, progress)
            if not _is_current(staging):
                raise ModelPreparationError(f"training wrote no current {INFO_FILE_NAME} into {staging}")
            shutil.rmtree(directory, ignore_errors=True)
            os.replace(staging, directory)
        except BaseException as error:
            shutil.rmtree(staging, ignore_errors=True)
            if isinstance(error, (ModelPreparationError, KeyboardInterrupt, SystemExit)):
                raise
            raise ModelPreparationError(f"Training the digits model failed: {type(error).__name__}: {error}") from error
    return directory


def build_unet():
    """The untrained UNet: two resolutions (8x8 and 4x4), a 4x4 middle block with attention, 11 class embeddings."""
    from diffusers import UNet2DModel

    return UNet2DModel(
        sample_size=SAMPLE_SIZE,
        in_channels=1,
        out_channels=1,
        block_out_channels=(32, 64),
        down_block_types=("DownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "UpBlock2D"),
        layers_per_block=1,
        norm_num_groups=8,
        attention_head_dim=32,
        num_class_embeds=NUM_CLASSES + 1,
    )


def build_scheduler():
    from diffusers import DDPMScheduler

    return DDPMScheduler(
        num_train_timesteps=TRAIN_TIMESTEPS,
        beta_schedule=BETA_SCHEDULE,
        prediction_type="epsilon",
        clip_sample=True,
        clip_sample_range=1.0,
        timestep_spacing="trailing",
    )


def load_training_images():
    """The sklearn digits as float32 tensors: images (N, 1, 8, 8) in [-1, 1] (ink = +1) and labels (N,)."""
    import torch
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0 * 2.0 - 1.0
    return images, torch.tensor(digits.target, dtype=torch.long)


def train_digits(out_dir: Path, progress: bool, *, steps: int = STEPS, seed: int = SEED) -> None:
    """Train the digits DDPM and write it to ``out_dir`` (created; diffusers layout plus ``omnipipe.json``).

    Deterministic for a given seed, torch version and thread count. Uses at most two torch threads (restored
    afterwards). The caller moves ``out_dir`` into place; :func:`prepare_digits` does that atomically.
    """
    import torch
    from tqdm.auto import tqdm

    started_s = time.perf_counter()
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    try:
        torch.manual_seed(seed)
        generator = torch.Generator().manual_seed(seed)
        images, labels = load_training_images()
        unet = build_unet().train()
        scheduler = build_scheduler()
        ema = {name: value.detach().clone() for name, value in unet.state_dict().items()}
        optimizer = torch.optim.AdamW(unet.parameters(), lr=LEARNING_RATE, weight_decay=0.0)
        lr_schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_factor(steps))
        alphas_cumprod = scheduler.alphas_cumprod
        order = torch.empty(0, dtype=torch.long)
        losses: list[float] = []
        with tqdm(total=steps, desc="training the digits diffusion model", unit="step", disable=not progress) as bar:
            for step in range(steps):
                if order.numel() < BATCH_SIZE:
                    order = torch.cat([order, torch.randperm(len(images), generator=generator)])
                batch, order = order[:BATCH_SIZE], order[BATCH_SIZE:]
                x0, y = images[batch], labels[batch].clone()
                y[torch.rand(len(y), generator=generator) < LABEL_DROPOUT] = NULL_CLASS
                noise = torch.randn(x0.shape, generator=generator)
                t = torch.randint(0, TRAIN_TIMESTEPS, (len(y),), generator=generator)
                a = alphas_cumprod[t].view(-1, 1, 1, 1)
                noisy = a.sqrt() * x0 + (1 - a).sqrt() * noise
                loss = torch.nn.functional.mse_loss(unet(noisy, t, class_labels=y).sample, noise)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(unet.parameters(), 1.0)
                optimizer.step()
                lr_schedule.step()
                decay = min(EMA_DECAY, (1 + step) / (10 + step))
                with torch.no_grad():
                    for name, value in unet.state_dict().items():
                        if value.dtype.is_floating_point:
                            ema[name].lerp_(value, 1 - decay)
                        else:
                            ema[name].copy_(value)
                losses.append(float(loss.detach()))
                if step % 50 == 49:
                    bar.set_postfix(loss=f"{sum(losses[-50:]) / 50:.4f}")
                bar.update(1)
        unet.load_state_dict(ema)
        unet.eval()
        _save(unet, scheduler, Path(out_dir), seed=seed, steps=steps, train_s=time.perf_counter() - started_s,
              final_loss=sum(losses[-100:]) / max(1, len(losses[-100:])))
    finally:
        torch.set_num_threads(previous_threads)


def _lr_factor(steps: int):
    import math

    def factor(step: int) -> float:
        if step < WARMUP_STEPS:
            return (step + 1) / WARMUP_STEPS
        progress = (step - WARMUP_STEPS) / max(1, steps - WARMUP_STEPS)
        return 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return factor


def _save(unet, scheduler, out_dir: Path, *, seed: int, steps: int, train_s: float, final_loss: float) -> None:
    import diffusers

    out_dir.mkdir(parents=True, exist_ok=True)
    unet.save_pretrained(str(out_dir / "unet"), safe_serialization=True)
    scheduler.save_pretrained(str(out_dir / "scheduler"))
    model_index = {
        "_class_name": "DDPMPipeline",
        "_diffusers_version": diffusers.__version__,
        "scheduler": ["diffusers", type(scheduler).__name__],
        "unet": ["diffusers", type(unet).__name__],
    }
    (out_dir / "model_index.json").write_text(json.dumps(model_index, indent=2) + "\n")
    info = {
        "kind": "class-conditional",
        "classes": [str(k) for k in range(NUM_CLASSES)],
        "null_class": NULL_CLASS,
        "dataset": "sklearn digits 8x8",
        "pixels": "[-1, 1], -1 = background, +1 = ink; as uint8 (x + 1) / 2 * 255 (bright ink on dark)",
        "training_version": TRAINING_VERSION,
        "seed": seed,
        "steps": steps,
        "batch_size": BATCH_SIZE,
        "train_seconds": round(train_s, 1),
        "final_loss": round(final_loss, 5),
        "parameters": sum(p.numel() for p in unet.parameters()),
        "diffusers_version": diffusers.__version__,
    }
    # Written last: a directory without a current info file is not a trained model.
    (out_dir / INFO_FILE_NAME).write_text(json.dumps(info, indent=2) + "\n")

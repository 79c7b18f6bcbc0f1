"""Omni: the synchronous, offline form. ``Omni(...).generate(prompts)`` returns one final output per prompt."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from omnipipe.api.async_omni import AsyncOmni
from omnipipe.api.outputs import OmniRequestOutput
from omnipipe.api.sampling_params import SamplingParams
from omnipipe.config.deploy_config import DeployConfig
from omnipipe.config.pipeline_spec import PipelineSpec


class Omni:
    """Runs an AsyncOmni on a private event loop thread; every call blocks until its results are in."""

    def __init__(self, pipeline: str | PipelineSpec = "default",
                 deploy: str | Path | dict[str, Any] | DeployConfig | None = None, *,
                 log_level: str = "WARNING") -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="omnipipe-omni-loop", daemon=True)
        self._thread.start()
        try:
            self._engine: AsyncOmni = self._call(self._create(pipeline, deploy, log_level))
        except BaseException:
            self._stop_loop()
            raise

    @staticmethod
    async def _create(pipeline: Any, deploy: Any, log_level: str) -> AsyncOmni:
        engine = AsyncOmni(pipeline, deploy, log_level=log_level)
        return await engine.start()

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def generate(
        self,
        prompts: Any | Sequence[Any],
        sampling_params: SamplingParams | dict[str, SamplingParams] | None = None,
        output_modalities: list[str] | None = None,
        use_tqdm: bool = True,
        session_id: str | None = None,
    ) -> list[OmniRequestOutput]:
        """Run every prompt concurrently; return the final output (full text and audio) of each, in order.
        ``session_id``: the conversation the prompts belong to (``AsyncOmni.generate``), kept until
        :meth:`end_session`."""
        batch = [prompts] if isinstance(prompts, (str, dict)) else list(prompts)
        return self._call(self._generate_all(batch, sampling_params, output_modalities, use_tqdm, session_id))

    def end_session(self, session_id: str) -> None:
        """Every stage drops what it keeps for ``session_id`` (``AsyncOmni.end_session``)."""
        self._call(self._engine.end_session(session_id))

    def append_audio(self, stream_id: str, pcm16k: Any, *, session_id: str | None = None) -> None:
        """The next piece (float32 mono at 16 kHz) of the audio stream ``stream_id`` (``AsyncOmni.append_audio``);
        a prompt then names it as ``{"audio": [{"stream": stream_id}]}``."""
        self._call(self._engine.append_audio(stream_id, pcm16k, session_id=session_id))

    def drop_audio_stream(self, stream_id: str) -> None:
        """Forget the audio stream ``stream_id`` (``AsyncOmni.drop_audio_stream``)."""
        self._call(self._engine.drop_audio_stream(stream_id))

    async def _generate_all(self, prompts: list[Any], sampling_params: Any, modalities: Any,
                            use_tqdm: bool, session_id: str | None) -> list[OmniRequestOutput]:
        # counts what is produced as it comes (tokens, seconds of audio), not finished requests: a batch of a few
        # long requests would otherwise sit at 0% and then jump, with an ETA worth nothing
        bar = tqdm(desc="Generating", unit="tok", disable=not use_tqdm)
        progress = {"done": 0, "audio_s": 0.0}

        def show() -> None:
            bar.set_postfix_str(f"{progress['done']}/{len(prompts)} requests done, {progress['audio_s']:.1f} s audio",
                                refresh=False)

        show()

        async def one(prompt: Any) -> OmniRequestOutput:
            final = None
            async for out in self._engine.generate(prompt, sampling_params=sampling_params,
                                                   output_modalities=modalities, session_id=session_id):
                if out.modality == "text":
                    bar.update(out.num_tokens)
                elif out.modality == "audio":
                    progress["audio_s"] += out.audio_duration_s
                    show()
                if out.finished:
                    final = out
            progress["done"] += 1
            show()
            bar.refresh()
            assert final is not None
            return final

        try:
            return list(await asyncio.gather(*(one(p) for p in prompts)))
        finally:
            bar.close()

    def debug_state(self) -> dict[str, Any]:
        return self._call(self._engine.debug_state())

    def shutdown(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self._call(self._engine.shutdown())
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> Omni:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

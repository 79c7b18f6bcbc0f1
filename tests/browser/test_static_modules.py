"""The pages' shared JavaScript modules, run in Chromium: the SSE parser, WAV encoding, the pcm16 player and the
microphone worklet's resampling to 24 kHz. Served by a gateway without a model."""

from __future__ import annotations

from typing import Any

import pytest

from tests.browser.conftest import Stack

pytestmark = pytest.mark.browser


@pytest.fixture
def page(bare_gateway: Stack, new_page: Any) -> Any:
    page = new_page()
    page.goto(bare_gateway.url + "/")
    return page


def test_sse_parser_handles_split_lines_named_events_and_comments(page: Any) -> None:
    events = page.evaluate("""async () => {
        const { readSSE } = await import("/static/js/sse.js");
        const pieces = ["event: queue\\r", "\\ndata: {\\"type\\":\\"queued\\"}\\r\\n\\r\\n", "data: one\\n",
                        "data: two\\n\\n",
                        ": a comment\\n\\n", "data: [DO", "NE]\\n\\n", "data: no blank line at the end"];
        const body = new ReadableStream({ start(controller) {
            const encoder = new TextEncoder();
            for (const piece of pieces) controller.enqueue(encoder.encode(piece));
            controller.close();
        } });
        const out = [];
        for await (const event of readSSE(new Response(body))) out.push([event.event, event.data]);
        return out;
    }""")
    # the last event is incomplete (the stream ends before its blank line): dropped, as the SSE standard says
    assert events == [["queue", '{"type":"queued"}'], ["message", "one\ntwo"], ["message", "[DONE]"]]


def test_wav_encoding_and_pcm16_round_trip(page: Any) -> None:
    result = page.evaluate("""async () => {
        const wav = await import("/static/js/wav.js");
        const samples = new Float32Array([0, 0.5, -0.5, 1, -1]);
        const file = wav.encodeWav(samples, 24000);
        const view = new DataView(file.buffer);
        const text = (at, n) => String.fromCharCode(...file.subarray(at, at + n));
        const back = wav.pcm16ToFloat(file.subarray(44));
        return { size: file.length, riff: text(0, 4), wave: text(8, 4), data: text(36, 4),
                 rate: view.getUint32(24, true), bits: view.getUint16(34, true), channels: view.getUint16(22, true),
                 dataBytes: view.getUint32(40, true), back: Array.from(back) };
    }""")
    assert result["riff"] == "RIFF" and result["wave"] == "WAVE" and result["data"] == "data"
    assert (result["rate"], result["bits"], result["channels"]) == (24000, 16, 1)
    assert result["dataBytes"] == 10 and result["size"] == 54
    assert result["back"] == pytest.approx([0, 0.5, -0.5, 1, -1], abs=1e-4)


def test_pcm_player_schedules_chunks_back_to_back_and_stops_at_once(page: Any) -> None:
    result = page.evaluate("""async () => {
        const { PcmPlayer } = await import("/static/js/pcm-player.js");
        const player = new PcmPlayer({ sampleRate: 24000 });
        await player.resume();
        const chunk = new Uint8Array(2400 * 2 + 1);  // 0.1 s and one odd byte carried to the next chunk
        player.enqueue(chunk);
        player.enqueue(chunk);
        player.enqueue(chunk);
        const queued = { chunks: player.chunks, sources: player.sources.size, playing: player.playing,
                         remaining: player.remainingSeconds, seconds: player.secondsQueued };
        player.stop();
        const stopped = { sources: player.sources.size, playing: player.playing, remaining: player.remainingSeconds };
        await player.close();
        return { queued, stopped };
    }""")
    queued, stopped = result["queued"], result["stopped"]
    assert queued["chunks"] == 3 and queued["sources"] == 3 and queued["playing"] is True
    # 3 x 4801 bytes = 7201 samples and a byte still carried: 0.3 s + 1 sample
    assert queued["seconds"] == pytest.approx(7201 / 24000)
    assert 0.25 < queued["remaining"] < 0.5
    assert stopped == {"sources": 0, "playing": False, "remaining": 0}


def test_pcm_player_jitter_buffer_stops_a_slow_stream_from_stuttering(page: Any) -> None:
    """Audio that arrives slower than it plays (0.1 s every 0.15 s) runs dry again and again when played as it
    arrives; held by the jitter buffer, sized from the arrival rate measured within the answer, it plays through.
    Audio arriving faster than real time starts after the small floor."""
    result = page.evaluate("""async () => {
        const { PcmPlayer } = await import("/static/js/pcm-player.js");
        const player = new PcmPlayer({ sampleRate: 24000 });
        await player.resume();
        const chunk = new Uint8Array(2400 * 2);  // 0.1 s
        const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
        const answers = [];
        for (const [jitter, gapMs] of [[false, 150], [true, 150], [true, 20]]) {
            player.jitterBuffer = jitter;
            player.lastRate = null;  // each answer measured on its own
            const stats = player.startAnswer();
            let buffering = false;
            for (let i = 0; i < 14; i++) { player.enqueue(chunk); buffering ||= player.buffering; await sleep(gapMs); }
            player.endAnswer();
            answers.push({ ...stats, buffering });
            while (player.playing) await sleep(50);
        }
        await player.close();
        return answers;
    }""")
    unbuffered, buffered, fast = result
    assert unbuffered["underruns"] >= 3 and unbuffered["underrunMs"] > 0, result
    assert buffered["underruns"] == 0 and buffered["bufferMs"] > 150 and buffered["buffering"], result
    assert 0.4 < buffered["arrivalRate"] < 1, result
    assert buffered["firstAudioAt"] - buffered["firstChunkAt"] > 300, result  # held while it measured
    assert fast["underruns"] == 0 and fast["bufferMs"] == 150, result  # faster than real time: the floor


@pytest.mark.parametrize("input_rate", [48000, 44100, 16000])
def test_capture_worklet_resamples_to_24_khz(page: Any, input_rate: int) -> None:
    """A 440 Hz tone at the context's rate comes out of the worklet as 24 kHz mono with the same pitch."""
    result = page.evaluate("""async (rate) => {
        const seconds = 1;
        const context = new OfflineAudioContext(2, rate * seconds, rate);
        await context.audioWorklet.addModule("/static/js/capture-worklet.js");
        const node = new AudioWorkletNode(context, "omnipipe-capture",
            { processorOptions: { targetRate: 24000, chunkMs: 100 } });
        const pieces = [];
        node.port.onmessage = (event) => { if (event.data.type === "chunk") pieces.push(event.data.samples); };
        const tone = context.createOscillator();
        tone.frequency.value = 440;
        const gain = context.createGain();
        gain.gain.value = 0.5;
        tone.connect(gain).connect(node).connect(context.destination);
        tone.start();
        await context.startRendering();
        await new Promise((resolve) => setTimeout(resolve, 300));
        const samples = pieces.flatMap((p) => Array.from(p));
        let crossings = 0;
        for (let i = 1; i < samples.length; i += 1) if (samples[i - 1] < 0 && samples[i] >= 0) crossings += 1;
        const peak = samples.slice(2400).reduce((m, s) => Math.max(m, Math.abs(s)), 0);
        return { count: samples.length, chunks: pieces.map((p) => p.length), crossings, peak };
    }""", input_rate)
    assert result["count"] == pytest.approx(24000, abs=2400)  # whole 100 ms chunks of the 1 s rendered
    assert set(result["chunks"]) == {2400}
    assert result["crossings"] == pytest.approx(440 * result["count"] / 24000, abs=3)
    assert result["peak"] == pytest.approx(0.5, abs=0.05)  # the low-pass keeps 440 Hz untouched

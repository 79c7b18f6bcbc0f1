// How long the voice page waited for an answer: end of the user's speech -> the answer's first audio, in ms; the
// clock that measures it, and the line under each answer and the session's median that show it.
//
// End of speech is counted as `omnipipe bench voice` and the server (`omnipipe:realtime_speech_end_to_first_audio_
// seconds`) count it: the moment the audio holding the last speech sample was sent. The server VAD's
// "input_audio_buffer.speech_stopped" gives `audio_end_ms`, milliseconds into the server's input audio buffer (which
// starts with the session and again after each commit or pause); the clock keeps the send time of every chunk of
// that buffer and takes the one holding that sample. First audio is the arrival of the answer's first
// "response.output_audio.delta" (not its playback, which the jitter buffer may hold back: see pcm-player.js). So the
// page's figure is the server's plus the two trips between the page and the worker (through the gateway).
//
// The server does not say where its buffer restarts after its VAD commits (it commits within the chunk that
// completes `silence_duration_ms` of quiet after the speech). The clock takes the last chunk sent before
// "speech_stopped" came back, but no chunk beyond `silence_duration_ms` + VAD_SLACK_MS past the end of speech (the
// VAD has fired by then): only a reply slower than a chunk's length puts the restart a chunk late, and then only
// later turns of the session are off, by that chunk.

import { h } from "./dom.js";

const VAD_SLACK_MS = 64; // the VAD's 32 ms windows and its resampler's delay, rounded up
const DEFINITION = "From the moment the end of your speech was sent to the arrival of the answer's first audio.";

export class AnswerDelayClock {
  /**
   * @param {object} [options]
   * @param {number} [options.sampleRate=24000] of the pcm16 the page sends
   * @param {number} [options.silenceMs=500] the server VAD's `silence_duration_ms`
   */
  constructor({ sampleRate = 24000, silenceMs = 500 } = {}) {
    this.sampleRate = sampleRate;
    this.silenceMs = silenceMs;
    this.chunks = []; // the server's input buffer: [{end: samples since the buffer began, at: when it was sent}]
    this.speechEnd = null; // when the speech the next answer replies to ended (performance.now() ms)
    this.waiting = new Map(); // response id -> the end of speech it replies to, until its first audio
    this.delays = []; // ms, one per answer timed, in order
  }

  /** A chunk of `samples` samples was sent to the server's input buffer at `at`. */
  sent(samples, at = performance.now()) {
    const before = this.chunks.length ? this.chunks[this.chunks.length - 1].end : 0;
    this.chunks.push({ end: before + samples, at });
  }

  /** The server emptied its input buffer with everything sent so far (the session was paused). */
  bufferEmptied() {
    this.chunks = [];
  }

  /** The server VAD heard the speech stop `audioEndMs` into its buffer, and committed the buffer. */
  speechStopped(audioEndMs) {
    const endSample = (audioEndMs * this.sampleRate) / 1000;
    const holding = this.chunks.find((chunk) => chunk.end >= endSample);
    this.speechEnd = holding ? holding.at : null;
    const latest = endSample + ((this.silenceMs + VAD_SLACK_MS) * this.sampleRate) / 1000;
    const beyond = this.chunks.findIndex((chunk) => chunk.end >= latest);
    const last = beyond < 0 ? this.chunks.length - 1 : beyond;
    if (last < 0) return;
    const restart = this.chunks[last].end;
    this.chunks = this.chunks.slice(last + 1).map((chunk) => ({ end: chunk.end - restart, at: chunk.at }));
  }

  /** A response began: it replies to the speech that ended last, if that has no answer yet. */
  responseCreated(responseId) {
    if (this.speechEnd === null) return;
    this.waiting.set(responseId, this.speechEnd);
    this.speechEnd = null;
  }

  /** Audio of the response arrived at `at`: the answer's delay in whole ms (as each answer shows it, so the
   * median is that of the delays shown) if this is its first audio, else null. */
  audioArrived(responseId, at = performance.now()) {
    const speechEnd = this.waiting.get(responseId);
    if (speechEnd === undefined) return null;
    this.waiting.delete(responseId);
    const delay = Math.round(at - speechEnd);
    this.delays.push(delay);
    return delay;
  }

  /** The median of the delays so far (ms), or null before the first. */
  get median() {
    if (!this.delays.length) return null;
    const sorted = [...this.delays].sort((a, b) => a - b);
    const middle = Math.floor(sorted.length / 2);
    return sorted.length % 2 ? sorted[middle] : (sorted[middle - 1] + sorted[middle]) / 2;
  }
}

/** "480 ms" */
export function formatDelay(ms) {
  return `${Math.round(ms).toLocaleString("en")} ms`;
}

/** The line under an answer: "Answer began 480 ms after you stopped speaking". */
export function delayNote(ms) {
  return h("span", { class: "delay", title: DEFINITION }, `Answer began ${formatDelay(ms)} after you stopped speaking`);
}

/** The session's median and count beside the controls, hidden until an answer was timed. */
export function showDelaySummary(clock, { summary, median, count }) {
  const timed = clock.delays.length;
  median.textContent = timed ? formatDelay(clock.median) : "";
  count.textContent = timed === 1 ? "over 1 answer" : `over ${timed} answers`;
  summary.classList.toggle("hidden", !timed);
}

// Plays streamed pcm16 (mono, little-endian) chunks gaplessly with the Web Audio API.
//
// Each chunk becomes an AudioBuffer at the stream's rate (24 kHz by default; the AudioContext resamples) scheduled
// right after the previous one. stop() silences everything at once (barge-in) and forgets the schedule.

import { pcm16ToFloat } from "./wav.js";

const START_LEAD_S = 0.06; // a little head start so the first chunks do not underrun

export class PcmPlayer {
  /**
   * @param {object} options
   * @param {number} [options.sampleRate=24000] rate of the incoming pcm16
   * @param {(playing: boolean) => void} [options.onStateChange] called when playback starts or drains
   */
  constructor({ sampleRate = 24000, onStateChange = null } = {}) {
    this.sampleRate = sampleRate;
    this.onStateChange = onStateChange;
    this.context = null;
    this.sources = new Set();
    this.nextTime = 0;
    this.carry = null; // an odd byte left from the previous chunk
    this.chunks = 0;
    this.secondsQueued = 0;
    this._playing = false;
  }

  /** Create or resume the AudioContext. Call it from a click handler so the browser allows sound. */
  async resume() {
    if (!this.context) this.context = new AudioContext({ latencyHint: "interactive" });
    if (this.context.state === "suspended") await this.context.resume().catch(() => {});
    return this.context;
  }

  get playing() {
    return this._playing;
  }

  /** Queue one chunk of pcm16 bytes (Uint8Array). */
  enqueue(bytes) {
    if (!this.context) this.context = new AudioContext({ latencyHint: "interactive" });
    if (this.context.state === "suspended") this.context.resume().catch(() => {});
    let data = bytes;
    if (this.carry !== null) {
      data = new Uint8Array(bytes.byteLength + 1);
      data[0] = this.carry;
      data.set(bytes, 1);
      this.carry = null;
    }
    if (data.byteLength % 2 === 1) {
      this.carry = data[data.byteLength - 1];
      data = data.subarray(0, data.byteLength - 1);
    }
    if (data.byteLength === 0) return;
    const samples = pcm16ToFloat(data);
    const buffer = this.context.createBuffer(1, samples.length, this.sampleRate);
    buffer.copyToChannel(samples, 0);
    const source = this.context.createBufferSource();
    source.buffer = buffer;
    source.connect(this.context.destination);
    const now = this.context.currentTime;
    const startAt = Math.max(this.nextTime, now + START_LEAD_S);
    source.start(startAt);
    this.nextTime = startAt + buffer.duration;
    this.chunks += 1;
    this.secondsQueued += buffer.duration;
    this.sources.add(source);
    source.onended = () => {
      this.sources.delete(source);
      if (this.sources.size === 0) this._setPlaying(false);
    };
    this._setPlaying(true);
  }

  /** Seconds of scheduled audio still to play. */
  get remainingSeconds() {
    if (!this.context) return 0;
    return Math.max(0, this.nextTime - this.context.currentTime);
  }

  /** Stop everything scheduled, at once. */
  stop() {
    for (const source of this.sources) {
      source.onended = null;
      try { source.stop(); } catch { /* not started yet or already stopped */ }
      source.disconnect();
    }
    this.sources.clear();
    this.nextTime = 0;
    this.carry = null;
    this._setPlaying(false);
  }

  async close() {
    this.stop();
    if (this.context) await this.context.close().catch(() => {});
    this.context = null;
  }

  _setPlaying(playing) {
    if (playing === this._playing) return;
    this._playing = playing;
    if (this.onStateChange) this.onStateChange(playing);
  }
}

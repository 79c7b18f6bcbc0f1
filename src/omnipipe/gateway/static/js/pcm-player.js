// Plays streamed pcm16 (mono, little-endian) chunks gaplessly with the Web Audio API.
//
// Each chunk becomes an AudioBuffer at the stream's rate (24 kHz by default; the AudioContext resamples) scheduled
// right after the previous one. stop() silences everything at once (barge-in) and forgets the schedule.
//
// Jitter buffer: when the audio would start from nothing (a new answer, or the answer ran dry because it arrives
// slower than it plays) playback starts `lead` seconds late. The lead adapts: an answer that runs dry mid-way
// (an underrun) raises it at once, sized from how fast audio is arriving (seconds of audio per second of wall
// time), and an answer that arrived comfortably ahead lowers it again, so a fast server keeps a short first-audio
// delay and a slow one stops stuttering after its first answer.

import { pcm16ToFloat } from "./wav.js";

const MIN_LEAD_S = 0.06; // a little head start so the first chunks do not underrun
const MAX_LEAD_S = 2.0;

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
    this.lead = MIN_LEAD_S; // the jitter buffer: seconds of delay before audio starts from nothing
    this.underruns = 0; // times an answer ran dry mid-way (all answers)
    this._answer = null; // {startWall, audioSeconds, underruns} of the answer being received
  }

  /** An answer begins: its first chunk starts after the current lead. */
  startAnswer() {
    this._answer = { startWall: null, audioSeconds: 0, underruns: 0 }; // the clock starts with its first chunk
  }

  /** The answer's last chunk has arrived: learn from how fast it came (a calm answer lowers the lead). */
  endAnswer() {
    const answer = this._answer;
    this._answer = null;
    if (!answer || answer.startWall === null || answer.audioSeconds <= 0 || answer.underruns > 0) return;
    const rate = answer.audioSeconds / Math.max(1e-3, performance.now() / 1000 - answer.startWall);
    if (rate > 1.2) this.lead = Math.max(MIN_LEAD_S, this.lead * 0.7);
  }

  /** Seconds of audio per second of wall time arriving in the current answer (Infinity before any time passed). */
  get arrivalRate() {
    const answer = this._answer;
    if (!answer || answer.startWall === null) return Infinity;
    const elapsed = performance.now() / 1000 - answer.startWall;
    return elapsed > 0.05 ? answer.audioSeconds / elapsed : Infinity;
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
    let startAt = this.nextTime;
    if (startAt < now + 0.005) { // nothing left to play: start from nothing, after the lead
      const answer = this._answer;
      if (answer && answer.audioSeconds > 0) { // ran dry mid-answer: audio arrives slower than it plays
        answer.underruns += 1;
        this.underruns += 1;
        // enough head start to cover the rest of an answer as long again at the measured arrival rate
        const rate = Math.min(1, this.arrivalRate);
        this.lead = Math.min(MAX_LEAD_S, Math.max(this.lead * 1.5, answer.audioSeconds * (1 / rate - 1)));
      }
      startAt = now + this.lead;
    }
    if (this._answer) {
      if (this._answer.startWall === null) this._answer.startWall = performance.now() / 1000;
      this._answer.audioSeconds += buffer.duration;
    }
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

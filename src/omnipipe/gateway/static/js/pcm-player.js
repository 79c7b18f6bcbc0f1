// Plays streamed pcm16 (mono, little-endian) chunks gaplessly with the Web Audio API.
//
// Each chunk becomes an AudioBuffer at the stream's rate (24 kHz by default; the AudioContext resamples) scheduled
// right after the previous one. stop() silences everything at once (barge-in) and forgets the schedule.
//
// Jitter buffer, per answer (startAnswer .. endAnswer): the answer's audio is held until enough of it is queued to
// play through without running dry, then played. How much is enough comes from the measured arrival rate r (seconds
// of audio received per second of wall time, after the first chunk): audio that arrives at least as fast as it
// plays starts at once with a small floor (FLOOR_S); slower audio needs B >= R * (1/r - 1) queued, R being the
// audio still to come (the expected answer length, learnt from earlier answers, less what has arrived), capped at
// CAP_S. Audio also arrives in bursts (a sentence, then a pause while the next one is made): the longest stall seen
// between chunks (the wait for a chunk beyond the audio the previous one carried), in this answer or the previous
// one, is added to the hold. The answer's own rate is trusted once measured over MEASURE_MS of wall time or MEASURE_AUDIO_S of audio
// after its first chunk; until then the previous answer's rate is used, and a first answer waits for that. If the
// answer runs dry anyway (an underrun), it is held again the same way. Each answer's figures (first audio, the
// buffer chosen, underruns) are kept in its `stats` object.

import { pcm16ToFloat } from "./wav.js";

const FLOOR_S = 0.15; // what is queued before starting when audio arrives faster than it plays
const CAP_S = 3.0; // never hold more than this before starting
const EXPECTED_ANSWER_S = 6.0; // the length of an answer assumed until answers have been measured
const START_DELAY_S = 0.02; // held audio starts this far ahead, so its chunks are scheduled back to back
// an answer's own arrival rate is used once measured over this much wall time or audio (before: the previous answer's)
const MEASURE_MS = 300;
const MEASURE_AUDIO_S = 0.5;

export class PcmPlayer {
  /**
   * @param {object} options
   * @param {number} [options.sampleRate=24000] rate of the incoming pcm16
   * @param {(playing: boolean) => void} [options.onStateChange] called when playback starts, drains or buffers
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
    this.jitterBuffer = true; // false: every chunk plays as it arrives (no hold; for comparison)
    this.underruns = 0; // times an answer ran dry mid-way (all answers)
    this.lastRate = null; // the previous answer's arrival rate
    this.lastStallS = 0; // the previous answer's longest stall between chunks
    this.expectedAnswerS = EXPECTED_ANSWER_S;
    this._answer = null; // the answer being received (see startAnswer)
  }

  /**
   * An answer begins: its audio is held until the jitter buffer is full. Returns its figures, updated as it plays:
   * {firstChunkAt, firstAudioAt (performance.now() ms), bufferMs (the last hold's size), arrivalRate, audioSeconds,
   * underruns, underrunMs, maxStallMs (the longest stall between chunks)}.
   */
  startAnswer(id = null) {
    this._endHold();
    const stats = { firstChunkAt: null, firstAudioAt: null, bufferMs: null, arrivalRate: null, audioSeconds: 0,
      underruns: 0, underrunMs: 0, maxStallMs: 0 };
    this._answer = { id, stats, firstWall: null, lastWall: null, firstChunkS: 0, lastChunkS: 0, holding: true,
      pending: [], started: false, dryAt: null };
    return stats;
  }

  /** The answer's last chunk has arrived: play what is held, and learn its rate and length for the next one. */
  endAnswer(id = null) {
    const answer = this._answer;
    if (!answer || (id !== null && answer.id !== null && answer.id !== id)) return;
    if (answer.pending.length) this._release(answer);
    this._answer = null;
    const rate = this._rate(answer);
    if (rate !== null) this.lastRate = rate;
    if (answer.firstWall !== null) this.lastStallS = answer.stats.maxStallMs / 1000;
    if (answer.stats.audioSeconds > 0) {
      this.expectedAnswerS = Math.max(1, (this.expectedAnswerS + answer.stats.audioSeconds) / 2);
    }
    this._notify();
  }

  /** Whether an answer is waiting for audio it already started receiving (held, or run dry mid-way). */
  get buffering() {
    const answer = this._answer;
    return Boolean(answer && answer.stats.audioSeconds > 0 && this.sources.size === 0);
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
    this.chunks += 1;
    this.secondsQueued += buffer.duration;
    const answer = this._answer;
    if (!answer) { // audio outside an answer plays at once
      this._schedule(buffer);
      return;
    }
    const wall = performance.now();
    const stats = answer.stats;
    if (answer.firstWall === null) {
      answer.firstWall = wall;
      answer.firstChunkS = buffer.duration;
      stats.firstChunkAt = wall;
    } else {
      stats.maxStallMs = Math.max(stats.maxStallMs, wall - answer.lastWall - answer.lastChunkS * 1000);
    }
    answer.lastWall = wall;
    answer.lastChunkS = buffer.duration;
    stats.audioSeconds += buffer.duration;
    stats.arrivalRate = this._rate(answer);
    if (!answer.holding && this.nextTime < this.context.currentTime) { // ran dry mid-answer: an underrun
      stats.underruns += 1;
      this.underruns += 1;
      answer.dryAt = wall - (this.context.currentTime - this.nextTime) * 1000;
      answer.holding = this.jitterBuffer;
    }
    if (!answer.holding) {
      if (answer.dryAt !== null) { // no jitter buffer: the gap lasts until this chunk plays
        stats.underrunMs += Math.max(0, wall - answer.dryAt);
        answer.dryAt = null;
      }
      this._schedule(buffer);
      return;
    }
    answer.pending.push(buffer);
    const target = this._target(answer);
    stats.bufferMs = Math.round(target * 1000);
    const held = answer.pending.reduce((sum, b) => sum + b.duration, 0);
    if (held >= target - 1e-6) this._release(answer);
    else this._notify();
  }

  /** Seconds to hold before (re)starting this answer, from its measured arrival rate. */
  _target(answer) {
    if (!this.jitterBuffer) return 0;
    const rate = this._measured(answer) ? this._rate(answer) : this.lastRate;
    if (rate === null) return CAP_S; // nothing measured yet and no earlier answer: wait for more chunks
    const stall = Math.max(answer.stats.maxStallMs / 1000, this.lastStallS);
    const toCome = Math.max(1, this.expectedAnswerS - answer.stats.audioSeconds);
    const slow = rate >= 1 ? 0 : toCome * (1 / Math.max(rate, 0.05) - 1);
    return Math.min(CAP_S, Math.max(FLOOR_S, slow + stall));
  }

  /** Whether the answer's own rate has been measured long enough to go by (a burst of two chunks has not). */
  _measured(answer) {
    if (answer.firstWall === null) return false;
    return answer.lastWall - answer.firstWall >= MEASURE_MS
      || answer.stats.audioSeconds - answer.firstChunkS >= MEASURE_AUDIO_S;
  }

  /** Seconds of audio per second of wall time after the answer's first chunk; null before a second chunk. */
  _rate(answer) {
    if (answer.firstWall === null || answer.lastWall - answer.firstWall < 20) return null;
    return (answer.stats.audioSeconds - answer.firstChunkS) / ((answer.lastWall - answer.firstWall) / 1000);
  }

  /** Play everything held, starting now. */
  _release(answer) {
    const wall = performance.now();
    const startAt = this.context.currentTime + START_DELAY_S;
    if (this.nextTime < startAt) this.nextTime = startAt;
    const startWall = wall + (this.nextTime - this.context.currentTime) * 1000;
    if (!answer.started) answer.stats.firstAudioAt = startWall;
    if (answer.dryAt !== null) answer.stats.underrunMs += Math.max(0, startWall - answer.dryAt);
    answer.started = true;
    answer.dryAt = null;
    answer.holding = false;
    for (const buffer of answer.pending.splice(0)) this._schedule(buffer);
  }

  _endHold() {
    if (this._answer && this._answer.pending.length) this._release(this._answer);
    this._answer = null;
  }

  _schedule(buffer) {
    const source = this.context.createBufferSource();
    source.buffer = buffer;
    source.connect(this.context.destination);
    const startAt = Math.max(this.nextTime, this.context.currentTime + 0.005);
    source.start(startAt);
    this.nextTime = startAt + buffer.duration;
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

  /** Stop everything scheduled or held, at once (the answer being received is dropped). */
  stop() {
    for (const source of this.sources) {
      source.onended = null;
      try { source.stop(); } catch { /* not started yet or already stopped */ }
      source.disconnect();
    }
    this.sources.clear();
    this._answer = null;
    this.nextTime = 0;
    this.carry = null;
    this._setPlaying(false);
    this._notify();
  }

  async close() {
    this.stop();
    if (this.context) await this.context.close().catch(() => {});
    this.context = null;
  }

  _notify() {
    if (this.onStateChange) this.onStateChange(this._playing);
  }

  _setPlaying(playing) {
    if (playing === this._playing) return;
    this._playing = playing;
    this._notify();
  }
}

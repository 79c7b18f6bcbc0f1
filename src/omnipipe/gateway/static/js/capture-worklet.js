// AudioWorklet processor: microphone -> mono float32 at a target rate (24 kHz by default), posted in chunks.
//
// Loaded with audioContext.audioWorklet.addModule("/static/js/capture-worklet.js") and created as
// new AudioWorkletNode(ctx, "omnipipe-capture", {processorOptions: {targetRate, chunkMs}}).
// Messages to the main thread: {type: "chunk", samples: Float32Array, rms: number}, and {type: "flushed"} after
// the main thread sends {type: "flush"} (the partial chunk, if any, comes first).
//
// Resampling: the input is mixed down to mono, low-passed below the target Nyquist frequency when downsampling
// (a 2nd-order Butterworth, enough against aliasing for speech), then linearly interpolated at the target rate.

class Lowpass {
  constructor(cutoffHz, rateHz) {
    const w0 = (2 * Math.PI * cutoffHz) / rateHz;
    const alpha = Math.sin(w0) / (2 * Math.SQRT1_2);
    const cos = Math.cos(w0);
    const a0 = 1 + alpha;
    this.b0 = (1 - cos) / 2 / a0;
    this.b1 = (1 - cos) / a0;
    this.b2 = this.b0;
    this.a1 = (-2 * cos) / a0;
    this.a2 = (1 - alpha) / a0;
    this.x1 = 0; this.x2 = 0; this.y1 = 0; this.y2 = 0;
  }

  process(samples) {
    for (let i = 0; i < samples.length; i += 1) {
      const x = samples[i];
      const y = this.b0 * x + this.b1 * this.x1 + this.b2 * this.x2 - this.a1 * this.y1 - this.a2 * this.y2;
      this.x2 = this.x1; this.x1 = x;
      this.y2 = this.y1; this.y1 = y;
      samples[i] = y;
    }
  }
}

class CaptureProcessor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const opts = (options && options.processorOptions) || {};
    this.targetRate = opts.targetRate || 24000;
    this.chunkSize = Math.max(1, Math.round((this.targetRate * (opts.chunkMs || 100)) / 1000));
    this.step = sampleRate / this.targetRate; // input samples per output sample (`sampleRate` is the context's)
    this.filter = this.step > 1 ? new Lowpass(0.45 * this.targetRate, sampleRate) : null;
    this.position = 0; // where the next output sample lies, in input samples from the current block's start
    this.previous = 0; // the last input sample of the previous block (index -1)
    this.out = new Float32Array(this.chunkSize);
    this.filled = 0;
    this.port.onmessage = (event) => {
      if (event.data && event.data.type === "flush") {
        this.post(this.filled);
        this.port.postMessage({ type: "flushed" });
      }
    };
  }

  post(count) {
    if (count === 0) return;
    const samples = this.out.slice(0, count);
    let sum = 0;
    for (let i = 0; i < count; i += 1) sum += samples[i] * samples[i];
    this.port.postMessage({ type: "chunk", samples, rms: Math.sqrt(sum / count) }, [samples.buffer]);
    this.filled = 0;
  }

  process(inputs) {
    const channels = inputs[0];
    if (!channels || channels.length === 0 || channels[0].length === 0) return true;
    const n = channels[0].length;
    const mono = new Float32Array(n);
    for (const channel of channels) for (let i = 0; i < n; i += 1) mono[i] += channel[i];
    if (channels.length > 1) for (let i = 0; i < n; i += 1) mono[i] /= channels.length;
    if (this.filter) this.filter.process(mono);

    let t = this.position;
    while (t <= n - 1) {
      const i = Math.floor(t);
      const frac = t - i;
      const a = i < 0 ? this.previous : mono[i];
      const b = frac === 0 ? a : mono[i + 1];
      this.out[this.filled] = a + (b - a) * frac;
      this.filled += 1;
      if (this.filled === this.chunkSize) this.post(this.filled);
      t += this.step;
    }
    this.position = t - n;
    this.previous = mono[n - 1];
    return true;
  }
}

registerProcessor("omnipipe-capture", CaptureProcessor);

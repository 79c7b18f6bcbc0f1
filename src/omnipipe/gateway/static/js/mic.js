// The microphone as a stream of mono float32 chunks at 24 kHz (through capture-worklet.js).

const WORKLET_URL = "/static/js/capture-worklet.js";

export class MicCapture {
  /**
   * @param {object} options
   * @param {number} [options.targetRate=24000]
   * @param {number} [options.chunkMs=100] how much audio each onChunk call carries
   * @param {(samples: Float32Array, rms: number) => void} options.onChunk
   */
  constructor({ targetRate = 24000, chunkMs = 100, onChunk }) {
    this.targetRate = targetRate;
    this.chunkMs = chunkMs;
    this.onChunk = onChunk;
    this.stream = null;
    this.context = null;
    this.node = null;
    this.flushWaiters = [];
  }

  get active() {
    return this.stream !== null;
  }

  /** Ask for the microphone and start capturing. Throws a readable Error if that is impossible. */
  async start() {
    if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) {
      throw new Error("This browser gives no microphone access here (a microphone needs https or localhost).");
    }
    try {
      this.stream = await navigator.mediaDevices.getUserMedia({
        audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true, autoGainControl: true },
      });
    } catch (error) {
      const reason = error.name === "NotAllowedError" ? "permission was denied"
        : error.name === "NotFoundError" ? "no microphone was found" : error.message || error.name;
      throw new Error(`Cannot use the microphone: ${reason}.`);
    }
    try {
      this.context = new AudioContext({ latencyHint: "interactive" });
      await this.context.audioWorklet.addModule(WORKLET_URL);
      const source = this.context.createMediaStreamSource(this.stream);
      this.node = new AudioWorkletNode(this.context, "omnipipe-capture", {
        numberOfInputs: 1,
        numberOfOutputs: 1,
        channelCount: 1,
        processorOptions: { targetRate: this.targetRate, chunkMs: this.chunkMs },
      });
      this.node.port.onmessage = (event) => {
        const message = event.data;
        if (message.type === "chunk") this.onChunk(message.samples, message.rms);
        else if (message.type === "flushed") this.flushWaiters.splice(0).forEach((resolve) => resolve());
      };
      // A silent sink keeps the node pulled by the audio graph in every browser.
      const sink = this.context.createGain();
      sink.gain.value = 0;
      source.connect(this.node).connect(sink).connect(this.context.destination);
      if (this.context.state === "suspended") await this.context.resume();
    } catch (error) {
      await this.stop();
      throw new Error(`Cannot process microphone audio: ${error.message || error}`);
    }
  }

  /** Mute or unmute the microphone track (the browser's recording indicator stays on). */
  setEnabled(enabled) {
    if (this.stream) for (const track of this.stream.getAudioTracks()) track.enabled = enabled;
  }

  /** Deliver the partial chunk still in the worklet (waits at most 300 ms). */
  async flush() {
    if (!this.node) return;
    const flushed = new Promise((resolve) => { this.flushWaiters.push(resolve); });
    this.node.port.postMessage({ type: "flush" });
    await Promise.race([flushed, new Promise((resolve) => { setTimeout(resolve, 300); })]);
  }

  /** Stop capturing and release the microphone. */
  async stop() {
    if (this.stream) for (const track of this.stream.getTracks()) track.stop();
    this.stream = null;
    if (this.node) {
      this.node.port.onmessage = null;
      this.node.disconnect();
      this.node = null;
    }
    if (this.context) await this.context.close().catch(() => {});
    this.context = null;
  }
}

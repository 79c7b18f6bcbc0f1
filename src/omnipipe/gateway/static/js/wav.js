// WAV files and sample conversions: float32 <-> pcm16, 16-bit mono WAV encoding, and turning any audio file the
// browser can decode into a mono WAV at a chosen rate.

/** Float32 samples in [-1, 1] -> little-endian int16 bytes. */
export function floatToPcm16(samples) {
  const out = new Int16Array(samples.length);
  for (let i = 0; i < samples.length; i += 1) {
    const s = Math.max(-1, Math.min(1, samples[i]));
    out[i] = s < 0 ? Math.round(s * 0x8000) : Math.round(s * 0x7fff);
  }
  return out;
}

/** Little-endian int16 bytes -> Float32 samples (an odd trailing byte is ignored). */
export function pcm16ToFloat(bytes) {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const count = Math.floor(bytes.byteLength / 2);
  const out = new Float32Array(count);
  for (let i = 0; i < count; i += 1) out[i] = view.getInt16(i * 2, true) / 0x8000;
  return out;
}

/** Join Float32Array pieces. */
export function concatFloat32(pieces) {
  const total = pieces.reduce((n, p) => n + p.length, 0);
  const out = new Float32Array(total);
  let offset = 0;
  for (const piece of pieces) { out.set(piece, offset); offset += piece.length; }
  return out;
}

/** Join byte pieces (Uint8Array). */
export function concatBytes(pieces) {
  const total = pieces.reduce((n, p) => n + p.byteLength, 0);
  const out = new Uint8Array(total);
  let offset = 0;
  for (const piece of pieces) { out.set(piece, offset); offset += piece.byteLength; }
  return out;
}

/** A 16-bit PCM mono WAV file (Uint8Array) from int16 samples. */
export function wavFromPcm16(pcm, sampleRate) {
  const samples = pcm instanceof Int16Array ? pcm : new Int16Array(pcm.buffer, pcm.byteOffset, Math.floor(pcm.byteLength / 2));
  const dataBytes = samples.length * 2;
  const buffer = new ArrayBuffer(44 + dataBytes);
  const view = new DataView(buffer);
  const ascii = (offset, text) => { for (let i = 0; i < text.length; i += 1) view.setUint8(offset + i, text.charCodeAt(i)); };
  ascii(0, "RIFF");
  view.setUint32(4, 36 + dataBytes, true);
  ascii(8, "WAVE");
  ascii(12, "fmt ");
  view.setUint32(16, 16, true); // fmt chunk size
  view.setUint16(20, 1, true); // PCM
  view.setUint16(22, 1, true); // mono
  view.setUint32(24, sampleRate, true);
  view.setUint32(28, sampleRate * 2, true); // byte rate
  view.setUint16(32, 2, true); // block align
  view.setUint16(34, 16, true); // bits per sample
  ascii(36, "data");
  view.setUint32(40, dataBytes, true);
  new Int16Array(buffer, 44).set(samples);
  return new Uint8Array(buffer);
}

/** A 16-bit PCM mono WAV file (Uint8Array) from float samples. */
export function encodeWav(samples, sampleRate) {
  return wavFromPcm16(floatToPcm16(samples), sampleRate);
}

/**
 * Decode an audio file with the browser's decoders and re-encode it as a mono 16-bit WAV at `sampleRate`.
 * Returns {wav: Uint8Array, duration: seconds}. Throws if the browser cannot decode the file.
 */
export async function fileToWav(file, sampleRate = 24000) {
  const data = await file.arrayBuffer();
  const probe = new OfflineAudioContext(1, 1, sampleRate);
  let decoded;
  try {
    decoded = await probe.decodeAudioData(data);
  } catch (error) {
    throw new Error(`This browser cannot decode "${file.name}" as audio (${error.message || error.name}).`);
  }
  const frames = Math.max(1, Math.ceil(decoded.duration * sampleRate));
  const offline = new OfflineAudioContext(1, frames, sampleRate); // rendering into 1 channel downmixes
  const source = offline.createBufferSource();
  source.buffer = decoded;
  source.connect(offline.destination);
  source.start();
  const rendered = await offline.startRendering();
  return { wav: encodeWav(rendered.getChannelData(0), sampleRate), duration: decoded.duration };
}

// The camera for a live session: a preview in a <video>, the choice among the browser's cameras, and still frames
// taken from the preview as JPEG data URLs (what `input_video_frame.append` carries).

const MAX_WIDTH = 640; // a frame is scaled down to this width (never up)
const QUALITIES = [0.7, 0.5, 0.3]; // the first whose frame fits under MAX_FRAME_CHARS is sent
export const MAX_FRAME_CHARS = 512 * 1024; // the server takes frames of at most 512 KiB

export class Camera {
  /** @param {HTMLVideoElement} video the preview */
  constructor(video) {
    this.video = video;
    this.stream = null;
    this.canvas = document.createElement("canvas");
  }

  get active() {
    return this.stream !== null;
  }

  /** The id of the camera in use ("" when none). */
  get deviceId() {
    const track = this.stream ? this.stream.getVideoTracks()[0] : null;
    return (track && track.getSettings().deviceId) || "";
  }

  /** Open the camera `deviceId` (the browser's choice when empty) and show it; replaces the one open. Throws a
   * readable Error when it cannot. */
  async start(deviceId = "") {
    if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) {
      throw new Error("This browser gives no camera access here (a camera needs https or localhost).");
    }
    let stream;
    try {
      stream = await navigator.mediaDevices.getUserMedia({
        video: deviceId ? { deviceId: { exact: deviceId } } : { width: { ideal: MAX_WIDTH } }, audio: false,
      });
    } catch (error) {
      const reason = error.name === "NotAllowedError" ? "permission was denied"
        : error.name === "NotFoundError" ? "no camera was found" : error.message || error.name;
      throw new Error(`Cannot use the camera: ${reason}.`);
    }
    this.stop();
    this.stream = stream;
    this.video.srcObject = stream;
    await this.video.play().catch(() => {}); // a muted preview plays without a gesture; a failure shows nothing
  }

  /** The browser's cameras: [{deviceId, label}] (labels are known once a camera was allowed). */
  async cameras() {
    if (!navigator.mediaDevices || !navigator.mediaDevices.enumerateDevices) return [];
    const devices = await navigator.mediaDevices.enumerateDevices();
    return devices.filter((device) => device.kind === "videoinput")
      .map((device, index) => ({ deviceId: device.deviceId, label: device.label || `Camera ${index + 1}` }));
  }

  /** Close the camera and blank the preview. */
  stop() {
    if (this.stream) for (const track of this.stream.getTracks()) track.stop();
    this.stream = null;
    this.video.srcObject = null;
  }

  /** The preview's picture now, as the camera sees it (never mirrored): {url (JPEG data URL), width, height}; null
   * while there is no picture yet, or none fits the server's size limit. */
  grab() {
    const { videoWidth, videoHeight } = this.video;
    if (!this.stream || !videoWidth || !videoHeight) return null;
    const scale = Math.min(1, MAX_WIDTH / videoWidth);
    const width = Math.round(videoWidth * scale);
    const height = Math.round(videoHeight * scale);
    this.canvas.width = width;
    this.canvas.height = height;
    this.canvas.getContext("2d").drawImage(this.video, 0, 0, width, height);
    for (const quality of QUALITIES) {
      const url = this.canvas.toDataURL("image/jpeg", quality);
      if (url.length <= MAX_FRAME_CHARS) return { url, width, height };
    }
    return null;
  }
}

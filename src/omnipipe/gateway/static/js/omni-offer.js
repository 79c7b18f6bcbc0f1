// Whether the served model can see the camera: the omni page is offered only when /v1/models says its first
// model takes images or video (`input_modalities`).

import { servedModel } from "./api.js";

/** True when `model` (as servedModel() gives it) takes images or video. */
export function seesFrames(model) {
  return Boolean(model.input && (model.input.includes("image") || model.input.includes("video")));
}

/** True when the served model takes images or video (false while no worker answers). */
export async function omniOffered() {
  return seesFrames(await servedModel());
}

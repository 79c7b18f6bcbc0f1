// The omni page's strip of the last camera frames sent, newest last; a frame is marked once the server says it
// went with a turn (the user item's `input_image` parts carry the `captured_at_ms` of each frame used).

import { h } from "./dom.js";

const SHOWN = 12; // frames kept on the strip

export class FrameStrip {
  /** @param {HTMLElement} container where the frames go (its ".placeholder" is removed by the first) */
  constructor(container) {
    this.container = container;
    this.turns = 0;
  }

  /** Show a frame sent: its JPEG data URL, its capture time and a caption (when it was taken). */
  add(url, capturedAt, caption) {
    this.container.querySelector(".placeholder")?.remove();
    const figure = h("figure", { class: "frame", dataset: { capturedAt: String(capturedAt) } },
      h("img", { src: url, alt: `Camera frame sent at ${caption}` }), h("figcaption", {}, caption));
    this.container.append(figure);
    const frames = this.container.querySelectorAll("figure.frame");
    for (let i = 0; i < frames.length - SHOWN; i += 1) frames[i].remove();
    this.container.scrollLeft = this.container.scrollWidth;
  }

  /** Mark the frames captured at `capturedAts` as gone with the next turn; returns how many of them are shown. */
  markUsed(capturedAts) {
    this.turns += 1;
    const wanted = new Set(capturedAts.map(String));
    let shown = 0;
    for (const figure of this.container.querySelectorAll("figure.frame")) {
      if (!wanted.has(figure.dataset.capturedAt)) continue;
      figure.classList.add("used");
      figure.querySelector("figcaption").append(h("span", { class: "turn-mark" }, `turn ${this.turns}`));
      shown += 1;
    }
    return shown;
  }

  /** Forget the frames shown (a new session). */
  clear(placeholder) {
    this.turns = 0;
    this.container.replaceChildren(h("p", { class: "placeholder" }, placeholder));
  }
}

// The voice page's transcript: what the user said and what the assistant answered, one entry each, newest last.
//
// Each entry is shown as a message (who, the words, a tag such as "spoken" or "interrupted", notes under it) and
// kept as {role, text, status} in a plain list the page hands out to tests (window.omnipipeVoice.transcript).

import { h } from "./dom.js";

export class VoiceTranscript {
  /**
   * @param {HTMLElement} container where the messages go (its ".placeholder" is removed by the first)
   * @param {Array<{role: string, text: string, status: string}>} entries the list each entry is also added to
   */
  constructor(container, entries) {
    this.container = container;
    this.entries = entries;
  }

  /** A new message at the end: {entry, bubble, tagEl, el}. */
  add(role, text) {
    this.container.querySelector(".placeholder")?.remove();
    const entry = { role, text, status: "" };
    this.entries.push(entry);
    const bubble = h("div", { class: "bubble" }, text);
    const tagEl = h("span", { class: "tag" });
    const el = h("article", { class: `msg ${role}` },
      h("span", { class: "who" }, role === "user" ? "You" : "Assistant"), bubble, tagEl);
    this.container.append(el);
    this.scrollToEnd();
    return { entry, bubble, tagEl, el };
  }

  /** Replace a message's words. */
  setText(item, text) {
    item.entry.text = text;
    item.bubble.textContent = text;
    this.scrollToEnd();
  }

  /** Mark a message ("spoken", "interrupted", "failed"): its status, and the tag shown beside it. */
  setTag(item, status, text) {
    item.entry.status = status;
    item.tagEl.textContent = text;
  }

  /** A line under a message (e.g. how long its answer took to begin). */
  addNote(item, note) {
    item.el.append(note);
    this.scrollToEnd();
  }

  scrollToEnd() {
    this.container.scrollTop = this.container.scrollHeight;
  }
}

// The session viewer's "Share" button (/s/{session_id} only): POST /api/sessions/{id}/share makes a read-only link
// (/shared/{token}; the admin page lists and revokes links), shown ready to copy. Self-contained: it adds itself to
// the page title bar and touches nothing else on the page.

import { describeError, fetchJSON } from "./api.js";
import { $, h } from "./dom.js";

const match = window.location.pathname.match(/^\/s\/([A-Za-z0-9_-]{1,128})\/?$/);

function mountShareButton(bar, sessionId) {
  const button = h("button", { type: "button", id: "share", class: "btn" }, "Share");
  const link = h("input", { type: "text", id: "share-url", readonly: true, "aria-label": "Share link" });
  const copy = h("button", { type: "button", id: "share-copy", class: "btn small" }, "Copy");
  const note = h("span", { class: "small muted", role: "status" });
  const box = h("div", { id: "share-box", class: "share-box hidden" }, link, copy, note);
  bar.append(button);
  bar.after(box);

  button.addEventListener("click", async () => {
    button.disabled = true;
    note.textContent = "";
    try {
      const made = await fetchJSON(`/api/sessions/${encodeURIComponent(sessionId)}/share`, { method: "POST" });
      link.value = new URL(made.url, window.location.origin).href;
      note.textContent = "Anyone with this link can view this session (not change it) until an admin revokes it.";
      box.classList.remove("hidden");
      link.select();
    } catch (error) {
      note.textContent = `Cannot make a share link: ${describeError(error)}`;
      box.classList.remove("hidden");
    } finally {
      button.disabled = false;
    }
  });
  copy.addEventListener("click", async () => {
    link.select();
    try {
      await navigator.clipboard.writeText(link.value);
      note.textContent = "Copied.";
    } catch {
      note.textContent = "Press Ctrl+C (or Cmd+C) to copy the selected link.";
    }
  });
}

if (match) mountShareButton($(".page-title"), match[1]);

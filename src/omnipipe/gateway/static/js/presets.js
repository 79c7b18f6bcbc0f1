// Preset selector: the gateway's named presets (GET /api/presets -> {presets: [{name, instructions, voice,
// output_modalities}]}) in a <select> a page mounts. Hidden when the gateway has none (or cannot be asked).
//
// API, for any page (chat, voice, omni):
//   const presets = mountPresetSelector(container, { onChange(preset) {...}, storageKey: "omnipipe.preset.chat" });
//   presets.current()   -> the chosen preset, or null for "None" (the page's own settings)
//   await presets.ready -> the list the gateway served ([] when none)
// onChange runs after the list arrived (with the remembered choice) and on every choice; the choice is remembered
// per storageKey; the container's data-presets says how many arrived. A page applies the preset itself:
// chatMessages() and realtimeSession() below say how; presets.element (the <select>) can be disabled while a
// session runs.

import { fetchJSON } from "./api.js";
import { h, setChildren } from "./dom.js";

const NONE = "";

/** Mount the selector into `container` (an empty element); see the API above. */
export function mountPresetSelector(container, { onChange = () => {}, storageKey = "omnipipe.preset" } = {}) {
  let presets = [];
  const select = h("select", { id: "preset", "aria-describedby": "preset-hint" });
  const hint = h("span", { id: "preset-hint", class: "hint" });
  container.classList.add("preset-selector", "hidden");
  container.replaceChildren(h("label", { class: "field", for: "preset" }, "Preset", select, hint));

  const current = () => presets.find((preset) => preset.name === select.value) || null;
  const describe = (preset) => {
    if (!preset) return "The page's own settings.";
    const answers = preset.output_modalities.includes("audio") ? "Spoken and written answers" : "Written answers";
    return `${answers}${preset.voice ? `, voice ${preset.voice}` : ""}${preset.instructions ? ", own instructions" : ""}.`;
  };
  const changed = () => {
    localStorage.setItem(storageKey, select.value);
    hint.textContent = describe(current());
    if (current()) hint.title = current().instructions;
    else hint.removeAttribute("title");
    onChange(current());
  };
  select.addEventListener("change", changed);

  const ready = fetchJSON("/api/presets").then((body) => body.presets || []).catch(() => []).then((list) => {
    presets = list;
    container.dataset.presets = String(presets.length);
    if (!presets.length) return presets;
    setChildren(select, h("option", { value: NONE }, "None"),
      presets.map((preset) => h("option", { value: preset.name }, preset.name)));
    const remembered = localStorage.getItem(storageKey);
    select.value = presets.some((preset) => preset.name === remembered) ? remembered : NONE;
    container.classList.remove("hidden");
    changed();
    return presets;
  });
  return { current, ready, element: select };
}

/** A chat request's messages with the preset's instructions as the system message in front (none without). */
export function chatMessages(preset, messages) {
  return preset && preset.instructions ? [{ role: "system", content: preset.instructions }, ...messages] : messages;
}

/** `session` (a realtime `session.update`'s session) with the preset applied: its instructions, its voice, and
 * output_modalities ["audio"] (which carries its transcript) or ["text"]. Without a preset, `session` as it is. */
export function realtimeSession(preset, session) {
  if (!preset) return session;
  const audio = session.audio || {};
  return { ...session, instructions: preset.instructions,
    output_modalities: preset.output_modalities.includes("audio") ? ["audio"] : ["text"],
    audio: preset.voice ? { ...audio, output: { ...(audio.output || {}), voice: preset.voice } } : audio };
}

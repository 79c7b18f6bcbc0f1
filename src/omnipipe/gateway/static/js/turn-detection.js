// When a spoken session's turn ends: the voice and omni pages' choice between the server VAD (the turn ends at a
// pause) and semantic VAD (an end-of-turn model hears whether the sentence is finished, so a pause mid-sentence
// waits longer), with semantic VAD's eagerness. The choice is remembered per page.
//
// API:
//   const turns = mountTurnDetection(container, { storageKey: "omnipipe.turn.voice", onChange(detection) {...} });
//   turns.current()  -> the session's audio.input.turn_detection for the choice
//   turns.element    -> the <select>
// onChange runs on every choice (not at mount).

import { h } from "./dom.js";

export const TURN_CHOICES = [
  { value: "pause", label: "When I pause", hint: "Answers after a short silence.",
    detection: { type: "server_vad" } },
  { value: "finish", label: "When I finish", hint: "Hears whether you finished your sentence: a pause mid-sentence waits longer.",
    detection: { type: "semantic_vad", eagerness: "auto" } },
  { value: "finish-patient", label: "When I finish, patiently", hint: "Waits up to 3 s on an unfinished sentence.",
    detection: { type: "semantic_vad", eagerness: "low" } },
  { value: "finish-quick", label: "When I finish, quickly", hint: "Cuts in sooner: at most 0.8 s on an unfinished sentence.",
    detection: { type: "semantic_vad", eagerness: "high" } },
];

/** Mount the choice into `container` (an empty element); see the API above. */
export function mountTurnDetection(container, { storageKey, onChange = () => {} }) {
  const select = h("select", { id: "turn-detection-choice", "aria-describedby": "turn-detection-hint" },
    TURN_CHOICES.map((choice) => h("option", { value: choice.value }, choice.label)));
  const hint = h("span", { id: "turn-detection-hint", class: "hint" });
  container.classList.add("preset-selector");
  container.replaceChildren(h("label", { class: "field", for: "turn-detection-choice" }, "Answer", select, hint));
  const chosen = () => TURN_CHOICES.find((choice) => choice.value === select.value) || TURN_CHOICES[0];
  const remembered = localStorage.getItem(storageKey);
  select.value = TURN_CHOICES.some((choice) => choice.value === remembered) ? remembered : TURN_CHOICES[0].value;
  hint.textContent = chosen().hint;
  select.addEventListener("change", () => {
    localStorage.setItem(storageKey, select.value);
    hint.textContent = chosen().hint;
    onChange(chosen().detection);
  });
  return { current: () => ({ ...chosen().detection }), element: select };
}

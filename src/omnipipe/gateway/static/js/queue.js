// The wait in the gateway's queue as the chat and voice pages show it.
//
// Each queue message ("queued", "queue_update") carries the place, the estimated wait in seconds (null when no
// worker slot serves the queue) and whether the service is starting (workers still loading their models). Between
// messages the page counts the wait down itself, one second at a time, never below zero ("any moment now" at zero);
// each message from the gateway sets it again.

import { formatWait } from "./dom.js";

export const STARTING_TEXT = "the service is starting (models loading)";
export const NO_WORKER_TEXT = "no worker is available right now";
export const ANY_MOMENT_TEXT = "any moment now";

/** "You are next in the queue", "You are number 3 in the queue"; place 0 is being connected. */
export function placeText(position) {
  if (position <= 0) return "Connecting to a worker…";
  return position === 1 ? "You are next in the queue" : `You are number ${position} in the queue`;
}

/** The wait, from whole seconds left: "estimated wait about 12 s", or "any moment now" at zero. */
export function waitText(seconds) {
  return seconds <= 0 ? ANY_MOMENT_TEXT : `estimated wait ${formatWait(seconds)}`;
}

/** Counts the last estimate down; `onChange(place, wait)` is called on each message and on each tick that changes
 * what is shown (`wait` is "" while being connected). */
export class QueueCountdown {
  constructor(onChange) {
    this.onChange = onChange;
    this.timer = null;
    this.deadline = null;
    this.place = "";
    this.wait = "";
  }

  /** A queue message from the gateway: show it and count its estimate down from now. */
  update(event) {
    this.stop();
    const position = Number(event.position ?? 0);
    const estimate = event.estimated_wait_s;
    this.place = placeText(position);
    if (position <= 0) this.wait = "";
    else if (event.starting) this.wait = STARTING_TEXT;
    else if (estimate === null || estimate === undefined || !Number.isFinite(Number(estimate))) this.wait = NO_WORKER_TEXT;
    else {
      this.deadline = performance.now() + Math.max(0, Number(estimate)) * 1000;
      this.wait = waitText(this.secondsLeft());
      if (this.secondsLeft() > 0) this.timer = setInterval(() => this.tick(), 1000);
    }
    this.onChange(this.place, this.wait);
  }

  /** Whole seconds left of the last estimate, never below zero. */
  secondsLeft() {
    if (this.deadline === null) return 0;
    return Math.max(0, Math.round((this.deadline - performance.now()) / 1000));
  }

  tick() {
    const left = this.secondsLeft();
    const wait = waitText(left);
    if (left === 0) {
      clearInterval(this.timer);
      this.timer = null;
    }
    if (wait !== this.wait) {
      this.wait = wait;
      this.onChange(this.place, wait);
    }
  }

  /** Stop counting (served, cancelled, or the page left the queue). */
  stop() {
    if (this.timer !== null) clearInterval(this.timer);
    this.timer = null;
    this.deadline = null;
  }
}

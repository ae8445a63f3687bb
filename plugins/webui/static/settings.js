// The settings panel of the open conversation: its system prompt and sampler values.
// Each conversation keeps its own; an empty box means the server's default.

import { api } from "./api.js";
import { SAMPLERS } from "./conversation.js";
import { isLoaded, picker } from "./model-picker.js";

const panel = document.getElementById("chat-settings");
const toggle = document.getElementById("settings-toggle");
const system = document.getElementById("set-system");
const grid = document.getElementById("settings-samplers");
const more = document.getElementById("settings-more");
const moreGrid = document.getElementById("settings-more-samplers");
const inputs = {};
let conversation = null;
let changed = () => {};

for (const s of SAMPLERS) {
  const label = document.createElement("label");
  label.textContent = s.label;
  const input = document.createElement("input");
  input.type = "number";
  input.id = "set-" + s.name;
  input.name = s.name;
  input.step = s.step;
  if (s.min) input.min = s.min;
  if (s.max) input.max = s.max;
  input.placeholder = s.hint;
  input.inputMode = s.integer ? "numeric" : "decimal";
  label.appendChild(input);
  (s.more ? moreGrid : grid).appendChild(label);
  inputs[s.name] = input;
}

function countSet() {
  const n = SAMPLERS.filter((s) => conversation.settings[s.name] !== undefined).length +
    (conversation.settings.system ? 1 : 0);
  toggle.textContent = n ? `Settings (${n})` : "Settings";
}

function store(name, value) {
  if (!conversation) return;
  if (value === "") delete conversation.settings[name];
  else conversation.settings[name] = value;
  countSet();
  changed();
}

// "change" as well as "input": a box emptied by a script or the browser's autofill fires
// only the former
for (const type of ["input", "change"]) {
  system.addEventListener(type, () => store("system", system.value));
  for (const [name, input] of Object.entries(inputs)) {
    // a value the box itself rejects (out of range, not a number) is not kept
    input.addEventListener(type, () => { if (input.validity.valid) store(name, input.value); });
  }
}
// The greyed hint of an empty box: the server's default for a request that sets none
// (tessera serve --temp ... changes them), the usual one (with its note) when they agree.
function hintOf(s, value) {
  if (typeof value !== "number" || value === parseFloat(s.hint)) return s.hint;
  // llama-server reports a random seed as -1 or as 4294967295 (its uint32 default seed)
  if (s.name === "seed" && (value < 0 || value === 4294967295)) return "random";
  if (s.name === "max_tokens" && value < 0) return "until the end";
  return String(value);
}

// Asked only of a loaded model: /props of one not loaded would load it.
async function showServerDefaults() {
  if (panel.hidden || !isLoaded(picker.value)) return;
  let params;
  try {
    params = (await api("/props?model=" + encodeURIComponent(picker.value)))
      .default_generation_settings.params;
  } catch (e) {
    return;  // the usual hints stay (an older server, /props off, a key not yet given)
  }
  for (const s of SAMPLERS) inputs[s.name].placeholder = hintOf(s, params[s.name]);
}

toggle.addEventListener("click", () => {
  panel.hidden = !panel.hidden;
  toggle.setAttribute("aria-expanded", String(!panel.hidden));
  showServerDefaults();
});
picker.addEventListener("change", showServerDefaults);
document.getElementById("settings-reset").addEventListener("click", () => {
  for (const s of SAMPLERS) delete conversation.settings[s.name];
  showSettings(conversation);
  changed();
});

// Show a conversation's settings; onChange() is called after each edit.
export function showSettings(conv, onChange) {
  conversation = conv;
  if (onChange) changed = onChange;
  system.value = conv.settings.system || "";
  for (const s of SAMPLERS) {
    const v = conv.settings[s.name];
    inputs[s.name].value = v === undefined ? "" : v;
  }
  // folded unless the conversation sets one of them
  more.open = SAMPLERS.some((s) => s.more && conv.settings[s.name] !== undefined);
  countSet();
}

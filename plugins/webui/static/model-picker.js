// The chat's model picker: favourites first, hidden models left out, "(loaded)" marked.

import { api, status } from "./api.js";

export const picker = document.getElementById("chat-model");
const loaded = new Set();

// Whether the server has the model loaded (as of the last fill).
export function isLoaded(name) {
  return loaded.has(name);
}

export async function fillPicker() {
  let names;
  try {
    const data = await api("/api/models");
    loaded.clear();
    for (const m of data.models) if (m.state === "loaded") loaded.add(m.name);
    const rows = data.models.filter((m) => !m.hidden);
    rows.sort((a, b) => (b.favourite - a.favourite) || a.name.localeCompare(b.name));
    names = rows.map((m) => [m.name, (m.favourite ? "\u2605 " : "") + m.name +
      (m.state === "loaded" ? " (loaded)" : "")]);
  } catch (e) {
    status(e.message);
    return;
  }
  const key = JSON.stringify(names);
  if (picker.dataset.key === key) return;
  const current = picker.value;
  picker.dataset.key = key;
  picker.replaceChildren(...names.map(([value, label]) => new Option(label, value)));
  if (names.some(([value]) => value === current)) picker.value = current;
}

// Show a conversation's model when the server still has it; true if it does.
export function selectModel(name) {
  if (name && [...picker.options].some((o) => o.value === name)) {
    picker.value = name;
    return true;
  }
  return false;
}

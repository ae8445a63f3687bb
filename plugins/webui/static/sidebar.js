// The conversation list: open, rename and delete a conversation, start a new one,
// export them all as JSON and import such a file back.

import { deleteConversation, getConversation, listConversations, putConversation } from "./store.js";
import { newId } from "./conversation.js";

const list = document.getElementById("conversation-list");
const importInput = document.getElementById("conv-import-file");
const FORMAT = "tessera-conversations";
let hooks = null;
let currentId = null;

function item(conv) {
  const li = document.createElement("li");
  li.className = "conv" + (conv.id === currentId ? " active" : "");
  li.dataset.id = conv.id;
  const title = document.createElement("button");
  title.type = "button";
  title.className = "conv-title";
  title.dataset.action = "open";
  title.textContent = conv.title;
  title.title = conv.title;
  const rename = document.createElement("button");
  rename.type = "button";
  rename.className = "conv-icon";
  rename.dataset.action = "rename";
  rename.title = "Rename";
  rename.textContent = "\u270e";
  const remove = rename.cloneNode();
  remove.dataset.action = "delete";
  remove.title = "Delete";
  remove.textContent = "\u00d7";
  li.append(title, rename, remove);
  return li;
}

let renaming = false;

export async function renderSidebar(activeId) {
  currentId = activeId;
  if (renaming) return;  // the name being typed stays; the list is drawn when it is saved
  const all = await listConversations();
  if (!renaming) list.replaceChildren(...all.map(item));
}

function startRename(li) {
  const title = li.querySelector(".conv-title");
  const box = document.createElement("input");
  box.className = "conv-rename";
  box.value = title.textContent;
  title.replaceWith(box);
  box.focus();
  box.select();
  renaming = true;
  let done = false;
  const finish = async (save) => {
    if (done) return;
    done = true;
    renaming = false;
    const conv = await getConversation(li.dataset.id);
    const name = box.value.trim();
    if (save && conv && name) {
      conv.title = name;
      await putConversation(conv);
      hooks.onChanged(conv);
    }
    await renderSidebar(currentId);
  };
  box.addEventListener("keydown", (e) => {
    if (e.key === "Enter") finish(true);
    if (e.key === "Escape") finish(false);
  });
  box.addEventListener("blur", () => finish(true));
}

async function exportAll() {
  const data = { format: FORMAT, version: 1, exported: new Date().toISOString(),
    conversations: await listConversations() };
  const blob = new Blob([JSON.stringify(data, null, 1)], { type: "application/json" });
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob);
  a.download = "tessera-conversations-" + data.exported.slice(0, 10) + ".json";
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 1000);
}

function valid(conv) {
  return conv && typeof conv === "object" && Array.isArray(conv.messages) &&
    conv.messages.every((m) => m && typeof m.role === "string" && typeof m.content === "string");
}

// An export file, a list of conversations or one conversation; returns how many came in.
async function importFile(file) {
  let data;
  try {
    data = JSON.parse(await file.text());
  } catch (e) {
    throw new Error(file.name + " is not JSON; import a file exported from this page");
  }
  const convs = Array.isArray(data) ? data : data.format === FORMAT ? data.conversations : [data];
  if (!Array.isArray(convs) || !convs.every(valid)) {
    throw new Error(file.name + " holds no conversations; import a file exported from this page");
  }
  for (const conv of convs) {
    const existing = conv.id ? await getConversation(conv.id) : null;
    if (existing && existing.updated === conv.updated) continue;  // already here
    const now = Date.now();
    await putConversation(Object.assign({ title: "Imported chat", created: now, updated: now,
      model: "", settings: {} }, conv, { id: existing || !conv.id ? newId() : conv.id }));
  }
  return convs.length;
}

export function initSidebar(callbacks) {
  hooks = callbacks;
  list.addEventListener("click", async (e) => {
    const b = e.target.closest("button[data-action]");
    if (!b) return;
    const li = b.closest("li.conv");
    if (b.dataset.action === "open") hooks.onSelect(li.dataset.id);
    if (b.dataset.action === "rename") startRename(li);
    if (b.dataset.action === "delete") {
      const title = li.querySelector(".conv-title").textContent;
      if (!confirm(`Delete the conversation '${title}'?`)) return;
      await deleteConversation(li.dataset.id);
      hooks.onDeleted(li.dataset.id);
    }
  });
  document.getElementById("chat-new").addEventListener("click", () => hooks.onNew());
  document.getElementById("conv-export").addEventListener("click", () => exportAll());
  importInput.addEventListener("change", async () => {
    for (const file of importInput.files) {
      try {
        const n = await importFile(file);
        hooks.onImported(n);
      } catch (err) {
        hooks.onError(err.message);
      }
    }
    importInput.value = "";
  });
}

// The Models Manager: every model with its facts and state, sorting, filtering (text,
// architecture, quant type), the actions (load, unload, hide, favourite, delete, details),
// and downloads with their progress.

import { api, status } from "./api.js";
import { showDetails } from "./model-details.js";

export function initModels() {
  const tbody = document.querySelector("#models-table tbody");
  const dlBody = document.querySelector("#downloads-table tbody");
  const filterInput = document.getElementById("models-filter");
  const archSelect = document.getElementById("models-arch");
  const quantSelect = document.getElementById("models-quant");
  const showHidden = document.getElementById("show-hidden");
  const info = document.getElementById("models-info");
  let data = { models: [], downloads: [], manageable: false };
  let sortKey = "name";
  let sortDir = 1;
  let rendered = "";
  let timer = null;

  function mib(bytes) {
    if (bytes === null || bytes === undefined) return "";
    return (bytes / 1048576).toFixed(1) + " MiB";
  }

  function button(label, action, name, extra) {
    const b = document.createElement("button");
    b.type = "button";
    b.textContent = label;
    b.dataset.action = action;
    b.dataset.name = name;
    if (extra) Object.assign(b.dataset, extra);
    return b;
  }

  function cell(tr, text, cls) {
    const td = document.createElement("td");
    td.textContent = text === undefined || text === null ? "" : String(text);
    if (cls) td.className = cls;
    tr.appendChild(td);
    return td;
  }

  // The architectures and quant types present, as the choices of their filters.
  function fillChoices(select, key, all) {
    const values = [...new Set(data.models.map((m) => m[key]).filter((v) => v))].sort();
    const signature = JSON.stringify(values);
    if (select.dataset.values === signature) return;
    select.dataset.values = signature;
    const current = select.value;
    select.replaceChildren(new Option(all, ""), ...values.map((v) => new Option(v, v)));
    select.value = values.includes(current) ? current : "";
  }

  function visibleRows() {
    const words = filterInput.value.trim().toLowerCase();
    const rows = data.models.filter((m) => {
      if (m.hidden && !showHidden.checked) return false;
      if (archSelect.value && m.arch !== archSelect.value) return false;
      if (quantSelect.value && m.quant !== quantSelect.value) return false;
      const hay = [m.name, m.arch, m.quant, m.state].join(" ").toLowerCase();
      return !words || hay.includes(words);
    });
    rows.sort((a, b) => {
      let x = a[sortKey], y = b[sortKey];
      if (typeof x === "boolean") { x = Number(x); y = Number(y); }
      if (x === null || x === undefined) x = "";
      if (y === null || y === undefined) y = "";
      const c = typeof x === "number" && typeof y === "number" ? x - y : String(x).localeCompare(String(y));
      return c * sortDir || a.name.localeCompare(b.name);
    });
    return rows;
  }

  function renderModels() {
    fillChoices(archSelect, "arch", "All architectures");
    fillChoices(quantSelect, "quant", "All quant types");
    const rows = visibleRows();
    const key = JSON.stringify([rows, sortKey, sortDir, data.manageable]);
    if (key === rendered) return;
    rendered = key;
    tbody.replaceChildren();
    for (const m of rows) {
      const tr = document.createElement("tr");
      tr.dataset.name = m.name;
      tr.dataset.state = m.state;
      if (m.hidden) tr.classList.add("hidden-model");
      const fav = cell(tr, "");
      if (data.manageable) {
        const b = button(m.favourite ? "\u2605" : "\u2606", "favourite", m.name);
        b.className = "fav";
        b.title = m.favourite ? "Remove from favourites" : "Mark as favourite";
        fav.appendChild(b);
      }
      const nameCell = cell(tr, "", "name");
      const details = button(m.name, "details", m.name);
      details.className = "model-name";
      details.title = "Show this model's metadata";
      nameCell.appendChild(details);
      cell(tr, mib(m.size), "num");
      cell(tr, m.arch);
      cell(tr, m.quant);
      cell(tr, m.n_ctx ? m.n_ctx + " / " + m.n_ctx_train : m.n_ctx_train, "num");
      const st = cell(tr, m.state + (m.in_use ? " (in use)" : ""), "state state-" + m.state);
      if (m.error) {
        const e = document.createElement("span");
        e.className = "error-text";
        e.textContent = m.error;
        st.appendChild(e);
      }
      const actions = cell(tr, "", "actions");
      if (data.manageable) {
        if (m.state === "loaded") actions.appendChild(button("Unload", "unload", m.name));
        else actions.appendChild(button("Load", "load", m.name, m.state === "loading" ? { busy: "1" } : null));
        actions.appendChild(button(m.hidden ? "Unhide" : "Hide", "hide", m.name));
        const del = button("Delete", "delete", m.name);
        del.disabled = !m.deletable;
        if (!m.deletable) del.title = "only files in the models directory can be deleted";
        actions.appendChild(del);
      }
      tbody.appendChild(tr);
    }
    for (const th of document.querySelectorAll("#models-table th[data-key]")) {
      th.classList.toggle("sorted-asc", th.dataset.key === sortKey && sortDir === 1);
      th.classList.toggle("sorted-desc", th.dataset.key === sortKey && sortDir === -1);
    }
    const loaded = data.models.filter((m) => m.state === "loaded").length;
    info.textContent = data.manageable
      ? `${data.models.length} models, ${loaded} loaded (at most ${data.models_max}) \u00b7 ${data.models_dir || "no models directory"}`
      : "one model (-m): start the server with --models-dir DIR to manage models";
  }

  function renderDownloads() {
    dlBody.replaceChildren();
    for (const d of data.downloads) {
      const tr = document.createElement("tr");
      tr.dataset.id = d.id;
      tr.dataset.state = d.state;
      cell(tr, d.filename, "name");
      const p = cell(tr, "");
      const bar = document.createElement("progress");
      bar.max = d.total_bytes || 1;
      bar.value = d.total_bytes ? d.done_bytes : 0;
      p.appendChild(bar);
      p.appendChild(document.createTextNode(" " + mib(d.done_bytes) + (d.total_bytes ? " / " + mib(d.total_bytes) : "")));
      const st = cell(tr, d.state, "state");
      if (d.error) {
        const e = document.createElement("span");
        e.className = "error-text";
        e.textContent = d.error;
        st.appendChild(e);
      }
      const actions = cell(tr, "", "actions");
      if (d.state === "downloading") actions.appendChild(button("Pause", "dl-pause", d.filename, { id: d.id }));
      if (d.state === "paused" || d.state === "interrupted") actions.appendChild(button("Resume", "dl-resume", d.filename, { id: d.id }));
      if (["downloading", "paused", "interrupted", "failed"].includes(d.state)) actions.appendChild(button("Cancel", "dl-cancel", d.filename, { id: d.id }));
      dlBody.appendChild(tr);
    }
  }

  async function refresh() {
    try {
      data = await api("/api/models");
    } catch (e) {
      status(e.message);
      return;
    }
    renderModels();
    const dlKey = JSON.stringify(data.downloads);
    if (dlKey !== dlBody.dataset.key) {
      dlBody.dataset.key = dlKey;
      renderDownloads();
    }
  }

  function poll() {
    clearTimeout(timer);
    if (document.getElementById("page-models").hidden) return;
    refresh().finally(() => { timer = setTimeout(poll, 700); });
  }

  async function act(b) {
    const name = b.dataset.name;
    const m = data.models.find((x) => x.name === name);
    status("");
    try {
      switch (b.dataset.action) {
        case "details": await showDetails(name); return;
        case "load": b.disabled = true; b.textContent = "Loading\u2026"; await api("/api/models/load", { model: name }); break;
        case "unload": await api("/api/models/unload", { model: name }); break;
        case "hide": await api("/api/models/hide", { model: name, hidden: !m.hidden }); break;
        case "favourite": await api("/api/models/favourite", { model: name, favourite: !m.favourite }); break;
        case "delete": {
          const loaded = m.state === "loaded";
          const q = loaded ? `'${name}' is loaded. Unload it and delete it from disk?` : `Delete '${name}' from disk?`;
          if (!confirm(q)) return;
          await api("/api/models/delete", { model: name, force: loaded });
          break;
        }
        case "dl-pause": await api("/api/downloads/pause", { id: b.dataset.id }); break;
        case "dl-resume": await api("/api/downloads/resume", { id: b.dataset.id }); break;
        case "dl-cancel": await api("/api/downloads/cancel", { id: b.dataset.id }); break;
        default: return;
      }
    } catch (e) {
      status(e.message);
    }
    rendered = "";
    await refresh();
  }

  document.getElementById("page-models").addEventListener("click", (e) => {
    const b = e.target.closest("button[data-action]");
    if (b) { act(b); return; }
    const th = e.target.closest("th[data-key]");
    if (th) {
      if (sortKey === th.dataset.key) sortDir = -sortDir;
      else { sortKey = th.dataset.key; sortDir = 1; }
      renderModels();
    }
  });
  filterInput.addEventListener("input", renderModels);
  archSelect.addEventListener("change", renderModels);
  quantSelect.addEventListener("change", renderModels);
  showHidden.addEventListener("change", renderModels);
  document.getElementById("download-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    status("");
    const body = { url: document.getElementById("dl-url").value.trim() };
    const filename = document.getElementById("dl-filename").value.trim();
    const sha = document.getElementById("dl-sha256").value.trim();
    if (filename) body.filename = filename;
    if (sha) body.sha256 = sha;
    try {
      await api("/api/downloads", body);
      e.target.reset();
    } catch (err) {
      status(err.message);
    }
    await refresh();
  });
  document.addEventListener("tessera:page", (e) => { if (e.detail === "models") poll(); });
  document.addEventListener("tessera:refresh", () => { rendered = ""; refresh(); });
}

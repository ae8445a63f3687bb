// Shared by both pages: the API key, JSON calls with errors shown, and page switching.
"use strict";

const Tessera = {
  keyInput: document.getElementById("api-key"),
  statusLine: document.getElementById("status"),

  headers(extra) {
    const h = Object.assign({}, extra || {});
    const key = this.keyInput.value.trim();
    if (key) h["Authorization"] = "Bearer " + key;
    return h;
  },

  // GET when body is undefined, else POST the body as JSON; throws Error(message).
  async api(path, body) {
    const opts = { method: body === undefined ? "GET" : "POST", headers: this.headers() };
    if (body !== undefined) {
      opts.headers["Content-Type"] = "application/json";
      opts.body = JSON.stringify(body);
    }
    const r = await fetch(path, opts);
    let data = null;
    try { data = await r.json(); } catch (e) { data = null; }
    if (!r.ok) {
      const message = data && data.error ? data.error.message : r.status + " " + r.statusText;
      const err = new Error(message);
      err.status = r.status;
      throw err;
    }
    return data;
  },

  status(message) {
    this.statusLine.textContent = message || "";
  },

  showPage() {
    const page = location.hash === "#models" ? "models" : "chat";
    for (const name of ["chat", "models"]) {
      document.getElementById("page-" + name).hidden = name !== page;
      document.getElementById("nav-" + name).classList.toggle("active", name === page);
    }
    document.dispatchEvent(new CustomEvent("tessera:page", { detail: page }));
  },
};

Tessera.keyInput.value = localStorage.getItem("tessera.apiKey") || "";
Tessera.keyInput.addEventListener("change", () => {
  localStorage.setItem("tessera.apiKey", Tessera.keyInput.value.trim());
  document.dispatchEvent(new Event("tessera:refresh"));
});
window.addEventListener("hashchange", () => Tessera.showPage());
window.addEventListener("DOMContentLoaded", () => Tessera.showPage());

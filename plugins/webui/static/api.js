// The API key, JSON calls to the server with its error messages, and the status line.

const keyInput = document.getElementById("api-key");
const statusLine = document.getElementById("status");

keyInput.value = localStorage.getItem("tessera.apiKey") || "";
keyInput.addEventListener("change", () => {
  localStorage.setItem("tessera.apiKey", keyInput.value.trim());
  document.dispatchEvent(new Event("tessera:refresh"));
});

export function headers(extra) {
  const h = Object.assign({}, extra || {});
  const key = keyInput.value.trim();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

// The server's one-sentence reason from an OpenAI-shaped error body, else the HTTP status.
export async function errorOf(response) {
  const data = await response.json().catch(() => null);
  return data && data.error ? data.error.message : response.status + " " + response.statusText;
}

// GET when body is undefined, else POST the body as JSON; throws Error(message).
export async function api(path, body) {
  const opts = { method: body === undefined ? "GET" : "POST", headers: headers() };
  if (body !== undefined) {
    opts.headers["Content-Type"] = "application/json";
    opts.body = JSON.stringify(body);
  }
  const r = await fetch(path, opts);
  if (!r.ok) {
    const err = new Error(await errorOf(r));
    err.status = r.status;
    throw err;
  }
  return r.json();
}

// One line under the header: what went wrong (the default), or a plain note.
export function status(message, note = false) {
  statusLine.textContent = message || "";
  statusLine.classList.toggle("note", note);
}

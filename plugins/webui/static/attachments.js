// Text files attached to the next message: read in the browser, their text sent inside
// the message (the model reads text only), shown as chips that can be removed.

const input = document.getElementById("chat-attach");
const list = document.getElementById("chat-attachments");
// Bigger files would not fit a small model's context anyway; refuse them early.
const MAX_BYTES = 512 * 1024;
let pending = [];

// Binary files are refused: a NUL byte, or text that did not decode as UTF-8.
function looksLikeText(text) {
  return !text.includes("\u0000") && !text.includes("\ufffd");
}

function render() {
  list.replaceChildren();
  pending.forEach((a, i) => {
    const chip = document.createElement("li");
    chip.className = "chip";
    chip.textContent = a.name;
    const remove = document.createElement("button");
    remove.type = "button";
    remove.textContent = "\u00d7";
    remove.title = "Remove " + a.name;
    remove.addEventListener("click", () => { pending.splice(i, 1); render(); });
    chip.appendChild(remove);
    list.appendChild(chip);
  });
  list.hidden = pending.length === 0;
}

// Read the chosen files; onError(message) for the ones refused.
export function initAttachments(onError) {
  input.addEventListener("change", async () => {
    for (const file of input.files) {
      if (file.size > MAX_BYTES) {
        onError(`${file.name} is ${Math.round(file.size / 1024)} KiB; attach text files up to 512 KiB`);
        continue;
      }
      const text = await file.text();
      if (!looksLikeText(text)) {
        onError(`${file.name} is not a UTF-8 text file; only text files can be attached`);
        continue;
      }
      pending.push({ name: file.name, text });
    }
    input.value = "";
    render();
  });
  render();
}

// The attached files, handed over to a message (the list empties).
export function takeAttachments() {
  const taken = pending;
  pending = [];
  render();
  return taken;
}

// Copy text: the Clipboard API where the page is a secure context (localhost, https),
// else a hidden text area and execCommand (a server reached over plain http on a LAN).

export async function copyText(text) {
  if (navigator.clipboard && window.isSecureContext) {
    try {
      await navigator.clipboard.writeText(text);
      return true;
    } catch (e) {
      // permission refused: fall through to the older way
    }
  }
  const area = document.createElement("textarea");
  area.value = text;
  area.setAttribute("readonly", "");
  area.style.position = "fixed";
  area.style.opacity = "0";
  document.body.appendChild(area);
  area.select();
  const ok = document.execCommand("copy");
  area.remove();
  return ok;
}

// Show that a button did its job for a moment.
export function flash(button, label) {
  const before = button.textContent;
  button.textContent = label;
  setTimeout(() => { button.textContent = before; }, 1200);
}

// The two pages, Chat and Models, switched by the URL's hash.

export function showPage() {
  const page = location.hash === "#models" ? "models" : "chat";
  for (const name of ["chat", "models"]) {
    document.getElementById("page-" + name).hidden = name !== page;
    document.getElementById("nav-" + name).classList.toggle("active", name === page);
  }
  document.dispatchEvent(new CustomEvent("tessera:page", { detail: page }));
}

window.addEventListener("hashchange", showPage);

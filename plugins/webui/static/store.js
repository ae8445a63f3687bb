// Conversations kept in the browser's IndexedDB: one record per conversation, its
// messages and settings inside it, so a reload (or a closed tab) loses nothing.

const DB_NAME = "tessera-webui";
const STORE = "conversations";
let opened = null;

function database() {
  if (!opened) {
    opened = new Promise((resolve, reject) => {
      const req = indexedDB.open(DB_NAME, 1);
      req.onupgradeneeded = () => {
        const store = req.result.createObjectStore(STORE, { keyPath: "id" });
        store.createIndex("updated", "updated");
      };
      req.onsuccess = () => resolve(req.result);
      req.onerror = () => reject(req.error);
    });
  }
  return opened;
}

// Runs fn(store) in one transaction; resolves with the request's result once committed.
async function transact(mode, fn) {
  const db = await database();
  return new Promise((resolve, reject) => {
    const tx = db.transaction(STORE, mode);
    const req = fn(tx.objectStore(STORE));
    tx.oncomplete = () => resolve(req ? req.result : undefined);
    tx.onerror = () => reject(tx.error);
    tx.onabort = () => reject(tx.error);
  });
}

// Every conversation, the most recently updated first.
export async function listConversations() {
  const all = await transact("readonly", (s) => s.getAll());
  return all.sort((a, b) => b.updated - a.updated);
}

export function getConversation(id) {
  return transact("readonly", (s) => s.get(id));
}

export function putConversation(conversation) {
  // a structured clone: what is stored never aliases the live object being streamed into
  return transact("readwrite", (s) => s.put(JSON.parse(JSON.stringify(conversation))));
}

export function deleteConversation(id) {
  return transact("readwrite", (s) => s.delete(id));
}

// The page's entry point: theme, pages, the chat and the Models Manager.

import "./theme.js";
import { status } from "./api.js";
import { initChat } from "./chat.js";
import { initModels } from "./models.js";
import { showPage } from "./pages.js";

initModels();
showPage();
// without IndexedDB (some private modes) nothing can be kept: say so instead of a dead page
initChat().catch((e) => status("the chat cannot start in this browser: " + e.message));

// The page's entry point: theme, pages, the chat and the Models Manager.

import "./theme.js";
import { initChat } from "./chat.js";
import { initModels } from "./models.js";
import { showPage } from "./pages.js";

initModels();
showPage();
initChat();

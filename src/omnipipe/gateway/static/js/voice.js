// Voice page: a spoken conversation over the realtime WebSocket, the live session of duplex-page.js as it is.

import { startDuplexPage } from "./duplex-page.js";

startDuplexPage({ hooksName: "omnipipeVoice", presetKey: "voice" });

"""Chat parts: reasoning and tool calls parsed out of streamed text, stop strings."""

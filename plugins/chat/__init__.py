"""Chat parts: reasoning and tool calls parsed out of streamed text, and stop strings.

This package's root is its public module: other plugins (the server) import
:class:`ChatSession`, :func:`chat_template` and :class:`StopStringMatcher` from here, and
nothing else of it.
"""

from tessera.plugins.chat.session import ChatSession, chat_template
from tessera.text.stop_strings import StopStringMatcher

__all__ = ["ChatSession", "StopStringMatcher", "chat_template"]

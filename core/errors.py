"""Exceptions a user can act on. The CLI prints their message as one line and exits non-zero."""


class TesseraError(Exception):
    """Base class: the message names the problem and the way out."""

    exit_code = 1


class ModelFileError(TesseraError):
    """A model file is missing, not a GGUF, truncated or otherwise unreadable."""


class UnknownNameError(TesseraError):
    """A name (of an architecture, quant type, backend ...) that no installed plugin
    registered; the message lists what is installed."""


class UnknownArchitectureError(UnknownNameError):
    """No installed architecture plugin handles the model's architecture."""


class UnknownQuantTypeError(UnknownNameError):
    """No installed quantization plugin handles a tensor's type."""


class UnknownBackendError(UnknownNameError):
    """The requested backend is not installed or not usable on this machine."""


class UnknownSpecDecoderError(UnknownNameError):
    """No installed speculative decoder has the requested ``--spec-type``."""


class TokenizerError(TesseraError):
    """A vocabulary is missing, malformed or of a kind tessera cannot tokenize."""


class UnknownTokenizerError(UnknownNameError, TokenizerError):
    """No installed tokenizer kind runs the vocabulary's ``tokenizer.ggml.model``."""


class ContextOverflowError(TesseraError):
    """A prompt or batch does not fit in the context window."""


class PluginError(TesseraError):
    """A plugin failed to import or register (raised only in strict mode)."""


class SwitchValueError(TesseraError):
    """A ``TESSERA_*`` environment switch is set to a value it does not take."""

"""Model files: reading GGUF and Hugging Face folders, writing GGUF, loading a model onto a
backend."""

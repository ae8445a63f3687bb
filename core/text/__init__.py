"""Text in and out of a model: tokenizers rebuilt from the model file, and chat templates."""

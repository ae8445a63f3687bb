"""Built-in feature plugins: quantization types, CLI commands, conversion ..."""

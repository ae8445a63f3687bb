"""Built-in architecture plugins, one module per model family."""

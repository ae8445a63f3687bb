"""Built-in backend plugins (numpy reference, torch)."""

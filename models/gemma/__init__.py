"""Gemma 2 and Gemma 3 text decoders (sliding and global attention, Gemma's four norms)."""

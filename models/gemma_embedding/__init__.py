"""EmbeddingGemma: a Gemma-3-style bidirectional encoder for embeddings."""

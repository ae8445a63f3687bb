"""BERT-style encoders for embeddings and reranking."""

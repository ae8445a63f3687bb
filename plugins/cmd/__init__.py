"""The built-in CLI commands: run, tokenize, convert, quantize, embed, rerank, bench and
batched-bench."""

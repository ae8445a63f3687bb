"""The engine along the data flow: batches, the KV cache, the context, sampling, generation
and the slots."""

"""The llama family: llama, qwen2, qwen3 and their MoE variants (qwen2moe, qwen3moe, Mixtral)."""

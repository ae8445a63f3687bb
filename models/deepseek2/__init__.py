"""DeepSeek-V2 and DeepSeek-V3 (GGUF ``deepseek2``): MLA attention, DeepSeek MoE."""

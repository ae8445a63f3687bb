"""gpt-oss (OpenAI's open-weight MoE models): attention sinks, alternating sliding and full
attention, YaRN, routed experts with biases and a clamped SwiGLU, MXFP4 experts."""

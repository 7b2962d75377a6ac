"""Serving: the multi-LoRA engines behind the OpenAI-compatible routes, and their adapter cache."""

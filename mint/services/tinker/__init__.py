"""Tinker-compatible primitives. The API half: sessions, training models and their requests,
samplers, futures and their rows, checkpoints and their signed URLs, projects, provenance and
traces. The worker half: what a worker process holds (resident), claiming a model's steps, the
training and weights operations, sample batches, releases, and the runner that dispatches them."""

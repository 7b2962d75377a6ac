"""Fine-tuning jobs: the API side (create, list, cancel), the worker-side runner and its context, and
replay of a job on new data."""

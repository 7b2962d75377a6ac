"""Auto mode: runs under a budget (runs), the driver that advances them by phase, and the search over
methods and hyperparameters. The orchestrator of the other domains."""

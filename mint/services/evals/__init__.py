"""Eval runs of the team's benchmark: creating and comparing runs, the worker-side runner, model
judges."""

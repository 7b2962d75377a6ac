"""Evals: graders, tool environments and benchmarks, shared by the eval service and the RL recipe.

Pure Python (pydantic only): nothing here imports torch, so the API process may validate
grader specs and benchmark tasks without loading a model.
"""

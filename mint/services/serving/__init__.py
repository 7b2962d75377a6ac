"""Serving: deployments and their revisions, inference plans, production capture and feedback, serving
nodes and the client that talks to them."""

"""Bringing a team's own training code to Mint: its TRL, verl or OpenRLHF reward functions,
trainers' shapes and datasets, mapped onto Mint's primitives and protocols.

A team's code runs in the team's own process (its training loop, or `mint reward-server`), never
inside Mint's API, workers or serving nodes. The frameworks themselves (trl, verl, openrlhf,
torch) are imported lazily, where a team's code needs them: `import mint.integrations` and its
reward server need none of them.
"""

"""Auto mode: runs under a budget (runs), the driver that advances them by phase, and the search over
methods and hyperparameters. The orchestrator of the other domains.

Imports point one way: `runs` -> `driver` -> the phases (`baseline`, `trials`, `final`) -> their
nouns (`dev_split`, `mining`, `running_trial`, `trial_jobs`, `evaluations`, `spend`) -> `tick`
(one tick's context) -> `state` (reading a run's typed state and trials); `search` imports none.
"""

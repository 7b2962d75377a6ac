"""`verifiers` environments on Mint: `mint env-server` serves one (`server`), playing its episodes
in a process of the environment's own virtualenv (`episode_process`), one model turn at a time,
while Mint's eval runs and RL jobs take the turns."""

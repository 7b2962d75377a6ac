"""TRL's trainers over Mint: `GRPOTrainer`, `SFTTrainer` and `DPOTrainer` with TRL's constructor
shape, whose model lives on Mint and whose reward functions run here.

A TRL script changes its import line and its model name, nothing else:

    from mint.integrations.trl import GRPOConfig, GRPOTrainer   # was: from trl import ...
    trainer = GRPOTrainer(model="smollm2-135m-instruct", reward_funcs=[accuracy_reward],
                          args=GRPOConfig(num_generations=4), train_dataset=dataset)
    trainer.train()

No model is loaded in this process: each step goes through the Tinker primitives of the
official `tinker` SDK (sample, forward_backward, optim_step) on Mint. The package, by noun:
`configs` (TRL's config fields, and those refused), `connection` (Mint, its tokenizer, the
training client), `data` (rows as tokens, batches), `steps` (each optimizer step's schedule and
inputs), `on_mint` (what the trainers share), `rewards` (reward functions and TRL's
advantages), and one module per trainer: `grpo`, `sft`, `dpo`.
"""

from mint.integrations.trl.configs import DPOConfig, GRPOConfig, SFTConfig
from mint.integrations.trl.connection import connect, download_tokenizer
from mint.integrations.trl.dpo import DPOTrainer
from mint.integrations.trl.grpo import GRPOTrainer, Rollout
from mint.integrations.trl.rewards import group_advantages
from mint.integrations.trl.sft import SFTTrainer

__all__ = [
    "DPOConfig",
    "DPOTrainer",
    "GRPOConfig",
    "GRPOTrainer",
    "Rollout",
    "SFTConfig",
    "SFTTrainer",
    "connect",
    "download_tokenizer",
    "group_advantages",
]

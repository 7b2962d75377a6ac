"""Training recipes: short readable loops over the session primitives (`sft`, `dpo`, `rl`).

They share components (`mint.trainer.data`, the losses, the checkpoints), not a base class.
Each takes a trainer with `forward_backward` / `optim_step` (a LoRA `TrainingSession`, or a
`FullParameterTrainer` for SFT), a start step (to resume), and an `on_step` callback through
which the job service records events, checkpoints and cancellation.
"""

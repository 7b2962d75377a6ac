"""Training recipes: short readable loops over the session primitives (`sft`, `dpo`, `rl`).

They share components (`mint.trainer.data`, the losses, the checkpoints), not a base class.
Each takes a trainer with `forward_backward` / `optim_step` (a LoRA `TrainingSession`, or a
`FullParameterTrainer` for SFT), a start step (to resume), and an `on_step` callback through
which the job service records events, checkpoints and cancellation. Each also has a
`run_<method>_plan(plan, inputs)` that a fine-tuning job reaches through the method registry
(`mint.trainer.methods`): it renders the job's rows and runs the loop with the plan's numbers.
"""

"""TRL's `DPOTrainer` over Mint: TRL's sigmoid DPO loss, computed with torch in this process
through the SDK's `forward_backward_custom`, against the starting weights as the reference."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from mint.integrations.trl.configs import DPO_REFUSED, DPOConfig, arg
from mint.integrations.trl.data import Row, dataset_rows, endless_batches, sft_tokens, truncate
from mint.integrations.trl.on_mint import TrainerOnMint
from mint.integrations.trl.steps import adam_params, loss_inputs, scheduled_learning_rate, total_steps

if TYPE_CHECKING:
    pass


class DPOTrainer(TrainerOnMint):
    """TRL's `DPOTrainer` over Mint, for prompt/chosen/rejected datasets (strings or messages).

    DPO's loss is not one of Tinker's built-in losses, so it goes through the SDK's
    `forward_backward_custom`: the server returns the policy's logprobs, this process computes
    TRL's sigmoid loss with torch,

        L = - (1 - ls) * log sigmoid(beta * m) - ls * log sigmoid(-beta * m),
        m = (log pi(chosen) - log ref(chosen)) - (log pi(rejected) - log ref(rejected)),

    and sends its gradient back as a weighted cross_entropy pass. The reference is the starting
    weights: a sampler of them, made before the first step, scores each pair once."""

    def __init__(
        self,
        model: str,
        ref_model: Any = None,
        args: Any = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: Any = None,
        peft_config: Any = None,
        callbacks: list[Any] | None = None,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
    ) -> None:
        if ref_model is not None:
            raise ValueError(
                "ref_model: the reference is the starting weights of `model` on Mint; leave ref_model=None"
            )
        self.args = args if args is not None else DPOConfig(output_dir=f"{str(model).split('/')[-1]}-DPO")
        if eval_dataset is not None:
            raise ValueError("eval_dataset is not supported on Mint; evaluate the saved adapter with `mint evals`")
        self.rows = dataset_rows(train_dataset)
        if not self.rows or not {"prompt", "chosen", "rejected"} <= set(self.rows[0]):
            raise ValueError("train_dataset: TRL's preference format, rows with `prompt`, `chosen` and `rejected`")
        self.batch_size = int(arg(self.args, "per_device_train_batch_size", 8))
        if len(self.rows) < self.batch_size:
            raise ValueError(f"train_dataset has {len(self.rows)} rows, fewer than per_device_train_batch_size")
        self._connect(
            model,
            DPO_REFUSED,
            processing_class=processing_class,
            peft_config=peft_config,
            callbacks=callbacks,
            base_url=base_url,
            api_key=api_key,
        )

    def _pair(self, row: Row) -> list[tuple[list[int], list[float]]]:
        """(tokens, completion mask) of the chosen and the rejected answer."""
        args = self.args
        return [
            truncate(
                *sft_tokens(self.processing_class, {"prompt": row["prompt"], "completion": row[key]}, args),
                arg(args, "max_length", 1024),
            )
            for key in ("chosen", "rejected")
        ]

    def train(self) -> Any:
        import torch
        import torch.nn.functional as F
        from tinker import types

        args = self.args
        beta, smoothing = float(arg(args, "beta", 0.1)), float(arg(args, "label_smoothing", 0.0))
        batches_per_epoch = len(self.rows) // self.batch_size
        total = total_steps(args, batches_per_epoch)
        self.state.max_steps = total
        batches = endless_batches(
            self.rows,
            self.batch_size,
            shuffle=bool(arg(args, "shuffle_dataset", True)),
            seed=int(arg(args, "seed", 42)),
        )
        reference = self.training_client.save_weights_and_get_sampling_client().result()
        started, losses = time.monotonic(), []
        self._mint.event("on_train_begin")
        for step in range(total):
            step_started = time.monotonic()
            # (chosen, rejected) for each pair, interleaved: 2 * B sequences.
            sequences = [seq for row in next(batches) for seq in self._pair(row)]
            futures = [reference.compute_logprobs(types.ModelInput.from_ints(tokens)) for tokens, _ in sequences]
            ref_logp_2B = [
                sum((lp or 0.0) * w for lp, w in zip(future.result()[1:], weights[1:], strict=True))
                for future, (_, weights) in zip(futures, sequences, strict=True)
            ]
            data = [
                types.Datum(
                    model_input=types.ModelInput.from_ints(tokens[:-1]),
                    loss_fn_inputs=loss_inputs({"target_tokens": tokens[1:], "weights": weights[1:]}),
                )
                for tokens, weights in sequences
            ]
            logged: dict[str, float] = {}

            def dpo_loss(batch: list[Any], logprobs: list[torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
                policy_2B = torch.stack(
                    [
                        (lp * torch.tensor(d.loss_fn_inputs["weights"].tolist())).sum()
                        for d, lp in zip(batch, logprobs, strict=True)
                    ]
                )
                reference_2B = torch.tensor(ref_logp_2B, dtype=policy_2B.dtype)  # noqa: B023 (called in this step)
                rewards_2B = beta * (policy_2B - reference_2B)
                margin_B = rewards_2B[0::2] - rewards_2B[1::2]
                loss = (-(1 - smoothing) * F.logsigmoid(margin_B) - smoothing * F.logsigmoid(-margin_B)).mean()
                detached = rewards_2B.detach()
                logged.update(  # noqa: B023 (called in this step)
                    {
                        "rewards/chosen": float(detached[0::2].mean()),
                        "rewards/rejected": float(detached[1::2].mean()),
                        "rewards/accuracies": float((margin_B > 0).float().mean()),
                        "rewards/margins": float(margin_B.detach().mean()),
                        "dpo_loss": float(loss.detach()),
                    }
                )
                return loss, {"dpo_loss": float(loss.detach())}

            learning_rate = scheduled_learning_rate(args, step, total)
            self.training_client.forward_backward_custom(data, dpo_loss).result()
            self.training_client.optim_step(adam_params(args, learning_rate)).result()
            loss = logged["dpo_loss"]
            losses.append(loss)
            self.state.global_step, self.state.epoch = step + 1, (step + 1) / batches_per_epoch
            self._mint.log({"loss": loss, "learning_rate": learning_rate, **logged}, step_started)
            self._mint.event("on_step_end")
        return self._mint.finish(losses, started)

"""TRL's `SFTTrainer` over Mint: `messages`, prompt/completion or text datasets, rendered here
with the base's tokenizer as TRL renders them, trained on Mint with Tinker's `cross_entropy`."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from mint.integrations.trl.configs import SFT_REFUSED, SFTConfig, arg
from mint.integrations.trl.data import dataset_rows, endless_batches, sft_tokens, truncate
from mint.integrations.trl.on_mint import TrainerOnMint
from mint.integrations.trl.steps import adam_params, loss_inputs, loss_of, scheduled_learning_rate, total_steps

if TYPE_CHECKING:
    pass


class SFTTrainer(TrainerOnMint):
    """TRL's `SFTTrainer` over Mint: Tinker's `cross_entropy`, weighted so that the loss is the
    mean over the step's trained tokens, as TRL's is."""

    def __init__(
        self,
        model: str,
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
        self.args = args if args is not None else SFTConfig(output_dir=f"{str(model).split('/')[-1]}-SFT")
        if eval_dataset is not None:
            raise ValueError("eval_dataset is not supported on Mint; evaluate the saved adapter with `mint evals`")
        self.rows = dataset_rows(train_dataset)
        self.batch_size = int(arg(self.args, "per_device_train_batch_size", 8))
        if len(self.rows) < self.batch_size:
            raise ValueError(f"train_dataset has {len(self.rows)} rows, fewer than per_device_train_batch_size")
        self._connect(
            model,
            SFT_REFUSED,
            processing_class=processing_class,
            peft_config=peft_config,
            callbacks=callbacks,
            base_url=base_url,
            api_key=api_key,
        )

    def train(self) -> Any:
        from tinker import types

        args = self.args
        batches_per_epoch = len(self.rows) // self.batch_size
        total = total_steps(args, batches_per_epoch)
        self.state.max_steps = total
        seed = int(arg(args, "seed", 42))
        batches = endless_batches(
            self.rows, self.batch_size, shuffle=bool(arg(args, "shuffle_dataset", False)), seed=seed
        )
        max_length = arg(args, "max_length", 1024)
        started, losses = time.monotonic(), []
        self._mint.event("on_train_begin")
        for step in range(total):
            step_started = time.monotonic()
            examples = [truncate(*sft_tokens(self.processing_class, row, args), max_length) for row in next(batches)]
            trained = sum(sum(weights[1:]) for _, weights in examples)
            data = [
                types.Datum(
                    model_input=types.ModelInput.from_ints(tokens[:-1]),
                    loss_fn_inputs=loss_inputs(
                        {
                            "target_tokens": tokens[1:],
                            "weights": [w / max(trained, 1.0) for w in weights[1:]],
                        }
                    ),
                )
                for tokens, weights in examples
                if len(tokens) > 1
            ]
            learning_rate = scheduled_learning_rate(args, step, total)
            output = self.training_client.forward_backward(data, "cross_entropy").result()
            self.training_client.optim_step(adam_params(args, learning_rate)).result()
            loss = loss_of(output)
            losses.append(loss)
            self.state.global_step, self.state.epoch = step + 1, (step + 1) / batches_per_epoch
            self._mint.log({"loss": loss, "learning_rate": learning_rate, "num_tokens": trained}, step_started)
            self._mint.event("on_step_end")
        return self._mint.finish(losses, started)

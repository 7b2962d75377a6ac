"""Mint's RL (GRPO style) against TRL's GRPOTrainer (with peft) on the same model, prompts, group
size, reward, LoRA and steps: how fast each turns prompts into trained samples, and its memory.

    python bench/rl_throughput.py [--base smollm2-135m-instruct] [--prompts-per-step 4] [--group-size 4]
                                  [--max-tokens 32] [--temperature 1.0] [--steps 4] [--threads 2]
                                  [--dtype float32|bfloat16|auto] [--mix-backward] [--batch-invariant]

Each contestant runs in a fresh process capped at `--threads` torch threads, so its peak
resident memory is its own:

- mint: a `ResidentBase` session (LoRA r16, alpha 32, on every attention and MLP linear, no
  lm_head) driven by `run_rl` over `RlPrompt`s, with the default `importance_sampling` loss
  and no KL (`kl_beta=0`).
- trl: `GRPOTrainer` with a peft `LoraConfig` of the same targets, `use_vllm=False`,
  `beta=0` (no reference model), one optimisation pass per batch (`num_iterations=1`), and a
  per-step batch of `prompts_per_step * group_size` completions (`num_generations=group_size`).

Both load SmolLM2-135M-Instruct in `--dtype` (float32 by default; `auto` is bfloat16 where the
CPU multiplies it natively, `mint.trainer.precision`; LoRA weights and Adam state stay float32
on both sides, as peft keeps them) and sample at the same temperature (no top-p/top-k). On an
Intel Xeon with AMX, bfloat16 leaves TRL's RL step as slow as in float32 (decoding 16 rows of a
135M model is small matmuls, where the bf16 kernels' set-up per call costs about what the
arithmetic saves), while Mint's step runs 1.36x faster: its decode steps are fused
(`mint.trainer.fused_decoder`) and its prefill runs the head on the last positions as one
product (`head_logprobs.last_position_only`). That is 2.42-3.04x TRL's samples per second in
bfloat16 against 2.12-2.39x in float32 (three runs each, 2026-12-07). The default is float32,
the comparison the goal is set in. Both contestants sample
for at most `--max-tokens` new tokens, on the same chat prompts (rendered to identical ids by
the same template) in the same order, and reward each completion with the same Python
function: the share of the prompt's target words that the completion names. AdamW has the same
settings on both sides (lr 1e-4 constant, betas 0.9/0.95, eps 1e-12, no weight decay, gradient
norm clipped at 1).

The table gives, over the steps after the first (the first pays one-off warm-up and is shown
on its own): samples per second (completions sampled and graded per second), trained tokens
per second (sampled completion tokens that the loss covered), mean seconds per step, then the
first step's seconds, peak RSS, the mean reward and the share of groups whose rewards differed
(the groups that carry a gradient), the model FLOP utilisation (MFU: 2N FLOPs per sampled token
and 6N per trained token, N the base's parameters, per second, over the matmul peak each
contestant's process measures at its start in the same dtype on the same threads), the decode
MFU (2N FLOPs per sampled token over the seconds spent sampling alone: Mint's `sample_batch`
calls, TRL's `generate`) and the share of a step those seconds are, and a last
row of Mint/TRL ratios of each column (above 1 in s/step means Mint is slower). Each
contestant's 1-minute load average before and after its run is printed too: other work on the
same cores slows a contestant's steps, so compare runs made on an otherwise idle machine.

Then (`--jobs K`, 4 by default; 0 skips it) K Mint RL jobs on one resident base, one after
another and at once, with the throughput ratio of the two. It also prints the share of the
one-after-another time spent sampling, the part that batches across jobs, the measured cost
of one sampling pass K times wider than a step's, and the bound both imply on the ratio.

What differs, by design of each trainer:
- Mint samples each prompt's group in its own call (one prefill, `group_size` rows decoded
  together); TRL generates the whole step's batch at once, left-padded, with `generate`.
- Mint leaves out groups whose rewards are all equal (zero advantage: no gradient), so its
  trained tokens can be fewer than it sampled; TRL runs the loss over every completion.
  Mint's loss pass runs each prompt once for its group (`shared_prefixes`) and pads the
  completions to the longest; TRL's pads whole sequences to the longest.
- Mint draws tokens by inverse CDF, TRL by `torch.multinomial` (50 times slower per call on
  a 49k vocabulary): the same distribution.
- Mint's loss is a sum over tokens with advantages scaled to sum to 1 in absolute value; TRL's
  `dapo` loss is a mean over the batch's completion tokens. On-policy (ratio 1, one pass) both
  give the gradient of -A * logp per token, up to that constant scale (which Adam mostly
  cancels). TRL divides by the group's sample std (n - 1) + 1e-4; Mint by its population
  std + 1e-6.
- Mint's sampler returns the sampled tokens' logprobs (the importance ratio's denominator);
  TRL skips them on-policy and computes the policy's entropy in its loss pass.
- The samplers draw from different random streams, so the completions (hence rewards and
  lengths) differ between the two sides; tokens per second accounts for lengths.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._common import (  # noqa: E402
    DTYPE_CHOICES,
    LORA_MODULES,
    base_parameter_count,
    bench_dtype,
    peak_rss_mb,
    pulled_folder,
    run_contestant,
    table_row,
)

LEARNING_RATE = 1e-4
ADAM_BETA2 = 0.95  # Mint's AdamParams defaults (Tinker's), given to TRL's AdamW too
ADAM_EPS = 1e-12
GRAD_CLIP_NORM = 1.0
SEED = 0

# (question, target words): the reward is the share of the targets a completion names.
PROMPTS = [
    ("Name some animals that live on a farm.", ["cow", "pig", "horse", "sheep", "chicken", "goat", "duck", "dog"]),
    ("Name some fruits.", ["apple", "banana", "orange", "grape", "mango", "pear", "cherry", "strawberry"]),
    ("Name some colors.", ["red", "blue", "green", "yellow", "orange", "purple", "black", "white"]),
    ("Name some vegetables.", ["carrot", "potato", "tomato", "onion", "broccoli", "lettuce", "pepper", "spinach"]),
    ("Name the planets of the solar system.", ["mercury", "venus", "earth", "mars", "jupiter", "saturn", "uranus"]),
    ("Name some musical instruments.", ["piano", "guitar", "violin", "drum", "flute", "trumpet", "cello", "harp"]),
    ("Name some countries in Europe.", ["france", "germany", "spain", "italy", "portugal", "poland", "greece"]),
    ("Name some sports.", ["football", "soccer", "tennis", "basketball", "baseball", "golf", "hockey", "rugby"]),
    ("Name some wild animals.", ["lion", "tiger", "elephant", "bear", "wolf", "giraffe", "zebra", "monkey"]),
    ("Name some kitchen tools.", ["knife", "spoon", "fork", "pan", "pot", "whisk", "spatula", "grater"]),
    ("Name some things you find in an office.", ["desk", "chair", "computer", "pen", "paper", "printer", "phone"]),
    ("Name some means of transport.", ["car", "bus", "train", "bicycle", "plane", "boat", "ship", "truck"]),
    ("Name some programming languages.", ["python", "java", "rust", "go", "ruby", "javascript", "swift", "kotlin"]),
    ("Name some types of weather.", ["rain", "snow", "sun", "wind", "storm", "fog", "hail", "cloud"]),
    ("Name some body parts.", ["head", "arm", "leg", "hand", "foot", "eye", "nose", "ear"]),
    ("Name some kinds of trees.", ["oak", "pine", "maple", "birch", "willow", "cedar", "palm", "elm"]),
]
INSTRUCTION = " Answer with a comma-separated list."


def target_word_reward(completion: str, targets: Sequence[str]) -> float:
    """The share of `targets` named in `completion` as whole words, case-insensitively."""
    words = set(re.findall(r"[a-z]+", completion.lower()))
    return sum(target in words for target in targets) / len(targets)


def chat(question: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": question + INSTRUCTION}]


def step_prompts(args: argparse.Namespace) -> list[int]:
    """The prompt indices of every step in order: Mint's own batch plan, which TRL then walks
    through unshuffled, so both sides see the same prompts at the same step."""
    from mint.trainer.data import batch_plan

    plan = batch_plan(len(PROMPTS), batch_size=args.prompts_per_step, steps=args.steps, seed=SEED)
    return [index for step in plan for index in step]


class StepClock:
    """Per step: seconds since the previous step ended (or since `start`), completions, and the
    trained and sampled tokens counted since."""

    def __init__(self, samples_per_step: int) -> None:
        self.samples_per_step = samples_per_step
        self.trained_tokens = 0  # running count, added to by the trainer's loss pass
        self.sampled_tokens = 0  # running count of completion tokens generated
        self.decode_seconds = 0.0  # running time spent sampling (prefill and decode)
        self.steps: list[dict[str, float]] = []
        self._last = 0.0
        self._counted = 0
        self._sampled = 0
        self._decoding = 0.0

    @contextmanager
    def decoding(self) -> Iterator[None]:
        """Count the time inside as sampling time."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.decode_seconds += time.perf_counter() - started

    def start(self) -> None:
        self._last = time.perf_counter()

    def step_done(self) -> None:
        now = time.perf_counter()
        self.steps.append(
            {
                "seconds": now - self._last,
                "samples": self.samples_per_step,
                "trained_tokens": self.trained_tokens - self._counted,
                "sampled_tokens": self.sampled_tokens - self._sampled,
                "decode_seconds": self.decode_seconds - self._decoding,
            }
        )
        self._last, self._counted, self._sampled = now, self.trained_tokens, self.sampled_tokens
        self._decoding = self.decode_seconds


# ---- Mint --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TargetWords:
    """`target_word_reward` as a grader of `run_rl` (the reference is the target list)."""

    def reward(self, output: Any, reference: Any, *, steps: int = 1, tokens: int = 0) -> float:
        return target_word_reward(output, reference)


class CountingPolicy:
    """A training session's primitives, counting the completion tokens each `forward_backward`
    trains on (those with a nonzero advantage; prompt positions carry zero)."""

    def __init__(self, session: Any, clock: StepClock) -> None:
        self.session = session
        self.clock = clock

    @property
    def version(self) -> str:
        return self.session.version

    def looping(self) -> Any:
        return self.session.looping()

    def sample_batch(self, requests: Any) -> Any:
        with self.clock.decoding():
            results = self.session.sample_batch(requests)
        self.clock.sampled_tokens += sum(len(sequence.tokens) for result in results for sequence in result)
        return results

    def sampler_copy(self) -> Any:
        return self.session.sampler_copy()

    def copy_weights_to(self, copy: Any) -> None:
        self.session.copy_weights_to(copy)

    def forward(self, data: Any, loss_fn: str | None = None, loss_fn_config: Any = None) -> Any:
        return self.session.forward(data, loss_fn, loss_fn_config)

    def forward_backward(self, data: Any, loss_fn: str, loss_fn_config: Any = None) -> Any:
        self.clock.trained_tokens += sum(sum(1 for a in datum.loss_fn_inputs["advantages"] if a != 0) for datum in data)
        return self.session.forward_backward(data, loss_fn, loss_fn_config)

    def optim_step(self, adam: Any = None) -> dict[str, float]:
        return self.session.optim_step(adam)


def mint_base(args: argparse.Namespace) -> Any:
    from mint.config import get_settings
    from mint.schemas.base_models import get_base_model_spec
    from mint.trainer.session import ResidentBase

    settings = get_settings()
    spec = get_base_model_spec(args.base, settings.model_configs_dir)
    return ResidentBase(
        spec,
        settings.models_cache_dir,
        dtype=dtype_of(args),
        mix_backward=True if args.mix_backward else None,
        batch_invariant=args.batch_invariant,
    )


def dtype_of(args: argparse.Namespace) -> str:
    return bench_dtype(args.dtype)


def run_mint(args: argparse.Namespace, resident: Any = None, seed: int = SEED) -> list[dict[str, float]]:
    """One RL run on its own session of `resident` (loaded here if not given)."""
    from mint.chat.render import render_prompt
    from mint.trainer.recipes.rl import RlConfig, RlPrompt, run_rl
    from mint.trainer.types import LoraOptions

    resident = resident or mint_base(args)
    tokenizer = resident.tokenizer
    prompts = [
        RlPrompt(prompt_tokens=render_prompt(tokenizer, chat(question)), reference=targets, grader=TargetWords())
        for question, targets in PROMPTS
    ]
    session = resident.create_session(
        LoraOptions(rank=16, alpha=32, dropout=0.0, train_attn=True, train_mlp=True, train_unembed=False, seed=seed)
    )
    config = RlConfig(
        steps=args.steps,
        prompts_per_step=args.prompts_per_step,
        group_size=args.group_size,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        learning_rate=LEARNING_RATE,
        grad_clip_norm=GRAD_CLIP_NORM,
        seed=seed,
        max_steps_without_signal=args.steps + 1,  # never stop early: every step is timed
        max_steps_off_policy=args.max_steps_off_policy,
    )
    clock = StepClock(args.prompts_per_step * args.group_size)
    clock.start()
    reports = run_rl(
        CountingPolicy(session, clock),
        prompts,
        config,
        tokenizer=tokenizer,  # graded as TRL decodes for its reward: special tokens dropped
        on_step=lambda _: clock.step_done(),
    )
    return [
        {**step, "reward": report.metrics["reward"], "groups_with_signal": report.metrics["groups_with_signal"]}
        for step, report in zip(clock.steps, reports, strict=True)
    ]


def run_mint_jobs(args: argparse.Namespace, *, together: bool) -> list[dict[str, float]]:
    """`--jobs` RL runs (sessions with seeds SEED, SEED+1, ...) on one resident base: one after
    another, or at once (`ResidentBase.run_at_once`: a thread each, their passes on this thread),
    whose sampling and forward_backward calls then share passes (`ResidentBase.sampling_passes`,
    `backward_passes`: the calls each combined; on a CPU base the sessions of a combined
    forward_backward run one after another, `mix_backward`). One entry: the whole wall time."""
    resident = mint_base(args)
    jobs = [functools.partial(run_mint, args, resident, seed=SEED + index) for index in range(args.jobs)]
    started = time.perf_counter()
    runs = resident.run_at_once(jobs) if together else [job() for job in jobs]
    seconds = time.perf_counter() - started
    samples = sum(step["samples"] for run in runs for step in run)
    if len(runs) != args.jobs or any(len(run) != args.steps for run in runs):
        raise RuntimeError("a job did not finish all its steps")
    result = [
        {
            "seconds": seconds,
            "samples": samples,
            "trained_tokens": sum(step["trained_tokens"] for run in runs for step in run),
            # Summed over the jobs; when they run at once their sampling overlaps, so this is
            # the sampling share's meaning only one after another.
            "decode_seconds": sum(step["decode_seconds"] for run in runs for step in run),
            "reward": statistics.fmean(step["reward"] for run in runs for step in run),
            "groups_with_signal": statistics.fmean(step["groups_with_signal"] for run in runs for step in run),
            "sampling_passes": resident.sampling_passes.batches_run,
            "backward_passes": resident.backward_passes.batches_run,
        }
    ]
    if not together:  # after the passes are counted
        result[0].update(sampling_pass_seconds(args, resident))
    return result


def sampling_pass_seconds(args: argparse.Namespace, resident: Any) -> dict[str, float]:
    """The fastest of three sampling passes of one job's step (`prompts_per_step` prompts x
    `group_size` rows) and of `--jobs` steps' worth as one pass, on the base with no stop token
    (every row decodes `max_tokens`): what a pass `jobs` times wider costs on this machine."""
    from mint.chat.render import render_prompt
    from mint.trainer.types import SampleRequest, SamplingParams

    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, stop=[], seed=SEED)
    requests = [
        SampleRequest(render_prompt(resident.tokenizer, chat(question)), params, args.group_size)
        for question, _ in PROMPTS
    ]
    timings = {}
    for name, count in (("one_pass_s", args.prompts_per_step), ("jobs_pass_s", args.prompts_per_step * args.jobs)):
        wide = [requests[index % len(requests)] for index in range(count)]
        times = []
        for _ in range(3):
            started = time.perf_counter()
            resident.sample_batch(None, wide)
            times.append(time.perf_counter() - started)
        timings[name] = min(times)
    return timings


# ---- TRL ---------------------------------------------------------------------------------------


def trl_reward(prompts: list[Any], completions: list[Any], targets: list[list[str]], **_: Any) -> list[float]:
    """`target_word_reward` as a TRL reward function (the dataset's `targets` column comes as a keyword)."""
    return [
        target_word_reward(completion[-1]["content"], row_targets)
        for completion, row_targets in zip(completions, targets, strict=True)
    ]


def run_trl(args: argparse.Namespace) -> list[dict[str, float]]:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    folder = pulled_folder(args.base)
    torch.manual_seed(SEED)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype_of(args)))
    rows = [{"prompt": chat(PROMPTS[i][0]), "targets": PROMPTS[i][1]} for i in step_prompts(args)]
    samples = args.prompts_per_step * args.group_size
    clock = StepClock(samples)
    generate = model.generate  # what TRL's sampling ends in, through peft: timed as sampling

    def timed_generate(*generate_args: Any, **generate_kwargs: Any) -> Any:
        with clock.decoding():
            return generate(*generate_args, **generate_kwargs)

    model.generate = timed_generate

    class CountingTrainer(GRPOTrainer):  # counts the completion tokens each loss pass covers
        def compute_loss(self, model: Any, inputs: dict[str, Any], *rest: Any, **kwargs: Any) -> Any:
            completion_tokens = int(inputs["completion_mask"].sum())  # TRL trains every completion
            clock.trained_tokens += completion_tokens
            clock.sampled_tokens += completion_tokens
            return super().compute_loss(model, inputs, *rest, **kwargs)

    class Timing(TrainerCallback):
        def on_train_begin(self, *_: Any, **__: Any) -> None:
            clock.start()

        def on_step_end(self, *_: Any, **__: Any) -> None:
            clock.step_done()

    with tempfile.TemporaryDirectory() as output:
        config = GRPOConfig(
            output_dir=output,
            max_steps=args.steps,
            per_device_train_batch_size=samples,  # completions per step: prompts x generations
            gradient_accumulation_steps=1,
            num_generations=args.group_size,
            max_completion_length=args.max_tokens,
            temperature=args.temperature,
            top_p=1.0,
            top_k=0,
            use_vllm=False,
            beta=0.0,
            num_iterations=1,
            loss_type="dapo",
            learning_rate=LEARNING_RATE,
            lr_scheduler_type="constant",
            warmup_steps=0,
            adam_beta2=ADAM_BETA2,
            adam_epsilon=ADAM_EPS,
            weight_decay=0.0,
            max_grad_norm=GRAD_CLIP_NORM,
            gradient_checkpointing=False,  # Mint keeps activations too
            shuffle_dataset=False,
            use_cpu=True,
            bf16=False,
            report_to="none",
            save_strategy="no",
            logging_steps=1,
            dataloader_num_workers=0,
            seed=SEED,
        )
        trainer = CountingTrainer(
            model=model,
            reward_funcs=trl_reward,
            args=config,
            train_dataset=Dataset.from_list(rows),
            processing_class=tokenizer,
            peft_config=LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=LORA_MODULES),
            callbacks=[Timing()],
        )
        trainer.train()
    logged = [entry for entry in trainer.state.log_history if "reward" in entry]  # one entry per step
    return [
        {**step, "reward": entry["reward"], "groups_with_signal": 1 - entry["frac_reward_zero_std"]}
        for step, entry in zip(clock.steps, logged, strict=True)
    ]


# ---- the comparison ----------------------------------------------------------------------------

CONTESTANTS = ("mint", "trl")
JOB_CONTESTANTS = ("one-after-another", "at-once")


def run_one(name: str, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from mint.trainer.precision import matmul_peak_flops

    torch.set_num_threads(args.threads)
    peak = matmul_peak_flops(getattr(torch, dtype_of(args)))  # measured before the model loads
    load_before = os.getloadavg()[0]
    if name in JOB_CONTESTANTS:
        steps = run_mint_jobs(args, together=name == "at-once")
    else:
        steps = run_mint(args) if name == "mint" else run_trl(args)
    # The machine's 1-minute load average around the run: other work on the cores skews the timings.
    load = (load_before, os.getloadavg()[0])
    parameters = base_parameter_count(args.base)
    return {
        "name": name,
        "steps": steps,
        "peak_rss_mb": peak_rss_mb(),
        "load": load,
        "peak_flops": peak,
        "parameters": parameters,
    }


def summary(result: dict[str, Any]) -> dict[str, float]:
    """Rates over the steps after the first (all steps if there is only one), and the first step."""
    from mint.trainer import precision

    steps = result["steps"]
    timed = steps[1:] or steps
    seconds = sum(step["seconds"] for step in timed)
    sampled = sum(step.get("sampled_tokens", 0) for step in timed)
    decoding = sum(step.get("decode_seconds", 0.0) for step in timed)
    peak = result["peak_flops"]
    return {
        "samples_per_s": sum(step["samples"] for step in timed) / seconds,
        "tokens_per_s": sum(step["trained_tokens"] for step in timed) / seconds,
        "s_per_step": seconds / len(timed),
        "first_step_s": steps[0]["seconds"],
        "peak_rss_mb": result["peak_rss_mb"],
        "reward": statistics.fmean(step["reward"] for step in steps),
        "groups_with_signal": statistics.fmean(step["groups_with_signal"] for step in steps),
        "mfu": precision.model_flops(
            result["parameters"],
            sum(step.get("sampled_tokens", 0) for step in timed),
            sum(step["trained_tokens"] for step in timed),
        )
        / seconds
        / result["peak_flops"],
        # Sampling alone: 2N FLOPs per sampled token over the time spent sampling.
        "decode_mfu": precision.model_flops(result["parameters"], sampled, 0) / max(decoding, 1e-9) / peak,
        "decode_share": decoding / seconds,
        "peak_gflops": result["peak_flops"] / 1e9,
    }


COLUMNS = (
    ("trainer", 9, ""),
    ("samples/s", 10, "samples_per_s"),
    ("trained tok/s", 14, "tokens_per_s"),
    ("s/step", 8, "s_per_step"),
    ("first step s", 13, "first_step_s"),
    ("peak RSS MB", 12, "peak_rss_mb"),
    ("mean reward", 12, "reward"),
    ("groups w/ signal", 17, "groups_with_signal"),
    ("MFU", 7, "mfu"),
    ("decode MFU", 11, "decode_mfu"),
    ("decode share", 13, "decode_share"),
    ("peak GFLOP/s", 13, "peak_gflops"),
)
FORMATS = {
    "peak_rss_mb": "{:.0f}",
    "reward": "{:.3f}",
    "groups_with_signal": "{:.0%}",
    "mfu": "{:.2%}",
    "decode_mfu": "{:.2%}",
    "decode_share": "{:.0%}",
    "peak_gflops": "{:.0f}",
}


def print_table(args: argparse.Namespace, summaries: dict[str, dict[str, float]]) -> None:
    widths = [width for _, width, _ in COLUMNS]
    print(
        f"\n{args.base}, LoRA r16 alpha 32 on attention + MLP linears, {dtype_of(args)}, {args.threads} torch threads; "
        f"{args.steps} steps x {args.prompts_per_step} prompts x {args.group_size} samples, "
        f"<= {args.max_tokens} new tokens, temperature {args.temperature}\n"
        "rates and s/step over the steps after the first\n"
    )
    print(table_row([header for header, _, _ in COLUMNS], widths))
    for name in CONTESTANTS:
        cells = [FORMATS.get(key, "{:.2f}").format(summaries[name][key]) for _, _, key in COLUMNS[1:]]
        print(table_row([name, *cells], widths))
    mint, trl = summaries["mint"], summaries["trl"]
    ratios = [f"{mint[key] / trl[key]:.2f}x" if trl[key] else "-" for _, _, key in COLUMNS[1:]]
    print(table_row(["mint/trl", *ratios], widths))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default="smollm2-135m-instruct")
    parser.add_argument("--prompts-per-step", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4, help="samples per prompt (TRL's num_generations)")
    parser.add_argument("--max-tokens", type=int, default=32, help="max new tokens per sample")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument(
        "--dtype",
        choices=DTYPE_CHOICES,
        default="float32",
        help="dtype both contestants load the base in (auto: bfloat16 where the CPU has a native bf16 path)",
    )
    parser.add_argument("--threads", type=int, default=2, help="torch threads of each contestant")
    parser.add_argument("--jobs", type=int, default=4, help="Mint RL jobs on one base, then at once (0: skip)")
    parser.add_argument("--skip-trl", action="store_true", help="only the K-jobs comparison")
    parser.add_argument(
        "--max-steps-off-policy", type=int, default=0, help="Mint samples up to this many steps ahead of training"
    )
    parser.add_argument(
        "--mix-backward",
        action="store_true",
        help="Mint's jobs at once run their forward_backward calls as one mixed pass (a CPU base's default: in turn)",
    )
    parser.add_argument(
        "--batch-invariant",
        action="store_true",
        help="Mint's base computes each session's rows independently of the rest of a pass (bit-exact isolation)",
    )
    parser.add_argument(
        "--only", choices=CONTESTANTS + JOB_CONTESTANTS, help=argparse.SUPPRESS
    )  # one contestant, in a child process
    args = parser.parse_args()
    if len(PROMPTS) % args.prompts_per_step:
        # Mint's batch plan cuts an epoch's last batch short; TRL's batches are all full.
        parser.error(f"--prompts-per-step must divide the {len(PROMPTS)} prompts, so both sides get the same batches")
    if args.only:
        print(json.dumps(run_one(args.only, args)))
        return
    pulled_folder(args.base)  # dequantize once, outside the timings
    argv = [
        *("--base", args.base, "--prompts-per-step", str(args.prompts_per_step)),
        *("--group-size", str(args.group_size), "--max-tokens", str(args.max_tokens)),
        *("--temperature", str(args.temperature), "--steps", str(args.steps), "--threads", str(args.threads)),
        *("--jobs", str(args.jobs), "--max-steps-off-policy", str(args.max_steps_off_policy)),
        *("--dtype", args.dtype),
        *(["--mix-backward"] if args.mix_backward else []),
        *(["--batch-invariant"] if args.batch_invariant else []),
    ]
    if not args.skip_trl:
        compare_with_trl(args, argv)
    if args.jobs:
        compare_jobs(args, argv)


def compare_jobs(args: argparse.Namespace, argv: list[str]) -> None:
    """K Mint RL jobs on one base: one after another, then at once; wall time and the ratio."""
    results = {name: run_contestant(__file__, name, argv, threads=args.threads) for name in JOB_CONTESTANTS}
    base = ", mixed forward_backward passes" if args.mix_backward else ""
    base += ", batch-invariant" if args.batch_invariant else ""
    print(f"\n{args.jobs} RL jobs on one resident base{base}, {args.steps} steps each, same settings as above\n")
    widths = [18, 10, 10, 14, 12, 16, 16]
    print(
        table_row(
            ["jobs", "wall s", "samples/s", "trained tok/s", "peak RSS MB", "sampling passes", "backward passes"],
            widths,
        )
    )
    for name, result in results.items():
        run = result["steps"][0]
        cells = [
            f"{run['seconds']:.1f}",
            f"{run['samples'] / run['seconds']:.2f}",
            f"{run['trained_tokens'] / run['seconds']:.1f}",
            f"{result['peak_rss_mb']:.0f}",
            str(run["sampling_passes"]),
            str(run["backward_passes"]),
        ]
        print(table_row([name, *cells], widths))
    one, both = (results[name]["steps"][0]["seconds"] for name in JOB_CONTESTANTS)
    print(f"at once / one after another: {one / both:.2f}x the throughput")
    print(batching_bound(results["one-after-another"]["steps"][0], args.jobs))


def batching_bound(sequential: dict[str, float], jobs: int) -> str:
    """What batching across jobs can gain at most (Amdahl): the share of the one-after-another
    wall time spent sampling, the part that batches across jobs, with the rest (loss passes,
    optimizer, grading) as it is. Two bounds: if `jobs` sampling passes cost one, and at the cost
    that one pass `jobs` times wider measured here (on a CPU, decoding is near compute-bound, so a
    wider pass costs nearly as much as the narrow ones it replaces)."""
    share = sequential["decode_seconds"] / sequential["seconds"]
    widening = sequential["jobs_pass_s"] / sequential["one_pass_s"]
    free = 1.0 / ((1.0 - share) + share / jobs)
    measured = 1.0 / ((1.0 - share) + share * widening / jobs)
    return (
        f"batchable share (sampling) one after another: {share:.0%}; one sampling pass {jobs}x wider costs "
        f"{widening:.2f}x one pass ({sequential['jobs_pass_s']:.2f} s against {sequential['one_pass_s']:.2f} s)\n"
        f"bound on at once / one after another: {free:.2f}x if {jobs} passes cost one, "
        f"{measured:.2f}x at the measured cost of a wider pass"
    )


def compare_with_trl(args: argparse.Namespace, argv: list[str]) -> None:
    summaries = {}
    for name in CONTESTANTS:
        result = run_contestant(__file__, name, argv, threads=args.threads)
        summaries[name] = summary(result)
        print(f"{name}: load average {result['load'][0]:.1f} before, {result['load'][1]:.1f} after", flush=True)
        for number, step in enumerate(result["steps"], 1):
            print(
                f"{name} step {number}: {step['seconds']:.2f}s, {step['trained_tokens']} trained tokens, "
                f"reward {step['reward']:.3f}",
                flush=True,
            )
    print_table(args, summaries)


if __name__ == "__main__":
    main()

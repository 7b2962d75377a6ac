"""What auto mode tries: which methods the base and the mined data allow, and each trial's
method and hyperparameters.

The methods follow from the base's dev results and the data mining could write:
- SFT (on mined failures with their references) whenever mining wrote chat rows;
- DPO when mining wrote preference pairs (the reference preferred over what the base said);
- RL when the reward gives signal: the base passes at least `RL_SIGNAL_PASS_RATE` of dev, or
  earns partial credit (`RL_SIGNAL_MEAN_SCORE`); otherwise every group would score the same;
- SFT then RL (one chained job) when both are allowed and RL alone has no signal: SFT gives
  RL the starting point its reward needs.

The first trial is the plain default (the preferred method, learning-rate multiplier 1, the
largest rank allowed up to 16, the most steps allowed): the search starts from what a person
would try first. Where the run considers several bases, the first trials are that default on
each base, in the order of their dev results, and the search goes on from the best of them
(`base` is then one more parameter of the space). Where the constraints allow both LoRA and
full-parameter training, one more default follows: the default SFT trial on the first base with
every weight trained (`training_type` full, SFT only: DPO and RL keep a frozen reference), and
`training_type` joins the space (TPE's full-parameter choices for another method train LoRA).
Whether a full-parameter trial runs at all is the budget's call: the driver trains the same
trial with LoRA when the full-parameter estimate does not fit what is left. The next two move
only the best default's learning rate,
the hyperparameter that matters most for a fixed number of steps: doubled, then doubled again
if that helped or halved if not (a measured run that left these to TPE spent its start-up on
random draws below the default, which did worse).
Trials after those come from an Optuna TPE study (ask and tell) rebuilt, at every call, from
the finished trials stored in the database: the database is the study's memory, so a driver
that restarts loses nothing and the same trials give the same next choice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

RL_SIGNAL_PASS_RATE = 0.1
RL_SIGNAL_MEAN_SCORE = 0.2
RANKS = (4, 8, 16, 32, 64, 128)
DEFAULT_RANK = 16
# Which mined dataset kind each method trains on.
DATA_OF_METHOD = {"sft": "chat", "dpo": "preference", "rl": "prompts", "sft_rl": "chat"}
# Preferred first: the method the first trial uses among those allowed.
PREFERENCE = ("sft", "sft_rl", "dpo", "rl")
MIN_LR_MULTIPLIER, MAX_LR_MULTIPLIER = 0.25, 4.0
# The default's learning-rate multiplier times these, in turn, for trials 2 and 3 (see above).
LEARNING_RATE_MOVES = (2.0, 4.0)


@dataclass(frozen=True)
class MethodChoice:
    """The methods trials may use, and why each allowed one is in or out."""

    methods: list[str]
    reasons: list[tuple[str, str]]


def choose_methods(
    allowed: Sequence[str], base_dev: Mapping[str, float], mined: Mapping[str, str | None]
) -> MethodChoice:
    """The trial methods among `allowed` (sft, dpo, rl) that the base's dev results
    (`accuracy`, `mean_score`) and the mined datasets (kind -> dataset id or None) support."""
    pass_rate, mean_score = base_dev.get("accuracy", 0.0), base_dev.get("mean_score", 0.0)
    signal = pass_rate >= RL_SIGNAL_PASS_RATE or mean_score >= RL_SIGNAL_MEAN_SCORE
    methods: list[str] = []
    reasons: list[tuple[str, str]] = []
    if "sft" in allowed:
        if mined.get("chat"):
            methods.append("sft")
            reasons.append(("try SFT", f"mining wrote SFT rows from the base's train failures ({mined['chat']})"))
        else:
            reasons.append(("skip SFT", "mining wrote no SFT rows: no failed train task has a reference answer"))
    if "dpo" in allowed:
        if mined.get("preference"):
            methods.append("dpo")
            reasons.append(("try DPO", f"mining wrote preference pairs ({mined['preference']})"))
        else:
            reasons.append(("skip DPO", "mining wrote no preference pairs"))
    if "rl" in allowed:
        if not mined.get("prompts"):
            reasons.append(("skip RL", "mining wrote no RL prompts"))
        elif signal:
            methods.append("rl")
            reasons.append(
                (
                    "try RL",
                    f"the reward gives signal: the base passes {pass_rate:.0%} of dev with mean score {mean_score:.2f}",
                )
            )
        elif "sft" in methods:
            methods.append("sft_rl")
            reasons.append(
                (
                    "try SFT then RL",
                    f"the base passes {pass_rate:.0%} of dev (mean score {mean_score:.2f}): RL alone would see "
                    "no reward signal, so it runs after an SFT stage",
                )
            )
        else:
            reasons.append(
                ("skip RL", f"the base passes {pass_rate:.0%} of dev: no reward signal, and no SFT to start")
            )
    ordered = [method for method in PREFERENCE if method in methods]
    return MethodChoice(ordered, reasons)


def ranks_up_to(max_rank: int) -> list[int]:
    return [rank for rank in RANKS if rank <= max_rank] or [max_rank]


def full_choice(methods: Sequence[str], training_types: Sequence[str]) -> bool:
    """Whether trials choose between LoRA and full-parameter training: both allowed, and SFT
    (the one method full-parameter training runs) among the methods."""
    return {"lora", "full"} <= set(training_types) and "sft" in methods


def _space(
    methods: Sequence[str], max_rank: int, max_steps: int, bases: Sequence[str], choose_full: bool
) -> dict[str, Any]:
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    return {
        **({"base": CategoricalDistribution(list(bases))} if len(bases) > 1 else {}),
        **({"training_type": CategoricalDistribution(["lora", "full"])} if choose_full else {}),
        "method": CategoricalDistribution(list(methods)),
        "learning_rate_multiplier": FloatDistribution(MIN_LR_MULTIPLIER, MAX_LR_MULTIPLIER, log=True),
        "rank": CategoricalDistribution(ranks_up_to(max_rank)),
        "steps": IntDistribution(max(1, max_steps // 4), max_steps, log=True),
    }


def first_params(methods: Sequence[str], max_rank: int, max_steps: int) -> dict[str, Any]:
    ranks = ranks_up_to(max_rank)
    return {
        "method": methods[0],
        "learning_rate_multiplier": 1.0,
        "rank": max(rank for rank in ranks if rank <= DEFAULT_RANK) if min(ranks) <= DEFAULT_RANK else ranks[0],
        "steps": max_steps,
    }


def _defaults(
    methods: Sequence[str], max_rank: int, max_steps: int, bases: Sequence[str], choose_full: bool
) -> list[dict[str, Any]]:
    """The default trials, in order: the default on each base, then (where trials choose) the
    default SFT trial on the first base with every weight trained."""
    first = first_params(methods, max_rank, max_steps)
    lora = {"training_type": "lora"} if choose_full else {}
    on = [{"base": base} for base in bases] if len(bases) > 1 else [{}]
    defaults = [{**where, **lora, **first} for where in on]
    if choose_full:
        defaults.append({**on[0], **first, "training_type": "full", "method": "sft"})
    return defaults


def why_params(
    finished: Sequence[tuple[Mapping[str, Any], float]], bases: Sequence[str] = (), choose_full: bool = False
) -> str:
    """Why `next_params` chooses what it does after `finished`: for the decision log."""
    defaults = max(1, len(bases)) + int(choose_full)
    if len(finished) < defaults:
        if choose_full and len(finished) == defaults - 1:
            return (
                "the default SFT trial with every weight trained: the constraints allow LoRA and full-parameter "
                "training, and the budget decides whether it runs"
            )
        return f"the default on base {bases[len(finished)]}" if len(bases) > 1 else "the default first trial"
    best = _best_default(finished[:defaults])[0]
    on = f" on base {best['base']}, the best default" if len(bases) > 1 else ""
    if choose_full:
        on += f" ({'full-parameter' if best.get('training_type') == 'full' else 'LoRA'}, the better default)"
    moves = finished[defaults:]
    if not moves:
        return f"the default{on} with its learning rate doubled"
    if len(moves) == 1:
        helped = moves[0][1] > _best_default(finished[:defaults])[1]
        return (
            f"the default's learning rate{on} doubled again: doubling it helped on dev"
            if helped
            else f"the default{on} with its learning rate halved: doubling it did not help on dev"
        )
    return "chosen by TPE from the trials so far"


def _best_default(defaults: Sequence[tuple[Mapping[str, Any], float]]) -> tuple[Mapping[str, Any], float]:
    """The default trial that scored best (the earliest among equals)."""
    return max(defaults, key=lambda trial: trial[1])


def next_params(
    finished: Sequence[tuple[Mapping[str, Any], float]],
    methods: Sequence[str],
    *,
    max_rank: int,
    max_steps: int,
    seed: int,
    bases: Sequence[str] = (),
    choose_full: bool = False,
) -> dict[str, Any]:
    """The next trial's parameters: the defaults first (`_defaults`), then the best default's
    learning rate moved twice, then TPE's choice given `finished` (each trial's parameters and
    dev score; a failed trial scores 0). With `choose_full`, each carries its `training_type`."""
    defaults = _defaults(methods, max_rank, max_steps, bases, choose_full)
    if len(finished) < len(defaults):
        return defaults[len(finished)]
    if len(finished) < len(defaults) + len(LEARNING_RATE_MOVES):
        default, default_score = _best_default(finished[: len(defaults)])
        moved = finished[len(defaults) :]
        factor = LEARNING_RATE_MOVES[0]
        if moved:  # keep going the way that helped, else turn back past the default
            factor = LEARNING_RATE_MOVES[1] if moved[0][1] > default_score else 1 / LEARNING_RATE_MOVES[0]
        multiplier = float(default["learning_rate_multiplier"]) * factor
        return {**default, "learning_rate_multiplier": min(max(multiplier, MIN_LR_MULTIPLIER), MAX_LR_MULTIPLIER)}
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = _space(methods, max_rank, max_steps, bases, choose_full)
    sampler = optuna.samplers.TPESampler(seed=seed + len(finished), n_startup_trials=2)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    for params, value in finished:  # a trial's parameters, as far as they are this space's
        known = {name: params[name] for name in space if name in params}
        within = {name: space[name] for name in known}
        study.add_trial(optuna.trial.create_trial(params=known, distributions=within, value=value))
    params = dict(study.ask(space).params)
    if params.get("training_type") == "full" and params["method"] != "sft":
        params["training_type"] = "lora"  # full-parameter training runs SFT only
    return params

"""Train -> serve handoff: how long from a freshly trained adapter to its first served token.

Anchor (the common practice): merge the LoRA adapter into the base (peft `merge_and_unload`),
save the merged checkpoint, load it as a new model, and generate the first token.

Mint: the serving node keeps the base resident; the new version is stored in the object
store under its sha256 (as a job's success does), and the node's adapter cache fetches it
from there into an engine slot on the first request, which generates the first token in a
batch beside any other adapter. Both paths start from the same trained PEFT folder and end
at the same first token (checked equal).

Each path is timed twice: to *servable* (the merged model loaded; the version leased in an
engine slot) and to the *first token* (one more forward pass over the prompt, the same work
on both sides). On a CPU the forward pass of even a 135M base is a large share of Mint's
path, so the first-token ratio understates the handoff itself; both are printed.

The serving node runs in a process of its own, as in production: a training worker stores
the version, a node with the base resident serves it. The anchor runs in the process that
trained the adapter, on the base it holds. `--node-in-trainer` runs the node in that process
too (the layout before 2026-12-08; on a 2-core AVX2 EPYC both layouts gave Mint the same first
token, 0.34-0.35 s). In either layout, each process runs its torch work on one thread
(`mint.trainer.compute_lane`): on a CPU a second thread running torch's OpenMP kernels in a
process would slow every parallel op there.

    .venv/bin/python bench/serve_handoff.py [--base smollm2-135m-instruct] [--repeats 3] [--node-in-trainer]

Prints each path's median times, and the ratios (goal: >= 18x, the MinT paper's 18.3x).
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

QUESTION = [{"role": "user", "content": "Name a colour."}]


def trained_adapter(base: object, folder: Path) -> Path:
    """A LoRA adapter (the base's default targets) after two real optimizer steps."""
    from mint.chat.render import render_chat
    from mint.trainer.types import AdamParams, Datum

    session = base.create_session()  # type: ignore[attr-defined]
    tokens, weights = render_chat(base.tokenizer, [*QUESTION, {"role": "assistant", "content": "Teal."}])  # type: ignore[attr-defined]
    datum = Datum(model_input=tokens[:-1], loss_fn_inputs={"target_tokens": tokens[1:], "weights": weights[1:]})
    for _ in range(2):
        session.forward_backward([datum], "cross_entropy")
        session.optim_step(AdamParams(learning_rate=1e-3))
    session.save_weights_for_sampler(folder)
    base.close(session.session_id)  # type: ignore[attr-defined]
    return folder


def merged_first_token(
    spec: object, cache_dir: Path, adapter: Path, prompt: list[int], scratch: Path
) -> tuple[float, float, int]:
    """Merge, save, reload (servable), generate one token: the anchor. (servable s, first token s, token)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from mint.trainer.models import load_base_model

    model, _tokenizer = load_base_model(spec, cache_dir)  # type: ignore[arg-type]
    started = time.perf_counter()
    merged = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    merged.save_pretrained(scratch / "merged", safe_serialization=True)
    reloaded = AutoModelForCausalLM.from_pretrained(scratch / "merged", dtype=torch.float32)
    servable = time.perf_counter() - started
    with torch.no_grad():
        logits = reloaded(torch.tensor([prompt])).logits[0, -1]
    token = int(logits.argmax())
    return servable, time.perf_counter() - started, token


def mint_first_token(node: object, adapter: Path, prompt_messages: list[dict[str, str]]) -> tuple[float, float, int]:
    """Store the version by content hash, lease it into an engine slot (servable), then answer the
    first request. (servable s, first token s, token)."""
    from mint.schemas.inference import AdapterOnNode
    from mint.schemas.node import NodeCompletion
    from mint.services.models.adapters import archive_adapter
    from mint.storage.keys import adapter_key

    started = time.perf_counter()
    stored = node.store.put_content(archive_adapter(adapter), adapter_key)  # type: ignore[attr-defined]
    version = AdapterOnNode(ref="bench@1", sha256=stored.sha256, object_key=stored.key)
    node.know(version)  # type: ignore[attr-defined]
    with node.cache.acquire(stored.sha256):  # type: ignore[attr-defined]
        servable = time.perf_counter() - started
        request = NodeCompletion(
            messages=prompt_messages,
            prompt=None,
            tools=None,
            adapter=version,
            max_tokens=1,
            temperature=0.0,
            top_p=1.0,
            seed=0,
            stop=[],
        )
        event = node.complete(request)[0]  # type: ignore[attr-defined]
    return servable, time.perf_counter() - started, event.token_ids[0]


FirstToken = Callable[[Path], tuple[float, float, int]]


def open_node(base: str, scratch: Path, lane: object) -> object:
    """A serving node of `base` on the torch engine, computing on `lane`, with its store under `scratch`."""
    from mint.config import PROJECT_ROOT, get_settings
    from mint.schemas.base_models import get_base_model_spec
    from mint.serving.engines import open_engine
    from mint.serving.node import ServingNode
    from mint.storage.objects import LocalObjectStore

    spec = get_base_model_spec(base, PROJECT_ROOT / "configs" / "models")
    engine = open_engine(
        spec,
        get_settings().models_cache_dir,
        kind="torch",
        max_adapters=8,
        max_batch_size=16,
        lane=lane,  # type: ignore[arg-type]
    )
    return ServingNode(spec, engine, LocalObjectStore(scratch / "objects"), ssd_dir=scratch / "ssd")


def node_process(connection: object, base: str, scratch: str) -> None:
    """The node in a process of its own: answers each adapter folder it receives with
    `mint_first_token`'s (servable s, first token s, token); None ends it."""
    from mint.trainer.compute_lane import ComputeLane

    lane = ComputeLane()
    lane.start("compute")
    node = open_node(base, Path(scratch), lane)
    connection.send("ready")  # type: ignore[attr-defined]
    while (adapter := connection.recv()) is not None:  # type: ignore[attr-defined]
        connection.send(mint_first_token(node, Path(adapter), QUESTION))  # type: ignore[attr-defined]
    node.close()  # type: ignore[attr-defined]
    lane.stop()


@contextmanager
def serving_node(base: str, scratch: Path, lane: object, *, in_trainer: bool) -> Iterator[FirstToken]:
    """Mint's path from a trained folder to its first token, on a node in this process (`in_trainer`)
    or in a child process started here."""
    if in_trainer:
        node = open_node(base, scratch, lane)
        try:
            yield lambda adapter: mint_first_token(node, adapter, QUESTION)  # the node computes on the lane
        finally:
            node.close()  # type: ignore[attr-defined]
        return
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    process = context.Process(target=node_process, args=(theirs, base, str(scratch / "node")), daemon=True)
    process.start()
    if ours.recv() != "ready":
        raise RuntimeError("the node process did not start")

    def first_token(adapter: Path) -> tuple[float, float, int]:
        ours.send(str(adapter))
        return ours.recv()  # type: ignore[no-any-return]

    try:
        yield first_token
    finally:
        ours.send(None)
        process.join(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default="smollm2-135m-instruct")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--node-in-trainer", action="store_true", help="serve from the process that trains and merges (earlier layout)"
    )
    args = parser.parse_args()

    import torch

    from mint.chat.render import render_prompt
    from mint.config import PROJECT_ROOT, get_settings
    from mint.schemas.base_models import get_base_model_spec
    from mint.trainer.compute_lane import ComputeLane
    from mint.trainer.session import ResidentBase

    torch.manual_seed(0)
    spec = get_base_model_spec(args.base, PROJECT_ROOT / "configs" / "models")
    cache_dir = get_settings().models_cache_dir
    lane = ComputeLane()
    lane.start("compute")
    with tempfile.TemporaryDirectory(prefix="mint-handoff-") as tmp:
        scratch = Path(tmp)
        trainer = lane.run(ResidentBase, spec, cache_dir)
        prompt = render_prompt(trainer.tokenizer, QUESTION)
        times: dict[str, list[float]] = {
            "anchor servable": [],
            "anchor token": [],
            "mint servable": [],
            "mint token": [],
        }
        with serving_node(args.base, scratch, lane, in_trainer=args.node_in_trainer) as first_token:
            for repeat in range(args.repeats):
                adapter = lane.run(trained_adapter, trainer, scratch / f"adapter-{repeat}")
                anchor = lane.run(merged_first_token, spec, cache_dir, adapter, prompt, scratch / f"m{repeat}")
                mint = first_token(adapter)
                assert anchor[2] == mint[2], (anchor[2], mint[2])
                for side, (servable, token, _) in (("anchor", anchor), ("mint", mint)):
                    times[f"{side} servable"].append(servable)
                    times[f"{side} token"].append(token)
                print(
                    f"repeat {repeat + 1}: merged export + load {anchor[0]:.2f} s (first token {anchor[1]:.2f} s), "
                    f"Mint {mint[0] * 1000:.0f} ms (first token {mint[1] * 1000:.0f} ms)"
                )
    lane.stop()
    median = {name: statistics.median(values) for name, values in times.items()}
    layout = "the node in the trainer's process" if args.node_in_trainer else "the node in a process of its own"
    print(f"\nbase {args.base}: train -> serve handoff, median of {args.repeats}; {layout}")
    rows = [
        ("anchor (merge, save, load merged checkpoint)", median["anchor servable"], median["anchor token"]),
        ("Mint (store version, cache fetch into a slot)", median["mint servable"], median["mint token"]),
    ]
    print(f"{'':48} {'servable':>10} {'first token':>12}")
    for label, servable, token in rows:
        print(f"{label:48} {servable:9.3f}s {token:11.3f}s")
    servable_ratio = median["anchor servable"] / median["mint servable"]
    token_ratio = median["anchor token"] / median["mint token"]
    print(f"{'ratio (goal >= 18x)':48} {servable_ratio:9.1f}x {token_ratio:11.1f}x")


if __name__ == "__main__":
    main()

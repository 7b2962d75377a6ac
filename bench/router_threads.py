"""A serving node's decoding speed once a mixture's embedding router has run on request threads.

A node with the torch engine runs every step on the engine's own thread, the one thread in the
process that runs torch's parallel (OpenMP) kernels. A mixture deployment's router embeds each
request with MiniLM: run on the request's thread (an HTTP server's worker, which lives on),
that thread keeps an OpenMP pool of its own, and once a process holds more pool threads than
cores every parallel op of the engine waits for its workers through the kernel
(`mint.trainer.compute_lane`). The node runs the encoder on the engine's thread instead
(`EncoderOnLane`).

Each placement runs in a child process of its own (a pool, once made, lasts as long as its
thread): 8 greedy requests x 32 tokens on the base are timed three times, then 16 mixture
requests are routed from 4 request threads that stay alive, then the decode is timed again.

    .venv/bin/python bench/router_threads.py [--base smollm2-135m-instruct]

Prints each placement's decode seconds before and after routing, and after/before (goal: 1.0x
on the engine's thread; the request threads' placement is the anchor).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PLACEMENTS = {"engine": "the engine's thread (Mint)", "request": "the request threads (anchor)"}
POLICY = {
    "type": "embedding",
    "candidates": [
        {"adapter": "billing@1", "examples": ["I was charged twice this month", "Can I get a refund?"]},
        {"adapter": "shipping@1", "examples": ["Where is my package?", "My parcel has not arrived yet"]},
    ],
}


def measure(base: str, placement: str) -> dict[str, list[float]]:
    """In this process: decode seconds before and after 16 mixture requests routed from 4 threads."""
    from bench.serving_decode import chat_prompts, write_random_adapters
    from mint.config import PROJECT_ROOT, get_settings
    from mint.schemas.base_models import get_base_model_spec
    from mint.schemas.inference import AdapterOnNode
    from mint.schemas.node import NodeCompletion, NodeMixture
    from mint.services.models.adapters import archive_adapter
    from mint.serving.embeddings import get_encoder
    from mint.serving.engine import GenerateRequest
    from mint.serving.engines import open_engine
    from mint.serving.node import ServingNode
    from mint.storage.objects import LocalObjectStore
    from mint.trainer.models import load_base_model

    if placement == "request":  # the encoder as the router would run it without the engine's lane
        ServingNode._encoder = lambda self: get_encoder()  # type: ignore[method-assign]
    spec = get_base_model_spec(base, PROJECT_ROOT / "configs" / "models")
    cache_dir = get_settings().models_cache_dir
    with tempfile.TemporaryDirectory(prefix="mint-router-threads-") as tmp:
        scratch = Path(tmp)
        model, tokenizer = load_base_model(spec, cache_dir)
        folders = write_random_adapters(spec, model, scratch, 2)
        del model
        store = LocalObjectStore(scratch / "objects")
        versions = {}
        for name, folder in zip(("billing", "shipping"), folders, strict=True):
            archive, key = archive_adapter(folder), f"adapters/{name}/1/adapter.tar"
            store.put_bytes(key, archive)
            sha256 = hashlib.sha256(archive).hexdigest()
            versions[f"{name}@1"] = AdapterOnNode(ref=f"{name}@1", sha256=sha256, object_key=key)
        engine = open_engine(spec, cache_dir, kind="torch", max_adapters=4, max_batch_size=16)
        node = ServingNode(spec, engine, store, ssd_dir=scratch / "ssd")
        requests = [
            GenerateRequest(adapter_id=None, prompt_tokens=prompt, max_tokens=32, temperature=0.0, ignore_eos=True)
            for prompt in chat_prompts(tokenizer, 8)
        ]

        def decode() -> float:
            started = time.perf_counter()
            engine.generate(requests)
            return time.perf_counter() - started

        mixture = NodeMixture(revision_id="r1", spec={"adapters": list(versions), "policy": POLICY}, versions=versions)

        def route(index: int) -> None:
            question = [{"role": "user", "content": f"Question {index}: why was my invoice charged twice?"}]
            node.route(NodeCompletion(messages=question, mixture=mixture, max_tokens=1))

        request_threads = ThreadPoolExecutor(4, thread_name_prefix="request")  # alive, as an HTTP server's are
        try:
            decode()  # warm-up
            before = [decode() for _ in range(3)]
            list(request_threads.map(route, range(16)))
            after = [decode() for _ in range(3)]
        finally:
            request_threads.shutdown()
            node.close()
            engine.close()
    return {"before": before, "after": after}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default="smollm2-135m-instruct")
    parser.add_argument("--placement", choices=list(PLACEMENTS), help=argparse.SUPPRESS)  # a child's one
    args = parser.parse_args()
    if args.placement:
        print(json.dumps(measure(args.base, args.placement)))
        return
    print(f"base {args.base}: 8 requests x 32 tokens decoded, before and after routing 16 mixture requests")
    for placement, label in PLACEMENTS.items():
        child = subprocess.run(
            [sys.executable, __file__, "--base", args.base, "--placement", placement],
            check=True,
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        times = json.loads(child.stdout.strip().splitlines()[-1])
        before, after = statistics.median(times["before"]), statistics.median(times["after"])
        print(
            f"encoder on {label:30} before {before:5.2f} s  after {after:5.2f} s  "
            f"after/before {after / before:4.2f}x  (runs: {' '.join(f'{t:.2f}' for t in times['after'])})"
        )


if __name__ == "__main__":
    main()

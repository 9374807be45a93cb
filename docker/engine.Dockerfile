# Engine image: `dllm worker` (the engine pods) and `dllm profile` (the profiling Job), on CUDA.
# Build: docker build -f docker/engine.Dockerfile -t ghcr.io/dllm-dev/dllm-engine:0.1.0 .
FROM nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04

ENV DEBIAN_FRONTEND=noninteractive PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    HF_HOME=/cache/huggingface XDG_CACHE_HOME=/cache
RUN apt-get update && apt-get install -y --no-install-recommends python3.11 python3.11-venv python3-pip \
    && rm -rf /var/lib/apt/lists/* \
    && python3.11 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

# torch with CUDA 12.4 first, then the project (its torch requirement is then already met)
RUN pip install --no-cache-dir torch==2.5.1 --index-url https://download.pytorch.org/whl/cu124
WORKDIR /src
COPY pyproject.toml README.md ./
COPY engine_pod ./engine_pod
COPY gateway ./gateway
COPY operator ./operator
RUN pip install --no-cache-dir ".[serve]" && rm -rf /src

RUN useradd --uid 10001 --create-home dllm && mkdir -p /cache && chown dllm /cache
USER 10001
WORKDIR /home/dllm
ENTRYPOINT []
CMD ["dllm", "--help"]

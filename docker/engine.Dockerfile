# Engine image: `dllm worker` (the engine pods) and `dllm profile` (the profiling Job), on NVIDIA GPUs.
# The tested set: torch at the version constraints.txt pins (its CUDA build; the CUDA libraries come
# with the wheels, the driver from the node), everything else with -c constraints.txt.
# Build: scripts/build-images.sh (or docker build -f docker/engine.Dockerfile .)
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu128
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
RUN pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX}"
WORKDIR /src
COPY constraints.txt pyproject.toml README.md ./
COPY dllm_contracts ./dllm_contracts
COPY engine_pod ./engine_pod
COPY gateway ./gateway
COPY operator ./operator
RUN pip install -c constraints.txt ".[serve]"

FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PATH=/opt/venv/bin:$PATH \
    HF_HOME=/cache/huggingface XDG_CACHE_HOME=/cache
COPY --from=build /opt/venv /opt/venv
RUN useradd --uid 10001 --create-home dllm && mkdir -p /cache && chown dllm /cache
USER 10001
WORKDIR /home/dllm
CMD ["dllm", "--help"]

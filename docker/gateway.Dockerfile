# Gateway image: `python -m gateway` (FastAPI, the Redis client, tokenizers); no torch.
# Build: scripts/build-images.sh (or docker build -f docker/gateway.Dockerfile .)
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY constraints.txt docker/gateway-requirements.txt ./
RUN pip install -c constraints.txt -r gateway-requirements.txt
COPY pyproject.toml README.md ./
COPY dllm_contracts ./dllm_contracts
COPY engine_pod ./engine_pod
COPY gateway ./gateway
COPY operator ./operator
# --no-deps: the project's own requirements are the engine's (torch); the gateway's are installed above
RUN pip install --no-deps .

FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PATH=/opt/venv/bin:$PATH \
    HF_HOME=/cache/huggingface XDG_CACHE_HOME=/cache
COPY --from=build /opt/venv /opt/venv
RUN useradd --uid 10001 --create-home dllm && mkdir -p /cache && chown dllm /cache
USER 10001
WORKDIR /home/dllm
EXPOSE 8000
CMD ["python", "-m", "gateway", "--port", "8000"]

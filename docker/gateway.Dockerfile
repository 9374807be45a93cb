# Gateway image: FastAPI + Redis client + tokenizers; no torch (checked by the test suite).
# Build: docker build -f docker/gateway.Dockerfile -t ghcr.io/dllm-dev/dllm-gateway:0.1.0 .
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HF_HOME=/cache/huggingface XDG_CACHE_HOME=/cache
WORKDIR /src
COPY docker/gateway-requirements.txt ./
RUN pip install --no-cache-dir -r gateway-requirements.txt
COPY pyproject.toml README.md ./
COPY engine_pod ./engine_pod
COPY gateway ./gateway
COPY operator ./operator
# --no-deps: the distribution's torch requirement is for the engine, not the gateway
RUN pip install --no-cache-dir --no-deps . && rm -rf /src

RUN useradd --uid 10001 --create-home dllm && mkdir -p /cache && chown dllm /cache
USER 10001
WORKDIR /home/dllm
EXPOSE 8000
CMD ["python", "-m", "gateway", "--port", "8000"]

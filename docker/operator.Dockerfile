# Operator image: `kopf run -m dllm_operator`; no torch.
# Build: docker build -f docker/operator.Dockerfile -t ghcr.io/dllm-dev/dllm-operator:0.1.0 .
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /src
COPY docker/operator-requirements.txt ./
RUN pip install --no-cache-dir -r operator-requirements.txt
COPY pyproject.toml README.md ./
COPY engine_pod ./engine_pod
COPY gateway ./gateway
COPY operator ./operator
RUN pip install --no-cache-dir --no-deps . && rm -rf /src

RUN useradd --uid 10001 --create-home dllm
USER 10001
WORKDIR /home/dllm
CMD ["kopf", "run", "--standalone", "--all-namespaces", "-m", "dllm_operator"]

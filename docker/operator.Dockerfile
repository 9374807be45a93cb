# Operator image: `kopf run -m dllm_operator`; no torch.
# Build: scripts/build-images.sh (or docker build -f docker/operator.Dockerfile .)
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY constraints.txt docker/operator-requirements.txt ./
RUN pip install -c constraints.txt -r operator-requirements.txt
COPY pyproject.toml README.md ./
COPY dllm_contracts ./dllm_contracts
COPY engine_pod ./engine_pod
COPY gateway ./gateway
COPY operator ./operator
RUN pip install --no-deps .

FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PATH=/opt/venv/bin:$PATH
COPY --from=build /opt/venv /opt/venv
RUN useradd --uid 10001 --create-home dllm
USER 10001
WORKDIR /home/dllm
CMD ["kopf", "run", "--standalone", "--all-namespaces", "-m", "dllm_operator"]

# The quality sidecar: slim Python, non-root, only the `sidecar` extra (no vLLM, no torch).
#   docker build -f deploy/docker/sidecar.Dockerfile -t ghcr.io/vllm-lookahead/quality-sidecar:0.1.0 .
# Runs with a read-only root filesystem in the chart: nothing is written outside /tmp.
FROM python:3.12-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY vllm_lookahead ./vllm_lookahead
COPY quality_sidecar ./quality_sidecar
RUN python -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir ".[sidecar]"

FROM python:3.12-slim
RUN groupadd --gid 10001 sidecar \
 && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin sidecar
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 10001:10001
EXPOSE 9400
ENTRYPOINT ["quality-sidecar"]
CMD ["run", "--help"]

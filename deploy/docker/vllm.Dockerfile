# vLLM + the lookahead plugin, on the official vLLM image of the pinned version (0.32.0).
#   docker build -f deploy/docker/vllm.Dockerfile -t ghcr.io/vllm-lookahead/vllm-lookahead:0.1.0 .
# The plugin registers through the `vllm.general_plugins` entry point, so `vllm serve` loads it in
# every process; the chart passes --speculative-config/--additional-config.  Only the telemetry
# extra is added: vLLM itself comes from the base image and must not be reinstalled (the plugin
# checks the vLLM version at import time).
FROM vllm/vllm-openai:v0.32.0

WORKDIR /opt/vllm-lookahead
COPY pyproject.toml README.md ./
COPY vllm_lookahead ./vllm_lookahead
COPY quality_sidecar ./quality_sidecar

# Installs this checkout (pinned by the build context), not a registry package.
# hadolint ignore=DL3013
RUN python3 -m pip install --no-cache-dir ".[telemetry]" \
 && python3 -c "import importlib.metadata as m; print('vllm', m.version('vllm'), 'vllm-lookahead', m.version('vllm-lookahead'))"

# vLLM needs no root: run as UID 2000 so the pod meets PodSecurity "restricted" (the chart sets
# runAsUser 2000 too, and points HOME at an emptyDir for the torch/Triton/vLLM caches).
RUN useradd --uid 2000 --user-group --create-home --home-dir /home/vllm vllm
ENV VLLM_LOOKAHEAD_TELEMETRY=1 HOME=/home/vllm
USER 2000
EXPOSE 8000
ENTRYPOINT ["vllm", "serve"]

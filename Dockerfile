# The slogate image: one image, three entrypoints.
#   slogate operator    the kopf operator (the Helm chart runs it)
#   slogate sidecar     the per-pod gate the operator injects next to llama-server
#   slogate calibrate   the calibration Job's main container
# Non-root (65532), and nothing is written outside /tmp, so it runs with
# readOnlyRootFilesystem: true and an emptyDir on /tmp.
#
# No registry publishes this image: build it. `slogate:0.1.0` is the name the chart and the
# operator default to (load it into kind, or push it and set image.repository:
# docs/install.md). SOURCE_URL, if given, becomes the org.opencontainers.image.source label.
#
#   docker build -t slogate:0.1.0 .

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# Dependencies first, so a source change does not re-download them.
COPY pyproject.toml README.md ./
RUN python -m venv /opt/slogate \
 && /opt/slogate/bin/pip install --upgrade pip wheel setuptools \
 && /opt/slogate/bin/python -c "import subprocess, tomllib; \
deps = tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']; \
subprocess.run(['/opt/slogate/bin/pip', 'install', *deps], check=True)"
COPY admission admission
COPY llama llama
COPY calibration calibration
COPY sidecar sidecar
COPY operator operator
COPY sim sim
COPY bench bench
COPY cli cli
# Install, prove every subcommand imports, and byte-compile now: at run time the root
# filesystem is read-only.
RUN /opt/slogate/bin/pip install --no-deps . \
 && /opt/slogate/bin/slogate --help >/dev/null \
 && /opt/slogate/bin/python -m compileall -q /opt/slogate/lib

FROM ${PYTHON_IMAGE}
ARG SOURCE_URL=""
LABEL org.opencontainers.image.title="slogate" \
      org.opencontainers.image.description="SLO-derived admission control for llama.cpp: operator, sidecar, calibrator" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="${SOURCE_URL}"
RUN groupadd --system --gid 65532 slogate \
 && useradd --system --uid 65532 --gid 65532 --home-dir /tmp --no-create-home --shell /usr/sbin/nologin slogate
COPY --from=build /opt/slogate /opt/slogate
COPY LICENSE /usr/share/doc/slogate/LICENSE
# Everything that might want a writable home or cache points into /tmp (an emptyDir in
# the pod); Python writes no .pyc files at run time.
ENV PATH=/opt/slogate/bin:$PATH \
    HOME=/tmp \
    XDG_CACHE_HOME=/tmp/.cache \
    XDG_CONFIG_HOME=/tmp/.config \
    XDG_DATA_HOME=/tmp/.local/share \
    MPLCONFIGDIR=/tmp/.config/matplotlib \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 65532:65532
WORKDIR /tmp
# 8081: the sidecar's client port; 8082: its admin API and /metrics;
# 8080: the operator's liveness endpoint; 9090: the operator's metrics.
EXPOSE 8081 8082
ENTRYPOINT ["slogate"]
CMD ["--help"]

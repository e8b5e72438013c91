# dl-gate: the GitHub Action's image. action.yml runs the prebuilt image by reference
# (docker://ghcr.io/dl-gate/dl-gate:<version>-cpu, published and digest-pinned by release.yml);
# build it yourself in a fork (and point action.yml's `image:` at `Dockerfile` or your registry):
#
#   torch only, CPU (the action's image):  docker build -t dl-gate:cpu .
#   torch + TensorFlow, CPU:               docker build -t dl-gate:cpu-all --build-arg TF_PACKAGE=tensorflow-cpu .
#   CUDA (a job `container:` with `options: --gpus all`):
#     docker build -t dl-gate:cuda --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 .
#   The CUDA runtime comes with the wheels; the host needs the NVIDIA driver and container toolkit.
#
# Two stages: everything is installed into /opt/venv in the builder and only that venv is copied
# into the final image, so no pip cache, build tool or wheel file is left in it.
#
# Docker actions run as root (GitHub's requirement): the entrypoint hands every file it leaves
# in the runner-owned workspace back to the workspace's owner, so later steps can clean up.
ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim-bookworm AS build
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# empty: no TensorFlow (the torch-only image); tensorflow-cpu or tensorflow[and-cuda] for the others
ARG TF_PACKAGE=""
ARG TF_VERSION=2.21.*
# triton: Triton kernels run in its interpreter on CPU (compiled on CUDA); cpp: ninja, with which
# torch.utils.cpp_extension builds a library's C++ extension (`build:`, docs/kernels.md)
ARG EXTRAS=plot,opinfo,triton,cpp
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# the frameworks first (the slow, rarely changing layer): torch from TORCH_INDEX_URL (CPU by
# default), TensorFlow from PyPI only when TF_PACKAGE names it
RUN pip install --no-cache-dir --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}" \
 && if [ -n "${TF_PACKAGE}" ]; then pip install --no-cache-dir "${TF_PACKAGE}==${TF_VERSION}"; fi
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gate ./gate
RUN pip install --no-cache-dir "/src[${EXTRAS}]" \
 && find /opt/venv -depth -name __pycache__ -type d -exec rm -rf {} + \
 && python -c "from gate.oracles import fused; from gate.search import randoms; assert fused.warm() and randoms.warm()" \
 && dl-gate --version

FROM python:${PYTHON_VERSION}-slim-bookworm
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    MPLBACKEND=Agg \
    MPLCONFIGDIR=/tmp/matplotlib
# git: the gate diffs the pull request against the merge-base with its base ref; g++ and make:
# it builds a library's C++ extension on both sides (`build:` in .dl-gate.yml, docs/kernels.md).
RUN apt-get update \
 && apt-get install -y --no-install-recommends git g++ make \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/venv /opt/venv
RUN dl-gate --version

ENTRYPOINT ["dl-gate", "action"]

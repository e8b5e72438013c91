# dl-gate: the GitHub Action's image, and with build args the CUDA image for self-hosted GPU runners.
#
#   CPU (what action.yml builds):  docker build -t dl-gate .
#   CUDA (for a job `container:` with `options: --gpus all`):
#     docker build -t dl-gate:cuda \
#       --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 \
#       --build-arg "TF_PACKAGE=tensorflow[and-cuda]" .
#   The CUDA runtime comes with the wheels; the host needs the NVIDIA driver and container toolkit.
#
# Docker actions run as root (GitHub's requirement): the entrypoint hands every file it leaves
# in the runner-owned workspace back to the workspace's owner, so later steps can clean up.
ARG PYTHON_VERSION=3.11
FROM python:${PYTHON_VERSION}-slim-bookworm

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG TF_PACKAGE=tensorflow-cpu
ARG TF_VERSION=2.21.*

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    MPLBACKEND=Agg \
    MPLCONFIGDIR=/tmp/matplotlib

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# git: the gate diffs the pull request against the merge-base with its base ref; g++ and make:
# it builds a library's C++ extension on both sides (`build:` in .dl-gate.yml, docs/kernels.md).
RUN apt-get update \
 && apt-get install -y --no-install-recommends git g++ make \
 && rm -rf /var/lib/apt/lists/*

# The frameworks first (the slow, rarely changing layer): torch from the index given by
# TORCH_INDEX_URL (CPU by default), TensorFlow from PyPI.
RUN pip install --no-cache-dir --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}" \
 && pip install --no-cache-dir "${TF_PACKAGE}==${TF_VERSION}"

WORKDIR /opt/dl-gate
COPY pyproject.toml README.md ./
COPY gate ./gate
# triton: Triton kernels run in its interpreter on CPU; ninja: torch.utils.cpp_extension builds
RUN pip install --no-cache-dir "/opt/dl-gate[plot,opinfo,export,triton,cpp]" \
 && dl-gate --version

ENTRYPOINT ["dl-gate", "action"]

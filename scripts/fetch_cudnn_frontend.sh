#!/usr/bin/env bash
# Fetches cudnn-frontend's C++ headers (cuDNN's graph API, header-only) into
# .cache/cudnn-frontend/include/, where meson finds them for the CUDA
# backend's convolutions (src/backend/cuda/conv_graph.cpp). They ship in
# PyPI's nvidia-cudnn-frontend wheel: scripts/fetch_wheel_part.sh downloads
# one pinned wheel and extracts include/ only (idempotent, never partial).
#
#   PYTHON   interpreter whose pip is used (default: python3)
set -euo pipefail
exec "$(dirname "$0")/fetch_wheel_part.sh" nvidia-cudnn-frontend==1.32.0 \
    nvidia_cudnn_frontend-1.32.0-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl \
    c6006556017a4d1c914c52a556c71b1267f2d6a0500f742e7b4edef539878df0 \
    manylinux_2_28_x86_64 include/ .cache/cudnn-frontend/include 90

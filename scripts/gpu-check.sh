#!/bin/bash
# gfcr's GPU check (issue 33): the tests marked `gpu` and the GPU benchmarks in one call
# of at most 5 minutes on a bare GPU machine, with a JSON of figures.
#
#   scripts/gpu-check.sh build         # here: the carry folder .gpu/ (git ignores it)
#   scripts/gpu-check.sh device        # there, from the repository root: OUT=<folder>
#
# A lent GPU machine (Python 3.12, torch, transformers, peft, pyarrow; no internet)
# lacks gfcr's other dependencies (../shared/gpu/README.md). `build` puts in .gpu/:
#   whl/   the wheels of requirements/gpu-carry.txt for CPython 3.12 x86-64 (pip
#          download) and the three with no wheel on the registry (GFCR_GPU_WHEELS,
#          default /work/shared/gpu/wheels: cellpylib, zss, pycosat built from source);
#   meta/  gfcr's distribution metadata (its entry points: the store backend, stage
#          plugins and ready pipelines are found through importlib.metadata), written
#          from pyproject.toml, so no build of gfcr is needed.
# The device tool copies the working tree; carry [".gpu"] brings these. Then `device`
# installs the wheels into /tmp/site, runs `pytest -m gpu`, bench/learner_speed.py
# (a ~0.5B Llama in bf16 against a plain PyTorch loop) and bench/gpu_step.py (a
# colocated HF engine + learner run), each under its own time limit, and writes
# $OUT/gpu-check.json (and the logs beside it).
set -o pipefail
cd "$(dirname "$0")/.." || exit 1
HERE=$PWD

build() {
  local py=${PYTHON:-python3} from=${GFCR_GPU_WHEELS:-/work/shared/gpu/wheels}
  rm -rf .gpu && mkdir -p .gpu/whl .gpu/meta
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .gpu/whl -r requirements/gpu-carry.txt || return 1
  cp "$from"/*.whl .gpu/whl/ || return 1
  "$py" - <<'EOF' || return 1
import tomllib
from pathlib import Path

project = tomllib.loads(Path("pyproject.toml").read_text())["project"]
meta = Path(".gpu/meta") / f"gfcr-{project['version']}.dist-info"
meta.mkdir(parents=True)
(meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: gfcr\nVersion: {project['version']}\n")
groups = dict(project.get("entry-points", {}))
groups["console_scripts"] = project.get("scripts", {})
(meta / "entry_points.txt").write_text("".join(
    f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items()) + "\n"
    for group, entries in groups.items()))
EOF
  git rev-parse HEAD > .gpu/commit.txt 2>/dev/null
  du -sh .gpu
  echo "carry: [\".gpu\"]   command: OUT=\$OUT bash scripts/gpu-check.sh device   timeout_s: 330"
}

T0=$SECONDS
# a phase's limit: its own, cut so the phases after it (their reserve) still fit DEADLINE
left() { local want=$1 r=$(( ${DEADLINE:-300} - (SECONDS - T0) - $2 )); [ "$r" -lt "$want" ] && want=$r; [ "$want" -lt 5 ] && want=5; echo "$want"; }

device() {
  OUT=${OUT:-/tmp/gpu-check}; mkdir -p "$OUT"
  export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
  if [ -d .gpu/whl ] && [ -z "$NO_INSTALL" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/whl/*.whl \
      > "$OUT/install.log" 2>&1 || echo "INSTALL FAILED (see install.log)"
  fi
  export PYTHONPATH=/tmp/site:$HERE:$HERE/.gpu/meta
  echo "=== installed at $((SECONDS - T0))s"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt" 2>&1
  echo "=== pytest -m gpu at $((SECONDS - T0))s"
  timeout "$(left 150 150)" python3 -m pytest -m gpu tests/gpu -q -p no:cacheprovider -rs \
    --junitxml="$OUT/gpu-tests.xml" > "$OUT/gpu-tests.log" 2>&1
  echo "pytest rc=$?"; tail -3 "$OUT/gpu-tests.log"
  echo "=== bench/learner_speed.py (bf16, ~0.5B) at $((SECONDS - T0))s"
  timeout "$(left 90 60)" python3 bench/learner_speed.py --json --size gpu --precision bf16 --micro 64 \
    > "$OUT/learner_speed.json" 2> "$OUT/learner_speed.log"
  echo "learner_speed rc=$?"; cat "$OUT/learner_speed.json"
  echo "=== bench/gpu_step.py (colocated HF + learner) at $((SECONDS - T0))s"
  timeout "$(left 90 10)" python3 bench/gpu_step.py --json > "$OUT/gpu_step.json" \
    2> "$OUT/gpu_step.log"
  echo "gpu_step rc=$?"; cat "$OUT/gpu_step.json"
  python3 - "$OUT" <<'EOF'
import json, subprocess, sys, time
import xml.etree.ElementTree as ET
from pathlib import Path

out = Path(sys.argv[1])
def read(name):
    path = out / name
    try:
        return json.loads(path.read_text().strip().splitlines()[-1])
    except Exception as err:  # a phase that failed or ran out of time: say so
        return {"error": f"{name}: {type(err).__name__}: {err}"}
tests = {}
try:
    suite = ET.parse(out / "gpu-tests.xml").getroot()
    suite = suite if suite.tag == "testsuite" else suite[0]
    tests = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
except Exception as err:
    tests = {"error": f"{type(err).__name__}: {err}"}
commit = (Path(".gpu/commit.txt").read_text().strip() if Path(".gpu/commit.txt").exists()
          else subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                              text=True).stdout.strip())
figures = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit or None,
           "gpu": (out / "gpu.txt").read_text().strip() if (out / "gpu.txt").exists() else None,
           "gpu_tests": tests, "learner_speed": read("learner_speed.json"),
           "gpu_step": read("gpu_step.json")}
(out / "gpu-check.json").write_text(json.dumps(figures, indent=1))
print(json.dumps(figures, indent=1))
EOF
  echo "=== done at $((SECONDS - T0))s"
}

case "${1:-device}" in
  build) build ;;
  device) mkdir -p "${OUT:=/tmp/gpu-check}"; device 2>&1 | tee "$OUT/log.txt" ;;
  *) echo "usage: scripts/gpu-check.sh build|device" >&2; exit 2 ;;
esac

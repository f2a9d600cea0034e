#!/usr/bin/env bash
# Build the wheelhouse bench/gpu.py needs on a GPU machine that has jax with CUDA but no package index.
#
#   bench/gpu_wheels.sh [WHEELS_DIR=wheels] [PYTHON_VERSION=3.12] [PLATFORM=manylinux2014_x86_64]
#
# Run it here (with an index), carry WHEELS_DIR beside the checkout, and on the GPU machine run, from
# the checkout:
#
#   pip install --no-index --find-links wheels -r wheels/requirements.txt && python bench/gpu.py --out gpu.jsonl
#
# dew's own dependencies are downloaded for the target's Python and platform, except jax and jaxlib:
# the GPU machine's CUDA build of those stays as it is (requirements.txt pins the jax range dew takes,
# so pip checks it without replacing it). bench/gpu.py runs from the checkout, so dew itself is not
# installed; its wheel is built too, for a machine that wants it installed.
set -euo pipefail
WHEELS=${1:-wheels}
PYVER=${2:-3.12}
PLATFORM=${3:-manylinux2014_x86_64}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-python}
mkdir -p "$WHEELS"
# The dependencies pyproject.toml declares, jax's excluded (its CUDA build is on the target already).
"$PY" - "$ROOT/pyproject.toml" > "$WHEELS/requirements.txt" <<'PYEOF'
import sys, tomllib
deps = tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]
print("\n".join(d for d in deps if not d.startswith(("jax>", "jax=", "jax<", "jaxlib"))))
PYEOF
"$PY" -m pip download --dest "$WHEELS" --only-binary=:all: --python-version "$PYVER" \
  --platform "$PLATFORM" --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --implementation cp -r "$WHEELS/requirements.txt"
# The downloads above pull jax and jaxlib in as dependencies of flax/optax/orbax; the target keeps
# its own, so they are dropped from the wheelhouse and pip resolves them to what is installed.
rm -f "$WHEELS"/jax-*.whl "$WHEELS"/jaxlib-*.whl
"$PY" -m pip wheel --no-deps --wheel-dir "$WHEELS" "$ROOT"
echo "wheelhouse: $WHEELS ($(ls "$WHEELS"/*.whl | wc -l) wheels)"

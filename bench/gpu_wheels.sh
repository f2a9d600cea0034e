#!/usr/bin/env bash
# Build the wheelhouse bench/gpu.py needs on a GPU machine that has jax with CUDA but no package index.
#
#   PY=python bench/gpu_wheels.sh [WHEELS_DIR=wheels]
#
# Run it on a machine with an index and the GPU machine's Python minor version and platform (CPython
# 3.12 on x86_64 Linux for an H200 host: `pip wheel` builds for the Python that runs it, which is
# what lets the sdist-only dependencies, omegaconf's antlr4 runtime among them, become wheels). Carry
# WHEELS_DIR beside the checkout and on the GPU machine run, from the checkout:
#
#   pip install --no-index --find-links wheels -r wheels/requirements.txt && python bench/gpu.py --out gpu.jsonl
#
# requirements.txt is dew's dependencies without jax: the GPU machine's CUDA build of jax and jaxlib
# stays as it is, and their wheels are left out of the wheelhouse so pip resolves flax, optax and
# orbax against the installed one. bench/gpu.py runs from the checkout, so dew itself need not be
# installed; its wheel is built too, for a machine that wants it.
set -euo pipefail
WHEELS=${1:-wheels}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-python}
mkdir -p "$WHEELS"
"$PY" - "$ROOT/pyproject.toml" > "$WHEELS/requirements.txt" <<'PYEOF'
import sys, tomllib
deps = tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]
print("\n".join(d for d in deps if not d.startswith(("jax>", "jax=", "jax<", "jaxlib"))))
PYEOF
"$PY" -m pip wheel --prefer-binary --wheel-dir "$WHEELS" -r "$WHEELS/requirements.txt"
rm -f "$WHEELS"/jax-*.whl "$WHEELS"/jaxlib-*.whl "$WHEELS"/jax_cuda*.whl
"$PY" -m pip wheel --no-deps --wheel-dir "$WHEELS" "$ROOT"
echo "wheelhouse: $WHEELS ($(ls "$WHEELS"/*.whl | wc -l) wheels) for $("$PY" -c 'import sys, sysconfig; print(sys.implementation.cache_tag, sysconfig.get_platform())')"

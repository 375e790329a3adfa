#!/usr/bin/env bash
# Install the vLLM 0.33.0 twin venv (twin/README.md) for the real-server test tier
# (tests/twin/) and the twin parts of benchmarks/fidelity and benchmarks/leak_eval.
#
#   scripts/install-twin.sh [VENV_DIR]      # default: <repo>/.venv-twin (git-ignored)
#
# Idempotent: does nothing when VENV_DIR/bin/python can already `import vllm` (the CI cache).
# Quiet; exits non-zero with a message on stderr when anything fails.
set -euo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${1:-$REPO/.venv-twin}"
REQS="$REPO/scripts/twin-requirements.txt"  # pinned, installed with --no-deps (see its header)
TWIN_TORCH="torch==2.13.0"  # the CPU build; an unpinned torch resolves to a CUDA one of GBs
# Same environment the twin itself needs, so the import check means what the tests mean.
export VLLM_TARGET_DEVICE=cpu HF_HUB_OFFLINE=1 PYTHONDONTWRITEBYTECODE=1

fail() {
  echo "install-twin: $*" >&2
  exit 1
}

has_vllm() {
  [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import vllm" >/dev/null 2>&1
}

if has_vllm; then
  echo "install-twin: $VENV already has vllm; nothing to do"
  exit 0
fi
[ -f "$REQS" ] || fail "$REQS not found"
command -v python3 >/dev/null || fail "python3 not found"

LOG="$(mktemp)"
trap 'rm -f "$LOG"' EXIT

# Run quietly; on failure show the tail of the output and stop.
quiet() {
  local what="$1"
  shift
  "$@" >"$LOG" 2>&1 || { tail -n 25 "$LOG" >&2; fail "$what failed"; }
}

start=$SECONDS
quiet "python3 -m venv $VENV" python3 -m venv "$VENV"
# CPU torch first, then the pinned packages without dependency resolution.
quiet "pip install $TWIN_TORCH" "$VENV/bin/pip" install -q "$TWIN_TORCH"
quiet "pip install --no-deps -r $REQS" "$VENV/bin/pip" install -q --no-deps -r "$REQS"
has_vllm || fail "vllm installed into $VENV but 'import vllm' fails"
echo "install-twin: $VENV ready in $((SECONDS - start)) s"

#!/usr/bin/env bash
# Accelerator figures for a ~1B-parameter Llama (random weights): rrc_jax's sampler and transformers' generate in
# tokens/s, and one GRPO learner step with its model FLOP utilization (benchmarks/device.py has the details).
#
#   bash benchmarks/device.sh [--dry_run] [device.py flags, e.g. --micro_batch=8 --peak_tflops=989]
#
# Runs the three parts of benchmarks/device.py (sampler, transformers, learner), each in its own process under one
# overall time limit (TIMEOUT_S, default 450 s); a part that fails does not stop the others, and the script exits
# with the first failure's status. --dry_run (or DRY_RUN=1) runs the same code on the CPU with a tiny model, in
# seconds. Results go to $OUT (if set, e.g. on a remote accelerator machine) or benchmarks/results/, as device_<part>.json.
# Uses the repository's rrc_jax through PYTHONPATH (no install needed); PYTHON picks the interpreter.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

dry=0
args=()
for arg in "$@"; do
  case "$arg" in
    --dry_run) dry=1 ;;
    *) args+=("$arg") ;;
  esac
done
case "${DRY_RUN:-}" in
  "" | 0 | false | no) ;;
  *) dry=1 ;;
esac
if [[ "$dry" == 1 ]]; then
  args+=(--dry_run)
  export JAX_PLATFORMS=cpu
fi

PYTHON="${PYTHON:-$(command -v python || command -v python3)}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# Each part is its own process: JAX may take most of the accelerator (the learner step needs about 70 GB).
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.90}"
limit="${TIMEOUT_S:-450}"
results="${OUT:-benchmarks/results}"
ckpt="$(mktemp -d "${TMPDIR:-/tmp}/rrc_device_ckpt.XXXXXX")"
trap 'rm -rf "$ckpt"' EXIT

echo "== environment"
date -u +"%Y-%m-%dT%H:%M:%SZ"
echo "dry run: $dry; time limit: ${limit} s; python: $PYTHON; results: $results"
if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
fi
if ! "$PYTHON" -c "import rrc_jax" 2> /dev/null; then
  "$PYTHON" -m pip install --no-deps -e . # only if PYTHONPATH did not make rrc_jax importable
fi
"$PYTHON" - << 'EOF'
import importlib
import jax

print(f"jax {jax.__version__}: {jax.devices()}")
for name in ("flax", "optax", "torch", "transformers"):
    try:
        print(f"{name} {importlib.import_module(name).__version__}")
    except ImportError as e:
        print(f"{name}: not importable ({e})")
EOF

status=0
for part in sampler transformers learner; do
  left=$((limit - SECONDS))
  echo "== $part (${left} s left)"
  if ((left < 10)); then
    echo "error: no time left for $part" >&2
    status=124
    continue
  fi
  rc=0
  if command -v timeout > /dev/null; then
    timeout "$left" "$PYTHON" benchmarks/device.py --part="$part" --ckpt_dir="$ckpt" --out_dir="$results" \
      ${args[@]+"${args[@]}"} || rc=$?
  else
    "$PYTHON" benchmarks/device.py --part="$part" --ckpt_dir="$ckpt" --out_dir="$results" \
      ${args[@]+"${args[@]}"} || rc=$?
  fi
  if ((rc != 0)); then
    why=""
    if ((rc == 124)); then why=" (time limit)"; fi
    echo "error: part $part exited with status ${rc}${why}" >&2
    if ((status == 0)); then status=$rc; fi
  fi
done
echo "== done in ${SECONDS} s (status $status)"
exit "$status"

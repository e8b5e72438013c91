#!/usr/bin/env bash
# The checks a lent GPU machine is for, in one call (docs/contributing.md, "On a GPU machine"):
#   1. the GPU tests: CUDA variants of the built-in rows (tests/test_gpu.py), and `dl-gate run`
#      end to end with CUDA variants on the Triton bed (compiled kernels) and on the C++/CUDA
#      extension bed (built by the gate with nvcc): a regression fails, a benign change passes;
#   2. the CUDA rows of the benches: bench/throughput.py --device cuda (forward and gradient),
#      bench/exhaustive.py --device cuda.
#   3. a profile of one CUDA row's search loop (profile-cuda.log: where an evaluation's time goes).
# PARTS picks some (default: "tests example throughput exhaustive profile"); the example runs
# beside the tests (outcomes, not timings).
# Results under $OUT: gpu-tests.xml (JUnit), gpu-tests.log, reports.tgz (every report.md/json of
# the end-to-end runs), example.log, throughput-cuda.log, exhaustive-cuda.log, env.txt.
#
# The machine has no package index: the gate's own dependencies that its image lacks travel as
# wheels in .whl/ (see the device tool's notes: pip download --python-version 3.12 ...), installed
# into the interpreter. Usage (on the machine, from the repository root): bash bench/gpu_session.sh
set -u
OUT=${OUT:-/tmp/dl-gate-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3
PY=${PYTHON:-python3}
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  # into the interpreter's own site-packages: the beds' subprocesses set PYTHONPATH themselves
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl \
    || { echo "wheel install failed"; exit 3; }
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
git config --global user.name >/dev/null 2>&1 || git config --global user.name dl-gate
git config --global user.email >/dev/null 2>&1 || git config --global user.email dl-gate@localhost
{
  date -u; nvidia-smi -L; nvcc --version | tail -1; g++ --version | head -1; git --version; nproc
  $PY -c "import torch, numpy, numba; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(), 'numpy', numpy.__version__, 'numba', numba.__version__)"
  $PY -c "import triton; print('triton', triton.__version__)"
} 2>&1 | tee "$OUT/env.txt"

PARTS=${PARTS:-tests example throughput exhaustive profile}
has() { case " $PARTS " in *" $1 "*) return 0;; esac; return 1; }
mkdir -p /tmp/dl-gate-gpu-bt
if has example; then
  ( t0=$(date +%s)  # the README's main job, the regression example, where CUDA variants are planned
    timeout "${EXAMPLE_S:-240}" $PY -c "import sys; from gate.cli import main; sys.exit(main())" run --example regression \
      --out /tmp/dl-gate-gpu-bt/example > "$OUT/example.log" 2>&1
    echo "dl-gate run --example regression: exit $? in $(( $(date +%s) - t0 )) s (1 expected)" >> "$OUT/example.log" ) &
fi
if has tests; then
  t0=$(date +%s)
  # -m gpu: the tests that need a device (the rest of those files assume the interpreter on CPU)
  timeout "${GPU_TESTS_S:-330}" $PY -m pytest -p no:cacheprovider -m gpu -n 6 --dist loadfile -o addopts="" -ra \
    --durations=15 --basetemp=/tmp/dl-gate-gpu-bt/tests --junitxml="$OUT/gpu-tests.xml" \
    tests/test_gpu.py tests/test_kernels_cuda.py tests/test_kernels_triton.py tests/test_cuda_modes.py \
    > "$OUT/gpu-tests.log" 2>&1
  echo "gpu tests: exit $? in $(( $(date +%s) - t0 )) s"; tail -40 "$OUT/gpu-tests.log"
fi
wait
if has example; then grep -v "^dl-gate: fuzzing" "$OUT/example.log" | tail -30; fi
(cd /tmp/dl-gate-gpu-bt 2>/dev/null && find . \( -name report.md -o -name report.json -o -name 'repro_*.py' \) \
  | tar czf "$OUT/reports.tgz" -T - 2>/dev/null)

if has throughput; then t0=$(date +%s)
timeout "${THROUGHPUT_S:-120}" $PY bench/throughput.py --device cuda --seconds "${BENCH_SECONDS:-1}" \
  > "$OUT/throughput-cuda.log" 2>&1
echo "throughput (cuda): exit $? in $(( $(date +%s) - t0 )) s"; tail -20 "$OUT/throughput-cuda.log"; fi

if has exhaustive; then t0=$(date +%s)
timeout "${EXHAUSTIVE_S:-60}" $PY bench/exhaustive.py --device cuda --ops torch.erf,torch.exp,torch.tanh --long 1 \
  > "$OUT/exhaustive-cuda.log" 2>&1
echo "exhaustive (cuda): exit $? in $(( $(date +%s) - t0 )) s"; tail -12 "$OUT/exhaustive-cuda.log"; fi

if has profile; then  # one forward row's evaluations (oracle and search), by the time of each function
  timeout 90 $PY -m cProfile -o /tmp/dl-gate-gpu-prof.out bench/throughput.py --row torch.softmax --device cuda \
    --seconds 2 > "$OUT/profile-cuda.log" 2>&1
  $PY -c "import pstats; s = pstats.Stats('/tmp/dl-gate-gpu-prof.out'); s.sort_stats('tottime').print_stats(30); \
s.sort_stats('cumulative').print_stats(40)" >> "$OUT/profile-cuda.log" 2>&1
  grep -A 45 "tottime" "$OUT/profile-cuda.log" | head -50
fi

#!/usr/bin/env bash
# One command for a CUDA machine (the H200 through the device tool, torch preinstalled, no network):
# build from source with all cores, run the whole test suite (CUDA included), run the benchmarks, and
# print a short summary last. Logs and JSON go under $OUT (or ./gpu_check_out).
#
#   scripts/gpu_check.sh [--sanitize] [--deep] [--no-bench] [--quick-bench] [--cpp-example] [--no-build] [--tests "PYTEST ARGS"] [--bench "ARGS"]
#
#   --sanitize     also run the CUDA kernel tests under compute-sanitizer memcheck and racecheck
#   --deep         also run the property suite's long profile (HYPOTHESIS_PROFILE=long, 3000 examples a property)
#   --no-bench     skip benchmarks;  --quick-bench: benchmarks with --quick
#   --cpp-example  also build and run examples/cpp on its own first (tests/test_cpp.py runs it too, on CPU and CUDA)
#   --no-build     reuse the in-place build of an earlier call on the same machine (a suite split over calls)
#   --tests ARGS   pytest selection/args instead of the whole suite (e.g. "-k cuda")
#   --bench ARGS   extra args for benchmarks/run_all.py (e.g. "--only vector_add")
#
# The test run stops (SIGINT, so pytest still prints its summary) after $TEST_TIMEOUT seconds (default 420), and
# every failure is written to $OUT/failures.txt as it happens: a device call cut short still names them.
# --sanitize runs its tools side by side, each for up to $SANITIZE_TIMEOUT seconds (default 300) over
# $SANITIZE_WORKERS pytest processes (default 7); SANITIZE_TOOLS=racecheck (or memcheck) runs one alone.
set -uo pipefail
cd "$(dirname "$0")/.."

SANITIZE=0; DEEP=0; CPP_EXAMPLE=0; BUILD=1; BENCH=1; BENCH_ARGS=""; TEST_ARGS="tests"
while [ $# -gt 0 ]; do
  case "$1" in
    --sanitize) SANITIZE=1 ;;
    --deep) DEEP=1 ;;
    --cpp-example) CPP_EXAMPLE=1 ;;
    --no-bench) BENCH=0 ;;
    --no-build) BUILD=0 ;;
    --quick-bench) BENCH_ARGS="$BENCH_ARGS --quick" ;;
    --bench) BENCH_ARGS="$BENCH_ARGS $2"; shift ;;
    --tests) TEST_ARGS="$2"; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done

OUT=${OUT:-$PWD/gpu_check_out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
summary=()
status=0
note() { summary+=("$1"); echo "== $1"; }

# Python packages the machine lacks travel as wheels in .whl/ (git-ignored; pass carry=[".whl"] to the device
# tool): `python3 -m pip download --no-deps -d .whl expecttest==0.3.0 liger-kernel==0.8.5 transformers==5.23.0`.
# The H200 image has pytest-xdist, hypothesis, cmake, ninja, torch_geometric with its dependencies, and what
# transformers 5.23 imports (huggingface_hub 1.33, tokenizers 0.23.2, safetensors, regex, PyYAML), so
# tests/test_transformers.py, benchmarks/bench_transformers.py and the GAT bench need only those wheels (and, should
# the image's regex be older than transformers' floor, checked at import: `--only-binary=:all: --platform
# manylinux2014_x86_64 --python-version 3.12 regex==2026.12.2`).
if compgen -G ".whl/*.whl" >/dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/torchops-site .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/torchops-site" PATH="/tmp/torchops-site/bin:$PATH"
fi
$PY -c "import expecttest" 2>/dev/null || note "setup: expecttest missing (see .whl/ above): tests/test_vector_add.py will fail to import"
command -v cmake >/dev/null || note "setup: cmake missing (see .whl/ above): the C++ example and tests/test_cpp.py will fail"

# The H200 image sets CC/CXX to /opt/gcc wrappers whose toolchain has only a static libstdc++.a: an
# extension linked with them carries a second libstdc++, and the process crashed (SIGSEGV in ostream
# code) on the first error message formatted on the CUDA path. Built with the system g++ the same
# code raises normally. So build with /usr/bin/g++ unless TORCHOPS_KEEP_CXX=1; the
# compilers in play are logged to gpu.txt either way.
{ echo "CC=${CC:-} CXX=${CXX:-} sysconfig LDSHARED=$($PY -c 'import sysconfig; print(sysconfig.get_config_var("LDSHARED"))')"
  for c in "${CXX:-}" "${CC:-}" /usr/bin/g++; do [ -n "$c" ] && [ -x "$c" ] && echo "$c: $($c --version | head -1) [$(file -b "$(readlink -f "$c")" | cut -c1-60)]"; done
  echo "g++ -print-file-name=libstdc++.so: $(${CXX:-g++} -print-file-name=libstdc++.so) / .a: $(${CXX:-g++} -print-file-name=libstdc++.a)"
} >"$OUT/compilers.txt" 2>&1
if [ "${TORCHOPS_KEEP_CXX:-0}" != 1 ] && [ -x /usr/bin/g++ ]; then
  export CC=/usr/bin/gcc CXX=/usr/bin/g++ LDSHARED="/usr/bin/gcc -shared" LDCXXSHARED="/usr/bin/g++ -shared"
fi

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())" | tee -a "$OUT/gpu.txt"
cat "$OUT/compilers.txt" >>"$OUT/gpu.txt"

# ---- build: in place, against this machine's torch, failing if CUDA can't be built.
t0=$(date +%s)
if [ $BUILD -eq 0 ] && compgen -G "torchops/_C*.so" >/dev/null; then
  # the generated C++ header is git-ignored, and a sync of the tree between calls may remove it
  $PY -c "import sys; sys.path.insert(0, 'scripts'); import gen_ops_header; gen_ops_header.write_header()"
  note "build: reused ($($PY -c 'import torchops; print(torchops.build_info())' 2>&1 | tail -1))"
else
  rm -rf build torchops/_C*.so torchops/lib  # a clean build: a kept build dir would skip relinking with another compiler
  if MAX_JOBS=${MAX_JOBS:-$(nproc)} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} TORCHOPS_FORCE_CUDA=1 \
      $PY setup.py build_ext --inplace >"$OUT/build.log" 2>&1; then
    note "build: ok ($(( $(date +%s) - t0 )) s) $($PY -c 'import torchops; print(torchops.build_info())' 2>&1 | tail -1)"
  else
    tail -40 "$OUT/build.log"
    note "build: FAILED (see build.log)"
    printf '%s\n' "${summary[@]}"
    exit 1
  fi
fi
# Evidence for the libstdc++ question above: libstdc++ internals defined inside the library holding the
# kernels or the Python module (there should be none).
nm -C --defined-only torchops/lib/libtorchops.so torchops/_C*.so | grep -E "std::(basic_ostream|ostream|codecvt|locale)" >"$OUT/libstdcxx-in-C.txt" || true
if nm -C --defined-only torchops/lib/libtorchops.so torchops/_C*.so | grep -q "_M_insert<long>"; then
  note "build: WARNING: libtorchops/_C embed libstdc++ stream code (a static libstdc++ was linked): set CXX to the system g++"
  status=1
fi
py_symbols=$(nm -D --undefined-only torchops/lib/libtorchops.so | grep -c ' Py')
[ "$py_symbols" = 0 ] || { note "build: libtorchops.so needs $py_symbols Python symbols"; status=1; }

# ---- smoke: a CUDA entry point raising a formatted error (the crash seen with the /opt/gcc build)
if $PY -c "
import torch, torchops
try:
    torchops.vector_add(torch.ones(2, 3, device='cuda'), torch.ones(2, 4, device='cuda'))
except RuntimeError as e:
    print('smoke ok:', e)
" >"$OUT/smoke.log" 2>&1; then note "smoke: $(tail -1 "$OUT/smoke.log")"
else note "smoke: FAILED (rc $?): a CUDA-side error message crashes the process, see smoke.log"; status=1; fi

# ---- C++: examples/cpp built with CMake against this torch, run without Python on CPU and CUDA (an AOTInductor
# package, a TorchScript module and direct header calls), outputs compared with Python's. CC/CXX are the system
# compilers here (above), for the program and the AOTInductor .so alike.
if [ $CPP_EXAMPLE -eq 1 ]; then
  t0=$(date +%s)
  if { cmake -S examples/cpp -B build/example $($PY -m torchops.cmake_args) && cmake --build build/example \
       && $PY examples/cpp/export_and_check.py --example build/example/torchops_example --workdir "$OUT/cpp-example" \
            --device cpu --device cuda; } >"$OUT/cpp-example.log" 2>&1; then
    note "cpp example: $(tail -1 "$OUT/cpp-example.log") ($(( $(date +%s) - t0 )) s)"
  else
    tail -30 "$OUT/cpp-example.log"
    note "cpp example: FAILED (see cpp-example.log)"; status=1
  fi
fi

# ---- tests: spread over worker processes when pytest-xdist is there (the compile/export/AOTI tests are
# CPU-bound in Inductor; the machine has 16 cores), else serial.
t0=$(date +%s)
XDIST=""
$PY -c "import xdist" 2>/dev/null && XDIST="-n ${TEST_WORKERS:-8} --dist loadgroup"  # loadgroup: the > 2^31-element tests share one worker
# --durations: the slowest tests at the end of the log, to keep the whole suite within one device call.
export TORCHOPS_FAILURE_LOG="$OUT/failures.txt"
eval "timeout -s INT -k 30 ${TEST_TIMEOUT:-420} $PY -m pytest $TEST_ARGS $XDIST -q -rfEs --durations=25 -p no:cacheprovider \
  --junitxml=\"$OUT/junit.xml\"" >"$OUT/tests.log" 2>&1
rc=$?
[ $rc -ne 0 ] && status=1 && grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -30
note "tests: $(tail -1 "$OUT/tests.log") (rc $rc, $(( $(date +%s) - t0 )) s)"

# ---- the property suite's long profile (the README's deeper run), CPU and CUDA samples alike
if [ $DEEP -eq 1 ]; then
  t0=$(date +%s)
  HYPOTHESIS_PROFILE=long eval "$PY -m pytest tests/test_properties.py tests/test_linear_cross_entropy.py \
    tests/test_rotary_embedding.py -k 'test_properties or test_property' $XDIST -q -rfE" >"$OUT/deep.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && status=1 && grep -E "^(FAILED|ERROR)" "$OUT/deep.log" | head -10
  note "deep: $(tail -1 "$OUT/deep.log") (rc $rc, $(( $(date +%s) - t0 )) s)"
fi

# ---- benchmarks
if [ $BENCH -eq 1 ]; then
  t0=$(date +%s)
  $PY benchmarks/run_all.py --device cuda --out-dir "$OUT" $BENCH_ARGS >"$OUT/bench.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && status=1
  note "bench: rc $rc ($(( $(date +%s) - t0 )) s)"
  grep -E "^Summary" "$OUT/bench.log" | while read -r line; do note "$line"; done
fi

# ---- two GPUs or more: the torchrun bench (benchmarks/multigpu.py; its bars are for world size 2)
if [ $BENCH -eq 1 ] && [ "$($PY -c 'import torch; print(torch.cuda.device_count())')" -ge 2 ]; then
  t0=$(date +%s)
  $PY -m torch.distributed.run --standalone --nproc_per_node 2 -m benchmarks.multigpu --out-dir "$OUT" \
    >"$OUT/multigpu.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && status=1
  note "multigpu bench: rc $rc ($(( $(date +%s) - t0 )) s)"
fi

# ---- sanitizers: every op's float64-reference samples and the CUDA-specific files (kernel paths, tiles).
if [ $SANITIZE -eq 1 ]; then
  # The selection is discovered, never named, so a new op is covered without an edit here: test_ops.py's
  # float64-reference test runs every op's op_db samples (odd sizes, strides, empty tensors) in every dtype,
  # and tests/test_*cuda*.py the engine's plan branches and tiles. The op files' own CUDA sweeps (800 cases)
  # are too slow under a checker: with all of them, one 180 s run checked 7% (memcheck) and 1% (racecheck).
  # racecheck takes the float32 and bfloat16 samples (the shared-memory code is the same in every dtype), and
  # leaves out the dweight-accuracy test: 80M-element inputs on branches the other tests already take.
  # Only torchops' kernels (all in namespace torchops) are instrumented; pytest-xdist spreads the tests over
  # processes, each checked (--target-processes all); the two tools run side by side. A run cut by the
  # timeout still reports the tests it finished and any error already printed, and fails.
  files="$(ls tests/test_*cuda*.py | tr '\n' ' ')tests/test_ops.py"
  only_ours="--kernel-name kns=torchops"  # where this sanitizer takes the filter (tried on a program with no GPU work)
  compute-sanitizer --tool memcheck $only_ours true >/dev/null 2>&1 || only_ours=""
  cuda_tests="(reference or not test_ops) and cuda and not graph and not pow_31 and not second_gpu"
  declare -A pids sel=([memcheck]="$files -k '$cuda_tests'" [racecheck]="$files -k '$cuda_tests and not float64 and not float16 and not dweight_error'")
  t0=$(date +%s)
  tools=${SANITIZE_TOOLS:-memcheck racecheck}  # one alone (SANITIZE_TOOLS=racecheck) gets the whole call's time
  for tool in $tools; do
    # memcheck: each allocation exact-sized (no caching allocator), so an overrun leaves it. racecheck checks
    # shared memory only: it keeps the cache, sparing every test's allocations a cudaMalloc and a synchronising
    # cudaFree under the checker.
    caching=""; [ $tool = memcheck ] && caching="PYTORCH_NO_CUDA_MEMORY_CACHING=1"
    eval "$caching timeout ${SANITIZE_TIMEOUT:-300} compute-sanitizer --tool $tool $only_ours --target-processes all \
      --error-exitcode 3 --print-limit 20 $PY -m pytest ${sel[$tool]} -v -p no:cacheprovider -n ${SANITIZE_WORKERS:-7}" \
      >"$OUT/sanitize-$tool.log" 2>&1 &
    pids[$tool]=$!
  done
  for tool in $tools; do
    wait ${pids[$tool]}; rc=$?
    log="$OUT/sanitize-$tool.log"
    # one summary per checked process (the xdist workers); a cut run has none, so every sanitizer line that is
    # not a header or a clean summary counts as an error
    reports=$(grep -cE "(ERROR|RACECHECK) SUMMARY" "$log")
    flagged=$(grep -E "^========= [^=]" "$log" | grep -cvE "COMPUTE-SANITIZER|SUMMARY: 0 (errors|hazards)")
    done_tests=$(grep -cE "(PASSED|SKIPPED) tests/" "$log")
    { [ $rc -ne 0 ] || [ "$flagged" != 0 ]; } && status=1
    note "sanitize $tool${only_ours:+ (torchops kernels)}: $done_tests tests done, $reports process summaries, $flagged error lines (rc $rc$([ $rc -eq 124 ] && echo ': cut by the timeout, incomplete')) | $(grep -E '[0-9]+ (passed|failed|skipped)' "$log" | tail -1) ($(( $(date +%s) - t0 )) s)"
  done
fi

echo
echo "================ gpu_check summary ================"
printf '%s\n' "${summary[@]}"
exit $status

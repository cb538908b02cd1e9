#!/usr/bin/env bash
# one device call: old tree vs new engine (correctness of the new, speed of both). Not committed.
set -u
OUT=${OUT:-$PWD/gpu_out}; mkdir -p $OUT
export CC=/usr/bin/gcc CXX=/usr/bin/g++ LDSHARED="/usr/bin/gcc -shared" LDCXXSHARED="/usr/bin/g++ -shared"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH="/tmp/site"
t0=$(date +%s)
(cd old_tree && MAX_JOBS=6 python3 setup.py build_ext --inplace > $OUT/old_build.log 2>&1; echo "old build rc $? $(( $(date +%s) - t0 ))s" >> $OUT/summary.txt) &
MAX_JOBS=12 TORCHOPS_FORCE_CUDA=1 python3 setup.py build_ext --inplace > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; echo BUILD FAILED; exit 1; }
echo "new build $(( $(date +%s) - t0 ))s" >> $OUT/summary.txt
export PYTHONPATH="$PWD:/tmp/site"
t1=$(date +%s)
timeout 420 python3 -m pytest ${TESTS:-tests/test_norm_cuda.py tests/test_rms_norm.py} -x -q -n 8 -k "${TESTK:-cuda}" > $OUT/tests.log 2>&1
echo "tests rc $? $(( $(date +%s) - t1 ))s: $(tail -1 $OUT/tests.log)" >> $OUT/summary.txt
grep -E "^(FAILED|ERROR)|Error" $OUT/tests.log | head -20 >> $OUT/summary.txt
wait
if [ "${BENCH:-1}" = 1 ]; then
  t2=$(date +%s)
  timeout 300 python3 -m benchmarks.bench_norm --device cuda --ops ${OPS:-rms_norm,add_rms_norm} --no-compile --no-bars --out-dir $OUT/new > $OUT/bench_new.log 2>&1
  echo "bench new rc $? $(( $(date +%s) - t2 ))s" >> $OUT/summary.txt
  t3=$(date +%s)
  (cd old_tree && PYTHONPATH="$PWD:/tmp/site" timeout 300 python3 -m benchmarks.bench_rms_norm --device cuda --no-compile --no-bars --out-dir $OUT/old > $OUT/bench_old.log 2>&1)
  echo "bench old rc $? $(( $(date +%s) - t3 ))s" >> $OUT/summary.txt
fi
cat $OUT/summary.txt

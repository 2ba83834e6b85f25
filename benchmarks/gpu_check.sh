#!/usr/bin/env bash
# On a machine with a CUDA GPU and torch installed: build octopus, run the whole test
# suite (pytest with the CUDA tests, and the GoogleTest suite with its CUDA tests), every op's
# CUDA kernels under compute-sanitizer, then the benchmarks. Logs and the benchmarks' JSON go to
# the directory given (default: benchmarks/results).
# BENCHES selects benchmarks (default: "affine scheduler diffusion all"; "" for none; also
# "contention": the scheduler's latency-critical/best-effort benchmark; "serving": the diffusion
# serving benchmark, about 6 minutes; "distributed": ragged exchanges across two or more GPUs).
# SANITIZE: "ops" (default): memcheck, racecheck, synccheck and initcheck over one run of every
# op on tiny inputs (tests/smoke_wheel.py --device cuda), memcheck and racecheck over yielding
# launches (tests/yield_check.py); "suite": those and memcheck over the whole CUDA pytest suite;
# "none".
# The build is for sm_90 unless OCTOPUS_CUDA_ARCHITECTURES says otherwise (README.md).
# Where GoogleTest is not installed, put its sources in .gtest/ (e.g. a copy of
# /usr/src/googletest from Debian's libgtest-dev); Python wheels the machine lacks
# (diffusers for the parity tests, hypothesis for the property tests) can be put in .whl/.
set -uo pipefail
out=${1:-benchmarks/results}
benches=${BENCHES-affine scheduler diffusion all}
sanitize=${SANITIZE:-ops}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 OCTOPUS_CUDA_ARCHITECTURES=${OCTOPUS_CUDA_ARCHITECTURES:-90}
status=0
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/octopus-wheels .whl/*.whl || status=1
  export PYTHONPATH=/tmp/octopus-wheels${PYTHONPATH:+:$PYTHONPATH}
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
python3 -m pip install --no-build-isolation --no-deps -q . 2>&1 | tail -n 20 | tee "$out/build.log" || status=1
python3 -m pytest tests/python -q -ra 2>&1 | tail -n 60 | tee "$out/pytest.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
gtest=()
[ -d .gtest ] && gtest=(-DOCTOPUS_GTEST_SOURCE="$PWD/.gtest")
{ cmake -S tests/cpp -B build/cpp -G Ninja "${gtest[@]}" >/dev/null && cmake --build build/cpp >/dev/null \
  && ctest --test-dir build/cpp --output-on-failure; } 2>&1 | tail -n 40 | tee "$out/ctest.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
# compute-sanitizer: every allocation its own cudaMalloc (no caching allocator), so that an
# access past the end of a tensor is outside any allocation.
sanitizer() {  # sanitizer TOOL LOG COMMAND...
  local tool=$1 log=$2 start=$SECONDS
  shift 2
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool "$tool" --error-exitcode 99 "$@" 2>&1 \
    | tail -n 30 | tee "$out/$log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  echo "compute-sanitizer --tool $tool took $((SECONDS - start)) s" | tee -a "$out/$log"
}
if [ "$sanitize" != none ]; then
  for tool in memcheck racecheck synccheck initcheck; do
    sanitizer "$tool" "sanitizer_ops_$tool.log" python3 tests/smoke_wheel.py --device cuda
  done
  # The yielding launches (device yield): claiming kernels, the waits between links.
  for tool in memcheck racecheck; do
    sanitizer "$tool" "sanitizer_yield_$tool.log" python3 tests/yield_check.py
  done
fi
if [ "$sanitize" = suite ]; then
  sanitizer memcheck sanitizer_suite_memcheck.log python3 -m pytest tests/python -m cuda -q -p no:cacheprovider
fi

gpu=$(python3 -c 'import torch; print(torch.cuda.get_device_name().split()[1].lower())')
day=$(date -u +%Y%m%dT%H%M)
for bench in $benches; do
  start=$SECONDS
  case $bench in
    affine) python3 -m octopus.bench affine --no-progress --out "$out/affine_${gpu}_${day}" \
              --json "$out/affine_${gpu}_${day}.json" ;;
    scheduler) python3 -m octopus.bench.scheduler --json "$out/scheduler_${gpu}_${day}.json" ;;
    contention) python3 -m octopus.bench contention --json "$out/contention_${gpu}_${day}.json" ;;
    serving) python3 -m octopus.bench.serving --out "$out/serving_${gpu}_${day}" ;;
    diffusion) python3 -m octopus.bench diffusion --repeats 50 --no-progress --out "$out/diffusion_${gpu}_${day}" \
                 --json "$out/diffusion_${gpu}_${day}.json" ;;
    all) python3 -m octopus.bench --all --no-progress \
           --out "$out/all_${gpu}_${day}" --json "$out/all_${gpu}_${day}.json" ;;
    distributed) python3 -m octopus.bench distributed --json "$out/distributed_${gpu}_${day}.json" ;;
    *) echo "unknown benchmark $bench"; false ;;
  esac 2>&1 | tee -a "$out/bench.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  echo "benchmark $bench took $((SECONDS - start)) s" | tee -a "$out/bench.log"
done
exit $status

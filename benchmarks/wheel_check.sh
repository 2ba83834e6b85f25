#!/usr/bin/env bash
# On a GPU machine with torch installed: checks the wheel users get.
#   wheel_check.sh wheel [OUTDIR]  builds the release wheel (the default CUDA architectures,
#       README.md) from scratch and reports its build time, size and contents (SASS per
#       architecture, PTX, the torch it requires), then installs it and runs the whole test suite.
#   wheel_check.sh ptx [OUTDIR]    checks the PTX path: a wheel of sm_90 PTX alone, which the
#       driver compiles when it loads the kernels (what a GPU newer than sm_90 does with the
#       release wheel's PTX), installed, and the whole test suite again.
# CUDA_FORCE_PTX_JIT=1 cannot check that path: torch's own wheels carry no PTX, so torch itself
# fails under it ("no kernel image is available"). Each mode takes a few minutes on 16 cores;
# the machine is left with the wheel built last installed. Logs go to OUTDIR (default
# benchmarks/results). NVCC_THREADS: architectures nvcc compiles at once per file (default 5).
# PYTEST_ADDOPTS reaches pytest (e.g. "-n 8 --dist loadfile" where pytest-xdist is installed).
set -uo pipefail
mode=${1:?usage: wheel_check.sh wheel|ptx [OUTDIR]}
out=${2:-benchmarks/results}
mkdir -p "$out"
case $mode in
  wheel) unset OCTOPUS_CUDA_ARCHITECTURES ;;
  ptx) export OCTOPUS_CUDA_ARCHITECTURES=90-virtual ;;
  *) echo "unknown mode $mode (wheel or ptx)" >&2; exit 2 ;;
esac
export PYTHONUNBUFFERED=1 OCTOPUS_WITH_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) CUDAFLAGS="--threads=${NVCC_THREADS:-5}"
report="$out/wheel_check_$mode.txt"
status=0
wheels=$(mktemp -d) build=$(mktemp -d)
start=$SECONDS
python3 -m pip wheel --no-build-isolation --no-deps -w "$wheels" -C build-dir="$build" . > "$out/wheel_build_$mode.log" 2>&1 \
  || { status=1; tail -n 30 "$out/wheel_build_$mode.log"; }
wheel=$(ls "$wheels"/octopus-*.whl) || exit 1
echo "$mode: built in $((SECONDS - start)) s on $(nproc) cores ($CUDAFLAGS), $(du -k "$wheel" | cut -f1) KiB: $(basename "$wheel")" \
  | tee "$report"
python3 -c 'import sys, zipfile; w = zipfile.ZipFile(sys.argv[1]); print(w.read(next(n for n in w.namelist() if n.endswith(".dist-info/METADATA"))).decode())' "$wheel" \
  | grep '^Requires-Dist: torch' | tee -a "$report"
python3 -m pip install -q --no-deps --force-reinstall "$wheel" || status=1
so=$(python3 -c 'import glob, os, octopus._build_info as b; print(glob.glob(os.path.dirname(b.__file__) + "/_C*.so")[0])')
readelf -d "$so" | grep NEEDED | tee -a "$report"
readelf -d "$so" | grep -q 'NEEDED.*libstdc++' \
  || { echo "libstdc++ is not linked shared: C++ exceptions would crash (CMakeLists.txt)" | tee -a "$report"; status=1; }
echo "SASS (cubins per architecture), then PTX:" | tee -a "$report"
for kind in elf ptx; do
  cuobjdump --list-$kind "$so" | grep -o 'sm_[0-9]*' | sort | uniq -c | tee -a "$report"
done
python3 tests/smoke_wheel.py --device cuda 2>&1 | tee "$out/wheel_check_${mode}_smoke.log" | tail -n 3 | tee -a "$report"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
start=$SECONDS
python3 -m pytest tests/python -q -p no:cacheprovider > "$out/wheel_check_${mode}_pytest.log" 2>&1 || status=1
echo "tests in $((SECONDS - start)) s: $(tail -n 1 "$out/wheel_check_${mode}_pytest.log")" | tee -a "$report"
rm -rf "$wheels" "$build"
exit $status

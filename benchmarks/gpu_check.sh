#!/usr/bin/env bash
# On a machine with a CUDA GPU and torch installed: build octopus, run the whole test
# suite (the CUDA tests included), then the affine benchmark. Logs and the benchmark's
# JSON go to the directory given (default: benchmarks/results).
set -uo pipefail
out=${1:-benchmarks/results}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
status=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
python3 -m pip install --no-build-isolation --no-deps -q . 2>&1 | tail -n 20 | tee "$out/build.log" || status=1
python3 -m pytest tests/python -q -ra 2>&1 | tail -n 60 | tee "$out/pytest.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
name="affine_$(python3 -c 'import torch; print(torch.cuda.get_device_name().split()[1].lower())')_$(date -u +%Y%m%d).json"
python3 -m octopus.bench --json "$out/$name" 2>&1 | tee "$out/bench.log" || status=1
exit $status

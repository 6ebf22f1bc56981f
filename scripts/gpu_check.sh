#!/usr/bin/env bash
# Run every GPU check in one go on a machine with a CUDA GPU and CuPy (e.g. the H200 device):
#   the `gpu`-marked tests (payloads byte-identical to the numpy reference, NaN/Inf behaviour),
#   the NCCL device path of realrun.comm, then a kernel-throughput benchmark and a one-rank NCCL
#   realrun bench, and `realrun train` on NCCL (one GPU; TP over two where there are two);
#   writes $OUT/gpu_check.json (OUT defaults to ./gpu_check_out).
# Budget: well under 8 minutes on an H200. Usage: bash scripts/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu_check_out}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/nvidia-smi.csv"
timeout 360 python3 -m pytest -q -m gpu tests/realrun/test_gpu.py --junitxml="$OUT/gpu_tests.xml" 2>&1 | tee "$OUT/gpu_tests.log"
tests_rc=${PIPESTATUS[0]}
timeout 120 python3 - "$OUT" <<'PY'
import json, sys, time
import cupy as cp
from realrun.gpu import GpuCompressor
out, n, rows = sys.argv[1], 1 << 26, []   # 256 MiB of float32
x = cp.random.standard_normal(n, dtype=cp.float32)
for spec in ("fp16", "fp8", "int8", "int4", "sign", "topk(0.01)"):
    c = GpuCompressor(spec)
    p = c.compress(x); c.decompress(p); cp.cuda.Device().synchronize()
    times = {}
    for name, fn in (("compress", lambda: c.compress(x)), ("decompress", lambda: c.decompress(p))):
        start = cp.cuda.Event(); end = cp.cuda.Event()
        start.record()
        for _ in range(10):
            fn()
        end.record(); end.synchronize()
        times[name] = cp.cuda.get_elapsed_time(start, end) / 10 / 1e3
    rows.append({"compressor": spec, "size_bytes": x.nbytes, "wire_bytes": int(p.size),
                 "compress_GBps": x.nbytes / times["compress"] / 1e9,
                 "decompress_GBps": x.nbytes / times["decompress"] / 1e9})
    print(rows[-1])
json.dump({"kernels": rows}, open(f"{out}/kernel_throughput.json", "w"), indent=1)
PY
bench_rc=$?
# compressed collectives on NCCL: one GPU allows one rank (the device path runs end to end)
timeout 120 python3 -m realrun.cli bench allreduce --world 1 --backend nccl --sizes 64MiB \
    --compressors "none,int8,topk(0.01)" --algorithms auto,ring,two_phase --json "$OUT/nccl_bench.jsonl" \
    2>&1 | tee "$OUT/nccl_bench.log"
nccl_rc=${PIPESTATUS[0]}
# real compressed training on NCCL with the CuPy compressors: one GPU (dp=1, the compressed
# paths run on one rank), and tensor parallelism over two where the machine has two GPUs
gpus=$(nvidia-smi --list-gpus | wc -l)
timeout 150 python3 -m torch.distributed.run --standalone --nproc_per_node 1 -m realrun.cli train \
    --model gpt-tiny --device cuda --steps 30 --policy "naive:int8" --metrics "$OUT/train_1gpu.jsonl" \
    2>&1 | tee "$OUT/train_1gpu.log"
train_rc=${PIPESTATUS[0]}
if [ "$gpus" -ge 2 ]; then
  timeout 150 python3 -m torch.distributed.run --standalone --nproc_per_node 2 -m realrun.cli train \
      --model gpt-tiny --device cuda --tp 2 --steps 30 --policy "tp=int8" --error-every 5 \
      --metrics "$OUT/train_tp2.jsonl" 2>&1 | tee "$OUT/train_tp2.log"
  tp_rc=${PIPESTATUS[0]}
  train_rc=$(( train_rc || tp_rc ))
fi
bench_rc=$(( bench_rc || nccl_rc || train_rc ))
python3 - "$OUT" "$tests_rc" "$bench_rc" <<'PY'
import json, sys
out, tests_rc, bench_rc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
result = {"tests_rc": tests_rc, "bench_rc": bench_rc}
try:
    result.update(json.load(open(f"{out}/kernel_throughput.json")))
except OSError:
    pass
json.dump(result, open(f"{out}/gpu_check.json", "w"), indent=1)
print(json.dumps(result)[:2000])
PY
exit $(( tests_rc || bench_rc ))

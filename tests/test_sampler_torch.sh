#!/usr/bin/env bash
# The sampler against PyTorch's own DistributedSampler, where torch is installed.
cd "$(dirname "$0")/.." || exit 1
if ! python3 -c 'import torch' 2>/dev/null; then
  echo "SKIP sampler.same_as_torch_DistributedSampler: python3 cannot import torch"
  exit 0
fi
python3 - <<'PY'
import subprocess
from torch.utils.data.distributed import DistributedSampler
cases = [(10, 3, 0, 0, 0), (10, 3, 0, 1, 1), (7, 5, 42, 2, 0), (3, 8, 1, 0, 0), (1000, 4, 1234, 7, 0),
         (1001, 6, 9, 3, 1), (100000, 7, 5, 11, 0), (0, 3, 0, 0, 0), (5, 5, 3, 0, 1), (65537, 2, 2**40 + 3, 1, 0)]
bad = []
for n, w, seed, epoch, drop in cases:
    for r in range(w):
        s = DistributedSampler(list(range(n)), num_replicas=w, rank=r, shuffle=True, seed=seed, drop_last=bool(drop))
        s.set_epoch(epoch)
        args = [str(v) for v in (n, w, r, seed, epoch, drop)]
        got = subprocess.run(["./tests/test_sampler", *args], capture_output=True, text=True).stdout.split()
        if [int(x) for x in got] != list(iter(s)):
            bad.append((n, w, r, seed, epoch, drop))
if bad:
    print("FAIL sampler.same_as_torch_DistributedSampler: differs for (N, W, rank, seed, epoch, drop_last) =", bad[:5])
else:
    print("PASS sampler.same_as_torch_DistributedSampler (%d cases, every rank)" % len(cases))
PY

#!/usr/bin/env bash
# The sampler against PyTorch's own DistributedSampler, where torch is installed
# (python3 on PATH, else Debian's /usr/bin/python3), and against torch.randperm on
# both sides of 214,748,364 samples, where torch 2.7 and later change the shuffle
# (with older torch, which shuffles those sizes the old way, that part skips).
cd "$(dirname "$0")/.." || exit 1
py=
for p in python3 /usr/bin/python3; do
  if command -v "$p" >/dev/null && "$p" -c 'import torch' 2>/dev/null; then py=$p; break; fi
done
if [ -z "$py" ]; then
  echo "SKIP sampler.same_as_torch_DistributedSampler: no python3 here can import torch"
  echo "SKIP sampler.same_as_torch_randperm_past_214748364: no python3 here can import torch"
  exit 0
fi
"$py" - <<'PY'
import subprocess, torch
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

# Too many for DistributedSampler's Python list: its order done in torch directly
# (randperm of seed + epoch, padded from the start, every W-th from rank), compared
# by the first and last 8 and a weighted sum.
bad = []
new = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 7)
big = [(214748363, 3, 2, 5, 1), (214748365, 2, 1, 7, 0)] if new else []
for n, w, r, seed, epoch in big:
    # ours runs beside torch's (each takes ~30 s at this size on one core)
    ours = subprocess.Popen(["./tests/test_sampler", str(n), str(w), str(r), str(seed), str(epoch), "0", "sum"],
                            stdout=subprocess.PIPE, text=True)
    g = torch.Generator()
    g.manual_seed(seed + epoch)
    perm = torch.randperm(n, generator=g)
    total = -(-n // w) * w
    if total > n:
        perm = torch.cat([perm, perm[: total - n]])
    mine = perm[r::w]
    del perm
    weights = torch.arange(1, mine.numel() + 1, dtype=torch.int64)
    want = mine[:8].tolist() + mine[-8:].tolist() + [int((mine * weights).sum()) % 2**64]
    del mine, weights
    got = ours.communicate()[0].split()
    if [int(x) for x in got] != want:
        bad.append((n, w, r, seed, epoch))
if bad:
    print("FAIL sampler.same_as_torch_randperm_past_214748364: differs for (N, W, rank, seed, epoch) =", bad)
elif new:
    print("PASS sampler.same_as_torch_randperm_past_214748364 (N = 214748363 and 214748365)")
else:
    print("SKIP sampler.same_as_torch_randperm_past_214748364: torch %s shuffles from 214748364 samples on as "
          "torch before 2.7 did; ddp.h follows 2.7 and later" % torch.__version__)
PY

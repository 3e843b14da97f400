#!/usr/bin/env python3
"""bench_train_gpt.py - train_gpt on the CPU against PyTorch, the same model and batch.

    python3 examples/bench_train_gpt.py                 # the benchmark shape, 3 rounds
    python3 examples/bench_train_gpt.py --shape large   # 6 layers, dim 384, ctx 256
    python3 examples/bench_train_gpt.py --rounds 5 --steps 30 --forms ddp2,torch_ddp
    python3 examples/bench_train_gpt.py --gpu           # one GPU: GPT-2 124M, batch 8

Prints the CPU first (its model as lscpu gives it, the vector instructions that matter for
the matmul, the caches per core): a figure holds for the CPU it was measured on; and
says so where PyTorch's MKL keeps its AVX-512 code from the CPU (AMD's). Runs
every form once per round, the forms alternating (A, B, C, A, B, C, ...), so that
a machine that slows down or speeds up meanwhile touches all of them alike, and prints
one table: tokens/s as the median of the rounds with the slowest and fastest in
brackets, the achieved GFLOP/s as a fraction of the measured matmul ceiling, and each
form against the best PyTorch one; then, round by round, each train_gpt form against
the best PyTorch form of that round. A run's tokens/s counts the steps after the first
--warmup (page faults, torch.compile's compilation), over their total time.

The forms (--forms, comma-separated; the default: all that can run here):
  ddp2        examples/train_gpt --nproc 2, batch 8 per rank (two processes)
  ddp1        examples/train_gpt --nproc 1, batch 16, one process with OpenMP threads
  ddp4        examples/train_gpt --nproc 4, batch 4 per rank (more processes than cores)
  torch       PyTorch eager, attention by F.scaled_dot_product_attention, all threads
  torch_ddp   PyTorch DistributedDataParallel on gloo, two processes, one thread each
  torch_compile  torch.compile of the eager model, all threads
With --gpu (one GPU, the shape gpt2 and a batch of 8 unless given) the forms are:
  gpu         examples/train_gpt_gpu: bf16 activations, fp32 master weights
  torch_gpu   PyTorch eager on the GPU, autocast to bf16, SDPA (flash attention), fused AdamW
  torch_gpu_compile  torch.compile of that model (minutes of compiling at GPT-2's size)
and the table gives tokens/s and each form against the best PyTorch one (no ceiling).
The PyTorch forms run where `import torch` works, and are the model train_gpt trains:
token + position embedding, pre-LN blocks (fused qkv, causal attention, GELU tanh MLP),
tied lm_head, AdamW (0.9, 0.95, eps 1e-8, weight decay 0.1 on matrices), clipping at 1.

FLOPs per token: 6 N + 12 L T C (N: the weights of the matmuls, lm_head included; the
attention term as nanoGPT and PaLM count it). The ceiling: the better of the two rates
train_gpt --bench-matmul measures on the model's matmul shapes with all cores,
ddp_kernels.cuh's own CPU matmul and PyTorch's sgemm (MKL/oneDNN), once per round (the
best round counts: other work on the machine only lowers it), divided by FLOPs per token.
Both rates are printed, and ours as a fraction of PyTorch's.
"""
import argparse
import contextlib
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN_GPT = os.path.join(HERE, "train_gpt")
TRAIN_GPT_GPU = os.path.join(HERE, "train_gpt_gpu")
SHAPES = {  # layers, heads, dim, ctx
    "bench": (4, 4, 128, 128),
    "large": (6, 6, 384, 256),
    "gpt2": (12, 12, 768, 1024),
}
VOCAB = 256
GPT2_VOCAB = 50304  # GPT-2's 50257 padded to a multiple of 128
ALL_FORMS = ["ddp2", "ddp1", "ddp4", "torch", "torch_ddp", "torch_compile"]
GPU_FORMS = ["gpu", "torch_gpu", "torch_gpu_compile"]


def flops_per_token(L, C, T, V):
    return 6 * (L * 12 * C * C + V * C) + 12 * L * T * C


def matmul_shapes(C, V=VOCAB):
    """(out, in) of each weight: qkv, attention proj, fc, mlp proj, lm_head"""
    return [(3 * C, C), (C, C), (4 * C, C), (C, 4 * C), (V, C)]


# ---- the PyTorch forms --------------------------------------------------------------------
def torch_worker(args):
    """One PyTorch run (or one rank of torch_ddp); prints 'tokens/s X' (rank 0)."""
    import math
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    L, NH, C, T, V = args.layers, args.heads, args.dim, args.ctx, args.vocab
    ddp = args.worker == "torch_ddp"
    gpu = args.worker.startswith("torch_gpu")
    dev = "cuda" if gpu else "cpu"
    if ddp:
        import torch.distributed as dist
        torch.set_num_threads(1)
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        torch.set_num_threads(args.threads)
        rank, world = 0, 1
    torch.manual_seed(rank)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
            self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
            self.c_fc, self.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

        def forward(self, x):
            B = x.shape[0]
            q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
            q, k, v = (t.view(B, T, NH, C // NH).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.c_proj(y.transpose(1, 2).reshape(B, T, C))
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
            self.h = nn.ModuleList(Block() for _ in range(L))
            self.ln_f = nn.LayerNorm(C)
            for name, p in self.named_parameters():
                if p.dim() == 2:
                    std = 0.02 / math.sqrt(2 * L) if name.endswith("c_proj.weight") or "mlp_proj" in name else 0.02
                    nn.init.normal_(p, 0.0, std)
                elif name.endswith("bias"):
                    nn.init.zeros_(p)

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
            for block in self.h:
                x = block(x)
            logits = self.ln_f(x) @ self.wte.weight.t()  # tied lm_head
            return F.cross_entropy(logits.view(-1, V).float(), targets.view(-1))

    model = GPT().to(dev)
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), eps=1e-8, **({"fused": True} if gpu else {}))
    if ddp:
        model = nn.parallel.DistributedDataParallel(model)
    step_fn = model
    if args.worker in ("torch_compile", "torch_gpu_compile"):
        step_fn = torch.compile(model)
    batch = args.batch // world
    data = torch.randint(0, V, (batch * (args.steps + 1), T + 1), generator=torch.Generator().manual_seed(rank))
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if gpu else contextlib.nullcontext()
    times = []
    for step in range(args.steps):
        x = data[step * batch:(step + 1) * batch].to(dev)
        t0 = time.perf_counter()
        with autocast:
            loss = step_fn(x[:, :-1].contiguous(), x[:, 1:].contiguous())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if ddp:
            dist.all_reduce(loss)  # what train_gpt does: the loss averaged over ranks, every step
        loss.item()  # the step's end, as train_gpt prints each step's loss (on a GPU: its kernels done)
        times.append(time.perf_counter() - t0)
    timed = times[args.warmup:]
    if rank == 0:
        print("tokens/s %.1f" % (args.batch * T * len(timed) / sum(timed)))
    if ddp:  # both ranks done before rank 0's store goes away (else gloo may abort the other)
        dist.barrier()
        dist.destroy_process_group()


def torch_run(form, args, L, NH, C, T):
    base = [sys.executable, os.path.abspath(__file__), "--worker", form, "--layers", str(L), "--heads", str(NH),
            "--dim", str(C), "--ctx", str(T), "--batch", str(args.batch), "--steps", str(args.steps),
            "--warmup", str(args.warmup), "--threads", str(args.threads), "--vocab", str(args.vocab)]
    if form != "torch_ddp":
        out = subprocess.run(base, capture_output=True, text=True, timeout=args.timeout)
        return parse_torch(out)
    with socket.socket() as s:  # a port free now, for this run's rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", OMP_NUM_THREADS="1")
    procs = [subprocess.Popen(base, env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(2)]
    outs = [p.communicate(timeout=args.timeout) for p in procs]
    rank0 = subprocess.CompletedProcess(base, procs[0].returncode, outs[0][0], outs[0][1] + outs[1][1])
    if procs[1].returncode:
        rank0.returncode = procs[1].returncode
    return parse_torch(rank0)


def parse_torch(out):
    m = re.search(r"^tokens/s ([0-9.]+)", out.stdout, re.M)
    if out.returncode or not m:
        raise RuntimeError("exit %d: %s" % (out.returncode, (out.stderr or out.stdout).strip()[-400:]))
    return float(m.group(1))


# ---- train_gpt ----------------------------------------------------------------------------
def ddp_run(form, args, L, NH, C, T):
    if form == "gpu":
        cmd = [TRAIN_GPT_GPU, "--batch-size", str(args.batch), "--vocab", str(args.vocab)]
    else:
        nproc = {"ddp1": 1, "ddp2": 2, "ddp4": 4}[form]
        cmd = [TRAIN_GPT, "--nproc", str(nproc), "--batch-size", str(args.batch // nproc)]
    cmd += ["--layers", str(L), "--heads", str(NH), "--dim", str(C), "--ctx", str(T), "--steps", str(args.steps),
            "--val-every", "0", "--sample-len", "0"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    rates = [float(r) for r in re.findall(r"^step .*\| ([0-9.]+) tok/s", out.stdout, re.M)]
    if out.returncode or len(rates) != args.steps:
        raise RuntimeError("exit %d: %s" % (out.returncode, (out.stderr or out.stdout).strip()[-400:]))
    timed = rates[args.warmup:]  # every step has the same tokens: their total over their total time
    return len(timed) / sum(1.0 / r for r in timed)


def command_of(form, args):
    if form == "gpu":
        return "train_gpt_gpu --batch-size %d" % args.batch
    if form.startswith("ddp"):
        n = {"ddp1": 1, "ddp2": 2, "ddp4": 4}[form]
        return "train_gpt --nproc %d --batch-size %d" % (n, args.batch // n)
    return {"torch": "PyTorch eager, SDPA, %d threads" % args.threads,
            "torch_ddp": "PyTorch DDP (gloo), 2 processes x 1 thread",
            "torch_compile": "PyTorch torch.compile, %d threads" % args.threads,
            "torch_gpu": "PyTorch eager, bf16 autocast, SDPA, fused AdamW",
            "torch_gpu_compile": "PyTorch torch.compile, bf16 autocast, fused AdamW"}[form]


# ---- the matmul ceiling -------------------------------------------------------------------
def torch_matmul(args):
    """--torch-matmul (train_gpt --bench-matmul asks for it): torch.mm's GFLOP/s on each weight's
    forward, input-gradient and weight-gradient products at the model's shapes (batch x ctx
    rows), each the fastest of 5-100 runs in about 0.2 s (as train_gpt times its own), with
    --threads threads; one line of torch's version, then 'out in fwd dinp dweight' per weight"""
    try:
        import torch
    except ImportError as e:
        print("no PyTorch for %s (%s)" % (sys.executable, e))
        return 1
    torch.set_num_threads(args.threads)
    M = args.batch * args.ctx
    print("PyTorch %s" % torch.__version__)
    for oc, ic in matmul_shapes(args.dim, args.vocab or VOCAB):
        x, w, dy = torch.randn(M, ic), torch.randn(oc, ic), torch.randn(M, oc)
        rates = []
        for product in (lambda: x @ w.t(), lambda: dy @ w, lambda: dy.t() @ x):
            product()  # warm
            best, runs, start = float("inf"), 0, time.perf_counter()
            while runs < 5 or (runs < 100 and time.perf_counter() - start < 0.2):
                t0 = time.perf_counter()
                product()
                best, runs = min(best, time.perf_counter() - t0), runs + 1
            rates.append(2.0 * M * oc * ic / best / 1e9)
        print("%d %d %.4g %.4g %.4g" % (oc, ic, rates[0], rates[1], rates[2]))
    return 0


def ceiling(args, C, T):
    """[(GFLOP/s, what measured it)]: train_gpt --bench-matmul's rates at the model's shapes with
    all cores, ddp_kernels.cuh's own and PyTorch's sgemm where torch imports"""
    out = subprocess.run([TRAIN_GPT, "--bench-matmul", "--dim", str(C), "--ctx", str(T), "--batch-size",
                          str(args.batch)], capture_output=True, text=True, timeout=args.timeout)
    found = []
    for rate, what in re.findall(r"^matmul: ([0-9.]+) GFLOP/s \((ddp_kernels.cuh|PyTorch \S+ sgemm)", out.stdout, re.M):
        found.append((float(rate), "ddp_kernels.cuh matmul" if what.startswith("ddp") else what))
    return found


def cpu_info():
    """the first processor's fields in /proc/cpuinfo (Linux), else {}"""
    info = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return info


def cpu_summary():
    """'AMD EPYC (family 25, model 1); avx2 fma; L1d 32K, L2 512K per core; 2 cores' from /proc/cpuinfo
    and sysfs (Linux), as much of it as this machine tells"""
    info = cpu_info()
    model = info.get("model name") or info.get("Model") or platform.processor() or platform.machine()
    if "cpu family" in info:
        model += " (family %s, model %s)" % (info["cpu family"], info.get("model", "?"))
    flags = (info.get("flags") or info.get("Features") or "").split()
    isa = [f for f in ("avx512f", "avx512_bf16", "amx_tile", "avx2", "fma", "sve", "asimd") if f in flags]
    parts = [model, " ".join(isa) or "no AVX2/AVX-512/NEON flags"]
    caches = []
    for index in range(4):
        d = "/sys/devices/system/cpu/cpu0/cache/index%d/" % index
        try:
            level, kind, size = (open(d + n).read().strip() for n in ("level", "type", "size"))
        except OSError:
            continue
        if kind != "Instruction" and level in ("1", "2"):
            caches.append("L%s%s %s" % (level, "d" if kind == "Data" else "", size))
    if caches:
        parts.append(", ".join(caches) + " per core")
    parts.append("%d cores" % cores())
    return "; ".join(parts)


def cores():
    """the cores this process may run on (taskset, a cgroup's cpuset), as train_gpt counts them"""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def gpu_summary():
    """'NVIDIA H200, driver 580.159.04, 143771 MiB' from nvidia-smi, or why not"""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return "no nvidia-smi (%s)" % e
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "nvidia-smi failed"


def torch_importable():
    return subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode == 0


def mkl_off_its_avx512():
    """True where PyTorch's sgemm is MKL's and MKL keeps its AVX-512 code from this CPU: it
    checks the vendor, and on AMD's CPUs with AVX-512 runs its AVX2 code (unless an
    LD_PRELOAD library answers its check, as the README shows)"""
    info = cpu_info()
    if info.get("vendor_id", "GenuineIntel") == "GenuineIntel" or "avx512f" not in info.get("flags", "").split() \
            or os.environ.get("LD_PRELOAD"):
        return False
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.backends.mkl.is_available())"],
                         capture_output=True, text=True)
    return out.returncode == 0 and out.stdout.strip() == "True"


def round_by_round(results, forms):
    """Each train_gpt form against the best PyTorch form of the same round, round by round:
    a round runs every form within minutes, so these ratios see less of a machine that
    speeds up and slows down between rounds than the medians do. [] without a PyTorch form."""
    torch_forms = [f for f in forms if f.startswith("torch")]
    lines = []
    for f in forms:
        if f.startswith("torch") or not torch_forms:
            continue
        ratios = [results[f][r] / max(results[g][r] for g in torch_forms) for r in range(len(results[f]))]
        lines.append("%s against the best PyTorch form of each round: %s (median %.2fx)" % (
            f, ", ".join("%.2fx" % x for x in ratios), statistics.median(ratios)))
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpu", action="store_true", help="train_gpt_gpu against PyTorch on one GPU")
    ap.add_argument("--shape", choices=sorted(SHAPES))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3, help="first steps of each run not timed")
    ap.add_argument("--batch", type=int, help="global batch, sequences (default 16; 8 with --gpu)")
    ap.add_argument("--forms", default="", help="comma-separated, of " + ",".join(ALL_FORMS + GPU_FORMS))
    ap.add_argument("--threads", type=int, default=cores(), help="default: the cores this process may run on")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--layers", type=int)  # the rest: a PyTorch worker's own flags
    ap.add_argument("--heads", type=int)
    ap.add_argument("--dim", type=int)
    ap.add_argument("--ctx", type=int)
    ap.add_argument("--vocab", type=int)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--torch-matmul", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return torch_worker(args)
    if args.torch_matmul:
        return torch_matmul(args)
    args.shape = args.shape or ("gpt2" if args.gpu else "bench")
    args.batch = args.batch or (8 if args.gpu else 16)
    args.vocab = args.vocab or (GPT2_VOCAB if args.shape == "gpt2" else VOCAB)
    if args.steps <= args.warmup or args.rounds < 1 or args.batch % 4:
        ap.error("need --steps > --warmup, --rounds >= 1, and a --batch that 1, 2 and 4 ranks divide")
    binary = TRAIN_GPT_GPU if args.gpu else TRAIN_GPT
    if not os.access(binary, os.X_OK):
        sys.exit("bench_train_gpt.py: %s is not built (make %s)" % (binary, os.path.relpath(binary, os.getcwd())))
    L, NH, C, T = SHAPES[args.shape]
    known = GPU_FORMS if args.gpu else ALL_FORMS
    for f in args.forms.split(","):
        if f and f not in known:
            ap.error("unknown form '%s' (of %s%s)" % (f, ",".join(known), "" if args.gpu else "; --gpu for the GPU's"))
    have_torch = torch_importable()
    forms = [f for f in args.forms.split(",") if f] or [f for f in known if have_torch or not f.startswith("torch")]
    for f in forms:
        if f.startswith("torch") and not have_torch:
            ap.error("form %s needs PyTorch (import torch fails for %s)" % (f, sys.executable))
    if not have_torch:
        print("note: no PyTorch for %s: train_gpt alone (pip install torch for the comparison)" % sys.executable)

    fpt = flops_per_token(L, C, T, args.vocab)
    where = cpu_summary()  # what the table's numbers come from
    print("cpu: " + where)
    if have_torch and not args.gpu and mkl_off_its_avx512():
        print("note: PyTorch's MKL runs its AVX2 code on this non-Intel CPU with AVX-512 (the README's Zen 5 "
              "section gives it its AVX-512 code too)")
    if args.gpu:
        where = gpu_summary()
        print("gpu: " + where)
    print("shape %s: %d layers, %d heads, dim %d, ctx %d, vocab %d; global batch %d; %d steps per run, the first %d "
          "not timed; %d rounds" % (args.shape, L, NH, C, T, args.vocab, args.batch, args.steps, args.warmup, args.rounds))
    results, ceilings = {f: [] for f in forms}, []
    for r in range(args.rounds):
        if not args.gpu:
            ceilings += ceiling(args, C, T)
        for f in forms:
            run = torch_run if f.startswith("torch") else ddp_run
            try:
                tps = run(f, args, L, NH, C, T)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                # a PyTorch form gets one more try, said aloud: gloo in PyTorch 2.15 aborted one
                # torch_ddp run in a dozen at teardown ("terminate called without an active
                # exception") on an AMD EPYC (family 23); a failure of train_gpt stops the benchmark
                if not f.startswith("torch"):
                    sys.exit("bench_train_gpt.py: %s failed: %s" % (f, e))
                print("round %d %-14s failed (%s); once more" % (r + 1, f, (str(e).splitlines() or [""])[-1][:120]),
                      flush=True)
                try:
                    tps = run(f, args, L, NH, C, T)
                except (RuntimeError, subprocess.TimeoutExpired) as e2:
                    sys.exit("bench_train_gpt.py: %s failed twice: %s" % (f, e2))
            results[f].append(tps)
            print("round %d %-14s %9.0f tokens/s" % (r + 1, f, tps), flush=True)

    gflops, source = max(ceilings) if ceilings else (0.0, "nothing measured")
    if args.gpu:
        print("\n%.1f GFLOP per token (6 N + 12 L T C)" % (fpt / 1e9))
    best = {}
    for rate, what in ceilings:
        best[what] = max(rate, best.get(what, 0.0))
    print("\nmatmul at the model's shapes, best of %d rounds: %s" % (args.rounds, ", ".join(
        "%s %.1f GFLOP/s" % (what, rate) for what, rate in sorted(best.items()))))
    ours = best.pop("ddp_kernels.cuh matmul", 0.0)
    for what, rate in best.items():
        print("ddp_kernels.cuh matmul at %.0f%% of %s" % (100 * ours / rate, what))
    if not args.gpu:
        print("\n%.2f MFLOP per token; matmul ceiling %.1f GFLOP/s (%s, best of %d rounds) = %.0f tokens/s" %
              (fpt / 1e6, gflops, source, args.rounds, gflops * 1e9 / fpt if gflops else 0))
    med = {f: statistics.median(v) for f, v in results.items()}
    best_torch = max((med[f] for f in forms if f.startswith("torch")), default=0)
    print("\non %s:" % where)
    print("| | tokens/s, median (min-max) | %s |%s" % ("TFLOP/s" if args.gpu else "of the matmul ceiling",
                                                      " vs best PyTorch |" if best_torch else ""))
    print("|---|---:|---:|%s" % ("---:|" if best_torch else ""))
    for f in forms:
        frac = "%.0f%%" % (100 * med[f] * fpt / (gflops * 1e9)) if gflops else "-"
        if args.gpu:
            frac = "%.1f" % (med[f] * fpt / 1e12)
        vs = " %.2fx |" % (med[f] / best_torch) if best_torch else ""
        print("| %s | %.0f (%.0f-%.0f) | %s |%s" % (command_of(f, args), med[f], min(results[f]),
                                                   max(results[f]), frac, vs))
    lines = round_by_round(results, forms)
    if lines:
        print("\n" + "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

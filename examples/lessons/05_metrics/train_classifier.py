# train_classifier.py - the template (seed: "pytorch单机多卡并行训练代码模板") made runnable,
# the PyTorch twin of examples/train_classifier.c. Same model, same data, same initial
# weights (read from the file that `train_classifier --init-out` writes), same sampler,
# so both print the same numbers per epoch:
#
#   ./examples/train_classifier --nproc 2 --epochs 3 --seed 1 --init-out init.safetensors
#   torchrun --nproc_per_node 2 examples/lessons/05_metrics/train_classifier.py \
#       --init init.safetensors --epochs 3 --seed 1
#
# On the CPU it uses gloo instead of the template's nccl. Each epoch prints two lines:
# "epoch ..." with the exact global means (what the C program prints) and "template ..."
# with the template's own averaging (its note 6), so the difference can be seen.
import argparse
import json
import os
import struct
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

DTYPES = {"F32": torch.float32, "I32": torch.int32}


def load_safetensors(path):
    """A whole safetensors file as a dict of tensors (8-byte header length, JSON, data)."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    data = bytearray(raw[8 + n :])
    # as the safetensors library requires: in offset order the tensors cover the data
    # exactly (no overlap, no gap), or two of them would load as each other's bytes
    spans = sorted(tuple(t["data_offsets"]) for name, t in header.items() if name != "__metadata__")
    if [b for b, _ in spans] != [0] + [e for _, e in spans[:-1]] or (spans[-1][1] if spans else 0) != len(data):
        raise SystemExit(f"{path}: the tensors' data_offsets do not tile the data (overlap, gap or trailing bytes)")
    out = {}
    for name, t in header.items():
        if name != "__metadata__":
            begin, end = t["data_offsets"]
            out[name] = torch.frombuffer(data[begin:end], dtype=DTYPES[t["dtype"]]).reshape(t["shape"]).clone()
    return out


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(2, 32)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


# 不用管为啥直接抄上这5行 (template: "just copy these lines"). torchrun sets LOCAL_RANK;
# the legacy launcher passes --local_rank.
parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", "--local-rank", default=int(os.environ.get("LOCAL_RANK", 0)), type=int)
parser.add_argument("--init", required=True, help="the file train_classifier --init-out wrote")
parser.add_argument("--epochs", default=5, type=int)
parser.add_argument("--batch-size", default=32, type=int, help="per rank, as in the template (note 4)")
parser.add_argument("--lr", default=0.1, type=float)
parser.add_argument("--seed", default=0, type=int, help="the sampler's shuffle, as in the C program")
parser.add_argument("--out", default="model.pth")
args = parser.parse_args()


def fail(why):
    """a bad argument or file: one line (from the first rank), before any training"""
    if os.environ.get("RANK", "0") == "0":
        print(f"train_classifier.py: {why}", file=sys.stderr)
    sys.exit(2)


if args.epochs < 1 or args.batch_size < 1:
    fail(f"--epochs and --batch-size take a count of 1 or more, not {min(args.epochs, args.batch_size)}")
if not os.access(os.path.dirname(os.path.abspath(args.out)), os.W_OK) or os.path.isdir(args.out):
    fail(f"--out {args.out}: cannot write a file there")
try:
    start = load_safetensors(args.init)
    if not {"train.x", "train.y", "val.x", "val.y"} <= start.keys():
        raise ValueError("no data in it")
except OSError as e:
    fail(f"--init {args.init}: {e.strerror}")
except (ValueError, KeyError, TypeError, struct.error):
    fail(f"--init {args.init} is not the file train_classifier --init-out writes")
torch.set_num_threads(1)
dist.init_process_group(backend="gloo")  # template: backend='nccl', torch.cuda.set_device(local_rank)
rank, world = dist.get_rank(), dist.get_world_size()

model = Net()
model.load_state_dict({k: v for k, v in start.items() if k.startswith("fc")})
model = nn.parallel.DistributedDataParallel(model)  # template: model.cuda(local_rank), device_ids=[...]
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)

train_dataset = TensorDataset(start["train.x"], start["train.y"].long())
val_dataset = TensorDataset(start["val.x"], start["val.y"].long())
train_sampler = DistributedSampler(train_dataset, seed=args.seed)
train_dataloader = DataLoader(train_dataset, batch_size=args.batch_size, sampler=train_sampler)
val_sampler = DistributedSampler(val_dataset, shuffle=False)
val_dataloader = DataLoader(val_dataset, batch_size=args.batch_size, sampler=val_sampler)


def real(i, n, dataset):
    """Which samples of batch i are real: the sampler pads the last positions with
    repeats (note 5), and rank r's local position p is global position r + p * world."""
    p = torch.arange(i * args.batch_size, i * args.batch_size + n)
    return rank + p * world < len(dataset)


def global_count(i, dataset):
    """Real samples in global batch i, over all ranks (ddp_batch.global_count)."""
    return min(args.batch_size * world, len(dataset) - i * args.batch_size * world)


def template_mean(value, dataset, per_rank_mean):
    """The template's averaging: per-rank total / each_dist_data_num, all_reduce, / world
    for the loss; all_reduce(correct) / len(dataset) * 100 for the accuracy. Padding is
    counted and each_dist_data_num is ((N % world) + N) / world, not the rank's count."""
    t = torch.tensor(value, dtype=torch.float)
    if per_rank_mean:
        t = t / (((len(dataset) % world) + len(dataset)) / world)
    dist.all_reduce(t)
    return (t / world).item() if per_rank_mean else (t / len(dataset) * 100).item()


for epoch in range(args.epochs):
    # exact: (sum, count) of real samples for train loss, train acc, val loss, val acc
    exact = torch.zeros(8, dtype=torch.float64)
    template = [0.0, 0.0, 0.0, 0.0]  # per-rank totals, padding included
    train_sampler.set_epoch(epoch)  # template: 开始取数据之前把这行加上 (note 3)
    model.train()
    for i, (x, y) in enumerate(train_dataloader):
        mask = real(i, len(y), train_dataset)
        outputs = model(x)
        losses = F.cross_entropy(outputs, y, reduction="none")
        correct = (outputs.argmax(1) == y).double()
        seen = losses.detach().double()  # the metrics are numbers, not part of the graph
        exact[0:4] += torch.stack([seen[mask].sum(), mask.sum(), correct[mask].sum(), mask.sum()])
        template[0] += seen.sum().item()
        template[1] += correct.sum().item()
        # DDP averages the gradients over the ranks: scaling each rank's sum by
        # world / global_count makes that average the mean over the real global batch.
        optimizer.zero_grad()
        (losses[mask].sum() * (world / global_count(i, train_dataset))).backward()
        optimizer.step()

    with torch.no_grad():
        model.eval()
        for i, (x, y) in enumerate(val_dataloader):
            mask = real(i, len(y), val_dataset)
            outputs = model(x)
            losses = F.cross_entropy(outputs, y, reduction="none")
            correct = (outputs.argmax(1) == y).double()
            exact[4:8] += torch.stack([losses.double()[mask].sum(), mask.sum(), correct[mask].sum(), mask.sum()])
            template[2] += losses.sum().item()
            template[3] += correct.sum().item()

    dist.all_reduce(exact)  # one collective: global sums and counts, exact
    t = [template_mean(template[k], train_dataset if k < 2 else val_dataset, k % 2 == 0) for k in range(4)]
    if dist.get_rank() == 0:  # template: 只在主进程中打印 (note 7)
        print("epoch %d train_loss %.6f train_acc %.6f val_loss %.6f val_acc %.6f"
              % (epoch, exact[0] / exact[1], 100 * exact[2] / exact[3], exact[4] / exact[5], 100 * exact[6] / exact[7]))
        print("template %d train_loss %.6f train_acc %.6f val_loss %.6f val_acc %.6f" % (epoch, *t))

if dist.get_rank() == 0:  # template: 模型在0卡存一个 (note 7); model.module, not model (note 1)
    torch.save(model.module.state_dict(), args.out)
dist.destroy_process_group()
# torch 2.x does not free a gloo process group that DDP has used: its threads (gloo_tcp_loop,
# pt_gloo_runloop) still run when the process exits, and the exit-time destructors that race
# them abort a run now and then ("terminate called without an active exception"); torch 1.x
# frees the group first. A rank whose work is done and saved leaves without that teardown.
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)

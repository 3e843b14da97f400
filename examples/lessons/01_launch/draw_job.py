# draw_job.py - a picture of a running job, drawn from what its ranks printed:
#   ./examples/lessons/01_launch/ranks --nproc 4 > examples/lessons/01_launch/ranks.txt 2>&1
#   python3 examples/lessons/01_launch/draw_job.py examples/lessons/01_launch/ranks.txt examples/lessons/01_launch/my_job.png
# The launcher, one box per rank (its rank, local rank and device), the store that
# rank 0 hosts for the rendezvous, and the backend that carries the collectives.
import os
import re
import sys

if len(sys.argv) != 3 or sys.argv[1] in ("-h", "--help"):
    sys.exit("usage: python3 draw_job.py ranks.txt my_job.png (ranks.txt: what ranks --nproc N printed)")
try:
    import matplotlib
except ImportError:
    sys.exit("draw_job.py draws with matplotlib, which this python3 cannot import: "
             "python3 -m pip install matplotlib (Debian, Ubuntu: apt install python3-matplotlib)")

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

if os.path.exists(sys.argv[1]) and not os.path.isfile(sys.argv[1]):  # a FIFO: read for good
    sys.exit(f"draw_job.py: {sys.argv[1]} is not a regular file")
try:
    with open(sys.argv[1]) as f:
        text = f.read()
except OSError as e:
    sys.exit(f"draw_job.py: {sys.argv[1]}: {e.strerror}")
except UnicodeDecodeError:
    sys.exit(f"draw_job.py: {sys.argv[1]} is not text (what ranks --nproc N printed)")
ranks = sorted((int(r), int(w), int(lr), int(node), int(dev), be) for r, w, lr, node, dev, be in re.findall(
    r"rank (\d+) of (\d+), local rank (\d+) on node (\d+), device (-?\d+), backend (\w+)", text))
store = re.search(r"the store: rank 0 at (\S+)", text)
if len(ranks) < 2 or not store:
    sys.exit(f"draw_job.py: {sys.argv[1]} is not what ranks --nproc N printed for N of 2 or more "
             f"({len(ranks)} rank lines{', no store line' if not store else ''})")
store = store.group(1)
world, backend = len(ranks), ranks[0][5]

fig, ax = plt.subplots(figsize=(8, 4.2), dpi=90)
ax.set_xlim(0, 10)
ax.set_ylim(0, 6)
ax.axis("off")


def box(x, y, w, h, label, color, size=8, va="center"):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.05", fc=color, ec="#333333", lw=0.8))
    ax.text(x + w / 2, y + (h - 0.15 if va == "top" else h / 2), label, ha="center", va=va, fontsize=size)


def arrow(x0, y0, x1, y1, style="-|>", ls="-", color="#333333", rad=0.0):
    ax.add_patch(FancyArrowPatch((x0, y0), (x1, y1), arrowstyle=style, linestyle=ls, color=color,
                                 mutation_scale=8, lw=0.8, connectionstyle=f"arc3,rad={rad}"))


box(3, 5.1, 4, 0.7, f"launcher: ranks --nproc {world}\n(ddp_launch: starts, watches, stops them)", "#e8e8e8")
w = 9.0 / world
store_x = 0.5 + (w - 0.3) / 2
for i, (r, _, lr, node, dev, _) in enumerate(ranks):
    x = 0.5 + i * w
    where = f"GPU {dev}" if dev >= 0 else "CPU"
    box(x, 2.8, w - 0.3, 1.3, f"rank {r}\nlocal rank {lr}, node {node}\n{where}", "#cfe0f3", va="top")
    arrow(5, 5.1, x + (w - 0.3) / 2, 4.15)
    arrow(x + 0.75 * (w - 0.3), 2.8, x + 0.75 * (w - 0.3), 1.35, style="<|-|>", color="#55a868")
    if r:  # every rank meets the others through rank 0's store
        arrow(x + 0.25 * (w - 0.3), 2.8, store_x, 2.85, style="-|>", ls="--", color="#8c6d31", rad=-0.25)
box(0.6, 2.9, w - 0.5, 0.35, f"store {store}", "#f3e3c3", size=6)
ax.text(5, 4.62, "each with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT", ha="center", fontsize=7,
        color="#555555", bbox=dict(fc="white", ec="none", pad=1))
link = "a shared-memory arena (one host, backend cpu)" if backend == "cpu" else f"{backend.upper()} (GPU to GPU)"
box(0.5, 0.6, 8.7, 0.7, f"collectives through {link}\nall-reduce, broadcast, all-gather: every rank calls the same "
    "ones in the same order", "#d5ecd9")
ax.text(5, 0.2, "dashed: each rank meets the others through rank 0's store, once, in ddp_init", ha="center",
        fontsize=7, color="#8c6d31")
fig.tight_layout()
try:
    fig.savefig(sys.argv[2])
except OSError as e:
    sys.exit(f"draw_job.py: cannot write {sys.argv[2]}: {e.strerror}")

# draw_trace.py - one training step of a Chrome trace written by ddp.h (ddp_trace_save,
# gradsync --trace, train_gpt --trace) as a PNG: a row per rank for its own work and one
# for its collectives, so the buckets' all-reduces can be seen overlapping the backward.
#   python3 draw_trace.py trace.json my_trace.png [STEP]
# STEP counts the "forward" spans of rank 0 (default: the middle one). A span is labelled
# where its name fits inside it; grey is what no colour names: the part of an outer span
# ("step N") that none of its inner ones covers, and collectives outside the buckets.
import json
import os
import re
import sys

if len(sys.argv) not in (3, 4) or sys.argv[1] in ("-h", "--help"):
    sys.exit("usage: python3 draw_trace.py trace.json my_trace.png [STEP]")
try:
    import matplotlib
except ImportError:
    sys.exit("draw_trace.py draws with matplotlib, which this python3 cannot import: "
             "python3 -m pip install matplotlib (Debian, Ubuntu: apt install python3-matplotlib)")

matplotlib.use("Agg")
import matplotlib.pyplot as plt

COLORS = [("forward", "#4c72b0"), ("backward", "#55a868"), ("bucket", "#dd8452"), ("wait", "#c44e52"),
          ("optimizer", "#8172b3"), ("other", "#bbbbbb")]


def color(name):
    return next((c for key, c in COLORS if key in name), COLORS[-1][1])


if os.path.exists(sys.argv[1]) and not os.path.isfile(sys.argv[1]):  # a FIFO: read for good
    sys.exit(f"draw_trace.py: {sys.argv[1]} is not a regular file")
try:
    with open(sys.argv[1]) as f:
        spans = [e for e in json.load(f)["traceEvents"] if e["ph"] == "X"]
    if not all({"pid", "tid", "ts", "dur", "name"} <= e.keys() for e in spans):
        raise ValueError("a span without its fields")
    ranks = sorted({e["pid"] for e in spans})
except OSError as e:
    sys.exit(f"draw_trace.py: {sys.argv[1]}: {e.strerror}")
except (ValueError, KeyError, TypeError, AttributeError):
    sys.exit(f"draw_trace.py: {sys.argv[1]} is not a trace that ddp.h wrote (ddp_trace_save, --trace)")

# Each rank's times count from the end of ddp_trace_start's barrier, which ranks leave
# up to a millisecond apart on a busy machine. An all-reduce ends on every rank at
# nearly the same moment (when the last rank's data is in), so shift each rank by the
# median difference of its all-reduce ends from rank 0's.
ends = {r: [e["ts"] + e["dur"] for e in spans if e["pid"] == r and "all_reduce" in e["name"]] for r in ranks}
for r in ranks:
    d = sorted(a - b for a, b in zip(ends[r], ends[ranks[0]]))
    shift = d[len(d) // 2] if d else 0
    for e in spans:
        if e["pid"] == r:
            e["ts"] -= shift
starts = sorted(e["ts"] for e in spans if e["pid"] == 0 and e["name"] == "forward")
if not starts:
    sys.exit(f"draw_trace.py: {sys.argv[1]} has no step: rank 0 recorded no \"forward\" span")
k = sys.argv[3] if len(sys.argv) > 3 else str(len(starts) // 2)
if not k.isdigit() or int(k) >= len(starts):
    sys.exit(f"draw_trace.py: STEP is a number from 0 to {len(starts) - 1} (the trace's steps), not '{k}'")
k = int(k)
t0, t1 = starts[k], starts[k + 1] if k + 1 < len(starts) else max(e["ts"] + e["dur"] for e in spans)

# spans nest ("step" > "backward" > "backward block 3"): longest first, so that the
# inner ones are drawn over their parents
shown = [e for e in spans if e["ts"] + e["dur"] >= t0 and e["ts"] <= t1 and e["dur"] >= 0.5]
shown.sort(key=lambda e: -e["dur"])

fig, ax = plt.subplots(figsize=(10, 0.9 + 0.8 * len(ranks)), dpi=90)
labels = []
for z, e in enumerate(shown):
    row = 2 * ranks.index(e["pid"]) + e["tid"]
    x, w = (e["ts"] - t0) / 1000, e["dur"] / 1000
    ax.broken_barh([(x, w)], (row - 0.4, 0.8), facecolors=color(e["name"]), edgecolor="white", linewidth=0.5,
                   zorder=2 * z)
    if any(o is not e and o["pid"] == e["pid"] and o["tid"] == e["tid"] and o["dur"] < e["dur"] and
           e["ts"] <= o["ts"] and o["ts"] + o["dur"] <= e["ts"] + e["dur"] for o in shown):
        continue  # an outer span: its label would peek out between its inner ones
    label = re.sub(r" all_reduce.*", "", e["name"]).replace("backward layer ", "bwd ").replace("backward block ", "bwd ")
    labels.append((ax.text(x + w / 2, row, label, ha="center", va="center", fontsize=6, color="white", clip_on=True,
                           zorder=2 * z + 1), x, w))
ax.set_yticks(range(2 * len(ranks)))
ax.set_yticklabels([f"rank {r} {row}" for r in ranks for row in ("main", "collectives")], fontsize=8)
ax.invert_yaxis()
ax.set_xlim(0, (t1 - t0) / 1000)
ax.set_xlabel("ms since the step began")
ax.set_title("one step: each bucket's all-reduce starts as soon as backward finishes its layer", fontsize=9)
ax.legend(handles=[matplotlib.patches.Patch(color=c, label=key) for key, c in COLORS], fontsize=7, ncol=len(COLORS),
          loc="upper right", bbox_to_anchor=(1, -0.25 - 0.1 / len(ranks)), frameon=False)
fig.tight_layout()
# a label stays only where it fits inside its span, measured as drawn
fig.canvas.draw()
for text, x, w in labels:
    left, right = ax.transData.transform([(x, 0), (x + w, 0)])[:, 0]
    if text.get_window_extent().width > right - left - 4:
        text.remove()
try:
    fig.savefig(sys.argv[2])
except OSError as e:
    sys.exit(f"draw_trace.py: cannot write {sys.argv[2]}: {e.strerror}")

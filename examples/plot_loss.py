#!/usr/bin/env python3
r"""plot_loss.py - draws train_gpt --log files (one JSON object per step) as loss curves.

    python3 examples/plot_loss.py "1 process x 8=one.jsonl" "4 processes x 2=four.jsonl" \
        -o examples/loss_curve.png

Each argument is LABEL=FILE, or just FILE (labelled with its name and the world size
its log records). Train loss is a line, validation loss a marker per evaluation. The
title is --title, or the runs' labels. Needs matplotlib
(pip install matplotlib, or apt install python3-matplotlib)."""
import argparse
import json
import os
import stat
import sys


def number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def read_log(path):
    """the log's rows, or exit with one line"""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would be read until a writer came
            sys.exit(f"plot_loss.py: {path} is not a regular file")
        with open(path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        if not all(number(r.get("step")) and number(r.get("loss")) and number(r.get("val_loss", 0)) for r in rows):
            raise ValueError("a row without its step or loss as numbers")
        return rows
    except OSError as e:
        sys.exit(f"plot_loss.py: {path}: {e.strerror}")
    except (ValueError, AttributeError):
        sys.exit(f"plot_loss.py: {path} is not a train_gpt --log file (one JSON object per step)")


def split_run(run):
    """(LABEL, FILE) of LABEL=FILE or FILE; either may hold '=': the split whose FILE exists"""
    if os.path.exists(run):
        return "", run
    for k, c in enumerate(run):
        if c == "=" and os.path.exists(run[k + 1:]):
            return run[:k], run[k + 1:]
    label, _, path = run.rpartition("=")
    return label, path


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="LABEL=FILE.jsonl")
    ap.add_argument("-o", "--out", default="loss_curve.png")
    ap.add_argument("--title", help="the plot's title (default: the runs' labels and world sizes)")
    args = ap.parse_args()
    try:
        import matplotlib
    except ImportError:
        sys.exit("plot_loss.py needs matplotlib: pip install matplotlib (or apt install python3-matplotlib)")
    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    titles = []
    styles = [dict(lw=3.0, alpha=0.45), dict(lw=1.2, ls="--")]  # later runs drawn over earlier ones
    for i, run in enumerate(args.runs):
        label, path = split_run(run)
        rows = read_log(path)
        if not rows:
            sys.exit(f"plot_loss.py: {path} holds no steps (a train_gpt --log file has one JSON object per step)")
        if not label:  # a bare FILE: its name and the world size its log records
            sizes = sorted({r.get("world_size", 1) for r in rows})
            label = f"{path} ({'/'.join(map(str, sizes))} process{'es' if sizes != [1] else ''})"
        titles.append(label)
        style = styles[min(i, len(styles) - 1)]
        line, = ax.plot([r["step"] for r in rows], [r["loss"] for r in rows], label=f"{label}: train", **style)
        val = [r for r in rows if "val_loss" in r]
        ax.plot([r["step"] for r in val], [r["val_loss"] for r in val], "o" if i == 0 else "x",
                color=line.get_color(), ms=8 if i == 0 else 7, label=f"{label}: validation")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy loss (nats per byte)")
    ax.set_title(args.title or "train_gpt: " + " vs ".join(titles), fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    try:
        fig.savefig(args.out)
    except OSError as e:
        sys.exit(f"plot_loss.py: cannot write {args.out}: {e.strerror}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""plot_loss.py - draws train_gpt --log files (one JSON object per step) as loss curves.

    python3 examples/plot_loss.py "1 process x 8=one.jsonl" "4 processes x 2=four.jsonl" \
        -o examples/loss_curve.png

Each argument is LABEL=FILE. Train loss is a line, validation loss a marker per
evaluation. Needs matplotlib (pip install matplotlib)."""
import argparse
import json

import matplotlib

matplotlib.use("Agg")  # files only, no display needed
import matplotlib.pyplot as plt


def read_log(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="LABEL=FILE.jsonl")
    ap.add_argument("-o", "--out", default="loss_curve.png")
    args = ap.parse_args()

    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    styles = [dict(lw=3.0, alpha=0.45), dict(lw=1.2, ls="--")]  # later runs drawn over earlier ones
    for i, run in enumerate(args.runs):
        label, _, path = run.rpartition("=")
        rows = read_log(path)
        style = styles[min(i, len(styles) - 1)]
        line, = ax.plot([r["step"] for r in rows], [r["loss"] for r in rows], label=f"{label}: train", **style)
        val = [r for r in rows if "val_loss" in r]
        ax.plot([r["step"] for r in val], [r["val_loss"] for r in val], "o" if i == 0 else "x",
                color=line.get_color(), ms=8 if i == 0 else 7, label=f"{label}: validation")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy loss (nats per byte)")
    ax.set_title("train_gpt: the same global batch on 1 and 4 processes")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

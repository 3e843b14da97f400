#!/usr/bin/env bash
# The PyTorch template (examples/lessons/05_metrics/train_classifier.py, DDP on gloo,
# launched by torchrun) and its C port (examples/train_classifier) start from the same
# weights and data (--init-out) and print the same per-epoch loss and accuracy, to
# fp32 rounding, for 1, 2 and 4 processes. PyTorch must print nothing but its epoch
# lines (no warning) and exit 0 (no abort at exit). Runs with every python3 here that
# imports torch (PyPI's as python3, Debian's as /usr/bin/python3), once each, and skips
# with the reason where none does. An init file whose tensors share bytes is refused.
cd "$(dirname "$0")/.." || exit 1
bin=./examples/train_classifier
twin=examples/lessons/05_metrics/train_classifier.py
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
found=""
flags="--epochs 3 --seed 1 --batch-size 8"
for n in 1 2 4; do
  # shellcheck disable=SC2086 # $flags is a word list
  "$bin" --nproc $n $flags --out "$tmp/c$n.bin" --init-out "$tmp/init$n.safetensors" >"$tmp/c$n.txt" 2>&1 ||
    { echo "FAIL pytorch_twin.nproc$n: the C port exited with status $?: $(tail -n 3 "$tmp/c$n.txt" | tr '\n' ' ')"; fail=1; }
done
for py in python3 /usr/bin/python3; do
  py=$(command -v "$py") || continue
  version=$("$py" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null) || continue
  case " $found " in *" $(readlink -f "$py") "*) continue ;; esac # one run per interpreter
  found="$found $(readlink -f "$py")"
  # torch 1.x on Python >= 3.11 cannot parse its own default --redirects/--tee (see
  # test_torchrun.sh); its agent polls every 5 s unless told otherwise.
  extra=""
  if [ "${version%%.*}" -lt 2 ]; then extra="--redirects 1 --tee 1 --log_dir $tmp/logs$version --monitor_interval 0.2"; fi
  for n in 1 2 4; do
    name=pytorch_twin.torch$version.nproc$n
    [ -s "$tmp/c$n.txt" ] && grep -q '^epoch 2 ' "$tmp/c$n.txt" || continue
    port=$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    # OMP_NUM_THREADS: the thread count torchrun would otherwise set, with a banner
    # shellcheck disable=SC2086 # $flags and $extra are word lists
    OMP_NUM_THREADS=1 timeout 150 "$py" -m torch.distributed.run $extra --nproc_per_node $n --master_port "$port" \
      "$twin" --init "$tmp/init$n.safetensors" $flags --out "$tmp/py$n.pth" >"$tmp/py$n.txt" 2>&1
    rp=$?
    sed -i 's/^\[default0\]://' "$tmp/py$n.txt"
    if [ $rp -ne 0 ]; then
      echo "FAIL $name: PyTorch exit $rp: $(tail -n 4 "$tmp/py$n.txt" | tr '\n' ' ' | head -c 600)"
      fail=1
      continue
    fi
    # fields: epoch E train_loss X train_acc Y val_loss Z val_acc W; 1e-5 relative (fp32)
    diff=$(awk 'FNR == NR && /^epoch / { c[$2] = $0; next }
                /^epoch / { n++; split(c[$2], x, " ");
                  for (i = 4; i <= 10; i += 2) { d = x[i] - $i; d = d < 0 ? -d : d; m = $i < 0 ? -$i : $i;
                    if (m < 1) m = 1; if (x[i] == "" || d > 1e-5 * m) bad = bad " epoch " $2 " " $(i-1) " C " x[i] " PyTorch " $i } }
                END { if (n != 3) bad = bad " " n + 0 " PyTorch epoch lines"; printf "%s", bad }' "$tmp/c$n.txt" "$tmp/py$n.txt")
    other=$(grep -v '^epoch \|^template ' "$tmp/py$n.txt" | head -n 3 | tr '\n' ' ' | head -c 400)
    if [ -n "$diff" ]; then
      echo "FAIL $name:$diff"
      fail=1
    elif [ -n "$other" ]; then
      echo "FAIL $name: PyTorch printed more than its epoch lines: $other"
      fail=1
    elif ! grep -q '^template 2 ' "$tmp/py$n.txt" || [ ! -s "$tmp/py$n.pth" ]; then
      echo "FAIL $name: no template line or no model.pth"
      fail=1
    else
      echo "PASS $name: C and PyTorch agree per epoch, nothing else printed ($(grep '^epoch 2' "$tmp/py$n.txt"))"
    fi
    [ -n "$DDP_TWIN_TABLE" ] && { echo "--- nproc $n"; grep '^epoch ' "$tmp/c$n.txt" | sed 's/^/C       /'; grep '^epoch \|^template ' "$tmp/py$n.txt" | sed 's/^/PyTorch /'; }
  done
  # an init file whose tensors share bytes is refused, as the safetensors library refuses it
  if [ -s "$tmp/init1.safetensors" ]; then
    "$py" - "$tmp/init1.safetensors" "$tmp/overlap.safetensors" <<'EOF'
import json, struct, sys
b = open(sys.argv[1], 'rb').read()
n = struct.unpack('<Q', b[:8])[0]
h = json.loads(b[8:8 + n])
h['fc1.bias']['data_offsets'] = [0, 128]  # the first bytes of fc1.weight
hs = json.dumps(h).encode()
hs += b' ' * (-len(hs) % 8)
open(sys.argv[2], 'wb').write(struct.pack('<Q', len(hs)) + hs + b[8 + n:])
EOF
    port=$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    # shellcheck disable=SC2086
    OMP_NUM_THREADS=1 timeout 150 "$py" -m torch.distributed.run $extra --nproc_per_node 1 --master_port "$port" "$twin" \
      --init "$tmp/overlap.safetensors" $flags --out "$tmp/overlap.pth" >"$tmp/overlap.txt" 2>&1
    rc=$?
    if [ $rc -ne 0 ] && grep -q 'do not tile the data' "$tmp/overlap.txt" && ! grep -q '^epoch ' "$tmp/overlap.txt"; then
      echo "PASS pytorch_twin.torch$version.overlapping_tensors_refused"
    else
      echo "FAIL pytorch_twin.torch$version.overlapping_tensors_refused: exit $rc: $(tail -n 3 "$tmp/overlap.txt" | tr '\n' ' ' | head -c 400)"; fail=1
    fi
  fi
done
if [ -z "$found" ]; then echo "SKIP pytorch_twin: no python3 here imports torch (Debian: apt-get install python3-torch)"; fi
exit $fail

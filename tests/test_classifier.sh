#!/usr/bin/env bash
# tests/test_classifier.sh - one process with batch 32 and four with batch 8 per rank
# train the same model: the last epoch's validation metrics agree to 1e-6 and the
# classifier learns (> 90 % validation accuracy); --flag=value; bad flags, outputs that
# cannot be written or would replace something else, bad --resume auto epochs and --help. The Makefile
# builds the example; tests/test_pytorch_twin.sh compares it with PyTorch.
cd "$(dirname "$0")/.." || exit 1
bin=./examples/train_classifier
. tests/lib.sh
need_built classifier "$bin"
"$bin" --nproc 1 --batch-size 32 --epochs 3 --seed 1 --out "$tmp/one.bin" >"$tmp/one.txt" 2>&1
rc1=$?
"$bin" --nproc 4 --batch-size 8 --epochs 3 --seed 1 --out "$tmp/four.bin" >"$tmp/four.txt" 2>&1
rc4=$?
report "classifier --nproc 1 runs" "$rc1" "exit $rc1: $(tail -n 3 "$tmp/one.txt" | tr '\n' ' ')"
report "classifier --nproc 4 runs" "$rc4" "exit $rc4: $(tail -n 3 "$tmp/four.txt" | tr '\n' ' ')"
[ "$rc1" -eq 0 ] && [ "$rc4" -eq 0 ] || exit 1

last1=$(grep '^epoch 2 ' "$tmp/one.txt")
last4=$(grep '^epoch 2 ' "$tmp/four.txt")
n1=$(grep -c '^epoch ' "$tmp/one.txt")
n4=$(grep -c '^epoch ' "$tmp/four.txt")
[ "$n1" -eq 3 ] && [ "$n4" -eq 3 ]
report "classifier prints one line per epoch, on rank 0 only" $? "got $n1 and $n4 epoch lines"

# fields: epoch E train_loss X train_acc Y val_loss Z val_acc W
awk -v a="$last1" -v b="$last4" 'BEGIN {
  split(a, x, " "); split(b, y, " ");
  if (x[7] != "val_loss" || y[7] != "val_loss") exit 1;
  for (i = 8; i <= 10; i += 2) {
    d = x[i] - y[i]; if (d < 0) d = -d;
    m = x[i] < 0 ? -x[i] : x[i]; if (m < 1) m = 1;
    if (d > 1e-6 * m) exit 1;
  }
}'
report "classifier: 1 x 32 and 4 x 8 give the same val_loss and val_acc" $? "'$last1' vs '$last4'"

awk -v a="$last1" 'BEGIN { split(a, x, " "); exit !(x[9] == "val_acc" && x[10] > 90) }'
report "classifier learns: val_acc > 90" $? "'$last1'"

[ -s "$tmp/four.bin" ] && [ ! -e "$tmp/four.bin.tmp" ] && cmp -s "$tmp/one.bin" "$tmp/four.bin"
report "classifier: rank 0 checkpoints the same weights for 1 and 4 ranks" $? "checkpoints missing or different"

"$bin" --nproc=1 --batch-size=32 --epochs=3 --seed=1 --out="$tmp/equals.bin" >"$tmp/equals.txt" 2>&1
rc=$?
[ "$rc" -eq 0 ] && cmp -s "$tmp/one.bin" "$tmp/equals.bin"
report "classifier: --flag=value trains as --flag value (the same checkpoint)" $? "exit $rc: $(tail -n 2 "$tmp/equals.txt" | tr '\n' ' ')"

"$bin" --nproc 2 --no-such-flag 1 >"$tmp/bad.txt" 2>&1
rc=$?
[ "$rc" -eq 2 ] && grep -q "^train_classifier: unknown flag '--no-such-flag' (train_classifier --help lists the flags)$" \
  "$tmp/bad.txt" && [ "$(wc -l <"$tmp/bad.txt")" -eq 1 ]
report "classifier: a bad flag prints one line, exits 2" $? "exit $rc: $(head -n 2 "$tmp/bad.txt" | tr '\n' ' ')"

# values that would read as others, and outputs checked before training, not after it
refused() { # want args...: one line that says it, exit 2
  local want=$1 rc; shift
  "$bin" --nproc 2 "$@" >"$tmp/bad.txt" 2>&1
  rc=$?
  [ "$rc" -eq 2 ] && [ "$(wc -l <"$tmp/bad.txt")" -eq 1 ] && grep -qF "train_classifier: $want" "$tmp/bad.txt"
  report "classifier: $* is refused in one line before training" $? "exit $rc: $(head -c 300 "$tmp/bad.txt")"
}
refused "bad value 'inf' for --lr" --lr inf
refused "bad value ' -1' for --seed" --seed ' -1'
refused "bad value '0' for --epochs: a whole number from 1 to 1000000" --epochs 0 # it would save the initial weights as a trained model
refused "bad value 'clf.st' for --resume: only auto: it goes on from --out's file (--out FILE --resume auto)" --resume clf.st
refused "--out $tmp/nodir/m.st: cannot create files in $tmp/nodir" --out "$tmp/nodir/m.st"
refused "--out needs a file name" --out=
refused "--out needs a value, not the flag '--epochs' (a value that starts with --: --out=VALUE)" --out --epochs 1
refused "--resume needs a value (train_classifier --help lists the flags)" --resume
refused "unknown flag '--no-such-flag' (train_classifier --help lists the flags)" --no-such-flag # last: no value either
refused "unknown argument 'clf.st' (train_classifier --help lists the flags)" clf.st
refused "--out $tmp is a directory" --out "$tmp"
# a save's rename would put a file in the place of a FIFO or a device
mkfifo "$tmp/p.fifo" && ln -s /dev/null "$tmp/null.st"
refused "--out $tmp/p.fifo is a pipe, not a regular file" --out "$tmp/p.fifo"
refused "--init-out $tmp/p.fifo is a pipe, not a regular file" --init-out "$tmp/p.fifo"
refused "--out $tmp/null.st is a device or socket, not a regular file" --out "$tmp/null.st"
refused "--out and --init-out are one file" --out "$tmp/a.st" --init-out "$tmp/a.st"
long=$tmp/$(printf 'a%.0s' $(seq 250)).st
refused "--out $long: the name is too long for the file system there" --out "$long"
refused "--out and --init-out are one file" --out "$tmp/a.st" --init-out "$tmp/./a.st"
# --init-out at --out's FILE.tmp: the last save leaves it as it is (it took it as its temporary file)
"$bin" --nproc 1 --epochs 1 --out "$tmp/c.st" --init-out "$tmp/c.st.tmp" >"$tmp/tmpname.txt" 2>&1
rc=$?
[ "$rc" -eq 0 ] && [ -s "$tmp/c.st" ] && [ "$(stat -c %s "$tmp/c.st.tmp" 2>/dev/null || echo 0)" -gt "$(stat -c %s "$tmp/c.st")" ] &&
  [ -z "$(ls "$tmp"/c.st.tmp.* 2>/dev/null)" ]
report "classifier: --init-out FILE.tmp of --out FILE stays (the save writes beside it)" $? \
  "exit $rc: $(ls -l "$tmp"/c.st* | tr '\n' ' ')"
# --init-out of a resumed run: the initial weights, as the run that started saved them (it
# wrote the trained weights read back, and the PyTorch twin started from those)
"$bin" --nproc 2 --epochs 2 --out "$tmp/r.st" --save-every 1 --init-out "$tmp/i1.st" >/dev/null 2>&1 &&
  "$bin" --nproc 2 --epochs 2 --out "$tmp/r.st" --save-every 1 --resume auto --init-out "$tmp/i2.st" \
    >"$tmp/resumed.txt" 2>&1 && grep -q "resumed from" "$tmp/resumed.txt" && cmp -s "$tmp/i1.st" "$tmp/i2.st"
report "classifier: --init-out of a resumed run holds the initial weights" $? "$(tr '\n' '|' <"$tmp/resumed.txt")"
# --resume auto reads the epoch as written (digits only): " +01", "+1" and "01" are not epochs,
# and one past --epochs is none (a single digit past it passed: 9 of --epochs 2 resumed)
if command -v python3 >/dev/null; then
  "$bin" --nproc 1 --epochs 2 --out "$tmp/e.st" >/dev/null 2>&1
  for v in ' +01' '+1' '01' '3' '9'; do
    python3 - "$tmp/e.st" "$tmp/bad_epoch.st" "$v" <<'EOF'
import json, struct, sys
b = open(sys.argv[1], 'rb').read()
n = struct.unpack('<Q', b[:8])[0]
h = json.loads(b[8:8 + n])
h['__metadata__']['epoch'] = sys.argv[3]
h['__metadata__'].pop('safetensors.h checksum')  # (it would refuse the edit first)
hs = json.dumps(h, separators=(',', ':')).encode()
hs += b' ' * (-len(hs) % 8)
open(sys.argv[2], 'wb').write(struct.pack('<Q', len(hs)) + hs + b[8 + n:])
EOF
    "$bin" --nproc 1 --epochs 2 --resume auto --out "$tmp/bad_epoch.st" >"$tmp/epoch.txt" 2>&1
    rc=$?
    [ "$rc" -eq 1 ] && grep -q "^train_classifier: .*bad_epoch.st: metadata epoch '$v' is not a count from 0 to --epochs 2$" "$tmp/epoch.txt"
    report "classifier --resume auto: metadata epoch '$v' is refused" $? "exit $rc: $(tr '\n' '|' <"$tmp/epoch.txt")"
  done
else
  echo "SKIP classifier --resume auto with a bad epoch: python3 not installed (it crafts the files)"
fi
# a learning rate that blows the weights up: NaN was clamped into a finite loss and saved
"$bin" --nproc 2 --lr 50 --epochs 2 --out "$tmp/nan.bin" >"$tmp/nan.txt" 2>&1
rc=$?
[ "$rc" -eq 1 ] && grep -q '^train_classifier: the loss is not finite in epoch 0 (train nan, val nan): a smaller --lr$' \
  "$tmp/nan.txt" && [ ! -e "$tmp/nan.bin" ]
report "classifier: a diverging run stops, says so, and saves nothing" $? "exit $rc: $(tr '\n' '|' <"$tmp/nan.txt")"

# two ranks started by hand, --resume auto on one of them (it adds a broadcast): named
port=$(free_port)
for r in 0 1; do
  extra=""; [ $r = 1 ] && extra="--resume auto"
  RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port DDP_TIMEOUT=30 timeout 60 "$bin" --epochs 1 \
    --out "$tmp/hand$r.bin" $extra >"$tmp/hand$r.txt" 2>&1 &
done
wait %1; rc0=$?; wait %2; rc1=$?
[ "$rc0" = 1 ] && [ "$rc1" = 1 ] && grep -q 'ranks disagree on --resume auto: rank 1 has on, rank 0 has off' "$tmp/hand0.txt" &&
  grep -q 'ranks disagree on --resume auto' "$tmp/hand1.txt"
report "classifier: ranks started by hand with --resume auto on one of them stop and name it" $? \
  "exit $rc0 $rc1: $(cat "$tmp/hand0.txt" "$tmp/hand1.txt" | tr '\n' '|')"

"$bin" --help >"$tmp/help.txt" 2>&1
rc=$?
[ "$rc" -eq 0 ] && grep -q '^usage: train_classifier' "$tmp/help.txt" && grep -q -- '--init-out FILE' "$tmp/help.txt"
report "classifier: --help prints the usage and exits 0" $? "exit $rc: $(head -n 2 "$tmp/help.txt" | tr '\n' ' ')"
exit $fail

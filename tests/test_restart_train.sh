#!/usr/bin/env bash
# tests/test_restart_train.sh - training that survives dead ranks and ends with the same
# bits as a run that was never stopped (examples/train_gpt and train_classifier, tiny).
#   Kill points: a rank gets SIGKILL at a moment of an attempt, of four kinds drawn at
#   random: as soon as the attempt's ranks appear (start-up, rendezvous: the restart
#   itself), after a random delay (mostly during a step), inside a save (rank 0 is
#   stopped now and then until it is caught with the checkpoint's new file open, then
#   killed: the previous checkpoint must still load), and a second rank a few ms after
#   the first (while the launcher stops the job). Each run draws 1-3 kill events and
#   gets as many restarts; a kill is counted as start-up when the attempt had printed
#   no step yet.
#   - train_gpt under its own launcher (--nproc 2 --max-restarts N --resume auto): every
#     run ends with status 0, a checkpoint byte-identical to the uninterrupted run's, and
#     a --log identical to its log (but tokens/s): exactly one record per step;
#   - train_classifier (--nproc 3 --save-every 1 --resume auto): the same weights, and
#     another run's file refused;
#   - a kill while a (40 MB) save is half written leaves the previous checkpoint whole;
#   - --resume auto: a fresh start without the file, a one-line refusal of another
#     run's file (seed, data, lr, steps, model, global batch), nothing to train at the
#     end, another split of the same global batch goes on, and ranks that found
#     different checkpoints (hosts without a shared file system) are refused;
#   - the same kills under torchrun --max-restarts (where a python3 imports torch): the
#     program sees the restart count (TORCHELASTIC_RESTART_COUNT) and resumes.
# The number of kill points of each kind is printed. DDP_RESTART_TRIALS (default 6)
# sets how many interrupted train_gpt runs to make.
cd "$(dirname "$0")/.." || exit 1
src=$PWD
bin=$src/examples/train_gpt
clf=$src/examples/train_classifier
tmp=$(mktemp -d)
job=""
trap '[ -n "$job" ] && kill -9 "$job" 2>/dev/null; rm -rf "$tmp"' EXIT
fail=0
report() { # name ok why
  if [ "$2" -eq 0 ]; then echo "PASS $1"; else echo "FAIL $1: $3"; fail=1; fi
}
for b in "$bin" "$clf"; do
  [ -x "$b" ] || { echo "FAIL restart_train: $b is not built (make ${b#"$src"/})"; exit 1; }
done
cd "$tmp" || exit 1
export OMP_NUM_THREADS=1 # tiny models: one thread per rank is fastest, and steadiest on a busy machine
head -c 30000 "$src/ddp.h" >data.txt
gpt="--layers 2 --heads 2 --dim 32 --ctx 16 --data data.txt --batch-size 4 --steps 30 --val-every 5 --sample-len 0
     --seed 5 --save-every 2"
gpt=$(echo $gpt)
clf_flags="--epochs 40 --batch-size 4 --seed 3 --save-every 1"

# The live children of a process, from /proc (no procps needed), but the launcher's
# watchdog: the ranks.
children() {
  local f pid comm state ppid
  for f in /proc/[0-9]*/stat; do
    read -r pid comm state ppid _ 2>/dev/null <"$f" || continue
    [ "$ppid" = "$1" ] && [ "$state" != Z ] && [ "$comm" != "(ddp-watchdog)" ] && echo "$pid"
  done
}
rank_of() { tr '\0' '\n' 2>/dev/null <"/proc/$1/environ" | sed -n 's/^RANK=//p'; }
# unnamed pid fd: fd is a file made without a name (O_TMPFILE: a save on Linux writes
# there until the file is whole), found by the flag in fdinfo, read by a builtin
unnamed() {
  local k v
  [ -f "$2" ] || return 1
  while read -r k v; do
    [ "$k" = flags: ] && [ $((8#$v & 8#20000000)) -ne 0 ] && return 0
  done <"/proc/$1/fdinfo/${2##*/}" 2>/dev/null
  return 1
}
# saving pid file: the size of file (or file.tmp, or the unnamed file a save writes first)
# if the process has it open for writing (a save). The files are matched with test's -ef,
# a builtin: a poll starts no process until it finds one (a readlink per descriptor made
# each poll cost more than a small model's save lasts, and 6 runs could pass without
# catching one)
saving() {
  local fd flags
  for fd in /proc/"$1"/fd/*; do
    if [ "$fd" -ef "$PWD/$2" ] || [ "$fd" -ef "$PWD/$2.tmp" ] || unnamed "$1" "$fd"; then
      flags=$(sed -n 's/^flags:[[:space:]]*//p' "/proc/$1/fdinfo/${fd##*/}" 2>/dev/null)
      [ -n "$flags" ] && [ $((8#$flags & 3)) -ne 0 ] && stat -L -c %s "$fd" 2>/dev/null && return 0
    fi
  done
  return 1
}
alive() { local p; for p in "$@"; do kill -0 "$p" 2>/dev/null && return 0; done; return 1; }
pause() { sleep "$(printf '0.%03d' "$1")"; } # milliseconds: the random moments of the kills

k_startup=0 k_step=0 k_save=0 k_stopping=0 k_late=0 saves_whole=0 saves_bad=""
# kill_events launcher events nproc ckpt progress-regex output [first-kind]: one kill
# event per attempt, the first of the given kind (else drawn, as the others)
kill_events() {
  local launcher=$1 events=$2 nproc=$3 ckpt=$4 progress=$5 out=$6 e kind victim r0 lines p caught other ranks
  for ((e = 0; e < events; e++)); do
    ranks=() # this attempt's ranks: the launcher starts them once the last attempt has ended
    while alive "$launcher" && [ ${#ranks[@]} -lt "$nproc" ]; do
      mapfile -t ranks < <(children "$launcher")
      [ ${#ranks[@]} -lt "$nproc" ] && pause 2
    done
    if ! alive "$launcher"; then k_late=$((k_late + events - e)); return; fi
    lines=$(grep -c "$progress" "$out")
    kind=$((RANDOM % 4))
    [ "$e" = 0 ] && [ -n "$7" ] && kind=$7
    case $kind in
      1 | 3) pause $((RANDOM % 400)) ;; # (0: at once)
      2) r0="" caught=0
         for p in "${ranks[@]}"; do [ "$(rank_of "$p")" = 0 ] && r0=$p; done
         for ((p = 0; p < 300 && caught == 0; p++)); do
           kill -STOP "$r0" 2>/dev/null || break
           if saving "$r0" "$ckpt" >/dev/null; then caught=1; else kill -CONT "$r0"; pause $((1 + RANDOM % 9)); fi
         done ;;
    esac
    if [ "$kind" = 2 ] && [ "$caught" = 1 ]; then
      kill -9 "$r0"
      k_save=$((k_save + 1))
      if [ -e "$ckpt" ]; then
        if "$bin" --compare "$ckpt" "$ckpt" >/dev/null 2>&1; then saves_whole=$((saves_whole + 1))
        else saves_bad="$saves_bad $ckpt"; fi
      fi
    else
      [ "$kind" = 2 ] && kill -CONT "$r0" 2>/dev/null
      victim=${ranks[RANDOM % ${#ranks[@]}]}
      kill -9 "$victim" 2>/dev/null
      if [ "$(grep -c "$progress" "$out")" -eq "$lines" ]; then k_startup=$((k_startup + 1)); else k_step=$((k_step + 1)); fi
      if [ "$kind" = 3 ]; then
        pause $((RANDOM % 10))
        for other in "${ranks[@]}"; do [ "$other" != "$victim" ] && kill -9 "$other" 2>/dev/null && break; done
        k_stopping=$((k_stopping + 1))
      fi
    fi
    while alive "${ranks[@]}"; do pause 10; done # the attempt has ended
  done
}

# interrupted name events nproc ckpt progress first-kind cmd...: runs cmd (a launcher)
# with kill events at random moments; the status is in $rc, the output in name.txt
interrupted() {
  local name=$1 events=$2 nproc=$3 ckpt=$4 progress=$5 first=$6 t0
  shift 6
  "$@" >"$name.txt" 2>&1 &
  job=$!
  kill_events "$job" "$events" "$nproc" "$ckpt" "$progress" "$name.txt" "$first"
  t0=$SECONDS
  while alive "$job" && [ $((SECONDS - t0)) -lt 120 ]; do pause 50; done
  alive "$job" && kill -9 "$job"
  wait "$job"
  rc=$?
  job=""
}
no_speed() { sed 's/"tokens_per_s": [0-9.]*, //' "$1"; }

# ---- train_gpt under its own launcher ---------------------------------------------------
"$bin" --nproc 2 $gpt --save ref.st --log ref.jsonl >ref.txt 2>&1
report "restart_train: the uninterrupted train_gpt run" $? "$(tail -n 3 ref.txt | tr '\n' ' ')"
trials=${DDP_RESTART_TRIALS:-6}
for ((t = 1; t <= trials; t++)); do
  rm -f b.st b.st.tmp b.jsonl
  events=$((1 + RANDOM % 3))
  # (the first event of the first four runs: each kind once)
  interrupted "gpt$t" "$events" 2 b.st '^step ' "$([ "$t" -le 4 ] && echo $((t - 1)))" "$bin" --nproc 2 --max-restarts "$events" $gpt --save b.st \
    --resume auto --log b.jsonl
  cmp -s ref.st b.st && [ "$rc" -eq 0 ]
  report "restart_train: train_gpt killed $events times ends with the same bits ($t)" $? \
    "status $rc; $("$bin" --compare ref.st b.st 2>&1); $(grep '^ddp: \|^train_gpt: ' "gpt$t.txt" | tr '\n' '|' | head -c 600)"
  diff <(no_speed ref.jsonl) <(no_speed b.jsonl) >log.diff
  report "restart_train: its --log has one record per step, as the uninterrupted run's ($t)" $? "$(head -c 400 log.diff)"
  # the last attempt, which finished, says which restart it is (or that nothing was left to train)
  restarts=$(grep -c 'restarting the job' "gpt$t.txt")
  [ "$restarts" -le "$events" ] && ! grep -q 'no restart left' "gpt$t.txt" &&
    { [ "$restarts" -eq 0 ] || grep -q "^restart $restarts of the job: \|nothing to train" "gpt$t.txt"; }
  report "restart_train: one launcher line per restart; the last attempt knows its restart count ($t)" $? \
    "$(grep 'restart\|nothing' "gpt$t.txt" | tr '\n' '|')"
done
[ -z "$saves_bad" ] && { [ "$k_save" -ge 1 ] || [ "$trials" -lt 3 ]; }
report "restart_train: a kill inside a save leaves the previous checkpoint whole ($saves_whole checked)" $? \
  "$k_save saves caught; unreadable after a kill:$saves_bad"
# (starting afresh would give the same bits too: the restarted attempts must have resumed)
resumed=$(cat gpt*.txt | grep -c '^resumed from b.st after step [1-9]')
[ "$resumed" -ge 1 ]
report "restart_train: restarted attempts went on from the checkpoint ($resumed did)" $? \
  "$(cat gpt*.txt | grep 'restart\|resumed' | tr '\n' '|' | head -c 400)"

# ---- a kill while a save writes -------------------------------------------------------------
# A model whose checkpoint takes a while to write (40 MB); once the first save is done, the
# process is stopped now and then until it is caught with the next one half written, and
# killed there: the checkpoint must still be the whole previous one.
"$bin" --layers 4 --heads 4 --dim 256 --ctx 16 --data data.txt --batch-size 2 --steps 30 --val-every 0 \
  --sample-len 0 --save big.st --save-every 1 >big.txt 2>&1 &
job=$!
while alive "$job" && [ ! -e big.st ]; do pause 20; done
full=$(stat -c %s big.st 2>/dev/null) caught=""
for ((p = 0; p < 2000; p++)); do
  kill -STOP "$job" 2>/dev/null || break
  size=$(saving "$job" big.st) && [ "$size" -lt "$full" ] && caught=$size && break
  kill -CONT "$job"
  pause $((1 + RANDOM % 3))
done
kill -9 "$job" 2>/dev/null
wait "$job" 2>/dev/null
job=""
[ -n "$caught" ] && "$bin" --compare big.st big.st >/dev/null 2>&1 && [ "$(stat -c %s big.st)" -eq "$full" ]
report "restart_train: a kill while a save is half written leaves the previous checkpoint whole" $? \
  "${caught:-no save caught half written} of $full bytes written; big.st: $(stat -c %s big.st 2>&1) bytes, $("$bin" --compare big.st big.st 2>&1)"

# ---- train_classifier ------------------------------------------------------------------
"$clf" --nproc 3 $clf_flags --out cref.st >cref.txt 2>&1
report "restart_train: the uninterrupted train_classifier run" $? "$(tail -n 3 cref.txt | tr '\n' ' ')"
rm -f c.st
interrupted clf 2 3 c.st '^epoch ' "" "$clf" --nproc 3 --max-restarts 2 $clf_flags --out c.st --resume auto
cmp -s cref.st c.st && [ "$rc" -eq 0 ]
report "restart_train: train_classifier killed twice ends with the same weights" $? \
  "status $rc; $(grep '^ddp: \|^train_classifier: ' clf.txt | tr '\n' '|' | head -c 600)"
out=$("$clf" $clf_flags --seed 4 --out cref.st --resume auto 2>&1); rc=$?
[ "$rc" -eq 1 ] && [ "$(wc -l <<<"$out")" -eq 1 ] && grep -q '^train_classifier: cref.st belongs to another run' <<<"$out"
report "restart_train: train_classifier --resume auto refuses another run's file in one line" $? "status $rc: $out"

# ---- --resume auto's decisions ------------------------------------------------------------
one_line() { # name expected-status pattern args...: train_gpt prints one line matching pattern
  local name=$1 want=$2 pattern=$3 out
  shift 3
  out=$(timeout 60 "$bin" "$@" 2>&1 >/dev/null); rc=$?
  [ "$rc" -eq "$want" ] && [ "$(wc -l <<<"$out")" -eq 1 ] && grep -q "$pattern" <<<"$out"
  report "restart_train: --resume auto $name" $? "status $rc (want $want): $out"
}
cp ref.st other.st
# (the launcher refuses before the ranks start; one rank of another launcher, after joining: test_train_gpt.sh)
while IFS='|' read -r change said; do
  one_line "refuses another run's file ($change)" 1 "^train_gpt: other.st belongs to another run: its $said (" \
    --nproc 2 $gpt $change --save other.st --resume auto
done <<'EOF2'
--seed 6|--seed is 5, this run's is 6
--lr 0.002|--lr is 0.003, this run's is 0.002
--steps 40|--steps is 30, this run's is 40
--batch-size 2|global batch (--batch-size x ranks x --grad-accum) is 8, this run's is 4
--clip 0.5|--clip is 1, this run's is 0.5
--stride 2|--stride is 1, this run's is 2
EOF2
head -c 20000 data.txt >data2.txt
one_line "refuses another run's file (other data)" 1 "belongs to another run: its --data is 30000 tokens, fnv1a [0-9a-f]*, this run's is 20000 tokens" \
  $gpt --data data2.txt --save other.st --resume auto
one_line "refuses another model's file" 1 "written for --dim 32, this run has --dim 64" $gpt --dim 64 --save other.st \
  --resume auto
cmp -s ref.st other.st
report "restart_train: --resume auto leaves a refused file as it was" $? "other.st changed"
out=$("$bin" $gpt --batch-size 8 --save other.st --resume auto 2>&1); rc=$?
[ "$rc" -eq 0 ] && [ "$out" = "train_gpt: nothing to train: other.st was written after step 30, and this run ends at step 30" ]
report "restart_train: --resume auto at the last step: nothing to train" $? "status $rc: $out"
rm -f fresh.st
"$bin" --nproc 2 $gpt --save fresh.st --resume auto >fresh.txt 2>&1 && cmp -s ref.st fresh.st && ! grep -q resumed fresh.txt
report "restart_train: --resume auto without the file starts from step 0" $? "$(tail -n 2 fresh.txt | tr '\n' ' ')"
out=$("$bin" --steps 2 --resume auto 2>&1); rc=$?
[ "$rc" -eq 2 ] && grep -q 'give --save FILE' <<<"$out"
report "restart_train: --resume auto needs --save" $? "status $rc: $out"
# a global batch of 8 as 2 ranks x 4 or 1 x 8 is the same run: a file of one goes on in the other
"$bin" --nproc 2 $gpt --steps 30 --stop-after 10 --save half.st >half.txt 2>&1 &&
  "$bin" --nproc 1 $gpt --batch-size 8 --save half.st --resume auto >half2.txt 2>&1 &&
  [ "$("$bin" --compare ref.st half.st)" = "max_rel_diff 0.000e+00 over 84 tensors" ]
report "restart_train: --resume auto goes on with another split of the same global batch" $? \
  "$(tail -n 2 half.txt half2.txt | tr '\n' ' ')"

# two "hosts" that do not share --save's file (a directory each): one would resume, the
# other start afresh; both refuse, rank 0 says why, nothing hangs
mkdir -p hostA hostB
"$bin" --nproc 2 $gpt --stop-after 10 --save hostA/s.st >mid.txt 2>&1
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
for r in 0 1; do
  (cd "host$( [ $r = 0 ] && echo A || echo B)" && RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 \
    MASTER_ADDR=127.0.0.1 MASTER_PORT=$port DDP_JOB_ID=hosts-$$ DDP_TIMEOUT=30 timeout 60 "$bin" $gpt \
    --data ../data.txt --save s.st --resume auto >"../host$r.txt" 2>&1; echo $? >"../host$r.rc") &
done
wait
[ "$(cat host0.rc)" = 1 ] && [ "$(cat host1.rc)" = 1 ] && [ "$(cat host0.txt)" = "train_gpt: the ranks start after \
different steps (0 to 10; rank 0: 10): every rank needs the same checkpoint (a file system all hosts share)" ] &&
  [ ! -s host1.txt ]
report "restart_train: --resume auto refuses ranks that found different checkpoints" $? \
  "status $(cat host0.rc) and $(cat host1.rc): $(cat host0.txt host1.txt | tr '\n' '|')"

# ---- under torchrun --max-restarts ----------------------------------------------------------
py="" # (importing torch takes seconds: once)
for p in python3 /usr/bin/python3; do
  if command -v "$p" >/dev/null && version=$("$p" -c 'import torch; print(torch.__version__)' 2>/dev/null); then
    py=$p
    break
  fi
done
if [ -z "$py" ]; then
  echo "SKIP restart_train: torchrun --max-restarts: no python3 here imports torch"
else
  extra="" # torch 1.x on Python >= 3.11: see tests/test_torchrun.sh
  [ "${version%%.*}" -lt 2 ] && extra="--redirects 1 --tee 1 --log_dir $tmp/logs"
  port=$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  rm -f b.st b.jsonl
  # torchrun's argparse takes the program's --log for an abbreviation of its own --log-dir
  # (and refuses it as ambiguous), so the program gets its flags from a wrapper
  printf '#!/bin/sh\nexec %s %s --save b.st --resume auto --log b.jsonl\n' "$bin" "$gpt" >gpt.sh
  chmod +x gpt.sh
  # shellcheck disable=SC2086 # word lists
  # (the first kill at once: on an idle machine the run can end before a random moment)
  interrupted torchrun 2 2 b.st '^\(\[default0\]:\)\?step ' 0 "$py" -m torch.distributed.run $extra --nproc_per_node 2 \
    --max_restarts 2 --monitor_interval 0.1 --master_port "$port" --no_python ./gpt.sh
  cmp -s ref.st b.st && [ "$rc" -eq 0 ] && diff <(no_speed ref.jsonl) <(no_speed b.jsonl) >/dev/null
  report "restart_train: under torchrun --max_restarts (torch $version), killed twice: the same bits and log" $? \
    "status $rc; $("$bin" --compare ref.st b.st 2>&1); $(grep -v '^\(\[default[01]\]:\)\?step ' torchrun.txt | tail -n 8 | tr '\n' '|' | head -c 800)"
  # (both kills may come before the first save: then the attempts say so and start afresh)
  restarts=$(grep -c 'restart [12] of the job: \(going on from the checkpoint\|no checkpoint yet\)' torchrun.txt)
  [ "$restarts" -ge 1 ]
  report "restart_train: under torchrun each restarted attempt reads TORCHELASTIC_RESTART_COUNT and the checkpoint" $? \
    "$restarts 'restart N of the job' lines: $(grep -i 'restart' torchrun.txt | tr '\n' '|' | head -c 400)"
fi
kills=$((k_startup + k_step + k_save + k_stopping))
echo "kill points: $kills ($k_startup at start-up or rendezvous, $k_step during steps, $k_save inside a save," \
  "$k_stopping more while the launcher stopped the job; $k_late came after the job had ended)"
[ "$kills" -ge "$k_late" ] # (a test that kills nothing proves nothing)
report "restart_train: most kill events found ranks to kill" $? "$kills kills, $k_late events after the job ended"
exit $fail

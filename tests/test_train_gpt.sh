#!/usr/bin/env bash
# tests/test_train_gpt.sh - examples/train_gpt on a tiny model (2 layers, dim 32, ctx 16):
#   world-size invariance: 1 x 8, 2 x 4 and 4 x 2 sequences per step give the same
#     losses and parameters, bit for bit; grad accumulation: 4 micro-steps of 2 = one
#     step of 8;
#   resume: 4 steps, save, resume for 4 more = 8 steps in one go (losses and weights);
#   checkpoints are safetensors (loaded by Python's safetensors when installed); a save
#   killed mid-write leaves no FILE.tmp behind;
#   --log writes one JSON object per step; --trace writes a Chrome trace (a process per
#   rank, spans per layer, gradient buckets on the collectives row) and leaves the
#   results as they are; bad data, bad flags and bad checkpoints
#   fail in one line; --flag=value trains as --flag value; --help lists every flag; a
#   diverged run (NaN loss) fails naming the step; --compare
#   reports a NaN or infinity as a difference, never as 0; on a terminal one progress
#   line; without --data the story (beside the program, also one found on PATH), and a
#   sample without runs of punctuation; the data line names the format read; --prompt
#   is bytes below --vocab on text, token ids on token data; plot_loss.py without
#   matplotlib says what to install. (The benchmarks:
#   tests/test_bench.sh.)
# The Makefile builds the example.
cd "$(dirname "$0")/.." || exit 1
bin=$PWD/examples/train_gpt
. tests/lib.sh
need_built train_gpt "$bin"
cd "$tmp" || exit 1
head -c 30000 "$OLDPWD/ddp.h" >data.txt
tiny="--layers 2 --heads 2 --dim 32 --ctx 16 --data data.txt --val-every 4 --sample-len 16 --seed 5"
run() { # name args...: runs train_gpt with the tiny model, output in name.txt
  local name=$1; shift
  timeout 60 "$bin" $tiny "$@" >"$name.txt" 2>&1
  local rc=$?
  report "train_gpt $name runs" "$rc" "exit $rc: $(tail -n 3 "$name.txt" | tr '\n' ' ')"
}
losses() { grep '^step ' "$1" | awk '{ print $2, $5 }'; }  # "step/steps loss" per line
same_params() { # a b: bit for bit the same (max relative difference exactly 0)
  [ "$("$bin" --compare "$1" "$2" 2>&1 | cut -d' ' -f1-2)" = "max_rel_diff 0.000e+00" ]
}
compare_runs() { # what a b
  [ -s "$2.txt" ] && [ "$(losses "$2.txt")" = "$(losses "$3.txt")" ] && [ -n "$(losses "$2.txt")" ]
  report "train_gpt $1: the same losses" $? "$(losses "$2.txt" | tail -n 1) vs $(losses "$3.txt" | tail -n 1)"
  same_params "$2.st" "$3.st"
  report "train_gpt $1: the same parameters, bit for bit" $? "$("$bin" --compare "$2.st" "$3.st" 2>&1)"
}

# ---- world-size invariance and gradient accumulation --------------------------------
run one --nproc 1 --batch-size 8 --steps 8 --save one.st --log one.jsonl
run two --nproc 2 --batch-size 4 --steps 8 --save two.st --log two.jsonl
run four --nproc 4 --batch-size 2 --steps 8 --save four.st --log four.jsonl
run accum --nproc 1 --batch-size 2 --grad-accum 4 --steps 8 --save accum.st
run accum2 --nproc 2 --batch-size 1 --grad-accum 4 --steps 8 --save accum2.st
compare_runs "1 x 8 vs 2 x 4" one two
compare_runs "1 x 8 vs 4 x 2" one four
compare_runs "accum 4 x 2 vs 1 x 8" one accum
compare_runs "2 ranks x accum 4 x 1 vs 1 x 8" one accum2
run equals --nproc=2 --batch-size=4 --steps=8 --save=equals.st
compare_runs "--flag=value as --flag value" two equals

# --help: every flag of train_gpt.c's FLAGS table that has a group, in lines of at most 92
"$bin" --help >help.txt 2>&1
rc=$?
flags=$(sed -n 's/^ *X("[a-z][a-z]*", "\(--[a-z-]*\)".*/\1/p' "$OLDPWD/examples/train_gpt.c")
missing=$(for f in $flags; do grep -qE -- "$f( |$)" help.txt || echo "$f"; done)  # --save, not --save-every
long=$(awk 'length > 92' help.txt | head -n 2)
[ "$rc" -eq 0 ] && [ "$(wc -w <<<"$flags")" -gt 30 ] && [ -z "$missing" ] && [ -z "$long" ]
report "train_gpt --help: every flag, lines of at most 92 columns" $? \
  "exit $rc, $(wc -w <<<"$flags") flags in the table, missing: $missing, long: $long"

out=$("$bin" --compare one.st two.st opt.m. 2>&1)
case $out in "max_rel_diff 0.000e+00 over 28 tensors") true ;; *) false ;; esac
report "train_gpt --compare A B opt.m.: only the tensors with that prefix" $? "$out"
# --compare reads every dtype (train_classifier's --init-out holds I32 labels): a file
# against itself is 0, one integer changed is a difference, another dtype is refused
python3 - <<'EOF'
import json, struct
def write(path, tensors):
    head, blob = {}, b""
    for name, (dtype, fmt, values) in tensors.items():
        data = struct.pack("<%d%s" % (len(values), fmt), *values)
        head[name] = {"dtype": dtype, "shape": [len(values)], "data_offsets": [len(blob), len(blob) + len(data)]}
        blob += data
    h = json.dumps(head).encode()
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + blob)
t = {"w": ("F32", "f", [1.5, -2.0]), "y": ("I32", "i", [3, -7, 9]), "h": ("F16", "H", [0x3c00, 0xc000]),
     "b": ("BF16", "H", [0x3f80]), "u": ("U8", "B", [200, 1]), "l": ("I64", "q", [-5])}
write("dt_a.st", t)
t["y"] = ("I32", "i", [3, -8, 9])
write("dt_b.st", t)
t["y"] = ("F32", "f", [3, -7, 9])
write("dt_c.st", t)
t["y"], t["z"] = ("I32", "i", [3, -7, 9]), ("F32", "f", [0.5])
write("dt_d.st", t)
write("dt_zero.st", {"w": ("F32", "f", [0.0, 0.0])})
write("dt_tiny.st", {"w": ("F32", "f", [0.0, 1e-30])})
EOF
same=$("$bin" --compare dt_a.st dt_a.st 2>&1); rc_same=$?
diff=$("$bin" --compare dt_a.st dt_b.st 2>&1); rc_diff=$?
other=$("$bin" --compare dt_a.st dt_c.st 2>&1); rc_other=$?
[ $rc_same -eq 0 ] && [ "$same" = "max_rel_diff 0.000e+00 over 6 tensors" ] &&
  [ $rc_diff -eq 0 ] && [ "$diff" = "max_rel_diff 1.111e-01 over 6 tensors, worst y" ] &&
  [ $rc_other -eq 1 ] && [ "$other" = "train_gpt: tensor y is I32 [3] in dt_a.st but F32 [3] in dt_c.st (tensors compare only with one dtype and shape)" ]
report "train_gpt --compare: every dtype, integers too; another dtype is refused" $? \
  "same: $rc_same '$same'; one I32 changed: $rc_diff '$diff'; I32 against F32: $rc_other '$other'"
# a PREFIX compares the tensors it names, whatever else either file holds; a flag is no prefix
sub=$("$bin" --compare dt_a.st dt_d.st y 2>&1); rc_sub=$?
all=$("$bin" --compare dt_a.st dt_d.st 2>&1); rc_all=$?
flag=$("$bin" --compare dt_a.st dt_d.st --help 2>&1); rc_flag=$?
[ $rc_sub -eq 0 ] && [ "$sub" = "max_rel_diff 0.000e+00 over 1 tensors" ] &&
  [ $rc_all -eq 1 ] && [ "$all" = "train_gpt: dt_a.st has 6 tensors, dt_d.st has 7" ] &&
  [ $rc_flag -eq 2 ] && [ "$flag" = "train_gpt: --compare A B [PREFIX] takes no flags: '--help' is not a tensor name's prefix" ]
report "train_gpt --compare A B PREFIX: only what PREFIX names counts; a flag is refused" $? \
  "prefix y: $rc_sub '$sub'; all: $rc_all '$all'; --help: $rc_flag '$flag'"
zero=$("$bin" --compare dt_zero.st dt_tiny.st 2>&1); rc_zero=$?
[ $rc_zero -eq 0 ] && [ "$zero" = "max_rel_diff 1.000e+00 over 1 tensors, worst w" ]
report "train_gpt --compare: a tensor of zeros in A against one that is not differs by 1, not inf" $? "$rc_zero '$zero'"
out=$("$bin" --device-info 2>&1); rc=$?
[ "$rc" -eq 1 ] && [ "$out" = "train_gpt: built without nvcc: no GPU path (examples/train_gpt_gpu has one)" ]
report "train_gpt --device-info: the CPU build says it has no GPU path" $? "exit $rc: $out"

[ "$(grep -c '^step ' one.txt)" -eq 8 ] && [ "$(grep -c '^step ' four.txt)" -eq 8 ]
report "train_gpt prints one line per step, on rank 0 only" $? "$(grep -c '^step ' four.txt) step lines for 4 ranks"
awk '/^step / { if (!first) first = $5; last = $5 } END { exit !(last < first) }' one.txt
report "train_gpt: the loss falls" $? "$(losses one.txt | head -n 1) -> $(losses one.txt | tail -n 1)"
grep -q '| val ' one.txt && grep -q '^sample' one.txt
report "train_gpt validates and prints a sample" $? "$(tail -n 3 one.txt | tr '\n' ' ')"

# ---- resume ------------------------------------------------------------------------------
run paused --nproc 2 --batch-size 4 --steps 8 --stop-after 4 --save resumed.st --log both.jsonl
cp resumed.st paused.st
run resumed --nproc 2 --batch-size 4 --steps 8 --resume resumed.st --save resumed.st --log both.jsonl
cat paused.txt resumed.txt >both.txt
cp resumed.st both.st
compare_runs "4 steps + resume 4 vs 8 steps" two both
# the log too (but its speeds): a pause is no end of the schedule, so no validation there
[ "$(sed 's/"tokens_per_s": [0-9.]*, //' both.jsonl)" = "$(sed 's/"tokens_per_s": [0-9.]*, //' two.jsonl)" ]
report "train_gpt: 4 steps + resume 4 log what 8 steps log" $? "$(diff <(cut -c1-60 two.jsonl) <(cut -c1-60 both.jsonl) | head -n 4 | tr '\n' ' ')"
run regrown --nproc 4 --batch-size 2 --steps 11 --resume two.st
[ "$(grep -c '^step ' regrown.txt)" -eq 3 ]
report "train_gpt resumes with another world size" $? "$(grep -c '^step ' regrown.txt) steps after resuming"
# --resume FILE without --seed goes on with the file's seed: its data order and its sample
timeout 60 "$bin" ${tiny% --seed 5} --nproc 2 --batch-size 4 --steps 8 --resume paused.st --save noseed.st >noseed.txt 2>&1
rc=$?
[ $rc -eq 0 ] && same_params noseed.st two.st && grep -q '^sample' two.txt &&
  [ "$(sed -n '/^sample/,$p' noseed.txt)" = "$(sed -n '/^sample/,$p' two.txt)" ]
report "train_gpt: --resume FILE without --seed: the file's run's weights and sample" $? \
  "exit $rc; $("$bin" --compare noseed.st two.st 2>&1); $(tail -n 2 noseed.txt | tr '\n' '|') vs $(tail -n 2 two.txt | tr '\n' '|')"
# a run of its own from a checkpoint (explicit --resume) says what it changes of the file's run
timeout 60 "$bin" $tiny --nproc 2 --batch-size 2 --steps 8 --lr 0.01 --resume paused.st >changed.txt 2>&1
grep -qx "note: this run changes paused.st's: global batch (--batch-size x ranks x --grad-accum) 8 -> 4; --lr 0.003 -> 0.01" changed.txt &&
  ! grep -q "^note: this run changes" noseed.txt
report "train_gpt: --resume FILE says which of its run's values this run changes, and only then" $? \
  "$(grep '^note' changed.txt noseed.txt | tr '\n' '|')"

# ---- checkpoint and log formats ----------------------------------------------------------
[ ! -e one.st.tmp ] && head -c 8 one.st | od -An -tu8 | awk '{ exit !($1 % 8 == 0 && $1 > 100) }'
report "train_gpt checkpoint: safetensors header length, no .tmp left" $? "$(ls)"
[ "$(wc -l <one.jsonl)" -eq 8 ] && grep -q '"val_loss"' one.jsonl &&
  ! grep -v '^{"step": [0-9]*, "loss": [0-9.]*, \("val_loss": [0-9.]*, \)\?"lr": [0-9.e+-]*, "tokens_per_s": [0-9.]*, "world_size": 1}$' one.jsonl
report "train_gpt --log: one JSON object per step" $? "$(head -n 2 one.jsonl | tr '\n' ' ')"
run traced --nproc 2 --batch-size 4 --steps 8 --save traced.st --bucket-kb 16 --trace trace.json
compare_runs "--trace vs without" two traced
python3 - trace.json <<'EOF' >trace.txt 2>&1
import json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
assert isinstance(ev, list) and ev, "no traceEvents"
for e in ev:
    assert all(k in e for k in ("name", "ph", "pid", "tid")), e
    assert e["ph"] == "M" or ("ts" in e and e.get("dur", -1) >= 0), e
spans = [e for e in ev if e["ph"] == "X"]
for rank in (0, 1):
    main = [e["name"] for e in spans if e["pid"] == rank and e["tid"] == 0]
    coll = [e["name"] for e in spans if e["pid"] == rank and e["tid"] == 1]
    for name in ["step 1", "step 8", "forward", "backward", "backward block 0", "backward block 1",
                 "backward lm_head, ln_f", "backward embedding", "optimizer", "validation"]:
        assert name in main, f"rank {rank}: no span {name!r} on the main row"
    assert main.count("forward") == 8, f"rank {rank}: {main.count('forward')} forward spans for 8 steps"
    assert sum(n.startswith("bucket ") and "all_reduce" in n for n in coll) >= 8 * 3, \
        f"rank {rank}: bucket all-reduces on the collectives row: {coll[:5]}"
assert {e["pid"] for e in ev} == {0, 1}, {e["pid"] for e in ev}
print(len(spans), "spans")
EOF
report "train_gpt --trace: a Chrome trace with a row per rank, layer spans and bucket all-reduces" $? \
  "$(tail -n 3 trace.txt | tr '\n' ' ')"
grep -q '^trace: trace.json' traced.txt
report "train_gpt --trace says where the trace went" $? "$(tail -n 3 traced.txt | tr '\n' ' ')"
# a long run's trace holds all of it (it ended at a fixed 100000 events, unsaid: step 9091
# of 15000 here)
timeout 120 "$bin" --layers 1 --dim 8 --heads 1 --ctx 8 --batch-size 1 --sample-len 0 --val-every 0 --steps 15000 \
  --nproc 2 --data data.txt --trace long.json >long.txt 2>&1 &&
  [ "$(python3 -c 'import json, sys; ev = json.load(open(sys.argv[1]))["traceEvents"]
print(sum(e.get("name") == "forward" for e in ev), [e["args"]["events"] for e in ev if e.get("name") == "dropped"])' long.json)" = "30000 [[0, 0]]" ] &&
  ! grep -q "ends early" long.txt
report "train_gpt --trace: a run of 15000 steps traced whole" $? "$(tail -n 2 long.txt | tr '\n' ' ')"
if python3 -c 'import safetensors.numpy' 2>/dev/null; then
  python3 - one.st <<'EOF' >py.txt 2>&1
import sys, json, struct
from safetensors.numpy import load_file
from safetensors import safe_open
t = load_file(sys.argv[1])
with safe_open(sys.argv[1], "np") as f:
    meta = f.metadata()
assert t["wte.weight"].shape == (256, 32), t["wte.weight"].shape
assert t["h.1.mlp.c_fc.weight"].shape == (128, 32)
assert t["opt.v.ln_f.bias"].shape == (32,)
assert meta["step"] == "8" and meta["layers"] == "2", meta
print(len(t), "tensors")
EOF
  report "train_gpt checkpoint loads in Python safetensors" $? "$(tail -n 2 py.txt | tr '\n' ' ')"
else
  echo "SKIP train_gpt checkpoint loads in Python safetensors: python3 safetensors and numpy not installed"
fi

# ---- the face: a progress line on a terminal, plot_loss.py ----------------------------------
if command -v script >/dev/null; then
  script -qec "$bin $tiny --nproc 2 --batch-size 4 --steps 8" /dev/null >tty.txt 2>&1
  rc=$?
  # every step rewrites one line (\r ... erase to its end); only the validation steps (4, 8) stay
  [ "$rc" -eq 0 ] && [ "$(tr '\r' '\n' <tty.txt | grep -c '^step ')" -eq 8 ] &&
    [ "$(grep -c '^step ' tty.txt)" -eq 0 ] && [ "$(grep -c ' | val ' tty.txt)" -eq 2 ] &&
    grep -q $'\r''step     8/8 .* | val ' tty.txt && grep -q '^trained 8 steps' tty.txt
  report "train_gpt on a terminal: one progress line, a line per validation" $? "exit $rc: $(tr '\r\033' '|~' <tty.txt | head -c 400)"
else
  echo "SKIP train_gpt on a terminal: no script(1) to give it one"
fi
# Open MPI gives each rank a pty whatever mpirun's output is: a file still gets lines
if command -v mpirun.openmpi >/dev/null; then
  timeout 120 mpirun.openmpi --allow-run-as-root --oversubscribe -np 2 "$bin" $tiny --batch-size 4 --steps 8 >mpi.txt 2>&1
  rc=$?
  [ "$rc" -eq 0 ] && [ "$(grep -c '^step ' mpi.txt)" -eq 8 ] && ! grep -q $'[\r\033]' mpi.txt
  report "train_gpt under mpirun into a file: a line per step, no carriage returns" $? "exit $rc: $(tr '\r\033' '|~' <mpi.txt | head -c 400)"
else
  echo "SKIP train_gpt under mpirun into a file: mpirun.openmpi not installed"
fi
# without --data: the story next to the program; the sample has no runs of punctuation
timeout 60 "$bin" --layers 2 --heads 2 --dim 32 --ctx 16 --steps 20 --val-every 0 --sample-len 200 >story.txt 2>&1
rc=$?
sample=$(sed -n '/^sample/,$p' story.txt | tail -n +2)
[ "$rc" -eq 0 ] && grep -q '^data: .*examples/train_gpt.txt: .* (stride 1)' story.txt && [ -n "$sample" ] &&
  ! printf '%s' "$sample" | grep -q '\([^[:alnum:]]\)\1\1\1' && [ "$(printf '%s' "$sample" | wc -c)" -le 204 ]
report "train_gpt without --data: the story, a sample without runs of punctuation" $? "exit $rc: $(tail -n 4 story.txt | tr '\n' '|')"
plot="$OLDPWD/examples/plot_loss.py"
python3 -c "import runpy, sys; sys.modules['matplotlib'] = None; sys.argv = ['plot_loss.py', 'one.jsonl']
runpy.run_path('$plot', run_name='__main__')" >plot.txt 2>&1  # as if matplotlib were missing
rc=$?
[ "$rc" -eq 1 ] && [ "$(cat plot.txt)" = "plot_loss.py needs matplotlib: pip install matplotlib (or apt install python3-matplotlib)" ]
report "plot_loss.py without matplotlib: what to install, exit 1" $? "exit $rc: $(head -c 300 plot.txt)"
if python3 -c 'import matplotlib' 2>/dev/null; then
  python3 "$plot" "one process=one.jsonl" four.jsonl -o curve.png >plot.txt 2>&1 && [ -s curve.png ]
  report "plot_loss.py draws a log" $? "$(tail -n 2 plot.txt)"
  cp one.jsonl lr=0.003.jsonl # a file name with '=', alone and after a label (its tail was taken for the file)
  python3 "$plot" lr=0.003.jsonl "run=lr=0.003.jsonl" -o eq.png >plot.txt 2>&1 && [ -s eq.png ]
  report "plot_loss.py draws a log whose name holds '='" $? "$(tail -n 2 plot.txt)"
  mkfifo fifo.jsonl # (read until a writer came: for good)
  printf '{"step": 1, "loss": "5.1"}\n' >text.jsonl # (drawn as a category)
  printf '{"step": 1, "loss": 5.1, "val_loss": "x"}\n' >textval.jsonl # (a traceback)
  for case in "none.jsonl|none.jsonl: No such file or directory" "one.txt|one.txt is not a train_gpt --log file (one JSON object per step)" \
              "one.jsonl -o none/c.png|cannot write none/c.png: No such file or directory" \
              "fifo.jsonl|fifo.jsonl is not a regular file" \
              "text.jsonl|text.jsonl is not a train_gpt --log file (one JSON object per step)" \
              "textval.jsonl|textval.jsonl is not a train_gpt --log file (one JSON object per step)"; do
    IFS='|' read -r args want <<<"$case"
    out=$(timeout 20 python3 "$plot" $args 2>&1) # (a word list)
    rc=$?
    [ $rc -eq 1 ] && [ "$out" = "plot_loss.py: $want" ]
    report "plot_loss.py $args: one line, exit 1" $? "exit $rc: $(head -c 300 <<<"$out")"
  done
else
  echo "SKIP plot_loss.py draws a log: python3 matplotlib not installed"
fi

# the data's format, by its header or a .bin name in any case, said on the data line
head -c 4000 /dev/zero >zeros.BIN
run upper --steps 1 --sample-len 0 --data zeros.BIN
grep -q '^data: zeros.BIN: 2000 tokens (nanoGPT uint16 tokens), ' upper.txt &&
  grep -q '^data: data.txt: 30000 tokens (text bytes), ' one.txt
report "train_gpt: a .BIN is uint16 tokens, and the data line says which format it read" $? \
  "$(grep '^data: ' upper.txt one.txt | tr '\n' '|')"

# the default --stride is 1 for data up to 1M tokens (all of them, as --help says), else --ctx
for i in $(seq 40); do cat data.txt; done | head -c 1100000 >large.dat
run large --steps 1 --sample-len 0 --data large.dat
grep -q '^data: large.dat: 1100000 tokens .* (stride 16)' large.txt
report "train_gpt: 1.1M tokens train with stride --ctx" $? "$(grep '^data: ' large.txt)"

# --prompt: token data's prompt is token ids (its bytes are no tokens), text data's each byte below --vocab
run idprompt --steps 1 --data zeros.BIN --prompt "0 0" --sample-len 4
sed -n '/^sample/,$p' idprompt.txt | tail -n +2 | grep -q '^0 0 [0-9]* [0-9]* [0-9]* [0-9]* $' &&
  grep -q '^sample (token ids' idprompt.txt
report "train_gpt --prompt on token data: token ids, the sample in ids" $? "$(tail -n 2 idprompt.txt | tr '\n' '|')"

# ---- errors: one line on stderr, non-zero exit, no hang ----------------------------------
one_line_error() { # name args...
  local name=$1; shift
  timeout 20 "$bin" "$@" >/dev/null 2>err.txt
  local rc=$?
  [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$(wc -l <err.txt)" -eq 1 ]
  report "train_gpt error: $name" $? "exit $rc, stderr: $(head -c 300 err.txt | tr '\n' '|')"
}
: >empty.txt
head -c 100 data.txt >short.txt
printf '\x2c\x01\x05\x00' >big.bin            # uint16 token 300 >= vocab 256
printf '\x01\x00\x02' >odd.bin
head -c 1000 one.st >truncated.st
{ printf '\x88\xd8\x34\x01\x01\x00\x00\x00\x10\x00\x00\x00'; head -c 1012 /dev/zero; } >shard.bin
                                              # llm.c header (20240520, 1, 16 tokens), no tokens
one_line_error "empty data file" --nproc 2 --data empty.txt
one_line_error "data too short for a window" --nproc 2 --data short.txt --ctx 16
one_line_error "token >= vocab" --nproc 2 --data big.bin
one_line_error "odd-length .bin" --nproc 2 --data odd.bin
one_line_error "llm.c shard shorter than its header says" --nproc 2 --data shard.bin
{ printf '\x88\xd8\x34\x01\x01\x00\x00\x00\x10\x00\x00\x00'; head -c 500 data.txt; } >cut.shard
one_line_error "llm.c shard cut inside its header (was read as text)" $tiny --steps 1 --data cut.shard
grep -q "cut.shard: an llm.c token file's header (magic 20240520) but only 512 bytes" err.txt
report "train_gpt: an llm.c shard shorter than its header is named as such" $? "$(cat err.txt)"
one_line_error "missing data file" --nproc 2 --data no-such-file
one_line_error "unknown flag" --nproc 2 --no-such-flag 1
one_line_error "bad number" --nproc 2 --lr fast
one_line_error "zero layers" --layers 0
one_line_error "dim not a multiple of heads" --dim 32 --heads 3
one_line_error "--save-every without --save" --save-every 5
# a run stopped early with nothing saved threw its steps away; a benchmark's unsynced weights
# (rank 0's alone) were saved, and --resume auto took them for the run's, silently
one_line_error "--stop-after without --save" $tiny --steps 4 --stop-after 2
one_line_error "--bench-no-sync with --save" --nproc 2 $tiny --steps 2 --bench-no-sync --save nosync.st
[ ! -e nosync.st ]
report "train_gpt: --bench-no-sync saves nothing" $? "nosync.st was written"
# and each flag that would go with a save is named as what it refuses (the messages for
# --save-every, --stop-after and --resume auto alone asked for the --save it refuses)
said=""
for f in "--save-every 1" "--stop-after 1" "--resume auto"; do
  "$bin" $tiny --steps 2 --bench-no-sync $f >/dev/null 2>err.txt
  [ "$(cat err.txt)" = "train_gpt: --bench-no-sync trains each rank apart (a benchmark): it saves nothing, so it takes no ${f% 1}" ] ||
    said+="$f: $(cat err.txt); "
done
[ -z "$said" ]
report "train_gpt: --bench-no-sync names each flag of a save it refuses" $? "$said"
one_line_error "flag without a value" --steps
said=""
for f in --data --log --save --resume --trace; do
  "$bin" $f= >/dev/null 2>err.txt
  [ "$(cat err.txt)" = "train_gpt: bad value '' for $f: a file name, not empty" ] || said+="$f: $(cat err.txt); "
done
[ -z "$said" ]
report "train_gpt: an empty file name is refused by its flag" $? "$said"
# a value left out before the next flag: --log --bench-no-sync wrote a log named so and
# dropped the flag (rc 0); --save --steps 10 blamed '10'; --steps --lr said "bad value"
said=""
for f in --data --log --save --resume --trace --prompt --steps; do
  "$bin" $tiny --steps 1 $f --bench-no-sync >/dev/null 2>err.txt
  [ "$(cat err.txt)" = "train_gpt: $f needs a value, not the flag '--bench-no-sync' (a value that starts with --: $f=VALUE)" ] ||
    said+="$f: $(cat err.txt); "
done
[ -z "$said" ] && [ ! -e ./--bench-no-sync ]
report "train_gpt: a flag where a value belongs is named as a value left out" $? "$said"
one_line_error "bad number after =" --nproc 2 --lr=fast
grep -q "bad value 'fast' for --lr:" err.txt
report "train_gpt: --lr=fast names the flag and the value" $? "$(cat err.txt)"
one_line_error "a switch given a value" --bench-no-sync=1
one_line_error "a --prompt byte not below --vocab (was taken modulo it)" $tiny --steps 1 --vocab 128 --prompt "$(printf '\303\251')"
grep -q "^train_gpt: --prompt: its byte 195 (at 0) is not below --vocab 128" err.txt
report "train_gpt: --prompt's byte past --vocab is named before training" $? "$(cat err.txt)"
one_line_error "a text --prompt on token data (its bytes were fed as token ids)" $tiny --steps 1 --data zeros.BIN --prompt "The "
grep -q "^train_gpt: --prompt 'The ': the data is nanoGPT uint16 tokens, so a prompt is token ids" err.txt
report "train_gpt: a text --prompt on token data says a prompt there is token ids" $? "$(cat err.txt)"
# outputs checked before training, each its own file; values that would read as others
one_line_error "--log in a missing directory, before the ranks start" --nproc 3 $tiny --log nodir/l.jsonl
grep -q "^train_gpt: --log nodir/l.jsonl: cannot create files in nodir" err.txt
report "train_gpt: --log's directory is checked at the start" $? "$(cat err.txt)"
one_line_error "--save and --trace one file" $tiny --save same.out --trace same.out
grep -q "^train_gpt: --save and --trace are one file (same.out)" err.txt && [ ! -e same.out ]
report "train_gpt: --save and --trace naming one file are refused, nothing written" $? "$(cat err.txt)"
# two spellings of one file that does not exist yet, and a --log that is the checkpoint
# read (its truncation to the resumed step cut the checkpoint)
for f in --trace --log; do
  rm -f new.st
  one_line_error "--save and $f one new file, spelled two ways" $tiny --save new.st $f ./new.st
  grep -q "^train_gpt: --save and $f are one file (./new.st)" err.txt && [ ! -e new.st ]
  report "train_gpt: --save new.st $f ./new.st is refused, nothing written" $? "$(cat err.txt)"
done
# a --log that is a link to the --save file not yet there: the log would be written there,
# and the save's rename would replace it
rm -f linkto.st && ln -sf linkto.st link.log
one_line_error "--log is a dangling link to the --save file" $tiny --save linkto.st --log link.log
grep -q "^train_gpt: --save and --log are one file (link.log)" err.txt && [ ! -e linkto.st ]
report "train_gpt: a --log linked to the --save file (not yet there) is refused, nothing written" $? "$(cat err.txt)"
cp one.st read.st
# another user's file in a sticky directory (as /tmp): a save (a rename over it) would
# fail after training, so --save, --trace and train_classifier's --out are refused at the
# start; a new name there trains (as root, run as nobody: otherwise skipped)
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null; then
  sticky=$(mktemp -d /tmp/ddp-sticky.XXXXXX) && chmod 1777 "$sticky" &&
    cp "$bin" "$OLDPWD/examples/train_classifier" data.txt "$sticky/" && chmod 755 "$sticky"/train_* &&
    chmod 644 "$sticky/data.txt" && echo old >"$sticky/x.st" && echo old >"$sticky/t.json"
  as_nobody() { (cd "$sticky" && timeout 60 setpriv --reuid=65534 --regid=65534 --clear-groups "$@"); }
  stiny="${tiny/--data data.txt/--data $sticky/data.txt}"
  said=""
  for f in "--save $sticky/x.st" "--trace $sticky/t.json"; do
    out=$(as_nobody ./train_gpt $stiny --steps 2 $f 2>&1); rc=$?
    [ $rc -eq 1 ] && [ "$out" = "train_gpt: ${f% *} ${f#* }: that name is another user's, in a sticky directory (as /tmp): this run could not replace it; give another name" ] || said+="$f: exit $rc '$out'; "
  done
  out=$(as_nobody ./train_classifier --epochs 1 --out "$sticky/x.st" 2>&1); rc=$?
  case $out in "train_classifier: --out $sticky/x.st: that name is another user's"*) [ $rc -ne 0 ] ;; *) false ;; esac || said+="--out: exit $rc '$out'; "
  as_nobody ./train_gpt $stiny --steps 2 --save "$sticky/new.st" >/dev/null 2>&1 && [ -s "$sticky/new.st" ] || said+="a new name did not train; "
  # the name counts, not what a link there points to; a log is written in place, so
  # another user's file that anyone may write takes it
  as_nobody sh -c "echo y >'$sticky/theirs.st' && ln -s '$sticky/x.st' '$sticky/their_link.st'" && ln -s "$sticky/theirs.st" "$sticky/root_link.st"
  out=$(as_nobody ./train_gpt $stiny --steps 2 --save "$sticky/root_link.st" 2>&1); rc=$?
  case $out in *"root_link.st: that name is another user's"*) [ $rc -eq 1 ] ;; *) false ;; esac || said+="root's link: exit $rc '$out'; "
  as_nobody ./train_gpt $stiny --steps 2 --save "$sticky/their_link.st" >/dev/null 2>&1 && [ -s "$sticky/their_link.st" ] &&
    [ ! -L "$sticky/their_link.st" ] || said+="nobody's link was not replaced; "
  echo >"$sticky/shared.jsonl" && chmod 666 "$sticky/shared.jsonl"
  as_nobody ./train_gpt $stiny --steps 2 --log "$sticky/shared.jsonl" >/dev/null 2>&1 && [ "$(grep -c step "$sticky/shared.jsonl")" -eq 2 ] ||
    said+="root's world-writable log was not written; "
  [ -z "$said" ] && [ "$(cat "$sticky/x.st")" = old ]
  report "train_gpt, train_classifier: another user's file in a sticky directory is refused at the start" $? "$said"
  rm -rf "$sticky"
else
  echo "SKIP train_gpt: another user's file in a sticky directory: needs root and setpriv"
fi
one_line_error "--log is the --resume file" $tiny --steps 10 --resume read.st --log read.st
grep -q "^train_gpt: --log and --resume are one file (read.st)" err.txt && cmp -s one.st read.st
report "train_gpt: a --log naming the --resume file is refused, the checkpoint stays" $? "$(cat err.txt)"
one_line_error "--seed other than the --resume file's run" ${tiny% --seed 5} --seed 6 --nproc 2 --batch-size 4 --steps 8 \
  --resume paused.st
grep -q "^train_gpt: --seed 6, but paused.st's run has seed 5, and --resume goes on with its data order" err.txt
report "train_gpt: --seed other than the --resume file's run is refused, named" $? "$(cat err.txt)"
cp data.txt data2.txt
one_line_error "--log is the data" $tiny --data data2.txt --log data2.txt
cmp -s data.txt data2.txt
report "train_gpt: a --log naming the data leaves the data as it was" $? "data2.txt changed"
one_line_error "--resume auto under --nproc with another global batch, before the ranks start" --nproc 3 $tiny \
  --batch-size 4 --steps 8 --save resumed.st --resume auto
grep -q "resumed.st belongs to another run: its global batch .* is 8, this run's is 12" err.txt
report "train_gpt: --resume auto names the global batch under --nproc" $? "$(cat err.txt)"
one_line_error "an empty --save" $tiny --save ''
# a name the file system cannot hold (FILE.tmp past 255 bytes): said before training, not after it
long=$(printf 'a%.0s' $(seq 250)).st
timeout 60 "$bin" $tiny --steps 1 --save "$long" >long.txt 2>err.txt
rc=$?
[ "$rc" -eq 1 ] && [ "$(wc -l <err.txt)" -eq 1 ] && ! grep -q '^step ' long.txt &&
  grep -q "^train_gpt: --save a*.st: the name is too long for the file system there" err.txt
report "train_gpt: a --save name too long for the file system is refused before training" $? \
  "exit $rc, $(grep -c '^step ' long.txt) steps: $(head -c 300 err.txt)"
# OpenMP threads with 128 KiB of stack (musl's default; OMP_STACKSIZE): the attention's
# backward kept 136 KiB of buffers on it
OMP_STACKSIZE=128K OMP_NUM_THREADS=2 timeout 60 "$bin" $tiny --steps 1 --ctx 64 >stack.txt 2>&1
report "train_gpt: trains on threads of 128 KiB of stack" $? "$(tail -c 300 stack.txt | tr '\n' ' ')"
(ulimit -f 20; one_line_error "a checkpoint past ulimit -f (SIGXFSZ killed the run)" $tiny --steps 1 --save big.st
 exit $fail) || fail=1
[ ! -e big.st.tmp ] && [ ! -e big.st ]
report "train_gpt: a save past ulimit -f leaves no file" $? "$(ls big.st* 2>&1)"
one_line_error "an empty --trace=" $tiny --trace=
one_line_error "a --seed with a space and a sign" $tiny --seed ' -1'
# the learning rate reaches --lr within the run: a short run's default warmup is --steps - 1
# (--steps 3 trained at 3/40 of --lr), and a --warmup as long as the run is refused
one_line_error "--warmup as long as --steps" $tiny --steps 3 --warmup 3
grep -qx "train_gpt: --warmup 3 is not shorter than --steps 3: the learning rate would never reach --lr" err.txt
report "train_gpt: a --warmup as long as the run is refused, named" $? "$(cat err.txt)"
timeout 60 "$bin" $tiny --steps 3 --lr 0.002 >short.txt 2>&1
[ "$(grep '^step ' short.txt | sed 's/.*| lr \([^ ]*\) .*/\1/' | tr '\n' ' ')" = "1.00e-03 2.00e-03 2.00e-04 " ]
report "train_gpt --steps 3: the default warmup reaches --lr, then the cosine" $? "$(grep '^step ' short.txt | tr '\n' '|')"
one_line_error "a --clip that is 0 in fp32" $tiny --clip 1e-50
grep -qx "train_gpt: bad value '1e-50' for --clip: a number from 0 to 1e9, not so near 0 that fp32 rounds it to 0" err.txt
report "train_gpt: a --clip that is 0 in fp32 is said to be" $? "$(cat err.txt)"
one_line_error "a --clip that is 0 in double too (underflow)" $tiny --clip 1e-400
grep -qx "train_gpt: bad value '1e-400' for --clip: a number from 0 to 1e9, not so near 0 that fp32 rounds it to 0" err.txt
report "train_gpt: a --clip that underflows is refused, not taken for 0" $? "$(cat err.txt)"
one_line_error "--compare with one file too many" --compare one.st one.st opt.m. extra
one_line_error "resume with another model shape" --nproc 2 $tiny --dim 64 --resume one.st
one_line_error "resume from a truncated checkpoint" --nproc 2 $tiny --resume truncated.st
one_line_error "compare with a missing file" --compare one.st nothing.st
mkdir datadir && mkfifo fifo
# ranks that do not fit the machine's memory: refused at the start, not killed later
# (65536 sequences of 1024 tokens each: terabytes of activations)
python3 -c "import sys; d=open('data.txt','rb').read(); sys.stdout.buffer.write((d * (1200000 // len(d) + 1))[:1200000])" >mega.txt
one_line_error "ranks past the machine's memory (refused at the start)" --nproc 2 --data mega.txt --stride 1 --batch-size 65536 --ctx 1024 --steps 1
grep -q 'more than the .* GiB this machine has free' err.txt
report "train_gpt: ranks that need more memory than the machine has free are refused, saying how much" $? "$(cat err.txt)"
one_line_error "--data is a directory" --nproc 2 --data datadir
grep -q 'is a directory' err.txt
report "train_gpt: --data DIR says it is a directory" $? "$(cat err.txt)"
one_line_error "--data is a FIFO (refused, no hang)" --nproc 2 --data fifo
grep -q 'pipe' err.txt
report "train_gpt: --data FIFO says it is a pipe" $? "$(cat err.txt)"
one_line_error "--save in a missing directory (at the start)" --nproc 2 $tiny --steps 2 --save no/such/dir/x.st
one_line_error "--save is a directory" --nproc 2 $tiny --steps 2 --save datadir
# an output there already that is not a regular file: a save's rename would put a file in
# the place of a device or a FIFO, and a --log opened on a FIFO waits for a reader forever
for f in --save --log --trace; do
  rm -f out.fifo null.out && mkfifo out.fifo && ln -s /dev/null null.out
  one_line_error "$f is a FIFO (refused, no hang)" $tiny --steps 1 $f out.fifo
  [ -p out.fifo ] && grep -q "^train_gpt: $f out.fifo is a pipe, not a regular file" err.txt
  report "train_gpt: $f FIFO is refused before training, the FIFO stays" $? "$(cat err.txt)"
  one_line_error "$f is a device" $tiny --steps 1 $f null.out
  [ -L null.out ] && grep -q "^train_gpt: $f null.out is a device or socket, not a regular file" err.txt
  report "train_gpt: $f naming a device is refused, the device stays" $? "$(cat err.txt)"
done
one_line_error "--dtype bf16 on the CPU (the GPU path's)" --nproc 2 $tiny --steps 2 --dtype bf16
grep -q 'for the GPU path' err.txt
report "train_gpt: --dtype bf16 on the CPU says it is for the GPU path" $? "$(cat err.txt)"
one_line_error "--allreduce bf16 on the CPU (the GPU path's)" $tiny --steps 2 --allreduce bf16
one_line_error "--dtype neither fp32 nor bf16" --dtype half
one_line_error "--trace in a missing directory (at the start)" --nproc 2 $tiny --steps 2 --trace no/such/dir/t.json
header='{"x":{"dtype":"F32","shape":[5,922337203685477581],"data_offsets":[0,4]}}'  # 5 x 922337203685477581
{ printf "\\x$(printf %02x ${#header})\\0\\0\\0\\0\\0\\0\\0%s" "$header"; head -c 4 /dev/zero; } >overflow.st  # x 4 bytes wraps to 4
one_line_error "--compare a shape whose size overflows" --compare overflow.st overflow.st
grep -q 'overflows' err.txt
report "train_gpt --compare says the shape's size overflows" $? "$(cat err.txt)"
one_line_error "--resume a shape whose size overflows" $tiny --resume overflow.st
header='{"w":{"dtype":"I32","shape":[1,2],"dtype":"F32","shape":[2],"data_offsets":[0,8]}}   '  # (padded to 88)
{ printf "\\x$(printf %02x ${#header})\\0\\0\\0\\0\\0\\0\\0%s" "$header"; head -c 8 /dev/zero; } >fieldtwice.st
one_line_error "--compare a tensor with a field twice (the last counted)" --compare fieldtwice.st fieldtwice.st
grep -q "tensor w has 'dtype' twice" err.txt
report "train_gpt --compare names a tensor's field given twice" $? "$(cat err.txt)"
# a header past the reference's 100 MB (its tokens took 16 times its size): refused by its length
printf '\x01\xe1\xf5\x05\0\0\0\0{}' >bighead.st && truncate -s 100000009 bighead.st  # 100000001 bytes of header
one_line_error "--compare a header past 100 MB" --compare bighead.st bighead.st
grep -q "bighead.st: a safetensors header of 100000001 bytes, past the 100000000 the format allows" err.txt
report "train_gpt --compare refuses a header past 100 MB by its length" $? "$(cat err.txt)"
# a large file that is no checkpoint: refused by its first 8 bytes, without reading it all
# (under 1 GB of address space: the whole file in memory was "out of memory")
truncate -s 3G sparse.st
(ulimit -v 1000000; timeout 20 "$bin" --compare sparse.st sparse.st >/dev/null 2>err.txt)
rc=$?
rm -f sparse.st
[ "$rc" -eq 1 ] && [ "$(cat err.txt)" = "train_gpt: sparse.st: not a safetensors file (truncated or bad header length)" ]
report "train_gpt --compare refuses 3 GB of something else by its length, not after reading it" $? "exit $rc: $(cat err.txt)"
# files other readers take differently, or that hold what training never writes
python3 - one.st <<'EOF' >mutate.txt 2>&1
import re, struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
head, data = raw[8:8 + n].decode().rstrip(), raw[8 + n:]
head = re.sub(r'"safetensors\.h checksum":"[0-9a-f]{16}",', '', head, count=1)  # (the edits below would be refused by it first)
def write(name, text, body=data):
    b = text.encode()
    b += b" " * (-len(b) % 8)
    open(name, "wb").write(struct.pack("<Q", len(b)) + b + body)
m = re.search(r'"wte\.weight":\{[^}]*"data_offsets":\[(\d+),(\d+)\]\}', head)
lo, hi = int(m.group(1)), int(m.group(2))
again = '"wte.weight":{"dtype":"F32","shape":%s,"data_offsets":[%d,%d]}' % (
    re.search(r'"shape":(\[[^]]*\])', m.group(0)).group(1), len(data), len(data) + hi - lo)
write("twice.st", head[:-1] + "," + again + "}", data + data[lo:hi])         # a tensor named twice
write("twokeys.st", head.replace('"__metadata__":{', '"__metadata__":{"step":"1",', 1))  # a key twice
write("twoempty.st", head.replace('"__metadata__":{', '"__metadata__":{"step":"",', 1))  # the first one empty
write("twometa.st", head[:-1] + ',"__metadata__":{"format":"pt"}}')         # two __metadata__
write("bigseed.st", re.sub(r'"seed":"\d+"', '"seed":"99999999999999999999"', head))
write("zeros.st", re.sub(r'"shape":\[(\d)', r'"shape":[0\1', head, count=1))  # JSON has no 08
write("escaped.st", head.replace('"wte.weight"', '"wte\\u002eweight"', 1))
write("longmeta.st", head.replace('"__metadata__":{', '"__metadata__":{"note":"' + 'x' * 128 + '",', 1))
v = re.search(r'"opt\.v\.wte\.weight":\{[^}]*"data_offsets":\[(\d+),', head)
at = int(v.group(1))
write("negv.st", head, data[:at] + struct.pack("<4f", -1, -1, -1, -1) + data[at + 16:])
m = re.search(r'"opt\.m\.wpe\.weight":\{[^}]*"data_offsets":\[(\d+),', head)
at = int(m.group(1))  # a first moment near FLT_MAX: the next update makes weights infinite
write("hugem.st", head, data[:at] + struct.pack("<4f", 3e38, 3e38, 3e38, 3e38) + data[at + 16:])
EOF
report "train_gpt: malformed checkpoints made" $? "$(head -c 300 mutate.txt)"
for f in twice.st twokeys.st twoempty.st twometa.st; do
  one_line_error "a checkpoint with a name twice ($f)" $tiny --resume $f
  grep -q 'twice\|two __metadata__\|each key once' err.txt
  report "train_gpt: $f is refused as ambiguous" $? "$(cat err.txt)"
  one_line_error "--compare with a name twice ($f)" --compare $f one.st
done
one_line_error "a checkpoint's seed past 2^64" $tiny --resume bigseed.st
one_line_error "a checkpoint's shape with a leading zero" $tiny --resume zeros.st
one_line_error "a checkpoint's name with a \\u escape" $tiny --resume escaped.st
grep -q 'a name with an escape' err.txt
report "train_gpt: an escaped name is named as such (not 'longer than 95 bytes')" $? "$(cat err.txt)"
# a metadata value of 128 bytes is valid safetensors past this reader's limits: said so, not "corrupt"
one_line_error "a metadata value of 128 bytes" $tiny --resume longmeta.st
grep -q "longmeta.st: unsupported safetensors header: __metadata__ has a value of 128 bytes or more.*: past this reader's limits" err.txt
report "train_gpt: a metadata value past the reader's limit is unsupported, not corrupt" $? "$(cat err.txt)"
# valid files of other writers: 8-bit floats and 9 dimensions are past the reader's limits
# (they were "corrupt"); a tensor's extra key and a null __metadata__ are taken, as the
# format's own reader takes them; --compare of finite F64 values near DBL_MAX is 2, not inf
python3 - <<'EOF2'
import struct
def w(name, hdr, data):
    h = hdr.encode(); open(name, 'wb').write(struct.pack('<Q', len(h)) + h + data)
w('f8.st', '{"a":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}}', bytes(2))
w('dims9.st', '{"a":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,2],"data_offsets":[0,8]}}', bytes(8))
w('extra.st', '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":[1,{"y":2}]}}', struct.pack('<2f', 1, 2))
w('metanull.st', '{"__metadata__":null,"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', struct.pack('<2f', 1, 2))
w('escdup.st', '{"a":{"dtype":"F32","dt\\u0079pe":"F16","shape":[2],"data_offsets":[0,8]}}', bytes(8))
w('big1.st', '{"a":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}}', struct.pack('<d', 1e308))
w('big2.st', '{"a":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}}', struct.pack('<d', -1e308))
# JSON that is not (the safetensors library refuses each), in a key the reader skips; and JSON
# that is, and past this reader's nesting
for n, v in enumerate(['1-2', '-', '007', '1e', '1.', '.5', '"\\q"', '"\\u12"', '"\\\xff"', '"\\\x01"']):
    w('badjson%d.st' % n, '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":%s}}' % v, struct.pack('<2f', 1, 2))
w('goodjson.st', '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":[0,-0,1.5e+10,-2E-3,0.25,"\\u00e9\\n\\/"]}}',
  struct.pack('<2f', 1, 2))
w('deep.st', '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":%s}}' % ('[' * 70 + ']' * 70), struct.pack('<2f', 1, 2))
EOF2
bad=""
for n in 0 1 2 3 4 5 6 7 8 9; do
  out=$(timeout 20 "$bin" --compare badjson$n.st badjson$n.st 2>&1)
  [ $? -eq 1 ] && [ "$out" = "train_gpt: badjson$n.st: corrupt safetensors header (not a JSON object)" ] || bad+=" $n: $out"
done
[ -z "$bad" ]
report "train_gpt: a header that is not JSON (a bad number or escape where the reader looks no further) is corrupt" $? "$bad"
out=$(timeout 20 "$bin" --compare goodjson.st goodjson.st 2>&1)
[ $? -eq 0 ] && [ "$out" = "max_rel_diff 0.000e+00 over 1 tensors" ]
report "train_gpt: JSON's numbers and escapes, each form, are read" $? "$out"
one_line_error "--compare of a header nested 70 deep" --compare deep.st deep.st
grep -q "^train_gpt: deep.st: unsupported safetensors header: nested more than 64 deep: past this reader's limits" err.txt
report "train_gpt: JSON nested past the reader's limit is unsupported, not corrupt" $? "$(cat err.txt)"
for f in f8 dims9; do
  one_line_error "--compare of a valid file past the reader's limits ($f)" --compare $f.st $f.st
  grep -q "^train_gpt: $f.st: unsupported safetensors header: .*past this reader's limits" err.txt
  report "train_gpt: $f.st is unsupported, not corrupt" $? "$(cat err.txt)"
done
one_line_error "a tensor's key escaped (dtype twice, as other readers read it)" --compare escdup.st escdup.st
grep -q "escdup.st: corrupt safetensors header: tensor a has a key with an escape" err.txt
report "train_gpt: an escaped key is refused, not taken for an unknown one" $? "$(cat err.txt)"
for f in extra metanull; do
  out=$(timeout 20 "$bin" --compare $f.st $f.st 2>&1)
  [ $? -eq 0 ] && [ "$out" = "max_rel_diff 0.000e+00 over 1 tensors" ]
  report "train_gpt: $f.st is read as the format's own reader reads it" $? "$out"
done
out=$(timeout 20 "$bin" --compare big1.st big2.st 2>&1)
[ $? -eq 0 ] && [ "$out" = "max_rel_diff 2.000e+00 over 1 tensors, worst a" ]
report "train_gpt: --compare of 1e308 and -1e308 is 2" $? "$out"
one_line_error "a negative Adam second moment" $tiny --resume negv.st --save negv_out.st --steps 9
grep -q "opt.v.wte.weight holds -1 at element 0 (Adam's second moment is never negative)" err.txt && [ ! -e negv_out.st ]
report "train_gpt: a negative second moment is refused, nothing saved" $? "$(cat err.txt)"
cp one.st kept.st
timeout 60 "$bin" --nproc 2 $tiny --batch-size 4 --val-every 0 --resume hugem.st --save kept.st --steps 9 >/dev/null 2>err.txt
[ $? -eq 1 ] && [ "$(grep -c "step 9: a weight is -\?inf after the update: training diverged, kept.st not written" err.txt)" -eq 1 ] &&
  cmp -s one.st kept.st
report "train_gpt: weights that are not finite are not saved over the last good checkpoint" $? "$(cat err.txt)"
# a FILE.tmp left as a link to another file: the save writes a fresh file beside it (and
# leaves the link: not its own), the other stays
echo keep >victim.txt && ln -sf victim.txt linked.st.tmp && ln -sf victim.txt linked.json.tmp
run linked --nproc 2 --batch-size 4 --steps 1 --save linked.st --trace linked.json
[ "$(cat victim.txt)" = keep ] && [ -f linked.st ] && [ ! -L linked.st ] && [ -L linked.st.tmp ] &&
  [ -f linked.json ] && [ ! -L linked.json ] && [ -L linked.json.tmp ] && [ -z "$(ls linked.st.tmp.* 2>/dev/null)" ] &&
  [ -z "$(ls linked.json.tmp.* 2>/dev/null)" ]
report "train_gpt --save, --trace: a link at FILE.tmp is not followed" $? "victim: $(head -c 40 victim.txt | tr '\n' ' '), $(ls -l linked.* | tr '\n' ' ')"
# a file at FILE.tmp is someone's (here the data itself): the save never removes it
cp data.txt mine.st.tmp
run tmpdata --steps 1 --save mine.st --data mine.st.tmp
cmp -s data.txt mine.st.tmp && "$bin" --compare mine.st mine.st >/dev/null && [ -z "$(ls mine.st.tmp.* 2>/dev/null)" ]
report "train_gpt --save FILE: a file at FILE.tmp (the data) is left as it was" $? "$(ls -l mine.st* | tr '\n' ' ')"
# the same for ddp_trace_save's own FILE.tmp (it removed whatever was there)
cp data.txt mine.json.tmp
run tmptrace --nproc 2 --batch-size 4 --steps 1 --trace mine.json --data mine.json.tmp
cmp -s data.txt mine.json.tmp && [ -s mine.json ] && [ -z "$(ls mine.json.tmp.* 2>/dev/null)" ]
report "train_gpt --trace FILE: a file at FILE.tmp (the data) is left as it was" $? "$(ls -l mine.json* | tr '\n' ' ')"
# a save killed while it writes (SIGKILL: a crash, the OOM killer, a job ended) leaves no
# FILE.tmp*, which no later save would remove (never a name it did not make): 20 kills left
# 6-8 checkpoint-sized files. The run is stopped (SIGSTOP) while it holds the new file open
# and that file is shorter than a whole checkpoint (by name FILE.tmp*, or unnamed: DIR/#inode),
# then killed; the next run resumes from the last whole checkpoint and saves
mkdir killed && kdir=$(cd killed && pwd -P)
if ! python3 -c 'import os, sys; os.close(os.open(sys.argv[1], os.O_TMPFILE | os.O_WRONLY))' killed 2>/dev/null; then
  echo "SKIP train_gpt --save: a save killed mid-write leaves no FILE.tmp: this file system has no O_TMPFILE (a killed save may leave FILE.tmp*)"
else
kargs="--layers 2 --heads 2 --dim 256 --ctx 16 --data data.txt --batch-size 2 --steps 40 --val-every 0 --sample-len 0
  --save killed/ck.st --save-every 1 --resume auto"
OMP_NUM_THREADS=1 "$bin" $kargs >killed.txt 2>&1 &
pid=$! held="" tries=0
for poll in $(seq 20000); do
  kill -0 "$pid" 2>/dev/null || break # the run ended before
  [ -e killed/ck.st ] || { sleep 0.01; continue; } # after the first save (and the start's probe of the name)
  fd=$(find "/proc/$pid/fd" \( -lname "$kdir/ck.st.tmp*" -o -lname "$kdir/#*" \) 2>/dev/null | head -n 1)
  [ -n "$fd" ] || continue
  kill -STOP "$pid"
  tries=$((tries + 1))
  for w in $(seq 1000); do [ "$(awk '{ print $3 }' "/proc/$pid/stat" 2>/dev/null)" = T ] && break; done
  size=$(stat -L -c %s "$fd" 2>/dev/null || echo none)
  case $size in none) ;; *) [ "$size" -lt "$(stat -c %s killed/ck.st)" ] && { held=$size; break; } ;; esac
  kill -CONT "$pid" # closed, or whole (being named): the next save
done
kill -KILL "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
left=$(ls killed | grep -c '\.tmp')
OMP_NUM_THREADS=1 timeout 120 "$bin" $kargs >killed2.txt 2>&1
rc=$?
[ -n "$held" ] && [ "$left" -eq 0 ] && [ "$rc" -eq 0 ] && grep -q '^resum' killed2.txt && [ -z "$(ls killed | grep '\.tmp')" ] &&
  "$bin" --compare killed/ck.st killed/ck.st >/dev/null
report "train_gpt --save: a save killed mid-write leaves no FILE.tmp, the next run saves" $? \
  "stopped at ${held:-no save caught in $tries tries} bytes, $left left, next run exit $rc: $(ls -l killed | tr '\n' ' ')"
fi
# the default data (next to the program) a FIFO: refused at once, no wait for a writer
mkdir alone && cp "$bin" alone/train_gpt && mkfifo alone/train_gpt.txt
(cd alone && timeout 10 ./train_gpt --steps 1 >/dev/null 2>../err.txt)
rc=$?
[ "$rc" -eq 1 ] && [ "$(wc -l <err.txt)" -eq 1 ] && grep -q 'pipe' err.txt
report "train_gpt without --data: a FIFO in the story's place is refused, no hang" $? "exit $rc: $(head -c 300 err.txt)"
# the default data beside the program when the shell found it on PATH (argv[0] is a bare name)
mkdir onpath elsewhere && cp "$bin" onpath/train_gpt && head -c 3000 data.txt >onpath/train_gpt.txt
(cd elsewhere && PATH="$OLDPWD/onpath:$PATH" timeout 30 train_gpt --layers 1 --heads 1 --dim 16 --ctx 8 --steps 1 \
  --sample-len 0 >../onpath.txt 2>&1)
rc=$?
[ "$rc" -eq 0 ] && grep -q "^data: $PWD/onpath/train_gpt.txt: 3000 tokens" onpath.txt
report "train_gpt on PATH without --data: the story beside the program" $? "exit $rc: $(head -c 300 onpath.txt)"
# --compare of two files that differ names the worst tensor (from a copy: it was read from freed memory)
out=$("$bin" --compare one.st linked.st 2>&1)
case $out in "max_rel_diff "*" over 84 tensors, worst "[a-z]*.*) true ;; *) false ;; esac
report "train_gpt --compare of files that differ names the worst tensor" $? "$out"

# two ranks started by hand (each node's own command line), rank 0's flags then rank 1's:
# both must stop, exit 1, and say "ranks disagree on" what (stderr in NAME0.txt, NAME1.txt)
port=$(free_port)
by_hand() { # name flags0 flags1 what
  local r pids="" rc0 rc1 flags
  for r in 0 1; do
    flags=$2; [ $r = 1 ] && flags=$3
    RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port DDP_TIMEOUT=30 timeout 60 "$bin" $tiny --steps 2 \
      $flags >/dev/null 2>"$1$r.txt" &
    pids="$pids $!"
  done
  set -- "$@" $pids
  wait "$5"; rc0=$?; wait "$6"; rc1=$?
  [ "$rc0" = 1 ] && [ "$rc1" = 1 ] && grep -q "ranks disagree on $4" "${1}0.txt" && grep -q "ranks disagree on $4" "${1}1.txt"
}
# another --lr: named with both values, instead of training apart
by_hand lr "--lr 0.001" "--lr 0.002" "--lr: rank 1 has 0.002, rank 0 has 0.001"
report "train_gpt: ranks started with another --lr stop and name it" $? "$(cat lr0.txt lr1.txt | tr '\n' '|')"
# --save on one rank only (only rank 0 saves): the run ended with no file and exit 0
by_hand sv "" "--save onlyone.st" "--save (rank 0 saves), --save-every"
report "train_gpt: ranks started with --save on one of them stop and name it" $? "$(cat sv0.txt sv1.txt | tr '\n' '|')"
# --val-every (it changes the collectives a step calls: they met in a mismatch that named no flag)
by_hand ve "--val-every 2" "--val-every 3" "--val-every, the last step (--stop-after), --trace (rank 0 writes it), --bench-no-sync: rank 1 has 3,"
report "train_gpt: ranks started with another --val-every stop and name it" $? "$(cat ve0.txt ve1.txt | tr '\n' '|')"
# --resume from two checkpoints of one step (each host its own copy, one of another run): each
# rank would keep its own file's AdamW moments and train apart; named instead
"$bin" $tiny --steps 2 --stop-after 1 --save ckA.st >/dev/null 2>&1 &&
  "$bin" $tiny --steps 2 --stop-after 1 --lr 0.002 --save ckB.st >/dev/null 2>&1
by_hand rs "--resume ckA.st" "--resume ckB.st" \
  "--resume's checkpoint (a hash of its weights and AdamW moments): rank 1 has [0-9a-f]\{16\}, rank 0 has [0-9a-f]\{16\}$"
report "train_gpt: ranks resumed from different checkpoints of one step stop and name it" $? "$(cat rs0.txt rs1.txt | tr '\n' '|')"
# --resume auto where only rank 1's host holds a file, of another run: rank 1 says so in its
# words, and every rank stops at once (it refused before joining, the others waited DDP_TIMEOUT)
cp ckB.st ckB2.st
start=$(date +%s)
for r in 0 1; do
  f=nofile.st; [ $r = 1 ] && f=ckB2.st
  RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port DDP_TIMEOUT=30 timeout 60 "$bin" $tiny --steps 2 \
    --resume auto --save $f >/dev/null 2>"ra$r.txt" &
done
wait %1; rc0=$?; wait %2; rc1=$?
[ "$rc0" = 1 ] && [ "$rc1" = 1 ] && [ $(($(date +%s) - start)) -lt 20 ] &&
  grep -q '^train_gpt: rank 1: ckB2.st belongs to another run: its .* is ' ra1.txt && [ ! -s ra0.txt ] && [ ! -e nofile.st ]
report "train_gpt: --resume auto's file of another run on rank 1 only: rank 1 says why, all stop at once" $? \
  "exit $rc0 $rc1 after $(($(date +%s) - start)) s: $(cat ra0.txt ra1.txt | tr '\n' '|')"

# ---- bad checkpoints, diverged runs ------------------------------------------------------
if command -v python3 >/dev/null; then
  edit_st() { # in out action: a copy of a checkpoint with one thing changed
    python3 - "$@" <<'EOF'
import json, struct, sys
src, dst, action = sys.argv[1:4]
b = open(src, 'rb').read()
n = struct.unpack('<Q', b[:8])[0]
h, data = json.loads(b[8:8 + n]), bytearray(b[8 + n:])
h['__metadata__'].pop('safetensors.h checksum')  # (train_gpt's own: the edits below would be refused by it first)
def put(name, i, v):
    off = h[name]['data_offsets'][0] + 4 * i
    data[off:off + 4] = struct.pack('<f', v)
if action == 'transpose': h['h.0.mlp.c_fc.weight']['shape'].reverse()   # same size, other shape
elif action == 'nan': put('h.0.ln_1.bias', 3, float('nan'))
elif action == 'inf': put('h.0.ln_1.bias', 3, float('inf'))
elif action == 'huge':                      # finite, but the logits (ln_f output . wte) overflow to inf
    for name in ('wte.weight', 'ln_f.bias'):
        begin, end = h[name]['data_offsets']
        for i in range((end - begin) // 4): put(name, i, 1e30)
elif action.startswith('step='): h['__metadata__']['step'] = action[5:]
elif action == 'overlap':                   # wpe.weight's offsets on wte.weight's first bytes
    begin, end = h['wpe.weight']['data_offsets']
    start = h['wte.weight']['data_offsets'][0]
    h['wpe.weight']['data_offsets'] = [start, start + end - begin]
elif action == 'trailing': data += bytes(8)  # bytes after the last tensor
elif action == 'ctlname': h['h.0.ln_1.bias\nx'] = h.pop('h.0.ln_1.bias')  # a name with an escaped newline
hs = json.dumps(h, separators=(',', ':')).encode()
if action == 'rawctl': hs = hs.replace(b'ln_1.bias', b'ln_1\n.bias', 1)  # a raw newline in a string: not JSON
hs += b' ' * (-len(hs) % 8)
open(dst, 'wb').write(struct.pack('<Q', len(hs)) + hs + bytes(data))
EOF
  }
  for a in transpose nan inf huge step=-5 step=12 overlap trailing ctlname rawctl; do edit_st two.st "${a/=/}.st" "$a"; done
  # a checkpoint changed after it was written (a bit flipped in a weight, its step edited):
  # refused by its checksum (it trained on from a weight of 3.5e36, or skipped steps, exit
  # 0); a bit flipped in the checksum's key would turn the check off: refused as well
  python3 - two.st <<'EOF'
import sys
b = bytearray(open(sys.argv[1], 'rb').read())
f = bytearray(b); f[-100] ^= 0x40; open('flipped.st', 'wb').write(f)
k = bytearray(b); k[k.index(b'"safetensors.h checksum"') + 3] ^= 0x20; open('keyflip.st', 'wb').write(k)
k = bytearray(b); k[k.index(b'"safetensors.h checksum"') + 3] ^= 0x21; open('keyflip2.st', 'wb').write(k)
i = b.index(b'"step":"') + 8; b[i] = ord('1') if b[i] != ord('1') else ord('2'); open('edited.st', 'wb').write(b)
EOF
  for f in flipped.st edited.st; do
    one_line_error "--resume a checkpoint changed after it was written ($f)" $tiny --steps 10 --resume $f
    grep -q "^train_gpt: $f: checksum mismatch ([0-9a-f]\{16\} in the file, [0-9a-f]\{16\} of its bytes)" err.txt
    report "train_gpt --resume: $f is refused by its checksum" $? "$(cat err.txt)"
  done
  one_line_error "--resume a checkpoint whose checksum key has a bit flipped" $tiny --steps 10 --resume keyflip.st
  grep -q "^train_gpt: keyflip.st: corrupt safetensors header: the metadata key 'saFetensors.h checksum' is a few bytes from" err.txt
  report "train_gpt --resume: a flip in the checksum's key is refused, not read unchecked" $? "$(cat err.txt)"
  one_line_error "--resume a checkpoint whose checksum key has two bits flipped" $tiny --steps 10 --resume keyflip2.st
  grep -q "^train_gpt: keyflip2.st: corrupt safetensors header: the metadata key 'saGetensors.h checksum' is a few bytes from" err.txt
  report "train_gpt --resume: two flips in the checksum's key are refused, not read unchecked" $? "$(cat err.txt)"
  one_line_error "--resume a transposed tensor" $tiny --steps 10 --resume transpose.st
  grep -q '32, 128' err.txt
  report "train_gpt --resume names the transposed tensor's shape" $? "$(cat err.txt)"
  one_line_error "--resume NaN weights" $tiny --steps 10 --resume nan.st
  # what the safetensors library refuses: tensors that share bytes, bytes after the last
  one_line_error "--resume overlapping tensors" $tiny --steps 10 --resume overlap.st
  grep -q 'overlap another tensor' err.txt
  report "train_gpt --resume says the tensors overlap" $? "$(cat err.txt)"
  one_line_error "--resume bytes after the last tensor" $tiny --steps 10 --resume trailing.st
  # text from the file goes into the message: its control characters would break the line
  one_line_error "--resume a name holding an escaped newline" $tiny --steps 10 --resume ctlname.st
  one_line_error "--resume a header holding a raw newline" $tiny --steps 10 --resume rawctl.st
  one_line_error "--compare a name holding an escaped newline" --compare ctlname.st two.st
  if python3 -c 'import safetensors.numpy' 2>/dev/null; then
    python3 -c 'import sys, safetensors.numpy as st
for f in sys.argv[1:]:
    try: st.load_file(f)
    except Exception: continue
    sys.exit(f + " loads")' overlap.st trailing.st >err.txt 2>&1
    report "the safetensors library refuses them too" $? "$(cat err.txt)"
  fi
  one_line_error "--resume infinite weights" $tiny --steps 10 --resume inf.st
  one_line_error "--resume a negative step" $tiny --steps 10 --resume step-5.st
  grep -q "step '-5'" err.txt
  report "train_gpt --resume names the bad step" $? "$(cat err.txt)"
  one_line_error "--resume past --steps" $tiny --steps 10 --resume step12.st
  grep -q 'after step 12, past --steps 10' err.txt
  report "train_gpt --resume past --steps says so with the right numbers" $? "$(cat err.txt)"
  out=$(timeout 20 "$bin" $tiny --batch-size 4 --steps 8 --resume two.st 2>&1)
  rc=$?
  [ "$rc" -eq 0 ] && [ "$out" = "train_gpt: nothing to train: two.st was written after step 8, and this run ends at step 8" ]
  report "train_gpt --resume at --steps: nothing to train, exit 0" $? "exit $rc: $out"
  for a in nan inf; do
    out=$("$bin" --compare two.st "$a.st" 2>/dev/null); rc=$?
    [ "$rc" -eq 1 ] && case $out in "max_rel_diff inf "*"not finite"*) true ;; *) false ;; esac
    report "train_gpt --compare: $a in the second file is a difference" $? "exit $rc: $out"
    out=$("$bin" --compare "$a.st" "$a.st" 2>/dev/null); rc=$?
    [ "$rc" -eq 1 ] && case $out in "max_rel_diff inf "*) true ;; *) false ;; esac
    report "train_gpt --compare: $a in both files is a difference" $? "exit $rc: $out"
  done
  one_line_error "a diverged run (NaN loss) fails" $tiny --batch-size 8 --steps 10 --resume huge.st
  grep -q '^train_gpt: step 9: the .* is -\?nan' err.txt
  report "train_gpt: a diverged run names the step" $? "$(cat err.txt)"
  timeout 30 "$bin" --nproc 2 $tiny --batch-size 4 --steps 10 --resume huge.st >/dev/null 2>err.txt
  rc=$?
  [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$(grep -c '^train_gpt: step 9: ' err.txt)" -eq 1 ]
  report "train_gpt: a diverged run on 2 ranks fails, named once" $? "exit $rc: $(tr '\n' '|' <err.txt)"
else
  echo "SKIP train_gpt bad checkpoints and diverged runs: python3 not installed (it crafts the files)"
fi
# examples/safetensors.h's writer, as other programs call it: a header with the 32 metadata
# keys the reader takes (the checksum made a 33rd, and the reader refused the file it had
# just written), one st_text written twice (the second write refused the checksum the first
# had put in it), __metadata__ first with JSON's white space around it (refused as not first);
# a header st_read refuses (a second __metadata__, offsets past the arrays) is not written
cat >stw.c <<'EOF'
#include "safetensors.h"
#include <stdio.h>
static int wr(const char *path, st_text *h, const float *x)
{
    char err[600];
    const void *arr[1] = {x};
    size_t b[1] = {8};
    st_file f;
    int ok = st_write_file(path, h, arr, b, 1, err, sizeof err) && st_read(&f, path, err, sizeof err);
    if (!ok) printf("%s: %s\n", path, err);
    else {
        ok = f.n == 1 && memcmp(f.t[0].data, x, 8) == 0;
        if (!ok) printf("%s: read back otherwise\n", path);
        st_free(&f);
    }
    return ok;
}
int main(void)
{
    static const char x1[] = "\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    float x[2] = {1, 2};
    char err[600];
    const void *arr[1] = {x};
    size_t b[1] = {8};
    st_text h;
    int ok = 1, i;
    memset(&h, 0, sizeof h);
    st_put(&h, "{\"__metadata__\":{");
    for (i = 0; i < 32; i++) st_put(&h, "%s\"k%d\":\"v\"", i ? "," : "", i);
    st_put(&h, "},%s", x1);
    ok &= wr("keys32.st", &h, x);
    free(h.s);
    memset(&h, 0, sizeof h);
    st_put(&h, "{\"__metadata__\":{\"a\":\"b\"},%s", x1);
    ok &= wr("once.st", &h, x) && wr("twice.st", &h, x);
    free(h.s);
    memset(&h, 0, sizeof h);
    st_put(&h, "{ \"__metadata__\" :\n {\"a\":\"b\"},%s", x1);
    ok &= wr("spaced.st", &h, x);
    free(h.s);
    memset(&h, 0, sizeof h);
    st_put(&h, "{%s", x1); /* no __metadata__: made for the checksum */
    ok &= wr("nometa.st", &h, x);
    free(h.s);
    memset(&h, 0, sizeof h); /* __metadata__ not first: refused, in one line */
    st_put(&h, "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"__metadata__\":{}}");
    if (st_write_file("last.st", &h, arr, b, 1, err, sizeof err) || !strstr(err, "wants __metadata__ first"))
        ok = 0, printf("last.st: %s\n", err);
    free(h.s);
    memset(&h, 0, sizeof h); /* what st_read refuses is not written: it was, and the load failed */
    st_put(&h, "{\"__metadata__\":{\"a\":\"b\"}, \"__metadata__\":{},%s", x1);
    if (st_write_file("two.st", &h, arr, b, 1, err, sizeof err) ||
        !strstr(err, "two.st: a header st_read would refuse: two __metadata__ objects"))
        ok = 0, printf("two.st: %s\n", err);
    free(h.s);
    memset(&h, 0, sizeof h);
    st_put(&h, "{\"x\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]}}");
    if (st_write_file("short.st", &h, arr, b, 1, err, sizeof err) || !strstr(err, "a header st_read would refuse: tensor x"))
        ok = 0, printf("short.st: %s\n", err);
    free(h.s);
    return ok ? 0 : 1;
}
EOF
if cc -std=c99 -Wall -Wextra -Werror -I"$OLDPWD/examples" stw.c -o stw 2>stw.txt; then
  ./stw >stw.txt 2>&1 && cmp -s once.st twice.st
  report "safetensors.h: 32 metadata keys, one header written twice, white space, none: written and read back; what st_read refuses, not written" $? \
    "$(tr '\n' '|' <stw.txt)"
else
  report "safetensors.h: the writer's check compiles" 1 "$(head -c 400 stw.txt)"
fi
"$bin" --nproc 2 --lr fast >/dev/null 2>&1
rc=$?
[ "$rc" -eq 2 ]
report "train_gpt: a bad flag exits 2" $? "exit $rc"
# standard output that cannot be written (/dev/full): the run fails, named (it exited 0)
timeout 60 "$bin" --nproc 2 $tiny --batch-size 4 --steps 3 --val-every 0 >/dev/full 2>err.txt
rc=$?
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && grep -q '^train_gpt: cannot write to standard output.*: No space left on device' err.txt
report "train_gpt: standard output it cannot write fails the run, named" $? "exit $rc: $(tr '\n' '|' <err.txt | head -c 300)"
# --log that cannot be written (a full disk: a 4 KB tmpfs in a mount namespace of its own)
# fails the run, named; it ended the log mid-line and exited 0
if unshare -m true 2>/dev/null; then
  mkdir -p full
  unshare -m sh -c 'mount --make-rprivate / && mount -t tmpfs -o size=4k tmpfs full && exec timeout 60 "$0" "$@"' \
    "$bin" --nproc 2 $tiny --batch-size 4 --steps 200 --val-every 0 --sample-len 0 --log full/cut.jsonl >/dev/null 2>err.txt
  rc=$?
  [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] &&
    grep -q '^train_gpt: cannot write --log full/cut.jsonl at step [0-9]*: No space left on device' err.txt
  report "train_gpt: a --log it cannot write fails the run, named" $? "exit $rc: $(tr '\n' '|' <err.txt | head -c 300)"
else
  echo "SKIP train_gpt: a --log it cannot write fails the run: no mount namespace here (unshare -m)"
fi
exit $fail

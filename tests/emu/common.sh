# tests/emu/common.sh - sourced by the check-emu scripts (tests/emu/test_*.sh).
# emulated [VAR=value ...] PROGRAM ARGS...: runs an emulated program, its PASS/FAIL/SKIP
# lines renamed emu.* (the same programs built with nvcc print the plain names, and
# skip without a GPU); a non-zero status without a FAIL line is a failure of its own.
# Sets fail=1 on any failure.
emulated() {
  local out rc prog a
  for a in "$@"; do case $a in *=*) ;; *) prog=$a; break ;; esac; done
  out=$(env "$@" 2>&1); rc=$?
  sed -e 's/^\(PASS\|FAIL\|SKIP\) /\1 emu./' <<<"$out"
  if grep -q '^FAIL ' <<<"$out"; then fail=1
  elif [ $rc -ne 0 ]; then echo "FAIL emu.$(basename "$prog"): '$*' exited $rc without a FAIL line"; fail=1; fi
}

# ---- planted bugs (test_mutants*.sh) ----
# mutants_need FILE...: a temporary directory $tmp for the mutants, removed at exit, and
# FILE... built (make's outputs the runs compare against), else one FAIL line and exit
mutants_need() {
  local b
  root=$PWD
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  fail=0
  EMU_CXX=${EMU_CXX:-g++}
  for b in "$@"; do
    if [ ! -e "$b" ]; then echo "FAIL emu.mutants: $b is not built (make emu $*)"; exit 1; fi
  done
}

# build NAME FILE OLD NEW PROGRAM [SOURCE]: $tmp/NAME/PROGRAM (a path like tests/test_nccl)
# from SOURCE (default PROGRAM.cu) among the rewritten copies under build/emu/src, with
# FILE mutated (OLD replaced by NEW)
build() {
  local name=$1 file=$2 old=$3 new=$4 prog=$5 dir=$tmp/$1 src=$tmp/$1/src/${6:-$5.cu}
  mkdir -p "$dir"
  cp -r build/emu/src "$dir/src"
  perl -0777 -e 'my ($f, $old, $new) = @ARGV; local $/; open(my $h, "<", $f) or die "$f: $!\n"; my $t = <$h>;
    my $n = () = $t =~ /\Q$old\E/g; die "the text to mutate occurs $n times in $f\n" if $n != 1;
    $t =~ s/\Q$old\E/$new/; print $t;' "$file" "$old" "$new" >"$dir/mutated" 2>"$dir/log" || return 1
  perl tests/emu/rewrite.pl <"$dir/mutated" >"$dir/src/$file" || return 1
  mkdir -p "$(dirname "$dir/$prog")"
  "$EMU_CXX" -std=c++17 -O0 -g0 -w -fno-strict-aliasing -pthread -D__CUDACC__ -Itests/emu -I"$dir/src" -x c++ "$src" \
    -x none build/emu/libemu.a $EMU_WRAP -o "$dir/$prog" -lrt >>"$dir/log" 2>&1
}

# mutant NAME FILE OLD NEW PROGRAM ARGS PATTERN: the mutant's run fails with a line
# matching PATTERN (grep -E); the same run of make emu's build passes (both with the
# variables in $MUTANT_ENV)
mutant() {
  local name=$1 file=$2 old=$3 new=$4 prog=$5 args=$6 pattern=$7 out rc good grc
  if ! build "$name" "$file" "$old" "$new" "$prog"; then
    echo "FAIL emu.mutant.$name: cannot build the mutant: $(tail -n 3 "$tmp/$name/log" | tr '\n' ' ' | head -c 400)"
    fail=1
    return
  fi
  out=$(cd "$tmp/$name" && env $MUTANT_ENV timeout 200 "./$prog" $args 2>&1); rc=$?
  good=$(env $MUTANT_ENV timeout 200 "build/emu/$prog" $args 2>&1); grc=$?
  if [ $grc -ne 0 ] || grep -q '^FAIL ' <<<"$good"; then
    echo "FAIL emu.mutant.$name: the unmutated build/emu/$prog $args fails: $(grep -m2 -e '^FAIL' -e '^emu:' <<<"$good" | tr '\n' ' ' | head -c 400)"
    fail=1
  elif [ $rc -ne 0 ] && grep -Eq "$pattern" <<<"$out"; then
    echo "PASS emu.mutant.$name: $(grep -Em1 "$pattern" <<<"$out" | head -c 200)"
  else
    echo "FAIL emu.mutant.$name: exit $rc, no line matching '$pattern': $(grep -m2 -e '^FAIL' -e '^emu:' <<<"$out" | tr '\n' ' ' | head -c 400)"
    fail=1
  fi
}


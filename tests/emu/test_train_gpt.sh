#!/usr/bin/env bash
# tests/emu/test_train_gpt.sh - examples/train_gpt's GPU path on the CUDA emulator against
# its CPU build: tests/test_train_gpt_gpu.sh with build/emu/examples/train_gpt_gpu (fp32
# on 1, 2 and 4 ranks, bf16, bf16 all-reduce); its lines renamed emu.*.
cd "$(dirname "$0")/../.." || exit 1
. tests/emu/common.sh
fail=0
emulated tests/test_train_gpt_gpu.sh build/emu/examples/train_gpt_gpu
exit $fail

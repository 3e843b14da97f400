#!/usr/bin/env bash
# tests/emu/test_nccl.sh - ddp.h's NCCL backend on the CUDA emulator: tests/test_nccl.cu
# with worlds of 1, 2, 3 and 4 ranks (with small shared-memory chunks from 2 ranks on,
# so that every collective crosses chunk borders).
cd "$(dirname "$0")/../.." || exit 1
. tests/emu/common.sh
fail=0
emulated build/emu/tests/test_nccl 1
for w in 2 3 4; do emulated DDP_EMU_NCCL_CHUNK=65536 build/emu/tests/test_nccl $w; done
exit $fail

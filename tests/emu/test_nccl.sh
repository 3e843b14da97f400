#!/usr/bin/env bash
# tests/emu/test_nccl.sh - ddp.h's NCCL backend on the CUDA emulator: tests/test_nccl.cu
# with worlds of 1, 2, 3 and 4 ranks (with small shared-memory chunks from 2 ranks on,
# so that every collective crosses chunk borders, and DDP_EMU_STRICT_DEVICES=1: a rank
# whose threads touch a second GPU, as a watchdog thread without cudaSetDevice would
# GPU 0, is reported).
cd "$(dirname "$0")/../.." || exit 1
. tests/emu/common.sh
fail=0
emulated build/emu/tests/test_nccl 1
for w in 2 3 4; do emulated DDP_EMU_NCCL_CHUNK=65536 DDP_EMU_STRICT_DEVICES=1 build/emu/tests/test_nccl $w; done
exit $fail

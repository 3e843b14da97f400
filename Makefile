# ddp.h - build the examples, run the tests.
#   make            examples (CPU builds with cc; GPU builds too when nvcc is present)
#   make run        the main job: a short data-parallel training run
#   make test       every test; the last line is "N passed, N failed, N skipped"
#   make gpu-build  every GPU example and GPU test (needs nvcc, not a GPU)
#   make check-gpu  on a GPU machine: a probe, the GPU tests, the benchmarks; fails if any
#                   step fails; builds only binaries that are missing (run gpu-build first)
#   make install PREFIX=/usr/local   copies the two headers
# GPU code is built for sm_80 (A100) and sm_90 (H100/H200) plus PTX that newer GPUs
# compile at load time; choose others with e.g. make NVARCH="-arch=sm_86".

CC      ?= cc
NVCC    ?= nvcc
PREFIX  ?= /usr/local
NPROC   ?= 2
VERSION  = 0.1
WARN     = -std=c99 -Wall -Wextra -Wpedantic -Werror
CFLAGS  ?= -O3 -march=native
LDLIBS   = -lpthread -lm
NVARCH_DEFAULT = -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
                 -gencode arch=compute_90,code=compute_90
NVARCH  ?= $(NVARCH_DEFAULT)
NVFLAGS  = $(NVARCH) -O3 -std=c++17 -Werror all-warnings -Xcompiler -Wall,-Wextra,-Wno-missing-field-initializers
NVLIBS   = -lnccl -lcublasLt -lcublas
HAVE_NVCC := $(shell command -v $(NVCC) 2>/dev/null)

EXAMPLES     = $(patsubst %.c,%,$(wildcard examples/*.c))
GPU_EXAMPLES = $(patsubst %.c,%_gpu,$(filter-out examples/ddprun.c,$(wildcard examples/*.c))) \
               $(patsubst %.cu,%,$(wildcard examples/*.cu))
GPU_TESTS    = $(patsubst %.cu,%,$(wildcard tests/test_*.cu))
GPU_SCRIPTS  = $(wildcard tests/test_*_gpu.sh)
TESTS        = $(patsubst %.c,%,$(wildcard tests/test_*.c)) $(if $(HAVE_NVCC),$(GPU_TESTS))
TEST_SCRIPTS = $(wildcard tests/test_*.sh)
HEADERS      = ddp.h ddp_kernels.cuh

# What tests/test_gpu_arch.sh expects in every GPU binary (nothing: NVARCH was chosen).
export DDP_EXPECT_ARCH = $(if $(filter file,$(origin NVARCH)),sm_80 sm_90 ptx:sm_90)

.PHONY: all run test gpu-build check-gpu install clean
all: $(EXAMPLES) $(if $(HAVE_NVCC),$(GPU_EXAMPLES))

examples/%: examples/%.c $(HEADERS)
	$(CC) $(WARN) $(CFLAGS) -fopenmp -I. $< -o $@ $(LDLIBS)
examples/%_gpu: examples/%.c $(HEADERS)
	$(NVCC) $(NVFLAGS) -x cu -I. $< -o $@ $(NVLIBS)
examples/%: examples/%.cu $(HEADERS)
	$(NVCC) $(NVFLAGS) -I. $< -o $@ $(NVLIBS)
tests/%: tests/%.c tests/test.h $(HEADERS)
	$(CC) $(WARN) -O2 -g -fopenmp -I. $< -o $@ $(LDLIBS)
tests/%: tests/%.cu tests/test.h $(HEADERS)
	$(NVCC) $(NVFLAGS) -I. $< -o $@ $(NVLIBS)

run: examples/train_gpt
	./examples/train_gpt --nproc 2 --steps 400

test: $(EXAMPLES) $(if $(HAVE_NVCC),$(GPU_EXAMPLES)) $(TESTS)
	@tests/run.sh $(TESTS) $(TEST_SCRIPTS)

gpu-build: $(GPU_EXAMPLES) $(GPU_TESTS)

# The benchmarks and training runs of check-gpu, one command each.
GPU_RUNS = "./examples/hello_allreduce_gpu" \
           "./examples/bench_allreduce_gpu --iters 20" \
           "./examples/bench_kernels" \
           "./examples/train_gpt_gpu --steps 30 --val-every 10 --sample-len 64" \
           "./examples/train_gpt_gpu --layers 12 --heads 12 --dim 768 --ctx 1024 --vocab 50304 --batch-size 8 --steps 6 --val-every 0 --sample-len 0"

# A GPU machine's time is short: binaries built beforehand are run as they are (make
# would rebuild them whenever a copied tree has newer header times); only missing
# ones are built. DDP_REQUIRE_GPU=1 turns every "no GPU" skip into a failure.
check-gpu:
	@for b in $(GPU_EXAMPLES) $(GPU_TESTS); do \
	  [ -x "$$b" ] || { echo "check-gpu: $$b is missing: make gpu-build"; $(MAKE) --no-print-directory gpu-build || exit 1; break; }; \
	done
	@export DDP_REQUIRE_GPU=1; failed=""; \
	echo "+ ./tests/test_gpu_probe"; \
	./tests/test_gpu_probe || { echo "check-gpu: FAILED: no usable GPU (the probe says why above)"; exit 1; }; \
	tests/run.sh $(filter-out tests/test_gpu_probe,$(GPU_TESTS)) $(GPU_SCRIPTS) || failed="$$failed, GPU tests"; \
	for c in $(GPU_RUNS); do echo "+ $$c"; $$c || failed="$$failed, $$c (status $$?)"; done; \
	if [ -n "$$failed" ]; then echo "check-gpu: FAILED:$${failed#,}"; exit 1; fi; \
	echo "check-gpu: every step passed"

install:
	install -d $(DESTDIR)$(PREFIX)/include
	install -m 644 $(HEADERS) $(DESTDIR)$(PREFIX)/include

clean:
	rm -f $(EXAMPLES) $(GPU_EXAMPLES) $(TESTS) $(GPU_TESTS)

# ddp.h - build the examples, run the tests.
#   make            examples (CPU builds with cc; GPU builds too when nvcc is present)
#   make run        the main job: a short data-parallel training run
#   make test       every test; the last line is "N passed, N failed, N skipped"
#   make check-gpu  GPU tests and benchmarks (needs a GPU)
#   make install PREFIX=/usr/local   copies the two headers

CC      ?= cc
NVCC    ?= nvcc
PREFIX  ?= /usr/local
NPROC   ?= 2
WARN     = -std=c99 -Wall -Wextra -Wpedantic -Werror
CFLAGS  ?= -O3 -march=native
LDLIBS   = -lpthread -lm
NVARCH  ?= -arch=sm_90
NVFLAGS  = $(NVARCH) -O3 -std=c++17 -Werror all-warnings -Xcompiler -Wall,-Wextra,-Wno-missing-field-initializers
NVLIBS   = -lnccl -lcublasLt -lcublas
HAVE_NVCC := $(shell command -v $(NVCC) 2>/dev/null)

EXAMPLES     = $(patsubst %.c,%,$(wildcard examples/*.c))
GPU_EXAMPLES = $(patsubst %.c,%_gpu,$(filter-out examples/ddprun.c,$(wildcard examples/*.c))) \
               $(patsubst %.cu,%,$(wildcard examples/*.cu))
GPU_TESTS    = $(patsubst %.cu,%,$(wildcard tests/test_*.cu))
TESTS        = $(patsubst %.c,%,$(wildcard tests/test_*.c)) $(if $(HAVE_NVCC),$(GPU_TESTS))
TEST_SCRIPTS = $(wildcard tests/test_*.sh)
HEADERS      = ddp.h ddp_kernels.cuh

.PHONY: all run test check-gpu install clean
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

check-gpu: $(GPU_EXAMPLES) $(GPU_TESTS)
	@tests/run.sh $(GPU_TESTS)
	./examples/hello_allreduce_gpu
	./examples/bench_allreduce_gpu --iters 20
	./examples/bench_kernels
	./examples/train_gpt_gpu --steps 30 --val-every 10 --sample-len 64
	./examples/train_gpt_gpu --layers 12 --heads 12 --dim 768 --ctx 1024 --vocab 50304 --batch-size 8 \
		--steps 6 --val-every 0 --sample-len 0    # the GPT-2 124M shape: tokens/s

install:
	install -d $(DESTDIR)$(PREFIX)/include
	install -m 644 $(HEADERS) $(DESTDIR)$(PREFIX)/include

clean:
	rm -f $(EXAMPLES) $(GPU_EXAMPLES) $(TESTS)

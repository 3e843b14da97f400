# ddp.h - build the examples, run the tests, install.
#   make            examples (CPU builds with cc; GPU builds too when nvcc is present)
#   make run        the main job: a short data-parallel training run
#   make test       every test; the last line is "N passed, N failed, N skipped"
#   make test-fast  about a minute once built: most C tests and the CPU examples' tests, no nvcc
#                   (tests/README.md: what each test checks, its tier, how long it takes)
#   make lessons    the lessons' programs (CPU builds, seconds); make lesson-N checks
#                   lesson N's exercise; make HAVE_NVCC= builds no GPU code at all
#   make gpu-build  every GPU example, lesson and test, and the portable CPU twin that
#                   check-gpu compares with (needs nvcc, not a GPU)
#   make check-gpu  on a GPU machine (tests/check_gpu.sh): libraries, a probe, the GPU
#                   tests, compute-sanitizer, the benchmarks and GPT-2 runs, the lessons;
#                   every step under a timeout, one table at the end, within 9 minutes;
#                   fails if any step fails; builds only binaries that are missing
#   make emu        every GPU program built with g++ against the CUDA emulator (tests/emu),
#                   under build/emu/: runs on any CPU, slowly; proves logic, not speed
#   make check-emu  the GPU tests, examples, lessons and NCCL with 1-4 ranks, emulated
#                   (make test runs them too)
#   make install PREFIX=/usr/local [DESTDIR=...]   headers, ddprun, ddp.pc, CMake package
#   make uninstall  removes exactly what install put
# GPU code is built for sm_80 (A100) and sm_90 (H100/H200) plus PTX that newer GPUs
# compile at load time; choose others with e.g. make NVARCH="-arch=sm_86".

CC      ?= cc
NVCC    ?= nvcc
PREFIX  ?= /usr/local
NPROC   ?= 2
# ddp.h's version, for ddp.pc and CMake's version file
VERSION := $(shell sed -n 's/^\#define DDP__VERSION "\(.*\)"$$/\1/p' ddp.h)
WARN     = -std=c99 -Wall -Wextra -Wpedantic -Werror
CFLAGS  ?= -O3 -march=native -fno-math-errno
LDLIBS   = -lpthread -lm
NVARCH_DEFAULT = -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
                 -gencode arch=compute_90,code=compute_90
NVARCH  ?= $(NVARCH_DEFAULT)
NVFLAGS  = $(NVARCH) -O3 -std=c++17 -Werror all-warnings -Xcompiler -Wall,-Wextra,-Wno-missing-field-initializers
# --as-needed: a binary records only the libraries it calls (bench_kernels needs no
# NCCL, hello_allreduce_gpu no cuBLAS), also with toolchains that do not default to it
NVLIBS   = -Xlinker --as-needed -lnccl -lcublasLt -lcublas
HAVE_NVCC := $(shell command -v $(NVCC) 2>/dev/null)

EXAMPLES     = $(patsubst %.c,%,$(wildcard examples/*.c))
GPU_EXAMPLES = $(patsubst %.c,%_gpu,$(filter-out examples/ddprun.c,$(wildcard examples/*.c))) \
               $(patsubst %.cu,%,$(wildcard examples/*.cu))
# The lessons' programs and solutions; the exercises are built and checked one at a time
# by make lesson-N, so that a half-done exercise never breaks make or make test (make emu
# builds them as handed out, from git: HANDED_OUT below).
LESSONS      = $(patsubst %.c,%,$(filter-out %/exercise.c,$(wildcard examples/lessons/*/*.c)))
EXERCISES    = $(patsubst %.c,%,$(wildcard examples/lessons/*/exercise.c))
GPU_LESSONS  = $(addsuffix _gpu,$(LESSONS))
GPU_TESTS    = $(patsubst %.cu,%,$(wildcard tests/test_*.cu))
GPU_SCRIPTS  = $(wildcard tests/test_*_gpu.sh)
# The CPU twin tests/test_train_gpt_gpu.sh compares the GPU with under check-gpu: built
# for any x86-64 since about 2009 (x86-64-v2: SSE4.2), since -march=native code from
# here could stop with SIGILL on the GPU machine's CPU, and without OpenMP (that
# machine may lack libgomp); its runs are tiny.
CPU_TWIN     = tests/train_gpt_twin
TWIN_ARCH    = $(if $(filter x86_64,$(shell uname -m)),-march=x86-64-v2)
C_TESTS      = $(patsubst %.c,%,$(wildcard tests/test_*.c))
TESTS        = $(C_TESTS) $(if $(HAVE_NVCC),$(GPU_TESTS))
TEST_SCRIPTS = $(wildcard tests/test_*.sh)
HEADERS      = ddp.h ddp_kernels.cuh

# What tests/test_gpu_arch.sh expects in every GPU binary: the default's architectures,
# or (when NVARCH was chosen) what it reads from NVARCH.
export DDP_EXPECT_ARCH = $(if $(filter file,$(origin NVARCH)),sm_80 sm_90 ptx:sm_90)
export DDP_NVARCH = $(NVARCH)
# 0 under make HAVE_NVCC=: the tests that read GPU binaries skip rather than find none
export DDP_GPU_BUILDS = $(if $(HAVE_NVCC),1,0)

.PHONY: all run test test-fast lessons gpu-build check-gpu emu check-emu install uninstall clean force
all: $(EXAMPLES) $(LESSONS) $(if $(HAVE_NVCC),$(GPU_EXAMPLES) $(GPU_LESSONS))

examples/%: examples/%.c $(HEADERS)
	$(CC) $(WARN) $(CFLAGS) -fopenmp -I. $< -o $@ $(LDLIBS)
examples/%_gpu: examples/%.c $(HEADERS)
	$(NVCC) $(NVFLAGS) -x cu -I. $< -o $@ $(NVLIBS)
# The lessons use no OpenMP and build at -O2: make lessons takes seconds.
examples/lessons/%: examples/lessons/%.c $(HEADERS)
	$(CC) $(WARN) -O2 -I. $< -o $@ $(LDLIBS)
$(LESSONS) $(GPU_LESSONS) $(EXERCISES): examples/lessons/device.h examples/lessons/exercise.h
$(addprefix examples/,train_gpt train_gpt_gpu train_classifier train_classifier_gpu): examples/safetensors.h
examples/%: examples/%.cu $(HEADERS)
	$(NVCC) $(NVFLAGS) -I. $< -o $@ $(NVLIBS)
tests/%: tests/%.c tests/test.h $(HEADERS)
	$(CC) $(WARN) -O2 -g -fopenmp -I. $< -o $@ $(LDLIBS)
tests/%: tests/%.cu tests/test.h $(HEADERS)
	$(NVCC) $(NVFLAGS) -I. $< -o $@ $(NVLIBS)
$(CPU_TWIN): examples/train_gpt.c $(HEADERS)
	$(CC) $(WARN) -O2 $(TWIN_ARCH) -Wno-unknown-pragmas -I. $< -o $@ $(LDLIBS)

# make lessons: every lesson's programs, CPU builds only. make lesson-N: builds lesson N's
# exercise and checks it with 1 to 7 ranks (examples/lessons/check.sh).
lessons: $(LESSONS)
$(foreach e,$(EXERCISES),$(eval lesson-$(patsubst 0%,%,$(firstword $(subst _, ,$(notdir $(e:/exercise=))))): $(e)))
lesson-%:
	@$(if $^,examples/lessons/check.sh $<,echo "no lesson $*: the lessons are 1 to $(words $(EXERCISES))"; exit 2)
lesson-:
	@echo "make lesson-N: N is the lesson's number, 1 to $(words $(EXERCISES))"; exit 2

run: examples/train_gpt
	./examples/train_gpt --nproc 2 --steps 400

test: $(EXAMPLES) $(LESSONS) $(if $(HAVE_NVCC),$(GPU_EXAMPLES) $(GPU_LESSONS)) $(TESTS) emu
	@TEST_JOBS=1 tests/run.sh $(TESTS) $(TEST_SCRIPTS) $(EMU_TESTS)

# The C tests and scripts whose row in tests/README.md's index says "fast" (the index is
# the list), the longest first (its seconds column), TEST_JOBS (default 4) of them at once:
# their time is mostly waiting (timeouts, ranks, children), so on 2 cores the tier takes
# about a minute where one at a time took about three.
FAST_ALL     = $(shell sed -n 's/^| `\(test_[a-z0-9_]*\)\(\.sh\)\{0,1\}\(\.c\)\{0,1\}` | fast | \([0-9]*\) |.*/\4 tests\/\1\2/p' \
                 tests/README.md | sort -rn | cut -d' ' -f2)
FAST_C       = $(filter-out %.sh,$(FAST_ALL))
TEST_JOBS   ?= 4
test-fast: $(EXAMPLES) $(LESSONS) $(FAST_C)
	@TEST_JOBS=$(TEST_JOBS) tests/run.sh $(FAST_ALL)

gpu-build: $(GPU_EXAMPLES) $(GPU_LESSONS) $(GPU_TESTS) $(CPU_TWIN)

# What gpu-build makes, check-gpu runs: build here, carry the repository with its built
# examples/ and tests/ to the GPU machine (tests/check_gpu.sh says what each step costs there).
check-gpu:
	@tests/check_gpu.sh

# ---- the CUDA emulator: the GPU programs built with g++, run on the CPU ----
# tests/emu/rewrite.pl copies each source under build/emu/src with its <<<>>> launches
# and __shared__ arrays in a form g++ takes; the copies compile against tests/emu's
# cuda_runtime.h, cublasLt.h, nccl.h, ... and link its runtime (build/emu/libemu.a).
# EMU_OPT=-O0 makes the kernels easier to step through in gdb. nvcc fuses a*b + c into one
# multiply-add in device code (--fmad=true, its default), so the emulated kernels do too where
# the CPU has FMA (tests/emu/cuda_runtime.h; EMU_FMA= or -O0 builds them with every product rounded).
EMU_CXX     ?= g++
EMU_OPT     ?= -O1
ifeq ($(origin EMU_FMA),undefined) # asked once, not at every compile
EMU_FMA     := $(if $(shell grep -qw fma /proc/cpuinfo 2>/dev/null && echo y),-DDDP_EMU_FMA)
endif
EMU_FLAGS    = -std=c++17 -g -fno-strict-aliasing -pthread -D__CUDACC__ -Wall -Wno-unused-function -Wno-unknown-pragmas $(EMU_FMA)
export DDP_EMU_FMA = $(if $(filter -O0,$(EMU_OPT)),0,$(if $(EMU_FMA),1,0))
# the kernels' expf, logf and tanhf as CUDA's may round them (tests/emu/emu.cpp), host code's glibc's
export EMU_WRAP = -Wl,--wrap=expf,--wrap=logf,--wrap=tanhf
EMU_SRC      = build/emu/src
EMU_LIB      = build/emu/libemu.a
EMU_HEADERS  = $(wildcard tests/emu/*.h tests/emu/cub/device/*.cuh)
# The exercises as handed out: HEAD's, from git (as tests/test_lessons.sh checks them), never
# the student's copy, which may be half done; none outside a git checkout of its own.
HANDED_OUT   := $(shell [ -z "$$(git rev-parse --show-cdup 2>/dev/null)" ] && \
                  git ls-tree -r --name-only HEAD examples/lessons 2>/dev/null | grep '/exercise\.c$$')
EMU_PROGRAMS = $(addprefix build/emu/,$(GPU_EXAMPLES) $(GPU_LESSONS) $(patsubst %.c,%_gpu,$(HANDED_OUT)) $(GPU_TESTS) \
               tests/emu/selftest tests/emu/gpt2_corners)
EMU_COPIES   = $(addprefix $(EMU_SRC)/,$(HEADERS) examples/safetensors.h examples/lessons/device.h examples/lessons/exercise.h \
                 tests/test.h)
EMU_TESTS    = $(wildcard tests/emu/test_*.sh)

emu: $(EMU_PROGRAMS)
.PRECIOUS: $(EMU_SRC)/%

check-emu: emu examples/train_gpt examples/train_classifier
	@tests/run.sh $(EMU_TESTS)

$(EMU_SRC)/%: % tests/emu/rewrite.pl
	@mkdir -p $(@D)
	perl tests/emu/rewrite.pl $< >$@
# read from git every time, replaced only when it changed (then the program is rebuilt)
$(addprefix $(EMU_SRC)/,$(HANDED_OUT)): $(EMU_SRC)/%: tests/emu/rewrite.pl force
	@mkdir -p $(@D)
	git show HEAD:$* >$@.git && perl tests/emu/rewrite.pl $@.git >$@.new && rm $@.git
	@if cmp -s $@.new $@; then rm $@.new; else mv $@.new $@; fi
force: ;
build/emu/%.o: tests/emu/%.cpp $(EMU_HEADERS)
	@mkdir -p $(@D)
	$(EMU_CXX) $(EMU_FLAGS) -O2 -Wextra -Itests/emu -c $< -o $@
$(EMU_LIB): build/emu/emu.o build/emu/emu_blas.o build/emu/emu_nccl.o
	ar rcs $@ $^
build/emu/examples/%_gpu: $(EMU_SRC)/examples/%.c $(EMU_COPIES) $(EMU_LIB) $(EMU_HEADERS)
	@mkdir -p $(@D)
	$(EMU_CXX) $(EMU_FLAGS) $(EMU_OPT) -Itests/emu -I$(EMU_SRC) -x c++ $< -x none $(EMU_LIB) $(EMU_WRAP) -o $@ -lrt
build/emu/%: $(EMU_SRC)/%.cu $(EMU_COPIES) $(EMU_LIB) $(EMU_HEADERS)
	@mkdir -p $(@D)
	$(EMU_CXX) $(EMU_FLAGS) $(EMU_OPT) -Itests/emu -I$(EMU_SRC) -x c++ $< -x none $(EMU_LIB) $(EMU_WRAP) -o $@ -lrt

# ---- install: headers, ddprun, pkg-config and CMake package files ----
INCLUDEDIR = $(PREFIX)/include
BINDIR     = $(PREFIX)/bin
PCDIR      = $(PREFIX)/share/pkgconfig
CMAKEDIR   = $(PREFIX)/share/cmake/ddp
INSTALLED  = $(addprefix $(INCLUDEDIR)/,$(HEADERS)) $(BINDIR)/ddprun $(PCDIR)/ddp.pc \
             $(CMAKEDIR)/ddpConfig.cmake $(CMAKEDIR)/ddpConfigVersion.cmake

define DDP_PC
prefix=$(PREFIX)
includedir=$${prefix}/include

Name: ddp
Description: PyTorch-style DistributedDataParallel for C and CUDA in two headers (Linux)
Version: $(VERSION)
Cflags: -I$${includedir}
Libs: -lpthread -lm
endef

# Relocatable: the include path is found from where this file lies.
define DDP_CMAKE_CONFIG
# find_package(ddp CONFIG) gives ddp::ddp: the include path of ddp.h and
# ddp_kernels.cuh, threads and libm. GPU programs also link NCCL and cuBLAS(Lt):
#   find_package(CUDAToolkit REQUIRED)
#   target_link_libraries(app PRIVATE ddp::ddp nccl CUDA::cublasLt CUDA::cublas)
include(CMakeFindDependencyMacro)
find_dependency(Threads)
get_filename_component(_ddp_prefix "$${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
if(NOT TARGET ddp::ddp)
  add_library(ddp::ddp INTERFACE IMPORTED)
  set_target_properties(ddp::ddp PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "$${_ddp_prefix}/include"
    INTERFACE_LINK_LIBRARIES "Threads::Threads;m")
endif()
unset(_ddp_prefix)
endef

define DDP_CMAKE_VERSION
set(PACKAGE_VERSION "$(VERSION)")
if(PACKAGE_FIND_VERSION VERSION_GREATER PACKAGE_VERSION)
  set(PACKAGE_VERSION_COMPATIBLE FALSE)
else()
  set(PACKAGE_VERSION_COMPATIBLE TRUE)
  if(PACKAGE_FIND_VERSION VERSION_EQUAL PACKAGE_VERSION)
    set(PACKAGE_VERSION_EXACT TRUE)
  endif()
endif()
endef
export DDP_PC DDP_CMAKE_CONFIG DDP_CMAKE_VERSION

install: examples/ddprun
	install -d $(DESTDIR)$(INCLUDEDIR) $(DESTDIR)$(BINDIR) $(DESTDIR)$(PCDIR) $(DESTDIR)$(CMAKEDIR)
	install -m 644 $(HEADERS) $(DESTDIR)$(INCLUDEDIR)
	install -m 755 examples/ddprun $(DESTDIR)$(BINDIR)
	printf '%s\n' "$$DDP_PC" > $(DESTDIR)$(PCDIR)/ddp.pc
	printf '%s\n' "$$DDP_CMAKE_CONFIG" > $(DESTDIR)$(CMAKEDIR)/ddpConfig.cmake
	printf '%s\n' "$$DDP_CMAKE_VERSION" > $(DESTDIR)$(CMAKEDIR)/ddpConfigVersion.cmake

uninstall:
	rm -f $(addprefix $(DESTDIR),$(INSTALLED))
	[ ! -d $(DESTDIR)$(CMAKEDIR) ] || rmdir --ignore-fail-on-non-empty $(DESTDIR)$(CMAKEDIR)

clean:
	rm -f $(EXAMPLES) $(GPU_EXAMPLES) $(LESSONS) $(GPU_LESSONS) $(EXERCISES) $(TESTS) $(GPU_TESTS) $(CPU_TWIN)
	rm -rf build/emu

# pdn.c — build the CPU reference, its tests, and (where nvcc exists) the CUDA trainer.
# `make config` prints what was detected. Knobs: CC, CFLAGS (optimisation; the flags the code needs are always
# added), NO_OMP=1, NO_NCCL=1, NO_MPI=1, MPI_CFLAGS / MPI_LDLIBS, GPU_ARCH, WERROR=1 (warnings are errors, as in CI),
# SANITIZE=1 (AddressSanitizer + UBSan, what `make test-asan` uses).

# gcc unless CC is given: make's built-in default for CC is cc, so `CC ?= gcc` would never take effect
ifeq ($(origin CC),default)
  CC := $(if $(shell command -v gcc 2>/dev/null),gcc,cc)
endif
CFLAGS ?= -O3 -march=native -fno-math-errno
# what the code needs, kept whatever CFLAGS the command line gives (make CFLAGS=-O0 still gets these)
override CFLAGS += -Wall -Wextra -std=gnu11
LDLIBS = -lm
ifeq ($(WERROR),1)
  override CFLAGS += -Werror
endif
ifeq ($(SANITIZE),1)
  override CFLAGS += -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all
endif

# OpenMP: use it only if the compiler can actually build and link an OpenMP program (no guessing from the OS)
OMP_OK := $(shell printf '#include <omp.h>\nint main(void){return omp_get_max_threads() < 1;}\n' | \
            $(CC) -fopenmp -x c - -o /dev/null 2>/dev/null && echo yes)
ifeq ($(NO_OMP),1)
  OMP_OK :=
endif
ifeq ($(OMP_OK),yes)
  override CFLAGS += -fopenmp
  OMP_MSG = OpenMP: yes
else
  override CFLAGS += -Wno-unknown-pragmas
  OMP_MSG = OpenMP: no (single-threaded; install libgomp or use a compiler with -fopenmp)
endif
$(info $(OMP_MSG))

HEADERS = utils.h pdn.h mqar.h train_common.h eval.h dist.h hf.h $(DATA_HEADERS)

# the Python-free data path: tokenizer, token shards, data loader (header-only) and the dev/data tools
DATA_HEADERS = tokenizer.h unicode_tables.h shard.h dataloader.h
DATA_TOOLS = dev/data/prepare_shards dev/data/inspect_shard dev/data/train_bpe dev/data/bench_tokenizer dev/data/make_mc

# CUDA: the GPU trainer builds where nvcc exists (it needs no GPU to compile): train_pdncu in bf16 mixed precision,
# train_pdncu_fp32 all in fp32 (the build that must match the CPU reference). GPU_ARCH: sm_90 (Hopper).
NVCC ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
GPU_ARCH ?= sm_90
NVCCFLAGS = -O3 -std=c++17 -arch=$(GPU_ARCH) -Xcompiler -Wall,-Wextra,-Wno-unused-function
ifeq ($(WERROR),1)
  NVCCFLAGS += -Werror all-warnings -Xcompiler -Werror
endif
NVLDLIBS = -lcublas -lcublasLt
# PRECISION=FP32 used to build the fp32 trainer under the bf16 one's name: two different binaries, one name
ifneq ($(filter-out BF16,$(PRECISION)),)
  $(error PRECISION=$(PRECISION) is not a build option: `make train_pdncu` is bf16, `make train_pdncu_fp32` is fp32)
endif

# Several GPUs: NCCL is needed, MPI is optional (mpirun launches; the TCP and file rendezvous work without it). Each is
# used only if a test program really compiles and links with it (NO_NCCL=1 / NO_MPI=1 turn them off; MPI_CFLAGS and
# MPI_LDLIBS override what mpicc reports: Open MPI's `mpicc --showme:compile/link`, else MPICH's `mpicc -show`, whose
# -I/-D flags are taken for compiling and -L/-l for linking). Without NCCL the trainer is single-GPU and says so.
ifneq ($(NVCC),)
  CUDA_HOME ?= $(abspath $(dir $(NVCC))..)
  # cuDNN (the bf16 build's fused attention, issue 19): used if a test program compiles and links with it (NO_CUDNN=1
  # turns it off); without it the attention layers run the trainer's own kernels and the kernel plan says so
  ifneq ($(NO_CUDNN),1)
    CUDNN_OK := $(shell printf '#include <cudnn_graph.h>\nint main(void){return cudnnGetVersion() == 0;}\n' | \
                  $(CC) -x c - -I$(CUDA_HOME)/include -L$(CUDA_HOME)/lib64 -L$(CUDA_HOME)/lib -lcudnn -o /dev/null 2>/dev/null && echo yes)
  endif
  ifeq ($(CUDNN_OK),yes)
    NVLDLIBS += -lcudnn
  else
    NVCCFLAGS += -DNO_CUDNN
  endif
  ifneq ($(NO_NCCL),1)
    NCCL_OK := $(shell printf '#include <nccl.h>\nint main(void){int v; return ncclGetVersion(&v) != 0;}\n' | \
                 $(CC) -x c - -I$(CUDA_HOME)/include -L$(CUDA_HOME)/lib64 -L$(CUDA_HOME)/lib -lnccl -o /dev/null 2>/dev/null && echo yes)
  endif
  ifneq ($(NO_MPI),1)
    MPI_FOUND_C := $(shell mpicc --showme:compile 2>/dev/null)
    MPI_FOUND_L := $(shell mpicc --showme:link 2>/dev/null)
    ifeq ($(strip $(MPI_FOUND_C)$(MPI_FOUND_L)),)
      MPI_SHOW := $(wordlist 2,1000,$(shell mpicc -show 2>/dev/null))
      MPI_FOUND_C := $(filter -I% -D%,$(MPI_SHOW))
      MPI_FOUND_L := $(filter -L% -l%,$(MPI_SHOW))
    endif
    MPI_CFLAGS ?= $(MPI_FOUND_C)
    MPI_LDLIBS ?= $(MPI_FOUND_L)
    MPI_OK := $(shell printf '#include <mpi.h>\nint main(void){int f; return MPI_Initialized(&f);}\n' | \
                $(CC) -x c - $(MPI_CFLAGS) $(MPI_LDLIBS) -o /dev/null 2>/dev/null && echo yes)
  endif
  ifeq ($(NCCL_OK),yes)
    DIST_FLAGS = -DENABLE_NCCL
    DIST_LIBS = -lnccl
    ifeq ($(MPI_OK),yes)
      DIST_FLAGS += -DENABLE_MPI -DOMPI_SKIP_MPICXX -DMPICH_SKIP_MPICXX $(MPI_CFLAGS)
      DIST_LIBS += $(MPI_LDLIBS)
      DIST_MSG = multi-GPU: NCCL + MPI (mpirun, TCP or file rendezvous)
    else
      DIST_MSG = multi-GPU: NCCL without MPI (TCP or file rendezvous; install an MPI dev package, e.g. libopenmpi-dev, for mpirun)
    endif
  else
    DIST_MSG = multi-GPU: no (NCCL not found: the CUDA trainer is single-GPU)
  endif
endif

# Each binary depends on a stamp holding the configuration it is built with (compiler, flags, OpenMP; for the GPU
# trainers NCCL and MPI): a stamp is rewritten only when its configuration changes, so a binary built before NCCL or
# MPI was installed, or with other flags, is rebuilt, and nothing is rebuilt otherwise.
CPU_CONFIG := $(CC) $(CFLAGS) $(LDLIBS) | $(OMP_MSG)
CUDA_CONFIG := $(NVCC) $(NVCCFLAGS) $(NVLDLIBS) $(DIST_FLAGS) $(DIST_LIBS) | $(DIST_MSG)
CPU_STAMP = .build/cpu.config
CUDA_STAMP = .build/cuda.config

.PHONY: all test test-asan clean cuda config cudnn-ok FORCE

all: train_pdn test_pdn test_pdn64 $(DATA_TOOLS)

$(CPU_STAMP): FORCE
	@mkdir -p $(@D); printf '%s\n' '$(CPU_CONFIG)' | cmp -s - $@ || printf '%s\n' '$(CPU_CONFIG)' > $@

$(CUDA_STAMP): FORCE
	@mkdir -p $(@D); printf '%s\n' '$(CUDA_CONFIG)' | cmp -s - $@ || printf '%s\n' '$(CUDA_CONFIG)' > $@

# yes if the CUDA builds use cuDNN (dev/cuda/Makefile asks)
cudnn-ok:
	@echo "$(if $(CUDNN_OK),yes,no)"

# what this make found and will use
config:
	@echo "CC         $(CC)"
	@echo "CFLAGS     $(CFLAGS)"
	@echo "$(OMP_MSG)"
	@echo "NVCC       $(if $(NVCC),$(NVCC),none)"
	@echo "MPI_CFLAGS $(MPI_CFLAGS)"
	@echo "MPI_LDLIBS $(MPI_LDLIBS)"
	@echo "$(if $(NVCC),$(DIST_MSG),multi-GPU: no (no nvcc))"
	@echo "cuDNN      $(if $(CUDNN_OK),yes (the bf16 build's fused attention),no (own attention kernels))"

# (the trainer uses part of the header-only data path, hence -Wno-unused-function)
train_pdn: train_pdn.c $(HEADERS) $(CPU_STAMP)
	$(CC) $(CFLAGS) -Wno-unused-function $< $(LDLIBS) -o $@

# the CPU tests in fp32, and the gradient checks in fp64 (the same code, real = double)
# (the tests include train_pdn.c without its main, hence -Wno-unused-function)
test_pdn: test_pdn.c test_hf.h test_mqar.h test_eval.h train_pdn.c $(HEADERS) $(CPU_STAMP)
	$(CC) $(CFLAGS) -Wno-unused-function $< $(LDLIBS) -o $@

test_pdn64: test_pdn.c test_hf.h test_mqar.h test_eval.h train_pdn.c $(HEADERS) $(CPU_STAMP)
	$(CC) $(CFLAGS) -Wno-unused-function -DPDN_DOUBLE $< $(LDLIBS) -o $@

test: train_pdn test_pdn test_pdn64 $(DATA_TOOLS)
	./test_pdn64
	./test_pdn

# `make test` with AddressSanitizer and UBSan, leak checking on (the binaries are rebuilt in place, and rebuilt
# again by the next plain make: the stamp changes)
test-asan:
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 $(MAKE) test SANITIZE=1

# the CUDA trainers: bf16 mixed precision, and all fp32 (no TF32) under its own name
train_pdncu: train_pdn.cu $(HEADERS) $(CUDA_STAMP)
ifeq ($(NVCC),)
	$(error nvcc not found: install the CUDA toolkit (or set NVCC=/path/to/nvcc) to build the GPU trainer)
endif
	@echo "$(DIST_MSG)"
	$(NVCC) $(NVCCFLAGS) $(DIST_FLAGS) $< $(NVLDLIBS) $(DIST_LIBS) -o $@

train_pdncu_fp32: train_pdn.cu $(HEADERS) $(CUDA_STAMP)
ifeq ($(NVCC),)
	$(error nvcc not found: install the CUDA toolkit (or set NVCC=/path/to/nvcc) to build the GPU trainer)
endif
	@echo "$(DIST_MSG)"
	$(NVCC) $(NVCCFLAGS) -DENABLE_FP32 $(DIST_FLAGS) $< $(NVLDLIBS) $(DIST_LIBS) -o $@

cuda: train_pdncu train_pdncu_fp32

# the data tools (a tool uses only part of the header-only libraries, hence -Wno-unused-function)
$(DATA_TOOLS): dev/data/%: dev/data/%.c dev/data/data_tools.h utils.h $(DATA_HEADERS) $(CPU_STAMP)
	$(CC) $(CFLAGS) -Wno-unused-function -I. $< $(LDLIBS) -o $@

clean:
	rm -rf train_pdn test_pdn test_pdn64 train_pdncu train_pdncu_fp32 $(DATA_TOOLS) .build

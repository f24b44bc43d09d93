# pdn.c — build the CPU reference, its tests, and (where nvcc exists) the CUDA trainer.
CC ?= gcc
CFLAGS ?= -O3 -march=native -fno-math-errno
CFLAGS += -Wall -Wextra -std=gnu11
LDLIBS = -lm

# OpenMP: use it only if the compiler can actually build and link an OpenMP program (no guessing from the OS)
OMP_OK := $(shell printf '#include <omp.h>\nint main(void){return omp_get_max_threads() < 1;}\n' | \
            $(CC) -fopenmp -x c - -o /dev/null 2>/dev/null && echo yes)
ifeq ($(NO_OMP),1)
  OMP_OK :=
endif
ifeq ($(OMP_OK),yes)
  CFLAGS += -fopenmp
  $(info OpenMP: yes)
else
  CFLAGS += -Wno-unknown-pragmas
  $(info OpenMP: no (single-threaded; install libgomp or use a compiler with -fopenmp))
endif

HEADERS = utils.h pdn.h mqar.h train_common.h dist.h $(DATA_HEADERS)

# the Python-free data path: tokenizer, token shards, data loader (header-only) and the dev/data tools
DATA_HEADERS = tokenizer.h unicode_tables.h shard.h dataloader.h
DATA_TOOLS = dev/data/prepare_shards dev/data/inspect_shard dev/data/train_bpe dev/data/bench_tokenizer

# CUDA: the GPU trainer builds where nvcc exists (it needs no GPU to compile). PRECISION=FP32 builds the all-fp32
# trainer used for exactness checks against the CPU reference; default bf16 mixed precision. GPU_ARCH: sm_90 (Hopper).
NVCC ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
GPU_ARCH ?= sm_90
NVCCFLAGS = -O3 -std=c++17 -arch=$(GPU_ARCH) -Xcompiler -Wall,-Wextra,-Wno-unused-function
NVLDLIBS = -lcublas -lcublasLt
PRECISION ?= BF16
ifeq ($(PRECISION),FP32)
  PRECISION_FLAG = -DENABLE_FP32
endif

# Several GPUs: NCCL is needed, MPI is optional (mpirun launches; the TCP and file rendezvous work without it). Each is
# used only if a test program really compiles and links with it (NO_NCCL=1 / NO_MPI=1 turn them off; MPI_CFLAGS and
# MPI_LDLIBS override what mpicc reports). Without NCCL the trainer is single-GPU and says so.
ifneq ($(NVCC),)
  CUDA_HOME ?= $(abspath $(dir $(NVCC))..)
  ifneq ($(NO_NCCL),1)
    NCCL_OK := $(shell printf '#include <nccl.h>\nint main(void){int v; return ncclGetVersion(&v) != 0;}\n' | \
                 $(CC) -x c - -I$(CUDA_HOME)/include -L$(CUDA_HOME)/lib64 -L$(CUDA_HOME)/lib -lnccl -o /dev/null 2>/dev/null && echo yes)
  endif
  MPI_CFLAGS ?= $(shell mpicc --showme:compile 2>/dev/null)
  MPI_LDLIBS ?= $(shell mpicc --showme:link 2>/dev/null)
  ifneq ($(NO_MPI),1)
    MPI_OK := $(shell printf '#include <mpi.h>\nint main(void){int f; return MPI_Initialized(&f);}\n' | \
                $(CC) -x c - $(MPI_CFLAGS) $(MPI_LDLIBS) -o /dev/null 2>/dev/null && echo yes)
  endif
  ifeq ($(NCCL_OK),yes)
    DIST_FLAGS = -DENABLE_NCCL
    DIST_LIBS = -lnccl
    ifeq ($(MPI_OK),yes)
      DIST_FLAGS += -DENABLE_MPI -DOMPI_SKIP_MPICXX $(MPI_CFLAGS)
      DIST_LIBS += $(MPI_LDLIBS)
      DIST_MSG = multi-GPU: NCCL + MPI (mpirun, TCP or file rendezvous)
    else
      DIST_MSG = multi-GPU: NCCL without MPI (TCP or file rendezvous; install an MPI dev package, e.g. libopenmpi-dev, for mpirun)
    endif
  else
    DIST_MSG = multi-GPU: no (NCCL not found: the CUDA trainer is single-GPU)
  endif
endif

.PHONY: all test clean cuda

all: train_pdn test_pdn test_pdn64 $(DATA_TOOLS)

# (the trainer uses part of the header-only data path, hence -Wno-unused-function)
train_pdn: train_pdn.c $(HEADERS)
	$(CC) $(CFLAGS) -Wno-unused-function $< $(LDLIBS) -o $@

# the CPU tests in fp32, and the gradient checks in fp64 (the same code, real = double)
# (the tests include train_pdn.c without its main, hence -Wno-unused-function)
test_pdn: test_pdn.c test_mqar.h train_pdn.c $(HEADERS)
	$(CC) $(CFLAGS) -Wno-unused-function $< $(LDLIBS) -o $@

test_pdn64: test_pdn.c test_mqar.h train_pdn.c $(HEADERS)
	$(CC) $(CFLAGS) -Wno-unused-function -DPDN_DOUBLE $< $(LDLIBS) -o $@

test: train_pdn test_pdn test_pdn64 $(DATA_TOOLS)
	./test_pdn64
	./test_pdn

# the CUDA trainer (PRECISION=BF16 default, or FP32), and the all-fp32 one under its own name
train_pdncu: train_pdn.cu $(HEADERS)
ifeq ($(NVCC),)
	$(error nvcc not found: install the CUDA toolkit (or set NVCC=/path/to/nvcc) to build the GPU trainer)
endif
	@echo "$(DIST_MSG)"
	$(NVCC) $(NVCCFLAGS) $(PRECISION_FLAG) $(DIST_FLAGS) $< $(NVLDLIBS) $(DIST_LIBS) -o $@

train_pdncu_fp32: train_pdn.cu $(HEADERS)
ifeq ($(NVCC),)
	$(error nvcc not found: install the CUDA toolkit (or set NVCC=/path/to/nvcc) to build the GPU trainer)
endif
	@echo "$(DIST_MSG)"
	$(NVCC) $(NVCCFLAGS) -DENABLE_FP32 $(DIST_FLAGS) $< $(NVLDLIBS) $(DIST_LIBS) -o $@

cuda: train_pdncu train_pdncu_fp32

# the data tools (a tool uses only part of the header-only libraries, hence -Wno-unused-function)
$(DATA_TOOLS): dev/data/%: dev/data/%.c dev/data/data_tools.h utils.h $(DATA_HEADERS)
	$(CC) $(CFLAGS) -Wno-unused-function -I. $< $(LDLIBS) -o $@

clean:
	rm -f train_pdn test_pdn test_pdn64 train_pdncu train_pdncu_fp32 $(DATA_TOOLS)

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

HEADERS = utils.h pdn.h mqar.h train_common.h

.PHONY: all test clean

all: train_pdn test_pdn test_pdn64

train_pdn: train_pdn.c $(HEADERS)
	$(CC) $(CFLAGS) $< $(LDLIBS) -o $@

# the CPU tests in fp32, and the gradient checks in fp64 (the same code, real = double)
# (the tests include train_pdn.c without its main, hence -Wno-unused-function)
test_pdn: test_pdn.c train_pdn.c $(HEADERS)
	$(CC) $(CFLAGS) -Wno-unused-function $< $(LDLIBS) -o $@

test_pdn64: test_pdn.c train_pdn.c $(HEADERS)
	$(CC) $(CFLAGS) -Wno-unused-function -DPDN_DOUBLE $< $(LDLIBS) -o $@

test: train_pdn test_pdn test_pdn64
	./test_pdn64
	./test_pdn

clean:
	rm -f train_pdn test_pdn test_pdn64

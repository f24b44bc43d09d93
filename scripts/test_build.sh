#!/usr/bin/env bash
# The Makefile's promises, checked in a scratch copy of the working tree (CI runs this; ~30 s on 2 cores):
#   - make CFLAGS=... keeps the flags the code needs (-fopenmp where available, -Wall, -std=gnu11)
#   - CC defaults to gcc (make's own default is cc), and CC=... on the command line or in the environment wins
#   - PRECISION=FP32 is refused: the fp32 GPU trainer is train_pdncu_fp32, never a binary named train_pdncu
#   - a binary is rebuilt when the detected configuration changes (here: OpenMP going away), and only then
#   - MPI is found through MPICH's `mpicc -show` when `mpicc --showme:*` (Open MPI) does not answer
#   - WERROR=1 makes warnings errors
set -uo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
tmp="$(mktemp -d /tmp/pdn_test_build.XXXXXX)"
fails=0
check() { if eval "$2"; then echo "  ok: $1"; else echo "  FAIL: $1"; fails=$((fails + 1)); fi; }

(cd "$repo" && git ls-files -z | xargs -0 cp --parents -t "$tmp")
cd "$tmp"
omp=$(make -s config | grep -c 'OpenMP: yes')

out=$(make -s config CFLAGS=-O0)
check "make CFLAGS=-O0 keeps -Wall -std=gnu11" 'grep -q "^CFLAGS .*-O0.*-Wall.*-std=gnu11" <<<"$out"'
[ "$omp" -gt 0 ] && check "make CFLAGS=-O0 keeps -fopenmp" 'grep -q "^CFLAGS .*-fopenmp" <<<"$out"'
check "CC defaults to gcc" '[ "$(env -u CC make -s config | sed -n "s/^CC *//p")" = gcc ]'
check "CC=clang on the command line wins" '[ "$(make -s config CC=clang | sed -n "s/^CC *//p")" = clang ]'
check "CC=cc in the environment wins" '[ "$(CC=cc make -s config | sed -n "s/^CC *//p")" = cc ]'
out=$(make -s config WERROR=1)
check "WERROR=1 adds -Werror" 'grep -q "^CFLAGS .*-Werror" <<<"$out"'

out=$(make train_pdncu PRECISION=FP32 2>&1); rc=$?
check "PRECISION=FP32 is refused with a pointer to train_pdncu_fp32 (rc $rc)" '[ $rc -ne 0 ] && grep -q train_pdncu_fp32 <<<"$out" && [ ! -e train_pdncu ]'

# the stamp: built once, up to date the second time, rebuilt when OpenMP goes away, up to date again
out=$(make train_pdn CFLAGS=-O0 2>&1)
check "train_pdn builds with CFLAGS=-O0" 'grep -q -- "-o train_pdn$" <<<"$out" && [ -x train_pdn ]'
out=$(make train_pdn CFLAGS=-O0 2>&1)
check "a second make with the same configuration rebuilds nothing" '! grep -q -- "-o train_pdn$" <<<"$out"'
out=$(make train_pdn CFLAGS=-O0 NO_OMP=1 2>&1)
check "a changed configuration (NO_OMP=1) rebuilds train_pdn" 'grep -q -- "-o train_pdn$" <<<"$out"'
out=$(make train_pdn CFLAGS=-O0 NO_OMP=1 2>&1)
check "... and then nothing again" '! grep -q -- "-o train_pdn$" <<<"$out"'

# MPICH: a wrapper that answers only -show (the real compiler rejects --showme:*); with a real Open MPI here, the
# wrapper prints its flags in MPICH's form, so the test program really links
mkdir -p "$tmp/fakebin"
real_c="-I/opt/mpich/include -DMPICH_FAKE"; real_l="-L/opt/mpich/lib -lmpich"
if command -v mpicc >/dev/null 2>&1 && mpicc --showme:compile >/dev/null 2>&1; then
    real_c="$(mpicc --showme:compile)"; real_l="$(mpicc --showme:link)"
fi
cat > "$tmp/fakebin/mpicc" <<EOF
#!/bin/sh
[ "\$1" = "-show" ] && { echo "gcc -Wl,-z,relro $real_c $real_l"; exit 0; }
echo "gcc: error: unrecognized command-line option '\$1'" >&2; exit 1
EOF
chmod +x "$tmp/fakebin/mpicc"
out=$(PATH="$tmp/fakebin:$PATH" make -s config)
check "MPICH's mpicc -show gives MPI_CFLAGS (-I/-D) and MPI_LDLIBS (-L/-l)" \
    'grep -qxF "MPI_CFLAGS $real_c" <<<"$out" && grep -qxF "MPI_LDLIBS $real_l" <<<"$out"'
if [ "$real_c" != "-I/opt/mpich/include -DMPICH_FAKE" ] && make -s config | grep -q "NCCL"; then
    check "... and they compile and link an MPI program" 'grep -q "multi-GPU: NCCL + MPI" <<<"$out"'
fi

cd / && rm -rf "$tmp"
if [ $fails -gt 0 ]; then echo "test_build: $fails FAILED"; exit 1; fi
echo "test_build: ALL OK"

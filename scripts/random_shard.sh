#!/usr/bin/env bash
# scripts/random_shard.sh FILE [N]: one llm.c-format shard (uint16 tokens: magic 20240520, version 1, count, the
# header padded to 1024 bytes) of N (default 2^21) uniform random tokens in [0, 32000), seed 1: the benchmarks' data
# (every position has a target, so the classifier does its full work, as in pre-training)
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 FILE [N]" >&2; exit 2; }
perl -e 'my $n = $ARGV[0]; srand(1); print pack("l<3", 20240520, 1, $n), "\0" x 1012;
         print pack("S<*", map { int(rand(32000)) } 1 .. $n)' "${2:-2097152}" > "$1"

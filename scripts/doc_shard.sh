#!/usr/bin/env bash
# scripts/doc_shard.sh: one llm.c-format shard (uint16 tokens: magic 20240520, version 1, count, the header padded to
# 1024 bytes) of packed documents, each after an end-of-text token, id 0 (--doc-mask 1 --eot-id 0); the other tokens
# uniform in [1, VOCAB), seed 1.
#   scripts/doc_shard.sh FILE lengths N VOCAB MEAN   N tokens, document lengths uniform in 1 .. 2 MEAN - 1 (the speed
#                                                    benchmark's ~1,000-token documents: MEAN 1000)
#   scripts/doc_shard.sh FILE grid B T C VOCAB       one window of B x T inputs (+ its last target) whose documents start
#                                                    where the GPU kernels' masks are tested: at a chunk's first, second
#                                                    and last rows, three in a row (one-token documents), one in the
#                                                    middle, and no boundary in some chunks (scripts/doc_check.sh)
#   scripts/doc_shard.sh FILE plain N VOCAB          N tokens in [1, VOCAB): no end-of-text at all
set -euo pipefail
[ $# -ge 4 ] || { echo "usage: $0 FILE lengths N VOCAB MEAN | $0 FILE grid B T C VOCAB | $0 FILE plain N VOCAB" >&2; exit 2; }
file=$1 mode=$2
shift 2
case "$mode" in
lengths)
    [ $# -ge 3 ] || { echo "usage: $0 FILE lengths N VOCAB MEAN" >&2; exit 2; }
    perl -e 'my ($n, $vocab, $mean) = @ARGV; srand(1); print pack("l<3", 20240520, 1, $n), "\0" x 1012;
             my @t; while (@t < $n) { push @t, 0; my $len = 1 + int(rand(2 * $mean - 1));
                                     push @t, 1 + int(rand($vocab - 1)) for 1 .. $len; }
             print pack("S<*", @t[0 .. $n - 1])' "$1" "$2" "$3" > "$file" ;;
grid)
    [ $# -ge 4 ] || { echo "usage: $0 FILE grid B T C VOCAB" >&2; exit 2; }
    # a document starts at t (0 < t < T) of row b where starts(b, t); the token before it is the end-of-text
    perl -e 'my ($B, $T, $C, $vocab) = @ARGV; srand(1); my $n = $B * $T + 1;
             sub starts { my ($b, $t) = @_; return 0 if $t <= 0 || $t >= $T; my ($ch, $i) = (int($t / $C), $t % $C);
                          return $b % 2 == 0 ? ($ch % 3 == 0 ? ($i <= 2 || $i == $C - 1) : $ch % 3 == 1 ? $i == int($C / 2) + 3 : 0)
                                             : ($ch == 0 ? 0 : $ch % 2 == 1 ? ($i == 0 || $i == $C - 2) : ($i >= 5 && $i <= 7)); }
             print pack("l<3", 20240520, 1, $n), "\0" x 1012;
             print pack("S<*", map { my ($b, $t) = (int($_ / $T), $_ % $T); starts($b, $t + 1) ? 0 : 1 + int(rand($vocab - 1)) } 0 .. $n - 1)' \
        "$1" "$2" "$3" "$4" > "$file" ;;
plain)
    perl -e 'my ($n, $vocab) = @ARGV; srand(1); print pack("l<3", 20240520, 1, $n), "\0" x 1012;
             print pack("S<*", map { 1 + int(rand($vocab - 1)) } 1 .. $n)' "$1" "$2" > "$file" ;;
*) echo "$0: unknown mode '$mode' (lengths, grid or plain)" >&2; exit 2 ;;
esac

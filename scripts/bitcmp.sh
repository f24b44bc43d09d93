#!/usr/bin/env bash
# Byte-for-byte comparison of this build against an older one (on a machine with an NVIDIA GPU): one micro-batch's
# --debug-state (logits, loss, every parameter gradient) from ./BIN and OLD_DIR/BIN at shapes that take every kernel
# plan (the 340m layer for each variant, chunks of 32, one long sequence; the state scans with 16 value columns and three
# stage buffers (B <= 2 at 340m), 32 columns and one stage (B = 9: 288 scan blocks) or two (B = 5: 160), the 1b KDA's
# heads of 120, the exact preconditioner, --recompute 1, an attention layer). A change that must not alter
# the arithmetic (a refactor, a new option left off) must print IDENTICAL on every row.
# Usage: scripts/bitcmp.sh OLD_DIR [BIN...]   (OLD_DIR: a checkout of the older revision, e.g. from
#        `git worktree add /tmp/old REV` or `git archive REV | tar -x -C /tmp/old`; it is built there; BIN: train_pdncu
#        train_pdncu_fp32 by default). Exit code 1 if any row differs or fails.
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] && [ -d "$1" ] || { echo "usage: $0 OLD_DIR [BIN...]" >&2; exit 2; }
old=$1; shift
bins=("$@"); [ ${#bins[@]} -gt 0 ] || bins=(train_pdncu train_pdncu_fp32)
make -s "${bins[@]}" || exit 1
make -s -C "$old" "${bins[@]}" || exit 1
tmp=$(mktemp -d /tmp/pdn_bitcmp_XXXXXX)
trap 'rm -rf "$tmp"' EXIT
bad=0
for bin in "${bins[@]}"; do
    while read -r args; do
        # the fp32 build runs the exact kernels everywhere: the 340m rows cover its plan
        [ "$bin" = train_pdncu_fp32 ] && [[ "$args" == *4096* || "$args" == *1b* || "$args" == *attn* ]] && continue
        ./$bin $args --debug-state "$tmp/new.bin" > "$tmp/new.txt" 2>&1; r1=$?
        "$old/$bin" $args --debug-state "$tmp/old.bin" > "$tmp/old.txt" 2>&1; r0=$?
        s=$([ $r0 = 0 ] && [ $r1 = 0 ] && cmp -s "$tmp/new.bin" "$tmp/old.bin" && echo IDENTICAL || echo DIFFERENT)
        [ "$s" = IDENTICAL ] || bad=$((bad + 1))
        printf "%-16s | %-9s | rc old %s new %s | %s\n" "$bin" "$s" "$r0" "$r1" "$args"
    done <<EOF
--preset dn-340m --n-layer 2 --vocab 512 -b 2 -t 256 -d 512
--preset pdn-340m --n-layer 2 --vocab 512 -b 2 -t 256 -d 512
--preset gdn-340m --n-layer 2 --vocab 512 -b 2 -t 256 -d 512
--preset pgdn-340m --n-layer 2 --vocab 512 -b 2 -t 256 -d 512
--preset kda-340m --n-layer 2 --vocab 512 -b 2 -t 256 -d 512
--preset pkda-340m --n-layer 2 --vocab 512 -b 2 -t 256 -d 512
--preset pgdn-340m --n-layer 2 --vocab 512 -b 2 -t 200 -d 400 --chunk 32
--preset pgdn-340m --n-layer 2 --vocab 512 -b 1 -t 4096 -d 4096
--preset kda-340m --n-layer 1 --vocab 512 -b 9 -t 256 -d 2304
--preset pgdn-340m --n-layer 1 --vocab 512 -b 9 -t 256 -d 2304
--preset kda-340m --n-layer 1 --vocab 512 -b 5 -t 256 -d 1280
--preset pkda-340m --n-layer 2 --vocab 512 -b 1 -t 4096 -d 4096
--preset pkda-1b --n-layer 1 --vocab 512 -b 1 -t 1024 -d 1024
--preset pgdn-tiny --precond exact -b 4 -t 100
--preset pgdn-tiny -b 4 -t 100 --recompute 1
--preset pgdn-340m --n-layer 2 --vocab 512 -b 2 -t 256 -d 512 --attn-layers 1
EOF
done
if [ $bad -gt 0 ]; then echo "bitcmp: $bad row(s) differ or failed"; exit 1; fi
echo "bitcmp: every row identical"

#!/usr/bin/env bash
# Train a small PGDN language model on tinyshakespeare on the CPU (a few minutes on a 2-core machine), print its
# loss curve, and sample from the final checkpoint. Nothing but a C compiler, make, and curl or wget when
# ../shared/data/tinyshakespeare.txt is absent (a fresh clone: the text is downloaded once).
#
# Vocabulary: a 512-token byte-level BPE learned from the text itself with dev/data/train_bpe, not GPT-2's 50,257
# tokens. On a CPU the classifier would dominate: with d_model 128 its matmuls cost 6 x vocab x 128 FLOPs per
# token, ~39 MFLOP with GPT-2's vocabulary against ~6 MFLOP for the rest of pgdn-small, so every step would be
# several times slower, and an embedding of 50,257 x 128 (6.4 M parameters, most of them for tokens that
# Shakespeare never uses) would be most of the model. 512 tokens cost ~2 bytes of text each (576k tokens for the
# 1.1 MB) against ~3.3 for GPT-2 (338k), so a 128-token context covers ~250 characters. (The BPE sees the
# whole text, validation part included: it learns 255 merges from 1.1 MB, which leaks nothing a loss depends on.)
#
# Data: llm.c's tinyshakespeare split (--separator '\n\n' --keep-separator 1: every blank-line section is a
# document preceded by <|endoftext|>, so training sees document starts and samples can begin at <|endoftext|>);
# the first 32,768 tokens are the validation shard, the rest the training shard.
#
# Usage: scripts/tinyshakespeare_cpu.sh [OUT_DIR]      (default out/tinyshakespeare_cpu)
#   env STEPS (default 600), THREADS (default 0: all cores)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-out/tinyshakespeare_cpu}
steps=${STEPS:-600}
threads=${THREADS:-0}
make -s train_pdn dev/data/train_bpe dev/data/prepare_shards
mkdir -p "$out/data"

# (a) the text, into $out/data/tinyshakespeare.txt: the shared copy when present, else karpathy's char-rnn copy
# (1,115,394 bytes; the same file)
text=$out/data/tinyshakespeare.txt
if [ ! -f "$text" ]; then
    if [ -f ../shared/data/tinyshakespeare.txt ]; then
        cp ../shared/data/tinyshakespeare.txt "$text"
    else
        url=https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt
        echo "downloading $url"
        if command -v curl >/dev/null 2>&1; then curl -fsSL -o "$text.tmp" "$url"; else wget -q -O "$text.tmp" "$url"; fi
        mv "$text.tmp" "$text"
    fi
fi
./dev/data/train_bpe --vocab-size 512 --out-dir "$out/tok" --quiet 1 "$text"

# (b) shards: validation first (the first 32,768 tokens), then training
./dev/data/prepare_shards --tokenizer "$out/tok/tokenizer.bin" --out "$out/data/tiny" --val-tokens 32768 \
    --separator '\n\n' --keep-separator 1 --quiet 1 "$text"

# (c) train pgdn-small (d 128, 4 heads of 32, 4 layers; vocabulary 512 from the tokenizer) on 16 x 128 tokens per
# step; the per-token mixer is the faster form on a CPU (the chunkwise one gives the same model). Val loss every
# 100 steps over the whole validation split, a decoded sample every 200.
rm -rf "$out/run"
./train_pdn --preset pgdn-small --mixer token --threads "$threads" \
    -i "$out/data/tiny_train_*.bin" -j "$out/data/tiny_val_*.bin" --tokenizer "$out/tok/tokenizer.bin" \
    -b 16 -t 128 -x "$steps" -l 3e-3 -u 30 -v 100 -m -1 -s 200 -g 96 -o "$out/run" | tee "$out/train.txt"

# the loss curve: at every evaluation, the mean training loss of the steps since the previous one, and the val loss
echo
echo "loss curve (train: the mean over the steps since the previous row; val: the whole validation split)"
echo "  step | train loss | val loss"
awk '/^s:[0-9]+ trl:/ { split($1, a, ":"); split($2, b, ":"); sum += b[2]; n++ }
     /^s:[0-9]+ vl:/  { split($1, a, ":"); split($2, b, ":"); printf "%6d | %10.4f | %8.4f\n", a[2], sum / n, b[2]; sum = 0; n = 0 }' \
    "$out/run/main.log"
grep '^done' "$out/train.txt"

# (d) a sample from the final checkpoint
echo
ckpt=$(printf '%s/run/model_%08d.bin' "$out" "$steps")
echo "./train_pdn -e $ckpt --tokenizer $out/tok/tokenizer.bin --generate 200 --prompt 'ROMEO:' --temperature 0.8 --top-k 40"
./train_pdn -e "$ckpt" --tokenizer "$out/tok/tokenizer.bin" --generate 200 --prompt 'ROMEO:' --temperature 0.8 --top-k 40

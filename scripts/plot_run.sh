#!/usr/bin/env bash
# PNG plots of a run's output directory (train_pdn / train_pdncu -o OUTDIR), no Python: awk and gnuplot (Debian's
# gnuplot-nox, installed with apt-get when missing and run as root).
#   from OUTDIR/main.log:  loss_step.png (train and val loss against the step), loss_tokens.png (the same against
#                          tokens seen), lr.png (learning rate), toks.png (training tok/s per step)
#   from --eval tables:    eval_sniah*.tsv -> sniah_accuracy.png (accuracy against length, one line per task);
#                          eval_ppl.tsv -> ppl_bpb.png (bits per byte and loss against the window length)
# Tokens per step come from the newest state_*.bin (batch x seq_len x grad_accum x nproc); without one the
# token plots are left out. The data files behind the plots go to OUTDIR/plots/*.dat.
# Usage: scripts/plot_run.sh OUTDIR     Exit: 0, 1 bad input, 4 gnuplot missing.
set -euo pipefail
out=${1:?usage: scripts/plot_run.sh OUTDIR}
[ -d "$out" ] || { echo "plot_run: $out is not a directory" >&2; exit 1; }
dat=$out/plots
mkdir -p "$dat"
if ! command -v gnuplot >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing gnuplot-nox (apt-get)"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gnuplot-nox; } \
        >/dev/null 2>&1 || true
fi
command -v gnuplot >/dev/null 2>&1 || { echo "plot_run: gnuplot is missing (Debian: apt-get install gnuplot-nox)" >&2; exit 4; }

plots=()
gp() { gnuplot -e "set terminal pngcairo size 900,560 noenhanced; set grid; set key top right; $1" 2>/dev/null ||
       gnuplot -e "set terminal png size 900,560 noenhanced; set grid; set key top right; $1"; }

if [ -f "$out/main.log" ]; then
    tps=0
    st=$(ls "$out"/state_*.bin 2>/dev/null | sort | tail -1 || true)
    if [ -n "$st" ]; then
        tps=$(head -c 2048 "$st" | tr -c '[:print:]\n' '\n' | awk '$1=="batch"{b=$2} $1=="seq_len"{t=$2} $1=="grad_accum"{a=$2}
              $1=="nproc"{p=$2} END{print b*t*a*p+0}')
    fi
    # s:STEP trl:L norm:N lr:LR ms:MS  /  s:STEP vl:L
    awk -v tps="$tps" '/^s:[0-9]+ trl:/ { split($1,s,":"); split($2,l,":"); split($4,r,":"); split($5,m,":");
            print s[2], s[2]*tps, l[2], r[2], (m[2] > 0 && tps > 0) ? tps / (m[2] / 1000) : 0 }' "$out/main.log" > "$dat/train.dat"
    awk -v tps="$tps" '/^s:[0-9]+ vl:/ { split($1,s,":"); split($2,l,":"); print s[2], s[2]*tps, l[2] }' "$out/main.log" > "$dat/val.dat"
    [ -s "$dat/train.dat" ] || { echo "plot_run: $out/main.log has no training steps" >&2; exit 1; }
    val=""
    [ -s "$dat/val.dat" ] && val=", '$dat/val.dat' using 1:3 with linespoints lw 2 title 'val loss'"
    gp "set output '$out/loss_step.png'; set xlabel 'step'; set ylabel 'loss (nats/token)';
        plot '$dat/train.dat' using 1:3 with lines title 'train loss'$val"
    gp "set output '$out/lr.png'; set xlabel 'step'; set ylabel 'learning rate'; plot '$dat/train.dat' using 1:4 with lines title 'lr'"
    plots+=("$out/loss_step.png" "$out/lr.png")
    if [ "$tps" -gt 0 ]; then
        valt=""
        [ -s "$dat/val.dat" ] && valt=", '$dat/val.dat' using 2:3 with linespoints lw 2 title 'val loss'"
        gp "set output '$out/loss_tokens.png'; set xlabel 'tokens'; set ylabel 'loss (nats/token)';
            plot '$dat/train.dat' using 2:3 with lines title 'train loss'$valt"
        gp "set output '$out/toks.png'; set xlabel 'step'; set ylabel 'tokens/s'; plot '$dat/train.dat' using 1:5 with lines title 'tok/s'"
        plots+=("$out/loss_tokens.png" "$out/toks.png")
    else
        echo "plot_run: no state_*.bin in $out: tokens per step unknown, loss_tokens.png and toks.png left out"
    fi
fi

# S-NIAH: the rows with depth "all" (length, accuracy)
sn=()
for f in "$out"/eval_sniah[123].tsv; do
    [ -f "$f" ] || continue
    name=$(basename "$f" .tsv); name=${name#eval_}
    awk -F'\t' 'NR > 1 && $2 == "all" { print $1, 100 * $5 }' "$f" > "$dat/$name.dat"
    [ -s "$dat/$name.dat" ] || continue
    sn+=("'$dat/$name.dat' using 1:2 with linespoints lw 2 title '$name'")
done
if [ ${#sn[@]} -gt 0 ]; then
    gp "set output '$out/sniah_accuracy.png'; set logscale x 2; set xlabel 'length (tokens)'; set ylabel 'accuracy (%)';
        set yrange [-2:102]; plot $(IFS=,; echo "${sn[*]}")"
    plots+=("$out/sniah_accuracy.png")
fi
awk -F'\t' 'NR > 1 { print $1, $8, $6 }' "$out/eval_ppl.tsv" > "$dat/ppl.dat" 2>/dev/null || true
if [ -s "$dat/ppl.dat" ]; then
    gp "set output '$out/ppl_bpb.png'; set logscale x 2; set xlabel 'window length (tokens)'; set ylabel 'bits per byte';
        set y2label 'loss (nats/token)'; set ytics nomirror; set y2tics;
        plot '$dat/ppl.dat' using 1:2 with linespoints lw 2 title 'bpb', '' using 1:3 axes x1y2 with linespoints title 'loss'"
    plots+=("$out/ppl_bpb.png")
fi
[ ${#plots[@]} -gt 0 ] || { echo "plot_run: nothing to plot in $out (no main.log, no eval_*.tsv)" >&2; exit 1; }
printf 'wrote %s\n' "${plots[@]}"

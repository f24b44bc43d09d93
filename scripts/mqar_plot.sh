#!/usr/bin/env bash
# The summary and the plot of an MQAR sweep (scripts/mqar_sweep.sh OUTDIR calls it; run it alone where gnuplot exists,
# e.g. on a sweep's OUTDIR copied from the GPU machine): from OUTDIR/runs.tsv and OUTDIR/sweep.env
#   OUTDIR/summary.tsv   per (variant, L, N): the best learning rate (highest mean accuracy over the seeds, as
#                        Zoology reports the best lr), its seeds, mean and sample std, and every lr's mean
#   OUTDIR/summary.md    the same as tables (one per family: N fixed, N = L/ratio) and preconditioned vs baseline
#   OUTDIR/mqar.png      accuracy vs L, one line per variant with mean +- std error bars, one panel per family
# No Python: awk and gnuplot (Debian's gnuplot-nox, installed with apt-get when missing and possible).
# Exit: 0, 1 bad input, 4 gnuplot missing (the summary is written all the same).
set -euo pipefail
OUT=${1:-}
[ -n "$OUT" ] && [ -f "$OUT/runs.tsv" ] && [ -f "$OUT/sweep.env" ] || {
    echo "usage: scripts/mqar_plot.sh OUTDIR   (OUTDIR: a scripts/mqar_sweep.sh output with runs.tsv and sweep.env)" >&2
    exit 1
}
# shellcheck disable=SC1091
. "$OUT/sweep.env"
[ "$(wc -l < "$OUT/runs.tsv")" -gt 1 ] || { echo "mqar_plot: $OUT/runs.tsv has no runs yet" >&2; exit 1; }

DAT="$OUT/plot"
rm -rf "$DAT"
mkdir -p "$DAT"
awk -F'\t' -v OFS='\t' -v nfix="$NFIX" -v ratio="$RATIO" -v lengths="$LENGTHS" -v variants="$VARIANTS" \
    -v sum_tsv="$OUT/summary.tsv" -v sum_md="$OUT/summary.md" -v dat="$DAT" '
NR == 1 { next }
$15 == "ok" || $15 == "diverged" {
    k = $1 SUBSEP $2 SUBSEP $3 SUBSEP $8
    n[k]++; s[k] += $12; ss[k] += $12 * $12; st[k] += $10
    cell[$1 SUBSEP $2 SUBSEP $3] = 1; lrs[$8] = 1
    if ($15 == "diverged") { div[k]++ }
}
function fam(L, N) { return (N == nfix && N * ratio == L) ? "both" : N == nfix ? "fixed" : N * ratio == L ? "ratio" : "other" }
function infam(f, L, N) { return fam(L, N) == f || fam(L, N) == "both" }
function sd(k,   m, v) { if (n[k] < 2) { return 0 } m = s[k] / n[k]; v = (ss[k] - n[k] * m * m) / (n[k] - 1); return v > 0 ? sqrt(v) : 0 }
END {
    nl = 0; for (x in lrs) { lr[++nl] = x }
    for (i = 2; i <= nl; i++) { for (j = i; j > 1 && lr[j - 1] + 0 > lr[j] + 0; j--) { t = lr[j]; lr[j] = lr[j - 1]; lr[j - 1] = t } }
    nv = split(variants, V, " "); nL = split(lengths, LL, " ")
    print "variant", "L", "N", "family", "best_lr", "seeds", "mean_acc", "std_acc", "mean_steps", "diverged", "acc_by_lr" > sum_tsv
    for (c in cell) {
        split(c, p, SUBSEP); best = ""
        for (i = 1; i <= nl; i++) {
            k = c SUBSEP lr[i]
            if (!(k in n)) { continue }
            if (best == "" || s[k] / n[k] > s[best] / n[best]) { best = k; blr = lr[i] }
        }
        by = ""
        for (i = 1; i <= nl; i++) { k = c SUBSEP lr[i]; if (k in n) { by = by (by == "" ? "" : ",") sprintf("%s:%.2f/%d", lr[i], s[k] / n[k], n[k]) } }
        M[c] = s[best] / n[best]; S[c] = sd(best); NS[c] = n[best]; BL[c] = blr
        print p[1], p[2], p[3], fam(p[2], p[3]), blr, n[best], sprintf("%.2f", M[c]), sprintf("%.2f", S[c]),
              sprintf("%.0f", st[best] / n[best]), div[best] + 0, by > sum_tsv
    }
    nf = split("fixed ratio", F, " ")
    title["fixed"] = "N = " nfix " pairs"; title["ratio"] = "N = L/" ratio " pairs"
    print "Accuracy (%) on the test set: mean +- sample std over the seeds at the best learning rate of the cell (in parentheses; seeds after the slash)." > sum_md
    for (f = 1; f <= nf; f++) {
        hdr = "| variant |"; rule = "|---|"; any = 0
        for (i = 1; i <= nL; i++) {
            L = LL[i]; N = F[f] == "fixed" ? nfix : L / ratio
            colN[i] = N; hdr = hdr " L " L ", N " N " |"; rule = rule "---|"
        }
        body = ""
        for (v = 1; v <= nv; v++) {
            row = "| " V[v] " |"
            for (i = 1; i <= nL; i++) {
                c = V[v] SUBSEP LL[i] SUBSEP colN[i]
                if (c in M) { row = row sprintf(" %.1f +- %.1f (%s/%d) |", M[c], S[c], BL[c], NS[c]); any = 1 } else { row = row " - |" }
                if (c in M) {
                    fn = dat "/" F[f] "_" V[v] ".dat"
                    printf "%s %.3f %.3f\n", LL[i], M[c], S[c] > fn
                }
            }
            body = body row "\n"
        }
        if (any) { printf "\n### %s\n\n%s\n%s\n%s", title[F[f]], hdr, rule, body > sum_md }
    }
    # preconditioned vs baseline, cell by cell: higher / within spread / lower, spread = the two stds added
    printf "\n### Preconditioned vs baseline (difference of the means; within spread: |difference| <= std + std)\n\n" > sum_md
    printf "| pair | L | N | difference | verdict |\n|---|---|---|---|---|\n" > sum_md
    np = split("pdn:dn pgdn:gdn pkda:kda", P, " ")
    for (q = 1; q <= np; q++) {
        split(P[q], ab, ":")
        for (i = 1; i <= nL; i++) {
            for (f = 1; f <= nf; f++) {
                L = LL[i]; N = F[f] == "fixed" ? nfix : L / ratio
                if (F[f] == "ratio" && N == nfix) { continue } # the shared cell once
                a = ab[1] SUBSEP L SUBSEP N; b = ab[2] SUBSEP L SUBSEP N
                if (!(a in M) || !(b in M)) { continue }
                d = M[a] - M[b]; w = S[a] + S[b]
                verdict = (NS[a] < 2 || NS[b] < 2) ? "one seed: no spread" : d > w ? "higher" : -d > w ? "lower" : "within spread"
                printf "| %s vs %s | %s | %s | %+.1f (+- %.1f) | %s |\n", ab[1], ab[2], L, N, d, w, verdict > sum_md
            }
        }
    }
}' "$OUT/runs.tsv"
# summary.tsv: header first, then by variant order, L, N
{ head -1 "$OUT/summary.tsv"; tail -n +2 "$OUT/summary.tsv" | awk -F'\t' -v variants="$VARIANTS" \
    'BEGIN { n = split(variants, v, " "); for (i = 1; i <= n; i++) { o[v[i]] = i } } { print o[$1] "\t" $0 }' |
    sort -t$'\t' -k1,1n -k3,3n -k4,4n | cut -f2-; } > "$OUT/summary.tsv.s" && mv "$OUT/summary.tsv.s" "$OUT/summary.tsv"
for f in "$DAT"/*.dat; do sort -n "$f" -o "$f"; done
echo "summary: $OUT/summary.tsv, $OUT/summary.md"

if ! command -v gnuplot >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "installing gnuplot-nox (apt-get)"
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gnuplot-nox; } \
            >/dev/null 2>&1 || true
    fi
fi
if ! command -v gnuplot >/dev/null 2>&1; then
    echo "mqar_plot: gnuplot is missing and could not be installed (Debian: apt-get install gnuplot-nox): no plot;" \
         "the summary is complete. Draw it where gnuplot exists: scripts/mqar_plot.sh $OUT" >&2
    exit 4
fi

term="pngcairo size 1400,560 font 'Sans,11'"
gnuplot -e "set terminal pngcairo" >/dev/null 2>&1 || term="png size 1400,560"
lmin=$(echo $LENGTHS | tr ' ' '\n' | sort -n | head -1)
lmax=$(echo $LENGTHS | tr ' ' '\n' | sort -n | tail -1)
xtics=$(echo $LENGTHS | tr ' ' '\n' | sort -n | awk '{ printf("%s\"%s\" %s", (NR > 1 ? ", " : ""), $1, $1) }')
seeds=$(awk -F'\t' 'NR > 1 { print $9 }' "$OUT/runs.tsv" | sort -u | wc -l)
lrs=$(awk -F'\t' 'NR > 1 { print $8 }' "$OUT/runs.tsv" | sort -g -u | paste -sd, -)
{
    echo "set terminal $term"
    echo "set output '$OUT/mqar.png'"
    echo "set termoption noenhanced"
    # two lines: one is wider than the picture
    echo "set multiplot layout 1,2 title \"MQAR, Zoology's generator (vocab $VOCAB): $N_LAYER layers, d_model $D_MODEL, $HEADS heads of $HEAD_DIM; $STEPS steps of $TOKENS tokens\\nbest lr of {$lrs}; mean +- std over $seeds seed(s); $DEVICE, $DATE\" font ',12'"
    echo "set logscale x 2"
    echo "set xrange [$lmin / 1.3 : $lmax * 1.3]"
    echo "set xtics ($xtics)"
    echo "set yrange [0:105]"
    echo "set ytics 0,20,100"
    echo "set grid"
    echo "set xlabel 'sequence length L'"
    echo "set ylabel 'accuracy (%)'"
    echo "set key outside right top box"
    for f in fixed ratio; do
        [ "$f" = fixed ] && t="N = $NFIX pairs" || t="N = L/$RATIO pairs"
        echo "set title '$t'"
        plots=()
        for v in $VARIANTS; do
            [ -s "$DAT/${f}_$v.dat" ] || continue
            case $v in dn|pdn) col='#1f77b4' ;; gdn|pgdn) col='#d62728' ;; *) col='#2ca02c' ;; esac
            case $v in p*) style="lw 2 dt 1 pt 7" ;; *) style="lw 2 dt 2 pt 6" ;; esac
            plots+=("'$DAT/${f}_$v.dat' using 1:2:3 with yerrorlines lc rgb '$col' $style ps 1.2 title '$v'")
        done
        if [ ${#plots[@]} = 0 ]; then
            echo "set label 1 'no cells' at graph 0.5, 0.5 center"
            echo "plot 1/0 notitle"
            echo "unset label 1"
        else
            (IFS=,; echo "plot ${plots[*]}")
        fi
    done
    echo "unset multiplot"
} > "$DAT/mqar.gp"
gnuplot "$DAT/mqar.gp"
echo "plot: $OUT/mqar.png"

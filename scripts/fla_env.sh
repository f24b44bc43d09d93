# scripts/fla_env.sh, sourced by the scripts that run fla (check_fla_export.sh, bench_fla.sh): checks that FLA_DIR
# (default .fla, relative to the repository root) holds an fla source tree, puts it on PYTHONPATH and checks that
# $PYTHON (default python3) imports the modules named in $1 ("torch, transformers, ..."); exits 1 with a hint if not.
FLA_DIR=${FLA_DIR:-.fla}
PYTHON=${PYTHON:-python3}
if [ ! -f "$FLA_DIR/fla/__init__.py" ]; then
    echo "error: no fla source tree at '$FLA_DIR' (expected $FLA_DIR/fla/__init__.py)" >&2
    echo "  hint: copy fla-org/flash-linear-attention's fla/ directory there, or set FLA_DIR" >&2
    exit 1
fi
export PYTHONPATH="$(cd "$FLA_DIR" && pwd)${PYTHONPATH:+:$PYTHONPATH}"
"$PYTHON" -c "import $1" || {
    echo "error: $PYTHON lacks one of $1 (see the message above)" >&2
    echo "  hint: einops is pure Python: an einops source tree beside fla/ in FLA_DIR works too" >&2
    exit 1
}

"""fla_lm_eval.py: lm-evaluation-harness with fla's models registered (and fla_compat's transformers-5 fix applied).

    PYTHONPATH=/path/to/flash-linear-attention python scripts/fla_lm_eval.py --model hf \
        --model_args pretrained=DIR,dtype=bfloat16,max_length=2048 --tasks wikitext,lambada_openai --batch_size 16

Every argument goes to lm_eval's own command line (`python -m lm_eval ...`), run in this process after fla is
imported, so `--model hf` finds fla's model types.
"""
import os
import runpy
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fla_compat  # noqa: E402

fla_compat.patch()
sys.argv = ["lm_eval"] + sys.argv[1:]
runpy.run_module("lm_eval", run_name="__main__", alter_sys=True)

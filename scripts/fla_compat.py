"""fla_compat.py: import fla and make its tied models load under transformers 5.

fla (fla-org/flash-linear-attention, bc3b101d) declares `_tied_weights_keys = ["lm_head.weight"]` (a list) on its
*ForCausalLM classes. transformers 5 expects a mapping {tied key: source key} and calls `.keys()` on it when
`tie_word_embeddings` is true (PreTrainedModel.get_expanded_tied_weights_keys: "'list' object has no attribute
'keys'", transformers issue #44861), so a tied fla model -- the paper's configs and pdn.c's default -- fails to build.
patch() gives those classes the mapping they mean (lm_head.weight is the embedding, model.embeddings.weight);
under transformers 4, or where fla already uses a mapping, it changes nothing.

    import fla_compat; fla_compat.patch()     # before from_pretrained / from_config / lm_eval
"""
import importlib
import sys

FLA_CLASSES = ["DeltaNetForCausalLM", "GatedDeltaNetForCausalLM", "KDAForCausalLM",
               "PrecondGatedDeltaNetForCausalLM", "PrecondKDAForCausalLM"]


def import_fla():
    try:
        import fla  # noqa: F401  (registers fla's model types with AutoConfig / AutoModelForCausalLM)
        models = importlib.import_module("fla.models")
    except Exception as e:  # the message names what is missing (torch, triton, einops, transformers, fla itself)
        sys.exit(f"error: cannot import fla ({type(e).__name__}: {e})\n"
                 "  hint: put fla's source tree on PYTHONPATH (the directory that holds fla/), e.g. "
                 "PYTHONPATH=$PWD/.fla")
    return models


def patch():
    import transformers
    models = import_fla()
    major = int(transformers.__version__.split(".")[0])
    patched = []
    for name in FLA_CLASSES:
        cls = getattr(models, name, None)
        if cls is None:
            sys.exit(f"error: fla.models has no {name}: this fla is older than the one pdn.c's export targets (bc3b101d)")
        if major >= 5 and isinstance(cls.__dict__.get("_tied_weights_keys"), (list, tuple)):
            cls._tied_weights_keys = {"lm_head.weight": "model.embeddings.weight"}
            patched.append(name)
    return patched

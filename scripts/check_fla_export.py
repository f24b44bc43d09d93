#!/usr/bin/env python3
"""check_fla_export.py: pdn.c's --export-hf / --import-hf checked against fla itself (run by check_fla_export.sh).

Forward (pdn.c -> fla), for dn, pdn, gdn, pgdn, kda, pkda and kda with --out-gate 0: train a tiny model a few steps with train_pdncu on text
(a 512-token BPE learned from the repository's READMEs), export it (fp32 and bf16), load it with
AutoModelForCausalLM.from_pretrained (fla imported; output_loading_info: no missing, unexpected or mismatched keys;
every parameter equal to the file, the tied head being the embedding), run it on the token batch that
`train_pdncu_fp32 --debug-state` wrote, and compare the logits and the loss with that file's.
Reverse (fla -> pdn.c), for the five fla classes: a model created by fla (AutoModelForCausalLM.from_config, weights
drawn here so that every path matters), save_pretrained, every config field equal to the class default removed
(pdn.c must apply fla's defaults), reloaded by fla, imported by --import-hf, -e trains from it, and
`train_pdncu_fp32 --debug-state` on it is compared with fla's logits in the same way.
--variants pgdn-attn (opt-in; fla's Attention needs flash-attn): the same for a hybrid whose layer 1 is attention, which
checks the export's rotary embedding and grouped-query layout against fla's.
The tokenizer files: AutoTokenizer loads the export and encodes a document exactly as pdn.c's tokenizer does.

Tolerances (logits; ref = pdn.c fp32, whose own rounding is ~1e-6 relative):
  fp32: fla's Triton kernels take TF32 products on Hopper (chunk_fwd.py/chunk_intra.py solve the intra-chunk system
        with input_precision 'tf32'; other tl.dot calls follow TRITON_F32_DEFAULT, tf32 by default). TF32 keeps 11
        significant bits: unit roundoff u = 2^-11 = 4.9e-4 per input. A logit passes through ~6 such products in
        series per layer (scores, the triangular solve, W/U, the state, the two output terms), so with L = 2 layers
        the expected relative L2 error is ~u * sqrt(6 L) = 1.7e-3. Criteria: L2 relative error <= 1e-2 (6x that),
        max |diff| <= 2e-2 of max |ref|, argmax agreement >= 99%, mean loss within 1e-3 relative. (dn runs fla's
        fused_recurrent kernel in fp32: fla's chunk_delta_rule refuses float32.)
  bf16: weights and activations rounded to 8 significant bits (u = 2^-9 = 2e-3) at ~30 places per layer: expected
        ~2e-3 * sqrt(30 L) = 1.5e-2; criteria L2 <= 5e-2 (the repository's bf16 criterion, test_pdn --compare),
        argmax >= 95%, loss within 1e-2 relative.
Exit status: 0 if every row passes, 1 otherwise (each failure says what failed).
"""
import argparse
import glob
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
# kda-gate: kda with --out-gate 0, exported with fla's output gate held open (g_proj = 0, bias 100)
VARIANTS = ["dn", "pdn", "gdn", "pgdn", "kda", "pkda", "kda-gate"]
# opt-in (--variants pgdn-attn): a hybrid (issue 19) whose layer 1 is fla's Attention (2 heads of 32 on 1 kv head, the
# rotary embedding); fla's Attention needs the flash-attn package, which is why it is not in the default list
EXTRA = {"pgdn-attn": ["--attn-layers", "1", "--attn-kv-heads", "1"]}
MODEL_TYPE = {"dn": "delta_net", "pdn": "precond_gated_deltanet", "gdn": "gated_deltanet",
              "pgdn": "precond_gated_deltanet", "kda": "kda", "pkda": "precond_kda", "kda-gate": "kda",
              "pgdn-attn": "precond_gated_deltanet"}
# the reverse direction: one model per fla class, shapes and ties varied (d 64, 2 heads, 2 layers)
REVERSE = [
    ("delta_net", dict(expand_k=1.0, expand_v=1.0, use_gate=False, tie_word_embeddings=True)),
    ("gated_deltanet", dict(head_dim=32, expand_v=2.0, use_gate=False, tie_word_embeddings=False)),
    ("precond_gated_deltanet", dict(head_dim=32, expand_v=1.0, use_gate=False, tie_word_embeddings=True)),
    ("kda", dict(head_dim=32, expand_v=1.0, tie_word_embeddings=True)),
    ("precond_kda", dict(head_dim=32, expand_v=1.0, tie_word_embeddings=False)),
]
CRIT = {"fp32": dict(l2=1e-2, mx=2e-2, agree=0.99, loss=1e-3), "bf16": dict(l2=5e-2, mx=1e-1, agree=0.95, loss=1e-2)}
B, T = 4, 128   # the compared batch: T > 64 so that fla runs its chunk kernels, not the short-input recurrent path

failures = []


def fail_row(what):
    failures.append(what)
    print(f"FAIL: {what}", flush=True)


def run(cmd, what):
    print("+ " + " ".join(cmd), flush=True)
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        print(r.stdout)
        sys.exit(f"error: {what} failed (exit {r.returncode}): {' '.join(cmd)}")
    return r.stdout


# ---- pdn.c's files, read without torch

def read_debug_state(path):
    """A --debug-state file (train_common.h): text header, then int32 x[B*T], y[B*T], f32 logits[B*T*V], grads."""
    data = open(path, "rb").read()
    if not data.startswith(b"PDNDEBUG\n"):
        sys.exit(f"error: {path} is not a pdn.c debug-state file")
    hb = int(re.search(rb"\nheader_bytes (\d+)\n", data[:200]).group(1))
    head = data[:hb].split(b"\0")[0].decode()
    kv = {}
    for line in head.splitlines()[1:]:
        k, _, v = line.partition(" ")
        kv.setdefault(k, v)
    crc_at = head.index("\ncrc32 ") + 1
    if zlib.crc32(data[:crc_at] + data[hb:]) != int(kv["crc32"], 16):
        sys.exit(f"error: {path}: checksum mismatch")
    b, t, v = int(kv["batch"]), int(kv["seq_len"]), int(kv["vocab_size"])
    n = b * t
    x = struct.unpack_from(f"<{n}i", data, hb)
    y = struct.unpack_from(f"<{n}i", data, hb + 4 * n)
    return dict(B=b, T=t, V=v, x=x, y=y, loss=float(kv["loss"]), logits_offset=hb + 8 * n, raw=data,
                precision=kv.get("precision", "?"))


def read_shard_tokens(path):
    data = open(path, "rb").read()
    magic, version, lo, hi = struct.unpack_from("<4i", data, 0)
    count = lo + (hi << 32)
    fmt = "H" if magic == 20240520 else "I"
    return list(struct.unpack_from(f"<{count}{fmt}", data, 1024))


# ---- the comparisons (torch from here on)

def tf_kwargs(dtype):
    import transformers
    return {("dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"): dtype}


def load_fla(path, dtype, what, **over):
    import torch  # noqa: F401
    from transformers import AutoModelForCausalLM
    model, info = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True, **tf_kwargs(dtype), **over)
    get = info.get if isinstance(info, dict) else (lambda k: getattr(info, k, None))   # a dict up to now
    bad = {k: sorted(str(x) for x in (get(k) or [])) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    for k, v in bad.items():
        if v:
            fail_row(f"{what}: from_pretrained reports {k}: {v[:8]}{' ...' if len(v) > 8 else ''}")
    return model, not any(bad.values())


def params_equal_file(model, path, what):
    """Every tensor of model.safetensors equals the loaded parameter bit for bit; a tied head is the embedding."""
    import torch
    from safetensors.torch import load_file
    file = load_file(os.path.join(path, "model.safetensors"))
    sd = model.state_dict()
    ok = True
    for k, v in file.items():
        if k not in sd or not torch.equal(sd[k].detach().cpu().to(v.dtype), v):
            fail_row(f"{what}: parameter {k} differs from the file (or is absent from the model)")
            ok = False
    extra = set(sd) - set(file)
    tied = model.config.tie_word_embeddings
    if extra - ({"lm_head.weight"} if tied else set()):
        fail_row(f"{what}: the model has parameters the file lacks: {sorted(extra)[:8]}")
        ok = False
    if tied and model.lm_head.weight.data_ptr() != model.model.embeddings.weight.data_ptr():
        fail_row(f"{what}: tie_word_embeddings is true but lm_head is not the embedding")
        ok = False
    return ok


def compare(model, dbg, what, crit):
    import torch
    import torch.nn.functional as F
    x = torch.tensor(dbg["x"], dtype=torch.long).view(dbg["B"], dbg["T"]).cuda()
    y = torch.tensor(dbg["y"], dtype=torch.long).view(-1)
    ref = torch.frombuffer(bytearray(dbg["raw"][dbg["logits_offset"]:dbg["logits_offset"] + 4 * x.numel() * dbg["V"]]),
                           dtype=torch.float32).view(-1, dbg["V"]).double()
    model = model.cuda().eval()
    with torch.no_grad():
        got = model(input_ids=x, use_cache=False).logits.double().cpu().reshape(-1, dbg["V"])
    diff = (got - ref).abs()
    mx = (diff.max() / ref.abs().max()).item()
    l2 = (diff.norm() / ref.norm()).item()
    agree = (got.argmax(-1) == ref.argmax(-1)).double().mean().item()
    top2 = ref.topk(2, dim=-1).values
    close = int(((top2[:, 0] - top2[:, 1]) <= 2 * diff.max(-1).values).sum())   # near-ties: where argmax may flip
    m = y >= 0
    loss_fla = F.cross_entropy(got[m], y[m]).item()
    loss_ref_py = F.cross_entropy(ref[m], y[m]).item()
    if abs(loss_ref_py - dbg["loss"]) > 1e-5 * abs(dbg["loss"]):
        fail_row(f"{what}: the debug file's loss {dbg['loss']:.6f} is not its logits' cross-entropy {loss_ref_py:.6f}")
    lrel = abs(loss_fla - dbg["loss"]) / abs(dbg["loss"])
    ok = all(math.isfinite(v) for v in (mx, l2, loss_fla))
    ok = ok and l2 <= crit["l2"] and mx <= crit["mx"] and agree >= crit["agree"] and lrel <= crit["loss"]
    if not ok:
        fail_row(f"{what}: logits max {mx:.2e} (<= {crit['mx']}), L2 {l2:.2e} (<= {crit['l2']}), argmax {agree:.4f} "
                 f"(>= {crit['agree']}; {close} near-ties), loss {loss_fla:.6f} vs {dbg['loss']:.6f} ({lrel:.2e} <= {crit['loss']})")
    # as it comes (a run cut short by a time limit still shows what it compared; the table repeats it at the end)
    print(f"{what}: logits max rel {mx:.2e}, L2 rel {l2:.2e}, argmax {100 * agree:.2f}% ({close} near-ties), "
          f"loss {loss_fla:.6f} vs {dbg['loss']:.6f}: {'ok' if ok else 'FAIL'}", flush=True)
    return dict(mx=mx, l2=l2, agree=agree, close=close, loss_c=dbg["loss"], loss_fla=loss_fla, lrel=lrel, ok=ok)


def randomize(model, seed):
    """Weights with every path active (as test_pdn's randomize_params) and decays of trained-model size: matrices
    N(0, 0.3), the decay projections (a_proj, a_atk_proj, f_proj) N(0, 0.05), norms 1 + N(0, 0.1), exp(A_log) in
    (0.14, 1), softplus(dt_bias) in (0.02, 0.31) -- a log-decay of -0.002 .. -0.3 per token -- and log_atk_scale
    in (-0.5, 0.5)."""
    import torch
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            shape = p.shape
            if name.endswith(("A_log", "A_log_atk")):
                v = torch.rand(shape, generator=g) * 2.0 - 2.0
            elif name.endswith(("dt_bias", "dt_bias_atk")):
                v = torch.rand(shape, generator=g) * 3.0 - 4.0
            elif name.endswith("log_atk_scale"):
                v = torch.rand(shape, generator=g) - 0.5
            elif "norm" in name:
                v = 1.0 + 0.1 * torch.randn(shape, generator=g)
            elif any(f".{k}." in name for k in ("a_proj", "a_atk_proj", "f_proj")):
                v = 0.05 * torch.randn(shape, generator=g)
            else:
                v = 0.3 * torch.randn(shape, generator=g)
            p.copy_(v.to(p.dtype))


def strip_defaults(path):
    """Removes from config.json every field equal to its class default: pdn.c's import must then apply fla's
    defaults to give the same model. Returns the removed names."""
    from transformers import AutoConfig
    cfg_path = os.path.join(path, "config.json")
    d = json.load(open(cfg_path))
    default = AutoConfig.for_model(d["model_type"]).to_dict()
    removed = [k for k in list(d) if k not in ("model_type", "architectures") and k in default and default[k] == d[k]]
    for k in removed:
        del d[k]
    json.dump(d, open(cfg_path, "w"), indent=2)
    return removed


def check_tokenizer(export_dir, doc_path, shard_path):
    """AutoTokenizer on the export encodes the document as pdn.c's tokenizer did (the shard: <|endoftext|> + ids)."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(export_dir)
    text = open(doc_path, encoding="utf-8").read()
    ours = read_shard_tokens(shard_path)
    theirs = tok(text, add_special_tokens=False)["input_ids"]
    ok = ours[0] == tok.eos_token_id and ours[1:] == theirs and tok.decode(theirs) == text
    if not ok:
        first = next((i for i, (a, b) in enumerate(zip(ours[1:], theirs)) if a != b), min(len(ours) - 1, len(theirs)))
        fail_row(f"tokenizer: {type(tok).__name__} encodes {doc_path} differently from pdn.c ({len(theirs)} vs "
                 f"{len(ours) - 1} ids, first difference at {first}; eos {tok.eos_token_id} vs {ours[0]})")
    return type(tok).__name__, len(theirs), ok


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="out/check_fla", help="work directory (kept between calls; each step redoes its part)")
    ap.add_argument("--steps", type=int, default=200, help="training steps per variant (a sharp model: few near-ties)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="forward direction: pdn.c variants to export")
    ap.add_argument("--reverse", default=",".join(mt for mt, _ in REVERSE), help="reverse direction: fla model types "
                    "to import ('' for none)")
    ap.add_argument("--dtypes", default="fp32,bf16", help="forward direction: export dtypes to load in fla")
    ap.add_argument("--cpu", action="store_true", help="use ./train_pdn for training and --debug-state (a smoke test "
                    "of this script's pdn.c side on a machine without a GPU)")
    ap.add_argument("--no-fla", action="store_true", help="skip everything that needs torch and fla")
    args = ap.parse_args()
    os.chdir(os.path.dirname(HERE))
    variants = [v for v in args.variants.split(",") if v]
    reverse = [r for r in REVERSE if r[0] in args.reverse.split(",")]
    dtypes = [d for d in args.dtypes.split(",") if d]
    if any(v not in VARIANTS and v not in EXTRA for v in variants) or any(d not in CRIT for d in dtypes):
        sys.exit(f"error: --variants takes {','.join(VARIANTS + list(EXTRA))} and --dtypes fp32,bf16")
    train = "./train_pdn" if args.cpu else "./train_pdncu"
    train32 = "./train_pdn" if args.cpu else "./train_pdncu_fp32"
    for b in (train, train32, "./dev/data/train_bpe", "./dev/data/prepare_shards"):
        if not os.path.exists(b):
            sys.exit(f"error: {b} is missing: run make first (check_fla_export.sh does)")
    out = args.out
    os.makedirs(out, exist_ok=True)
    if not args.no_fla:
        import torch
        import transformers
        sys.path.insert(0, HERE)
        import fla_compat
        patched = fla_compat.patch()
        if not torch.cuda.is_available():
            sys.exit("error: torch sees no GPU (fla's kernels are Triton GPU kernels)")
        import fla
        print(f"torch {torch.__version__}, transformers {transformers.__version__}, fla {getattr(fla, '__version__', '?')} "
              f"from {os.path.dirname(fla.__file__)}; {torch.cuda.get_device_name(0)}; TRITON_F32_DEFAULT="
              f"{os.environ.get('TRITON_F32_DEFAULT', '(unset: tf32)')}; tied-weights fix applied to: {patched or 'none'}")

    # data: a BPE vocabulary and shards from the repository's own text (no download; the same on every call)
    docs = ["README.md", "dev/data/README.md", "dev/cuda/README.md"]
    for d in ("tok", "data", "tokcheck"):
        shutil.rmtree(f"{out}/{d}", ignore_errors=True)
    run(["./dev/data/train_bpe", "--vocab-size", "512", "--quiet", "1", "--out-dir", f"{out}/tok"] + docs, "train_bpe")
    tok_bin = f"{out}/tok/tokenizer.bin"
    run(["./dev/data/prepare_shards", "--tokenizer", tok_bin, "--out", f"{out}/data/t", "--val-tokens", "4096",
         "--quiet", "1"] + docs, "prepare_shards")
    run(["./dev/data/prepare_shards", "--tokenizer", tok_bin, "--out", f"{out}/tokcheck/t", "--val-tokens", "0",
         "--quiet", "1", docs[2]], "prepare_shards (tokenizer check)")
    shards = f"{out}/data/t_train_*.bin"
    text = ["-i", shards, "--tokenizer", tok_bin]
    rows = []

    # forward: pdn.c -> fla
    for v in variants:
        for d in [f"run_{v}"] + [f"hf_{v}_{dt}" for dt in CRIT]:
            shutil.rmtree(f"{out}/{d}", ignore_errors=True)
        preset = ["--preset", f"{v.split('-')[0]}-tiny"] + (["--out-gate", "0"] if v.endswith("-gate") else [])
        preset += EXTRA.get(v, [])
        run([train, *preset, *text, "-b", "8", "-t", str(T), "-x", str(args.steps), "-l", "3e-3",
             "-u", "20", "-v", "0", "-o", f"{out}/run_{v}"], f"training {v}")
        ckpt = f"{out}/run_{v}/model_{args.steps:08d}.bin"
        for dt in dtypes:
            run([train, "-e", ckpt, "--tokenizer", tok_bin, "--export-hf", f"{out}/hf_{v}_{dt}", "--export-dtype", dt],
                f"--export-hf {v} {dt}")
        run([train32, "-e", ckpt, *text, "-b", str(B), "-t", str(T), "--debug-state", f"{out}/dbg_{v}.bin"],
            f"--debug-state {v}")
        dbg = read_debug_state(f"{out}/dbg_{v}.bin")
        if args.no_fla:
            rows.append((f"pdn.c -> fla", v, MODEL_TYPE[v], "-", None))
            continue
        import torch
        for dt in dtypes:
            what = f"{v} {dt} export"
            over = {"attn_mode": "fused_recurrent"} if v == "dn" and dt == "fp32" else {}
            model, keys_ok = load_fla(f"{out}/hf_{v}_{dt}", torch.float32 if dt == "fp32" else torch.bfloat16, what, **over)
            same = params_equal_file(model, f"{out}/hf_{v}_{dt}", what)
            if type(model).__name__ != json.load(open(f"{out}/hf_{v}_{dt}/config.json"))["architectures"][0]:
                fail_row(f"{what}: loaded as {type(model).__name__}")
            r = compare(model, dbg, what, CRIT[dt])
            r.update(keys=keys_ok, same=same, dtype=dt, mode=over.get("attn_mode", "chunk"))
            rows.append(("pdn.c -> fla", v, type(model).__name__, dt, r))
            del model
            torch.cuda.empty_cache()
        if v == variants[0]:
            shard = sorted(glob.glob(f"{out}/tokcheck/t_*.bin"))[0]
            name, n, ok = check_tokenizer(f"{out}/hf_{v}_{dtypes[0]}", docs[2], shard)
            print(f"tokenizer: AutoTokenizer -> {name}; {docs[2]}: {n} ids, {'identical to pdn.c' if ok else 'DIFFERENT'}")

    # reverse: fla -> pdn.c
    if not args.no_fla and reverse:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM
        vocab = len(json.load(open(f"{out}/tok/encoder.json")))
        eot = vocab - 1   # train_bpe puts <|endoftext|> last
        for i, (mt, kw) in enumerate(REVERSE):
            if (mt, kw) not in reverse:
                continue
            what = f"{mt} from fla"
            for d in (f"fla_{mt}", f"imp_{mt}"):
                shutil.rmtree(f"{out}/{d}", ignore_errors=True)
            cfg = AutoConfig.for_model(mt, hidden_size=64, num_heads=2, num_hidden_layers=2, vocab_size=vocab,
                                       intermediate_size=None, bos_token_id=eot, eos_token_id=eot, **kw)
            model = AutoModelForCausalLM.from_config(cfg, **tf_kwargs(torch.float32))
            randomize(model, 1000 + i)
            d = f"{out}/fla_{mt}"
            model.save_pretrained(d)
            removed = strip_defaults(d)
            print(f"{what}: saved; {len(removed)} config fields left to their defaults: {', '.join(sorted(removed))}")
            over = {"attn_mode": "fused_recurrent"} if mt == "delta_net" else {}
            back, keys_ok = load_fla(d, torch.float32, what + " (defaults stripped)", **over)
            same = list(model.state_dict()) == list(back.state_dict()) and \
                all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), back.state_dict().values()))
            if not same:
                fail_row(f"{what}: reloaded from the stripped config.json, fla builds a different model")
            del model
            run([train, "--import-hf", d, "-o", f"{out}/imp_{mt}"], f"--import-hf {mt}")
            imp = f"{out}/imp_{mt}/model_00000000.bin"
            cont = run([train, "-e", imp, *text, "-b", "8", "-t", str(T), "-x", "3", "-v", "0"], f"-e after import {mt}")
            if "done: 3 steps" not in cont:
                fail_row(f"{what}: -e from the import did not train 3 steps")
            run([train32, "-e", imp, *text, "-b", str(B), "-t", str(T), "--debug-state", f"{out}/dbg_fla_{mt}.bin"],
                f"--debug-state {mt}")
            dbg = read_debug_state(f"{out}/dbg_fla_{mt}.bin")
            r = compare(back, dbg, what, CRIT["fp32"])
            r.update(keys=keys_ok, same=same, dtype="fp32", mode=over.get("attn_mode", "chunk"))
            rows.append(("fla -> pdn.c", mt, type(back).__name__, "fp32", r))
            del back
            torch.cuda.empty_cache()

    # the table
    print()
    hdr = (f"{'direction':<13} {'variant':<22} {'fla class':<32} {'dtype':<5} {'mode':<15} {'keys':<4} {'=file':<5} "
           f"{'max rel':>9} {'L2 rel':>9} {'argmax':>7} {'loss pdn.c':>10} {'loss fla':>10} {'rel':>8}  verdict")
    print(hdr)
    print("-" * len(hdr))
    for d, v, cls, dt, r in rows:
        if r is None:
            print(f"{d:<13} {v:<22} {cls:<32} {'-':<5} {'(fla skipped: --no-fla)'}")
            continue
        print(f"{d:<13} {v:<22} {cls:<32} {dt:<5} {r['mode']:<15} {'ok' if r['keys'] else 'BAD':<4} "
              f"{'ok' if r['same'] else 'BAD':<5} {r['mx']:9.2e} {r['l2']:9.2e} {100 * r['agree']:6.2f}% "
              f"{r['loss_c']:10.6f} {r['loss_fla']:10.6f} {r['lrel']:8.1e}  "
              f"{'PASS' if r['ok'] and r['keys'] and r['same'] else 'FAIL'}")
    for name, c in CRIT.items():
        print(f"criteria {name}: L2 rel <= {c['l2']}, max rel <= {c['mx']}, argmax >= {100 * c['agree']:.0f}%, "
              f"loss rel <= {c['loss']}")
    if failures:
        print(f"\nFAILED: {len(failures)} problem(s):")
        for f in failures:
            print(f"  - {f}")
        sys.exit(1)
    print("\nALL PASS" if not args.no_fla else "\npdn.c side OK (fla checks skipped)")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""bench_fla.py: training throughput and device memory of fla's model against train_pdncu, same job (run by bench_fla.sh).

For every variant and shape: the model pdn.c trains at the preset (--preset V-340m, or V-1b) is exported with
--export-hf, and fla builds the same model from that config.json (AutoModelForCausalLM.from_config: fla's own
init; throughput does not depend on the weights). Both train on the same llm.c shard of uniform random tokens
(every position a target, the classifier at full work), one micro-batch of B x T tokens per optimizer step:
  pdn.c: train_pdncu (bf16 mixed precision, its AdamW), tokens/s as it prints them (the first step not timed);
  fla:   fp32 weights, torch.autocast(bf16), model(input_ids, labels=input_ids) with fla's config defaults
         (fuse_cross_entropy, fuse_norm, fuse_swiglu), torch.optim.AdamW(fused=True), zero_grad(set_to_none);
         WARMUP untimed steps (the first one autotunes fla's Triton kernels for the shape), then STEPS timed ones
         between two cuda synchronisations.
Memory: what the process holds on the device at the end (total - free from cudaMemGetInfo), as train_pdncu reports
it; for fla also torch's peak allocated, which leaves out the CUDA context and the allocator's cache.
fla bc3b101d refuses the gated backward on Hopper with Triton 3.4 ... 3.7.0 (its issue #640: wrong dq/dk/dw/dg
there); that guard is switched off here (fla.ops.common.chunk_o.TRITON_ABOVE_3_7_1 = True) because only the speed is
measured: the kernels run the same work either way. The table says so when the guard was hit.
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)


def sh(cmd, what):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    if r.returncode != 0:
        print(r.stdout[-3000:])
        sys.exit(f"error: {what} failed (exit {r.returncode}): {' '.join(cmd)}")
    return r.stdout


def pdnc_run(preset, shard, B, T, steps, extra):
    log = sh(["./train_pdncu", "--preset", preset, "-i", shard, "-b", str(B), "-t", str(T), "-d", str(B * T),
              "-x", str(steps), "-v", "0", "-m", "1"] + extra, f"train_pdncu {preset} {B}x{T}")
    tps = mem = None
    for line in log.splitlines():
        if "tok/s averaged" in line:
            tps = float(line.split(" tok/s averaged")[0].split(";")[-1])
        if "device memory in use" in line:
            mem = float(line.split("device memory in use ")[1].split(" GiB")[0])
    if tps is None:
        print(log[-3000:])
        sys.exit(f"error: no tokens/s in train_pdncu's output for {preset} {B}x{T}")
    return tps, mem


def export_config(preset, shard, work):
    """config.json of the preset's model: one tiny step of train_pdncu for a checkpoint, then --export-hf."""
    run = os.path.join(work, preset)
    sh(["./train_pdncu", "--preset", preset, "-i", shard, "-b", "1", "-t", "64", "-d", "64", "-x", "1", "-v", "0",
        "-o", run], f"checkpoint for {preset}")
    ckpt = sorted(f for f in os.listdir(run) if f.startswith("model_") and f.endswith(".bin"))[-1]
    hf = os.path.join(work, preset + "_hf")
    sh(["./train_pdn", "-e", os.path.join(run, ckpt), "--export-hf", hf], f"--export-hf for {preset}")
    return hf


def read_shard(path, n):
    import numpy as np
    header = np.fromfile(path, dtype=np.int32, count=256)
    if header[0] != 20240520:
        sys.exit(f"error: {path} is not an llm.c shard (magic {header[0]})")
    return np.fromfile(path, dtype=np.uint16, count=n, offset=1024).astype(np.int64)


def fla_run(hf, tokens, B, T, warmup, steps):
    import torch
    import transformers
    cfg = transformers.AutoConfig.from_pretrained(hf)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).float().cuda()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, fused=True)
    n = B * T
    batches = [torch.from_numpy(tokens[i * n:(i + 1) * n]).view(B, T).cuda() for i in range(len(tokens) // n)]

    def step(i):
        x = batches[i % len(batches)]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for i in range(warmup):
        step(i)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(steps):
        loss = step(warmup + i)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    free, total = torch.cuda.mem_get_info()
    peak = torch.cuda.max_memory_allocated() / 2**30
    held = (total - free) / 2**30
    lv = float(loss)
    del model, opt, batches
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    return n * steps / dt, held, peak, lv


def fla_child(a):
    """--fla-one HF,B,T: one fla measurement in a fresh process, so that its memory is its own; prints one JSON line."""
    import fla_compat
    fla_compat.patch()
    chunk_o = __import__("fla.ops.common.chunk_o", fromlist=["TRITON_ABOVE_3_7_1"])
    guarded = not chunk_o.TRITON_ABOVE_3_7_1
    chunk_o.TRITON_ABOVE_3_7_1 = True  # see the docstring: speed only
    hf, B, T = a.fla_one.rsplit(",", 2)
    B, T = int(B), int(T)
    tokens = read_shard(a.shard, B * T * (a.warmup + a.steps))  # a fresh batch every step, as pdn.c reads them
    if len(tokens) < B * T:
        sys.exit(f"error: {a.shard} has {len(tokens)} tokens; {B} x {T} needs {B * T}")
    tps, held, peak, loss = fla_run(hf, tokens, B, T, a.warmup, a.steps)
    print("FLA " + json.dumps(dict(tps=tps, held=held, peak=peak, loss=loss, guarded=guarded)), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shard", required=True, help="llm.c shard of tokens below the preset's vocabulary")
    ap.add_argument("--variants", default="dn,gdn,pgdn,kda,pkda", help="pdn.c variants (pdn has no fla model of its own)")
    ap.add_argument("--shapes", default="16x2048", help="B x T, comma separated, e.g. 16x2048,1x32768")
    ap.add_argument("--size", default="340m", help="preset size: 340m or 1b")
    ap.add_argument("--steps", type=int, default=6, help="timed steps (fla) / steps (pdn.c, the first untimed)")
    ap.add_argument("--warmup", type=int, default=2, help="fla's untimed steps (the first autotunes)")
    ap.add_argument("--work", default="/tmp/pdn_bench_fla", help="scratch directory for checkpoints and exports")
    ap.add_argument("--fla-one", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.fla_one:
        return fla_child(a)
    os.makedirs(a.work, exist_ok=True)
    shapes = [tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",")]
    rows, guarded = [], False
    gpu = sh(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], "nvidia-smi").splitlines()[0]
    for v in [s for s in a.variants.split(",") if s]:
        preset = f"{v}-{a.size}"
        hf = export_config(preset, a.shard, a.work)
        with open(os.path.join(hf, "config.json")) as f:
            mtype = json.load(f)["model_type"]
        for B, T in shapes:
            p_tps, p_mem = pdnc_run(preset, a.shard, B, T, a.steps, [])
            out = sh([sys.executable, os.path.abspath(__file__), "--shard", a.shard, "--steps", str(a.steps),
                      "--warmup", str(a.warmup), "--fla-one", f"{hf},{B},{T}"], f"fla {preset} {B}x{T}")
            r = json.loads([ln for ln in out.splitlines() if ln.startswith("FLA ")][-1][4:])
            guarded |= r["guarded"]
            row = (f"{preset:10s} {B:>3d} x {T:<6d}| {mtype:22s} | {p_tps:11,.0f} | {r['tps']:9,.0f} | "
                   f"{p_tps / r['tps']:5.2f} | {p_mem:8.1f} GiB | {r['held']:6.1f} GiB ({r['peak']:5.1f}) | {r['loss']:.3f}")
            print(row, flush=True)
            rows.append(row)
    print(f"== pdn.c train_pdncu vs fla, {gpu}, {time.strftime('%Y-%m-%d')}, {a.steps} steps "
          f"(pdn.c: the first untimed; fla: after {a.warmup} untimed), random tokens ==")
    print("preset     B x T       | fla model_type         | pdn.c tok/s | fla tok/s | ratio | pdn.c memory | "
          "fla memory (torch peak) | fla loss")
    for r in rows:
        print(r)
    if guarded:
        print("(fla's #640 guard for this Triton on Hopper was switched off: fla's gated backward gradients may be "
              "wrong here; its speed is what is measured)")


if __name__ == "__main__":
    main()

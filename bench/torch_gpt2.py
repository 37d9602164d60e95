#!/usr/bin/env python3
"""PyTorch's GPT-2 124M training step, to set beside cutrain's nn::GPT on the same GPU: the same
model, init and optimizer as bench/torch_char_gpt.py, at GPT-2 size, timed per batch size and mode;
with --train, a training run whose validation loss sets beside examples/gpt's on the same shards.

  python3 bench/torch_gpt2.py --batches 16,32,64 --modes eager,compile --out torch_gpt2.json
  python3 bench/torch_gpt2.py --batches 16 --modes eager,compile,compile-graph \
      --shards 'fineweb10B/fineweb_train_*.bin' --profile torch_gpt2_profile.txt
  python3 bench/torch_gpt2.py --device cpu --batches 2 --context 64 --vocab 512 --layers 2 \
      --heads 2 --dim 64 --modes eager --steps 3 --warmup 1             (a smoke run on the CPU)
  python3 bench/torch_gpt2.py --train --shards DIR --batch 16 --steps 2000 --lr 6e-4 --min-lr 6e-5 \
      --warmup 200 --eval-every 250 --eval-batches 20 --mode compile --out torch_gpt2_train.json

Model (as torch_char_gpt.py and nn::GPT): wte [V, C] + wpe [T, C]; L pre-norm blocks
  x = x + proj(attn(ln1(x))),  x = x + fc2(gelu_tanh(fc1(ln2(x))))
qkv Linear(C, 3C), proj, fc1 Linear(C, 4C), fc2 Linear(4C, C), all with bias; causal
F.scaled_dot_product_attention (held to the flash backend on the GPU; --sdpa auto lets PyTorch
choose); LayerNorm eps 1e-5; a final LayerNorm; logits = x @ wte^T (tied, no bias); no dropout.
Init N(0, 0.02), proj and fc2 weights N(0, 0.02 / sqrt(2L)), biases 0, LayerNorm (1, 0).
V = --vocab (50257) unless --pad-vocab N rounds the rows of wte up to a multiple of N (nanoGPT's
50304); the padded logits then take part in the softmax, as in nanoGPT, and count in N below.
Data: random tokens in [0, vocab) from one seeded generator, a pool of --pool batches made on the
device and cycled; or, with --shards, llm.c .bin shards (256 int32 header: magic 20240520,
version 1, token count; then uint16 tokens; a folder means its *_train_*.bin) walked as llm.c's
loader and cutrain's data::ShardLoader do: a step takes the next B*T + 1 tokens of the current
shard (x = [:-1], y = [1:] as [B, T]), or moves to the start of the next shard (after the last, the
first) where too few are left; the benchmark copies all its batches to the device first.
Step: bf16 autocast, f32 master weights; loss = F.cross_entropy(logits, y) inside autocast (it
runs in f32 there, as nanoGPT's); backward; clip_grad_norm_(1.0); AdamW(fused, lr 6e-4 fixed,
betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on the 2-d weights except wte and wpe, that is the
Linear weights, as cutrain's char_gpt; nanoGPT also decays wte); zero_grad(set_to_none=True).
cudnn.benchmark on, TF32 matmul ('high') for f32 leftovers.
Modes: eager; compile (torch.compile(model)); compile-graph (mode='reduce-overhead': CUDA graphs
of the compiled forward and backward). Each (batch, mode) gets a fresh model, optimizer and
Dynamo cache, so every compile sees static shapes. A failure (OOM) is recorded in its row.
Timing: --warmup steps, then CUDA events around each of --steps whole steps; median and min ms;
tokens/s = B*T / median. MFU = B*T * (6N + 12*L*H*Q*T) / median / peak (nanoGPT's estimate_mfu,
PaLM appendix B: N all parameters, the tied wte once, wpe included; Q = C/H; attention counted
full, not halved for the causal mask); peak --peak-tflops (989: H100 and H200 SXM dense bf16).
Peak memory: torch.cuda.max_memory_allocated() over warm-up and timed steps of that row, and
max_memory_reserved() (what the caching allocator held: the figure cutrain reports).
--profile FILE: torch.profiler over 5 steps of the first batch size in its fastest mode.
Training (--train, one --mode: eager or compile): --steps steps of --batch rows of DIR's
*_train_*.bin in the walk above, each batch made on the host and copied through pinned memory; the
step above at examples/gpt's learning rate for step k (from 0): lr (k + 1) / warmup below --warmup,
then min_lr + (lr - min_lr) (1 + cos(pi min(1, p))) / 2, p = (k - warmup) / max(1, steps - 1 - warmup).
Every --eval-every steps and after the last, "step K: val loss L": the first --eval-batches batches
of DIR's *_val_*.bin in the same walk from its start, under no_grad and autocast, the sum of their
tokens' cross-entropies over the token count (examples/gpt's evaluate). Every --log-every steps the
mean train loss since the last line. --out: the evals, final_val_loss, median_step_ms (wall clock
from a step's start to its loss read back; the first 10 steps left out, as examples/gpt) and config.
"""
import argparse
import contextlib
import gc
import glob
import json
import math
import os
import statistics
import struct
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

MODES = {"eager": None, "compile": "default", "compile-graph": "reduce-overhead"}


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim, eps=1e-5), nn.LayerNorm(dim, eps=1e-5)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, c))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab, context, dim, layers, heads):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Parameter(torch.empty(context, dim))
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim, eps=1e-5)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0.0, 0.02)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        nn.init.normal_(self.wte.weight, 0.0, 0.02)
        nn.init.normal_(self.wpe, 0.0, 0.02)
        for blk in self.blocks:
            nn.init.normal_(blk.proj.weight, 0.0, 0.02 / math.sqrt(2 * layers))
            nn.init.normal_(blk.fc2.weight, 0.0, 0.02 / math.sqrt(2 * layers))

    def forward(self, x, y):
        """Mean cross-entropy of next-token logits against y (x, y contiguous [B, T])."""
        h = self.wte(x) + self.wpe[: x.shape[1]]
        for blk in self.blocks:
            h = blk(h)
        logits = F.linear(self.ln_f(h), self.wte.weight)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))


def shard_paths(spec, split="train"):
    """A folder's *_{split}_*.bin (as cutrain's data::find_shards), or a glob; sorted."""
    paths = sorted(glob.glob(os.path.join(spec, f"*_{split}_*.bin") if os.path.isdir(spec) else spec))
    if not paths:
        raise SystemExit(f"torch_gpt2: no .bin shards at {spec}")
    return paths


def read_shard(path):
    """The tokens of an llm.c token shard, as an int64 tensor."""
    with open(path, "rb") as f:
        header = struct.unpack("<256i", f.read(1024))
        if header[0] != 20240520 or header[1] != 1:
            raise SystemExit(f"torch_gpt2: {path} is not an llm.c v1 token shard "
                             f"(magic {header[0]}, version {header[1]})")
        raw = bytearray(f.read())
    if len(raw) != 2 * header[2]:
        raise SystemExit(f"torch_gpt2: {path} holds {len(raw)} bytes of tokens, its header says {header[2]} tokens")
    return torch.frombuffer(raw, dtype=torch.int16).long() & 0xFFFF if raw else torch.zeros(0, dtype=torch.long)


class ShardWalk:
    """Endless host batches x, y [batch, context] (int64) of llm.c's sequential walk over shards,
    as cutrain's data::ShardLoader at world 1; one shard in memory at a time."""

    def __init__(self, paths, batch, context, vocab):
        self.paths, self.batch, self.context, self.vocab = paths, batch, context, vocab
        self.loaded, self.tokens = None, None
        self.reset()

    def reset(self):
        self.shard, self.pos = 0, 0

    def load(self, i):
        if self.loaded != i:
            self.tokens, self.loaded = None, None  # the old shard goes before the new one comes
            tok, path = read_shard(self.paths[i]), self.paths[i]
            if len(tok) < self.batch * self.context + 1:
                raise SystemExit(f"torch_gpt2: {path} has {len(tok)} tokens, fewer than a step's "
                                 f"batch {self.batch} x context {self.context} + 1")
            if int(tok.max()) >= self.vocab:
                raise SystemExit(f"torch_gpt2: {path} holds token {int(tok.max())}, --vocab is {self.vocab}")
            self.tokens, self.loaded = tok, i
        return self.tokens

    def next(self):
        n = self.batch * self.context
        if self.pos + n + 1 > len(self.load(self.shard)):
            self.shard, self.pos = (self.shard + 1) % len(self.paths), 0
        w = self.load(self.shard)[self.pos:self.pos + n + 1]
        self.pos += n
        return w[:-1].view(self.batch, self.context), w[1:].view(self.batch, self.context)


def make_batches(args, batch, count, dev):
    """x, y [count, batch, context] on dev: random tokens, or consecutive windows of the shards."""
    t = args.context
    if args.shards:
        walk = ShardWalk(shard_paths(args.shards), batch, t, args.vocab)
        x, y = zip(*(walk.next() for _ in range(count)))
        return torch.stack(x).to(dev), torch.stack(y).to(dev)
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    w = torch.randint(0, args.vocab, (count, batch, t + 1), generator=gen, device=dev)
    return w[..., :-1].contiguous(), w[..., 1:].contiguous()


def make_optimizer(model, cuda):
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and n not in ("wte.weight", "wpe")]
    ids = {id(p) for p in decay}
    rest = [p for p in model.parameters() if id(p) not in ids]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=cuda)


class Run:
    """One (batch, mode): a fresh model, its optimizer and (pool) batches; step(k) runs training
    step k on the batches made here, update(x, y) a step on the given ones."""

    def __init__(self, args, batch, mode, dev, pool=True):
        torch._dynamo.reset()  # no graph or automatic-dynamic shape carried over from another row
        self.dev, self.cuda, self.graph = dev, dev.type == "cuda", mode == "compile-graph"
        flash = self.cuda and args.sdpa == "flash"
        self.attention = (lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION)) if flash else contextlib.nullcontext
        torch.manual_seed(args.seed)
        self.model = GPT(args.model_vocab, args.context, args.dim, args.layers, args.heads).to(dev)
        self.fwd = self.model if MODES[mode] is None else torch.compile(self.model, mode=MODES[mode])
        self.opt = make_optimizer(self.model, self.cuda)
        self.params = list(self.model.parameters())
        if pool:
            count = args.warmup + args.steps if args.shards else min(args.pool, args.warmup + args.steps)
            self.x, self.y = make_batches(args, batch, max(count, 1), dev)

    def autocast(self):
        return torch.autocast(self.dev.type, dtype=torch.bfloat16, enabled=self.cuda)

    def step(self, k):
        i = k % len(self.x)
        return self.update(self.x[i], self.y[i])

    def update(self, x, y):
        if self.graph:
            torch.compiler.cudagraph_mark_step_begin()
        with self.autocast(), self.attention():
            loss = self.fwd(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss.detach()


def time_steps(run, first, count, cuda):
    """ms of each of steps first..first+count-1 (CUDA events, wall clock on the CPU); the last loss."""
    def mark():
        if not cuda:
            return time.perf_counter()
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    marks = []
    for k in range(first, first + count):
        begin = mark()
        loss = run.step(k)
        marks.append((begin, mark()))
    if cuda:
        torch.cuda.synchronize()
    return [a.elapsed_time(b) if cuda else (b - a) * 1e3 for a, b in marks], loss.float().item()


def measure(args, batch, mode, dev):
    """One row of the table."""
    cuda = dev.type == "cuda"
    row = {"batch": batch, "context": args.context, "vocab": args.model_vocab, "mode": mode}
    row.update(dict.fromkeys(["median_ms", "min_ms", "tokens_per_s", "mfu", "peak_mem_gib", "peak_reserved_gib", "loss_last", "params"]))
    run = None
    try:
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        run = Run(args, batch, mode, dev)
        row["params"] = n = sum(p.numel() for p in run.params)
        for k in range(args.warmup):
            run.step(k)
        ms, loss = time_steps(run, args.warmup, args.steps, cuda)
        med = statistics.median(ms)
        q = args.dim // args.heads
        flops = batch * args.context * (6 * n + 12 * args.layers * args.heads * q * args.context)
        row.update(median_ms=med, min_ms=min(ms), tokens_per_s=batch * args.context / (med / 1e3),
                   mfu=flops / (med / 1e3) / (args.peak_tflops * 1e12) if cuda else None,
                   peak_mem_gib=torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
                   peak_reserved_gib=torch.cuda.max_memory_reserved() / 2**30 if cuda else None, loss_last=loss)
    except Exception as e:  # an OOM or a compile failure: record it, go on to the next row
        lines = str(e).strip().splitlines()
        row["error"] = f"{type(e).__name__}: {lines[0] if lines else ''}"[:400]
    finally:
        del run
        release(cuda)
    return row


def release(cuda):
    """Gives back what a row held: its compiled graphs, CUDA-graph pools and cached blocks."""
    torch._dynamo.reset()
    gc.collect()
    if cuda:
        from torch._inductor.cudagraph_trees import reset_cudagraph_trees
        reset_cudagraph_trees()
        torch.cuda.empty_cache()


def profile(args, batch, mode, dev, path):
    """torch.profiler's kernel table over 5 steps of (batch, mode), after --warmup steps."""
    from torch.profiler import ProfilerActivity, profile as torch_profile
    cuda = dev.type == "cuda"
    run = Run(args, batch, mode, dev)
    for k in range(args.warmup):
        run.step(k)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch_profile(activities=acts) as prof:
        for k in range(args.warmup, args.warmup + 5):
            run.step(k)
        if cuda:
            torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="device_time_total" if cuda else "cpu_time_total", row_limit=30)
    with open(path, "w") as f:
        f.write(f"torch {torch.__version__}, {device_name(dev)}: GPT batch {batch}, context {args.context}, "
                f"vocab {args.model_vocab}, mode {mode}; 5 training steps\n{table}\n")
    del run
    release(cuda)


def lr_at(args, k):
    """examples/gpt's lr_at: linear warm-up, then cosine decay to --min-lr at the last step."""
    if k < args.warmup:
        return args.lr * (k + 1) / args.warmup
    p = (k - args.warmup) / max(1, args.steps - 1 - args.warmup)
    return args.min_lr + (args.lr - args.min_lr) * (1 + math.cos(math.pi * min(1.0, p))) / 2


def evaluate(run, walk, count, feed):
    """Mean cross-entropy over every token of the walk's first count batches (examples/gpt's evaluate)."""
    walk.reset()
    total, n = 0.0, 0
    with torch.no_grad(), run.autocast(), run.attention():
        for _ in range(count):
            x, y = feed(walk.next())
            total += run.model(x, y).item() * y.numel()  # the eager module: no inference graph to compile
            n += y.numel()
    return total / n


def train(args, dev):
    """--train: one model trained on the shards' train split; its val loss as examples/gpt reports it."""
    cuda = dev.type == "cuda"
    walks = [ShardWalk(shard_paths(args.shards, s), args.batch, args.context, args.vocab) for s in ("train", "val")]
    run = Run(args, args.batch, args.mode, dev, pool=False)
    # Each step ends by reading its loss back, so the pinned buffers are free again when refilled.
    pinned = [torch.empty(args.batch, args.context, dtype=torch.long, pin_memory=cuda) for _ in range(2)]

    def feed(xy):
        return [buf.copy_(t).to(dev, non_blocking=True) for buf, t in zip(pinned, xy)]

    n_params = sum(p.numel() for p in run.params)
    result = {"torch": torch.__version__, "gpu": device_name(dev), "config": vars(args), "params": n_params,
              "train": [], "evals": []}
    print(f"torch {torch.__version__}, {result['gpu']}: training {n_params} parameters ({args.layers} layers, "
          f"{args.heads} heads, dim {args.dim}, context {args.context}, vocab {args.model_vocab}), batch "
          f"{args.batch}, {args.steps} steps, mode {args.mode}, {'bf16' if cuda else 'f32'}; {args.shards}", flush=True)
    ms, window = [], []
    for k in range(args.steps):
        lr = lr_at(args, k)
        for g in run.opt.param_groups:
            g["lr"] = lr
        x, y = feed(walks[0].next())
        begin = time.perf_counter()
        window.append(run.update(x, y).item())  # waits for the step
        ms.append((time.perf_counter() - begin) * 1e3)
        step = k + 1
        if step % args.log_every == 0 or step == args.steps:
            loss = sum(window) / len(window)
            result["train"].append({"step": step, "loss": loss, "lr": lr, "ms": ms[-1]})
            print(f"step {step:5d}/{args.steps} | loss {loss:.4f} | lr {lr:.2e} | {ms[-1]:.1f} ms", flush=True)
            window = []
        if step % args.eval_every == 0 or step == args.steps:
            val = evaluate(run, walks[1], args.eval_batches, feed)
            result["evals"].append({"step": step, "val_loss": val})
            print(f"step {step}: val loss {val:.4f}", flush=True)
            tail = sorted(ms[min(10, len(ms) // 2):])  # examples/gpt's: the first 10 left out, the upper median
            med = tail[len(tail) // 2]
            result.update(final_val_loss=val, median_step_ms=med, tokens_per_s=args.batch * args.context / (med / 1e3),
                          peak_reserved_gib=torch.cuda.max_memory_reserved() / 2**30 if cuda else None)
            if args.out:  # after every evaluation, so a run cut short keeps what it measured
                with open(args.out, "w") as f:
                    json.dump(result, f, indent=1)
    print(f"final val loss {result['final_val_loss']:.4f}, median step {result['median_step_ms']:.2f} ms, "
          f"{result['tokens_per_s']:.0f} tokens/s")


def device_name(dev):
    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", default="16,32,64")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--pad-vocab", type=int, default=0, help="round the embedding rows up to a multiple of this")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--modes", default="eager,compile", help="of " + ",".join(MODES))
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=10, help="untimed steps; with --train, lr warm-up steps")
    ap.add_argument("--pool", type=int, default=8, help="random batches made on the device and cycled")
    ap.add_argument("--shards", help="llm.c .bin token shards: a folder or a glob")
    ap.add_argument("--sdpa", default="flash", choices=["flash", "auto"], help="attention backend on the GPU")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak for the MFU")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--profile", help="write the profiler's table here")
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--train", action="store_true", help="train on --shards DIR and report the val loss")
    ap.add_argument("--mode", default="eager", choices=["eager", "compile"], help="--train's mode")
    ap.add_argument("--batch", type=int, default=16, help="--train's batch")
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--min-lr", type=float, default=6e-5)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--eval-batches", type=int, default=20)
    ap.add_argument("--log-every", type=int, default=10)
    args = ap.parse_args()

    batches = [int(b) for b in args.batches.split(",")]
    modes = args.modes.split(",")
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise SystemExit(f"torch_gpt2: unknown mode {bad[0]} (modes: {', '.join(MODES)})")
    if args.dim % args.heads:
        raise SystemExit(f"torch_gpt2: --dim {args.dim} is not a multiple of --heads {args.heads}")
    if args.steps < 1:
        raise SystemExit("torch_gpt2: --steps must be at least 1")
    if args.train and not (args.shards and os.path.isdir(args.shards) and 0 < args.warmup < args.steps
                           and min(args.batch, args.eval_every, args.eval_batches, args.log_every) > 0):
        raise SystemExit("torch_gpt2: --train needs --shards DIR (its *_train_*.bin and *_val_*.bin), "
                         "0 < --warmup < --steps, and positive --batch, --eval-every, --eval-batches, --log-every")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("torch_gpt2: CUDA is not available (try --device cpu)")
    dev = torch.device(args.device)
    pad = max(1, args.pad_vocab)
    args.model_vocab = (args.vocab + pad - 1) // pad * pad
    if dev.type == "cuda":
        torch.backends.cudnn.benchmark = True
        torch.set_float32_matmul_precision("high")
    if args.train:
        return train(args, dev)

    result = {"torch": torch.__version__, "cudnn": torch.backends.cudnn.version() if dev.type == "cuda" else None,
              "cuda": torch.version.cuda, "gpu": device_name(dev), "config": vars(args),
              "data": f"shards {args.shards}" if args.shards else f"random tokens, a pool of {args.pool} batches",
              "flops_per_token": "6 * params + 12 * layers * heads * (dim / heads) * context", "rows": []}
    print(f"torch {torch.__version__}, cuDNN {result['cudnn']}, {result['gpu']}; vocab {args.vocab} "
          f"(model rows {args.model_vocab}), {args.layers} layers, {args.heads} heads, dim {args.dim}, "
          f"context {args.context}; {args.warmup} warm-up + {args.steps} timed steps; {result['data']}")
    print(f"{'batch':>5} {'mode':>13} {'median ms':>10} {'min ms':>9} {'tokens/s':>10} {'MFU':>6} "
          f"{'peak GiB':>8} {'loss':>7}", flush=True)
    for batch in batches:
        for mode in modes:
            row = measure(args, batch, mode, dev)
            result["rows"].append(row)
            if "error" in row:
                print(f"{batch:5d} {mode:>13}  failed: {row['error']}", flush=True)
            else:
                mfu = "-" if row["mfu"] is None else f"{100 * row['mfu']:.1f}%"
                mem = "-" if row["peak_mem_gib"] is None else f"{row['peak_mem_gib']:.2f}"
                print(f"{batch:5d} {mode:>13} {row['median_ms']:10.2f} {row['min_ms']:9.2f} "
                      f"{row['tokens_per_s']:10.0f} {mfu:>6} {mem:>8} {row['loss_last']:7.4f}", flush=True)
            if args.out:  # after every row, so a run cut short keeps what it measured
                with open(args.out, "w") as f:
                    json.dump(result, f, indent=1)

    if args.profile:
        done = [r for r in result["rows"] if r["batch"] == batches[0] and "error" not in r]
        if not done:
            print(f"no profile: batch {batches[0]} failed in every mode")
        else:
            best = min(done, key=lambda r: r["median_ms"])["mode"]
            profile(args, batches[0], best, dev, args.profile)
            print(f"profile of batch {batches[0]}, mode {best}: {args.profile}")


if __name__ == "__main__":
    main()

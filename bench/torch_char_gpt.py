#!/usr/bin/env python3
"""The character-level GPT of examples/char_gpt in PyTorch: same data, model, init scheme,
optimizer, schedule and validation windows, so the validation losses and step times compare.

  scripts/char-corpus /tmp/fortunes.txt
  python3 bench/torch_char_gpt.py --corpus /tmp/fortunes.txt --mode eager --out torch_char_gpt.json
  python3 bench/torch_char_gpt.py --corpus /tmp/fortunes.txt --mode graph --bench-steps 300
  python3 bench/torch_char_gpt.py --corpus /tmp/fortunes.txt --device cpu --steps 20 \
      --layers 2 --heads 2 --dim 64 --context 64 --batch 8                 (a smoke run on the CPU)

Data (as data::CharCorpus in include/cutrain/data/text.hpp): tokens are the file's bytes; the
vocabulary is its distinct bytes sorted, a byte's id its rank. train = tokens [0, n_train),
val = tokens [n_train, n), n_train = floor(n * 0.9) in double. A window at offset o of a split s
is x[t] = s[o + t], y[t] = s[o + t + 1], t < context.
  Training windows: row b of step k is at offset rng.below(len(train) - context), drawn in
  (step, row) order from one cutrain Rng(seed) (core/random.hpp, reproduced below bit for bit):
  the batches of CharCorpus::sample with that Rng, in the same order.
  Validation windows (CharCorpus::eval_batches(val, batch, context, count)): with W = batch *
  count windows and M = len(val) - context - 1, window i starts at i * M // (W - 1) (0 if W == 1);
  window i is row i % batch of batch i // batch. The val loss is the mean over all W * context
  tokens.

Model: token embedding wte [V, C] + learned position embedding wpe [context, C]; N pre-norm blocks
  x = x + proj(attn(ln1(x))),  x = x + fc2(gelu_tanh(fc1(ln2(x))))
attn: qkv = Linear(C, 3C) (columns [0, C) are q, [C, 2C) k, [2C, 3C) v; head h is columns
[h*D, (h+1)*D) of each, D = C / heads), causal F.scaled_dot_product_attention; proj Linear(C, C),
fc1 Linear(C, 4C), fc2 Linear(4C, C), all with bias; LayerNorm eps 1e-5 with weight and bias; a
final LayerNorm; logits = x @ wte^T (tied, no bias). No dropout.
Init: Linear weights, wte and wpe ~ N(0, 0.02), proj and fc2 weights ~ N(0, 0.02 / sqrt(2N)),
biases 0, LayerNorm weight 1 and bias 0 (torch.manual_seed(seed) first).
Loss: cross-entropy, mean over every token. AdamW(betas (0.9, 0.99), eps 1e-8, weight decay 0.1
on the Linear weights only: not embeddings, biases, LayerNorm), fused on CUDA; gradients clipped
to global norm 1.0. LR at step k (0-based, S steps, warmup W = 100): peak * k / W for k < W, then
min + (peak - min) * (1 + cos(pi * p)) / 2 with p = (k - W) / max(1, S - 1 - W): 1e-3 at k = W,
1e-4 at k = S - 1. CUDA: bf16 autocast, f32 master weights.

Modes: eager; graph (batch gather, forward, backward, clipping and the optimizer step captured
as one CUDA graph with static inputs, fed per step by copying the step's offsets and LR into
device tensors); compile (torch.compile(model)).
Timing: CUDA events around each step (batch gather included, evaluation excluded); the median
over steps 50..end; tokens/s = batch * context / median. --bench-steps N times N steps, no eval.
"""
import argparse
import hashlib
import json
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

MASK64 = (1 << 64) - 1


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


class CutrainRng:
    """cutrain::Rng (include/cutrain/core/random.hpp): next_u64 and below, bit for bit."""

    def __init__(self, seed):
        self.key = splitmix64(seed & MASK64)
        self.counter = 0

    def next_u64(self):
        r = splitmix64(self.key ^ ((self.counter * 0xD1B54A32D192ED03) & MASK64))
        self.counter += 1
        return r

    def below(self, n):
        return self.next_u64() % n if n else 0


class CharCorpus:
    """data::CharCorpus: byte vocabulary, split by position, the same windows."""

    def __init__(self, path, train_fraction=0.9):
        with open(path, "rb") as f:
            data = f.read()
        if not data:
            raise SystemExit(f"torch_char_gpt: {path} is empty")
        self.sha256 = hashlib.sha256(data).hexdigest()
        self.vocab = sorted(set(data))
        table = bytearray(256)
        for i, b in enumerate(self.vocab):
            table[b] = i
        ids = torch.frombuffer(bytearray(data.translate(bytes(table))), dtype=torch.uint8).long()
        n = len(data)
        n_train = int(n * train_fraction)
        if not 1 <= n_train < n:
            raise SystemExit(f"torch_char_gpt: {n} bytes at train_fraction {train_fraction} leave an empty split")
        self.size = n
        self.train, self.val = ids[:n_train], ids[n_train:]

    def sample_offsets(self, rng, steps, batch, context):
        """[steps, batch] offsets: CharCorpus::sample(train, batch, context, rng) called steps times."""
        starts = len(self.train) - context
        return torch.tensor([[rng.below(starts) for _ in range(batch)] for _ in range(steps)], dtype=torch.long)

    @staticmethod
    def eval_offsets(length, batch, context, count):
        w, last = batch * count, length - context - 1
        return torch.tensor([0 if w == 1 else i * last // (w - 1) for i in range(w)], dtype=torch.long).view(count, batch)


def windows(tokens, offsets, context):
    """x, y [..., context] at the given offsets (any shape) of tokens (on the same device)."""
    w = tokens[offsets.unsqueeze(-1) + torch.arange(context + 1, device=tokens.device)]
    return w[..., :-1], w[..., 1:]


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


class CharGPT(nn.Module):
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
        """Mean cross-entropy of next-token logits against y."""
        h = self.wte(x) + self.wpe[: x.shape[1]]
        for blk in self.blocks:
            h = blk(h)
        logits = F.linear(self.ln_f(h), self.wte.weight)
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.reshape(-1))


def lr_at(k, steps, peak, floor, warmup):
    if k < warmup:
        return peak * k / warmup
    p = min(1.0, (k - warmup) / max(1, steps - 1 - warmup))
    return floor + (peak - floor) * (1.0 + math.cos(math.pi * p)) / 2.0


def make_optimizer(model, args, cuda, lr):
    decay = [m.weight for m in model.modules() if isinstance(m, nn.Linear)]
    ids = {id(p) for p in decay}
    rest = [p for p in model.parameters() if id(p) not in ids]
    groups = [{"params": decay, "weight_decay": args.weight_decay}, {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.99), eps=1e-8, fused=cuda,
                             capturable=cuda and args.mode == "graph")


class StepTimer:
    """Per-step times: CUDA events on the GPU (read after a synchronize), wall clock on the CPU."""

    def __init__(self, cuda):
        self.cuda, self.marks = cuda, []

    def start(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def stop(self, begin):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.marks.append((begin, e))
        else:
            self.marks.append((begin, time.perf_counter()))

    def ms(self):
        if self.cuda:
            torch.cuda.synchronize()
            return [a.elapsed_time(b) for a, b in self.marks]
        return [(b - a) * 1e3 for a, b in self.marks]


def build_step(model, compiled, opt, args, cuda, train_tok):
    """step(offsets [B] on the device, lr) -> loss (a device scalar) for the chosen mode."""
    params = list(model.parameters())

    def loss_of(offsets, cache=True):
        x, y = windows(train_tok, offsets, args.context)
        with torch.autocast(train_tok.device.type, dtype=torch.bfloat16, enabled=cuda, cache_enabled=cache):
            return compiled(x, y)

    def update(loss):
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, args.clip)
        opt.step()

    if args.mode != "graph":
        def step(offsets, lr):
            for g in opt.param_groups:
                g["lr"] = lr
            opt.zero_grad(set_to_none=True)
            loss = loss_of(offsets)
            update(loss)
            return loss.detach()
        return step

    # The LR lives in a device tensor the graph reads; the step's offsets are copied into a static
    # buffer. Warm-up runs at LR 0 (AdamW leaves the weights as they are: p * (1 - 0) - 0), then
    # the optimizer's moments and step counts are zeroed in place, so the captured run starts from
    # the same state as eager.
    lr_t = torch.zeros((), device="cuda")
    for g in opt.param_groups:
        g["lr"] = lr_t
    static_off = torch.zeros(args.batch, dtype=torch.long, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            update(loss_of(static_off, cache=False))
    torch.cuda.current_stream().wait_stream(side)
    for state in opt.state.values():
        for v in state.values():
            if torch.is_tensor(v):
                v.zero_()
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_loss = loss_of(static_off, cache=False)
        update(static_loss)

    def step(offsets, lr):
        static_off.copy_(offsets)
        lr_t.fill_(lr)
        graph.replay()
        return static_loss

    return step


@torch.no_grad()
def val_loss(model, val_x, val_y, cuda):
    total = torch.zeros((), device=val_x.device)
    for x, y in zip(val_x, val_y):
        with torch.autocast(val_x.device.type, dtype=torch.bfloat16, enabled=cuda):
            total += model(x, y).float()
    return total.item() / len(val_x)


def main():
    ap = argparse.ArgumentParser(description="char-level GPT in PyTorch, as examples/char_gpt")
    ap.add_argument("--corpus", required=True, help="the file scripts/char-corpus writes")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--mode", default="eager", choices=["eager", "graph", "compile"])
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--min-lr", type=float, default=1e-4)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--eval-every", type=int, default=500)
    ap.add_argument("--eval-batches", type=int, default=50, help="validation batches of --batch windows each")
    ap.add_argument("--train-fraction", type=float, default=0.9)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--bench-steps", type=int, default=0, help="only time this many steps (no eval)")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args()

    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise SystemExit("torch_char_gpt: CUDA is not available (try --device cpu)")
    if args.mode == "graph" and not cuda:
        raise SystemExit("torch_char_gpt: --mode graph needs --device cuda")
    if args.dim % args.heads:
        raise SystemExit(f"torch_char_gpt: --dim {args.dim} is not a multiple of --heads {args.heads}")
    dev = torch.device(args.device)
    steps = args.bench_steps if args.bench_steps > 0 else args.steps

    corpus = CharCorpus(args.corpus, args.train_fraction)
    for name, split in (("train", corpus.train), ("val", corpus.val)):
        if args.context >= len(split):
            raise SystemExit(f"torch_char_gpt: context {args.context} needs {args.context} + 1 tokens, "
                             f"the {name} split has {len(split)}")
    train_tok, val_tok = corpus.train.to(dev), corpus.val.to(dev)
    offsets = corpus.sample_offsets(CutrainRng(args.seed), steps, args.batch, args.context).to(dev)
    val_off = CharCorpus.eval_offsets(len(corpus.val), args.batch, args.context, args.eval_batches).to(dev)
    val_x, val_y = windows(val_tok, val_off, args.context)

    torch.manual_seed(args.seed)
    model = CharGPT(len(corpus.vocab), args.context, args.dim, args.layers, args.heads).to(dev)
    compiled = torch.compile(model) if args.mode == "compile" else model
    opt = make_optimizer(model, args, cuda, args.lr)
    step = build_step(model, compiled, opt, args, cuda, train_tok)
    n_params = sum(p.numel() for p in model.parameters())
    where = torch.cuda.get_device_name() if cuda else "cpu"
    print(f"torch {torch.__version__}, {where}, mode {args.mode}; corpus {args.corpus}: {corpus.size} bytes, "
          f"vocab {len(corpus.vocab)}, train {len(corpus.train)}, val {len(corpus.val)}, sha256 {corpus.sha256[:16]}")
    print(f"model: {args.layers} layers, {args.heads} heads, dim {args.dim}, context {args.context}, "
          f"{n_params / 1e6:.2f} M parameters; batch {args.batch}, {steps} steps")

    losses = torch.zeros(steps, device=dev)
    timer = StepTimer(cuda)
    evals = []
    t0 = time.perf_counter()
    for k in range(steps):
        begin = timer.start()
        loss = step(offsets[k], lr_at(k, args.steps, args.lr, args.min_lr, args.warmup))
        losses[k].copy_(loss)
        timer.stop(begin)
        done = k + 1
        if args.bench_steps <= 0 and (done % args.eval_every == 0 or done == steps):
            train_loss = losses[max(0, done - 100):done].mean().item()
            vl = val_loss(model, val_x, val_y, cuda)
            evals.append({"step": done, "train_loss": train_loss, "val_loss": vl, "val_bpc": vl / math.log(2)})
            print(f"step {done:5d} | train {train_loss:.4f} | val {vl:.4f} | val bpc {vl / math.log(2):.4f}", flush=True)
    ms = timer.ms()
    wall = time.perf_counter() - t0
    first = 50 if steps > 50 else steps // 2
    median_ms = statistics.median(ms[first:])
    tokens_s = args.batch * args.context / (median_ms / 1e3)
    print(f"median step {median_ms:.3f} ms over steps {first}..{steps - 1}, {tokens_s:,.0f} tokens/s; "
          f"{wall:.1f} s in all; final train loss {losses[-1].item():.4f}")
    if args.out:
        result = {
            "config": vars(args), "steps_run": steps, "parameters": n_params,
            "corpus": {"path": args.corpus, "bytes": corpus.size, "sha256": corpus.sha256, "vocab": len(corpus.vocab),
                       "train_tokens": len(corpus.train), "val_tokens": len(corpus.val)},
            "evals": evals, "median_step_ms": median_ms, "tokens_per_s": tokens_s, "first_timed_step": first,
            "wall_s": wall, "torch": torch.__version__, "device": where,
            "cuda": torch.version.cuda if cuda else None,
        }
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
# Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
"""Writes a synthetic training step of a decoder-only transformer in cistern's trace format.

The traces in traces/synthetic/ are made by this script (the command that made each is in its
second line, spaces written as \\x20), so that the project has workloads of its own:
`scripts/run.sh` replays them on a clone without ../shared. The step is what PyTorch's allocator
sees in one iteration of an fp32 training loop with AdamW, in steady state:

- before the window (live blocks): the weights (token embedding, per layer the attention
  projections, the MLP and two norms, the final norm) and AdamW's two moment buffers per weight;
- forward: the input batch (copied on a side stream and synchronised), then per layer the
  activations autograd saves (norm output, q/k/v, attention probabilities, attention output, MLP
  input and the GELU output) and short-lived temporaries, plus a cuBLAS workspace per matmul;
  the logits and the loss at the end;
- backward, layers in reverse: each weight's gradient (allocated on first use, as
  `zero_grad(set_to_none=True)` leaves none), activation gradients that live for one layer,
  and the saved activations freed as their layer is done;
- the optimizer step: a temporary per weight, then the gradients freed.

Sizes are exact for the shapes given (4 bytes per element); the allocation order follows the
computation, not a measured run. Usage:

  scripts/synth_trace.py --layers 6 --hidden 512 --heads 8 --seq 256 --batch 8 \\
      --vocab 32000 -o traces/synthetic/transformer_6l_512h.trace.gz
"""
import argparse
import gzip
import shlex
import sys

FLOAT = 4
WORKSPACE = 4 * 1024 * 1024  # cuBLAS's default workspace per matmul: 4 MiB


class Trace:
    """Collects the records and numbers allocations densely, as cistern's readers do."""

    def __init__(self):
        self.live = []    # (id, size) before the window
        self.lines = []   # event lines
        self.next_id = 0
        self.time = 0
        self.sizes = {}

    def _id(self, size):
        i = self.next_id
        self.next_id += 1
        self.sizes[i] = size
        return i

    def before(self, size):
        i = self._id(size)
        self.live.append((i, size))
        return i

    def alloc(self, size, stream=0):
        i = self._id(size)
        self.time += 1
        self.lines.append(f"a {i} {size} {stream} 0x0 {self.time}")
        return i

    def free(self, i, stream=0):
        self.time += 1
        self.lines.append(f"f {i} {stream} {self.time}")

    def sync(self):
        self.time += 1
        self.lines.append(f"s 0 {self.time}")

    def write(self, path, command):
        # cistern's reader reads at most 8 fields a line, comments included: the command goes in
        # one field, its spaces written as '\x20' (the format's escape for text).
        out = ["# cistern-trace v1", "# made-by " + command.replace(" ", "\\x20"),
               "format cistern", "device 0",
               "stream 0x0", "stream 0x1"]
        out += [f"live {i} {size} 0" for i, size in self.live]
        out += self.lines
        data = ("\n".join(out) + "\n").encode()
        if path.endswith(".gz"):
            # mtime 0: the same command always writes the same bytes.
            with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0,
                                                          filename="") as f:
                f.write(data)
        else:
            with open(path, "wb") as f:
                f.write(data)


def matmul(t, out_elems):
    """A matmul's output and its cuBLAS workspace (freed when the call returns)."""
    w = t.alloc(WORKSPACE)
    out = t.alloc(out_elems * FLOAT)
    t.free(w)
    return out


def step(a):
    t = Trace()
    h, s, b, v, L = a.hidden, a.seq, a.batch, a.vocab, a.layers
    tokens = b * s
    ff = 4 * h
    weight_shapes = [("embed", v * h)]
    for l in range(L):
        weight_shapes += [(f"l{l}.ln1", 2 * h), (f"l{l}.qkv", 3 * h * h), (f"l{l}.proj", h * h),
                          (f"l{l}.ln2", 2 * h), (f"l{l}.fc1", ff * h), (f"l{l}.fc2", h * ff)]
    weight_shapes.append(("ln_f", 2 * h))
    weights = [(name, t.before(n * FLOAT)) for name, n in weight_shapes]
    for _ in range(2):  # AdamW's exp_avg and exp_avg_sq
        for _, n in weight_shapes:
            t.before(n * FLOAT)

    # The batch: copied on the side stream, then the compute stream waits for it.
    batch = t.alloc(tokens * 8, stream=1)  # int64 token ids
    t.sync()
    x = t.alloc(tokens * h * FLOAT)  # embedding output
    saved = []
    for l in range(L):
        ln1 = t.alloc(tokens * h * FLOAT)
        qkv = matmul(t, tokens * 3 * h)
        scores = matmul(t, b * a.heads * s * s)
        probs = t.alloc(b * a.heads * s * s * FLOAT)
        t.free(scores)
        attn = matmul(t, tokens * h)
        proj = matmul(t, tokens * h)
        x2 = t.alloc(tokens * h * FLOAT)  # residual
        t.free(proj)
        ln2 = t.alloc(tokens * h * FLOAT)
        fc1 = matmul(t, tokens * ff)
        gelu = t.alloc(tokens * ff * FLOAT)
        fc2 = matmul(t, tokens * h)
        x3 = t.alloc(tokens * h * FLOAT)
        t.free(fc2)
        saved.append([x, ln1, qkv, probs, attn, x2, ln2, fc1, gelu])
        x = x3
    lnf = t.alloc(tokens * h * FLOAT)
    logits = matmul(t, tokens * v)
    loss = t.alloc(FLOAT)

    # Backward.
    grads = {}
    dlogits = t.alloc(tokens * v * FLOAT)
    t.free(logits)
    grads["embed"] = t.alloc(v * h * FLOAT)  # tied output embedding
    dx = matmul(t, tokens * h)
    t.free(dlogits)
    grads["ln_f"] = t.alloc(2 * h * FLOAT)
    t.free(lnf)
    for l in reversed(range(L)):
        x_in, ln1, qkv, probs, attn, x2, ln2, fc1, gelu = saved[l]
        dgelu = matmul(t, tokens * ff)
        grads[f"l{l}.fc2"] = matmul(t, h * ff)
        t.free(gelu)
        dfc1 = t.alloc(tokens * ff * FLOAT)
        t.free(dgelu)
        grads[f"l{l}.fc1"] = matmul(t, ff * h)
        t.free(fc1)
        dln2 = matmul(t, tokens * h)
        t.free(dfc1)
        grads[f"l{l}.ln2"] = t.alloc(2 * h * FLOAT)
        t.free(ln2)
        dx2 = t.alloc(tokens * h * FLOAT)
        t.free(dln2)
        t.free(dx)
        grads[f"l{l}.proj"] = matmul(t, h * h)
        dattn = matmul(t, tokens * h)
        t.free(attn)
        t.free(x2)
        dprobs = matmul(t, b * a.heads * s * s)
        t.free(probs)
        dqkv = matmul(t, tokens * 3 * h)
        t.free(dprobs)
        t.free(dattn)
        grads[f"l{l}.qkv"] = matmul(t, 3 * h * h)
        t.free(qkv)
        dln1 = matmul(t, tokens * h)
        t.free(dqkv)
        grads[f"l{l}.ln1"] = t.alloc(2 * h * FLOAT)
        t.free(ln1)
        dx = t.alloc(tokens * h * FLOAT)
        t.free(dln1)
        t.free(dx2)
        t.free(x_in)
    t.free(dx)
    t.free(x)
    t.free(loss)
    t.free(batch)

    # AdamW: one temporary per weight, then the gradients go (set_to_none).
    for name, _ in weights:
        tmp = t.alloc(t.sizes[grads[name]])
        t.free(tmp)
    for name, _ in weights:
        t.free(grads[name])
    return t


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("-o", "--output", required=True)
    a = p.parse_args(argv)
    command = "scripts/synth_trace.py " + " ".join(shlex.quote(x) for x in argv)
    step(a).write(a.output, command)


if __name__ == "__main__":
    main(sys.argv[1:])

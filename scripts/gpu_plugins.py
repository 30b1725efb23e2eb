# Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
"""GPU checks of the framework plug-ins (run by scripts/gpu-plugins.sh; each mode in its own
process, since an allocator can only be swapped before the first CUDA allocation).

  python3 scripts/gpu_plugins.py torch-train {cistern|native} OUT.json [SNAPSHOT.pickle]
  python3 scripts/gpu_plugins.py cupy {cistern|native} OUT.json
  python3 scripts/gpu_plugins.py compare A.json B.json

torch-train: a small GPT-style model from torch.nn trains 20 steps on random data (fixed seeds,
deterministic kernels) and writes its losses and peak reserved bytes; with cistern it also
writes the plug-in's snapshot. cupy: a fixed sequence of array operations, with the result
checksum and the peak. compare: same losses/checksum exactly, and both peaks side by side.
Exit status 0 = pass, 1 = fail, 77 = skipped (no torch/CuPy or no GPU), with a message."""
import json
import os
import sys

SKIP = 77


def skip(message):
    print("gpu-plugins: SKIP: " + message)
    sys.exit(SKIP)


def torch_train(mode, out, snapshot=None):
    try:
        import torch
    except ImportError:
        skip("torch is not installed")
    if not torch.cuda.is_available():
        skip("torch sees no CUDA GPU")
    import cistern
    import cistern.torch
    if mode == "cistern":
        cistern.torch.enable()
        cistern.record_history(True)
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    vocab, width, heads, layers, context, batch = 512, 256, 4, 4, 128, 16

    class GPT(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(vocab, width)
            self.position = torch.nn.Embedding(context, width)
            layer = torch.nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0,
                                                     batch_first=True, norm_first=True)
            self.blocks = torch.nn.TransformerEncoder(layer, layers)
            self.head = torch.nn.Linear(width, vocab)

        def forward(self, tokens):
            n = tokens.shape[1]
            mask = torch.nn.Transformer.generate_square_subsequent_mask(n, device=tokens.device)
            x = self.embed(tokens) + self.position(torch.arange(n, device=tokens.device))
            return self.head(self.blocks(x, mask=mask, is_causal=True))

    model = GPT().cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator(device="cpu").manual_seed(1)
    losses = []
    for _ in range(20):
        tokens = torch.randint(0, vocab, (batch, context + 1), generator=generator).cuda()
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab),
                                                 tokens[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    torch.cuda.synchronize()
    if mode == "cistern":
        stats = cistern.torch.memory_stats()
        if snapshot:
            cistern.write_snapshot(snapshot)
        misuse = cistern.misuse_count()
    else:
        stats = torch.cuda.memory_stats()
        misuse = 0
    result = {"mode": mode, "losses": losses, "peak_reserved": stats["reserved_bytes.all.peak"],
              "peak_allocated": stats["allocated_bytes.all.peak"], "misuse": misuse}
    with open(out, "w") as f:
        json.dump(result, f)
    print(json.dumps(result))


def cupy_run(mode, out):
    try:
        import cupy
    except ImportError:
        skip("CuPy is not installed")
    try:
        if cupy.cuda.runtime.getDeviceCount() == 0:
            skip("CuPy sees no CUDA GPU")
    except cupy.cuda.runtime.CUDARuntimeError:
        skip("CuPy sees no CUDA GPU")
    import cistern
    import cistern.cupy
    if mode == "cistern":
        cistern.cupy.enable()
    rng = cupy.random.RandomState(seed=0)
    total = 0.0
    for step in range(20):
        a = rng.standard_normal((512 + 16 * step, 512), dtype=cupy.float64)
        b = a @ a.T
        total += float(cupy.tanh(b / 512.0).sum())
        del a, b
    cupy.cuda.Stream.null.synchronize()
    if mode == "cistern":
        peak = cistern.memory_stats(cupy.cuda.runtime.getDevice())["reserved_bytes.all.peak"]
    else:
        peak = cupy.get_default_memory_pool().total_bytes()
    result = {"mode": mode, "checksum": total, "peak_reserved": peak}
    with open(out, "w") as f:
        json.dump(result, f)
    print(json.dumps(result))


def compare(a_path, b_path):
    with open(a_path) as f:
        a = json.load(f)
    with open(b_path) as f:
        b = json.load(f)
    key = "losses" if "losses" in a else "checksum"
    print("%-10s %20s %20s" % ("", a["mode"], b["mode"]))
    print("%-10s %20d %20d" % ("peak_reserved", a["peak_reserved"], b["peak_reserved"]))
    if a[key] != b[key]:
        print("gpu-plugins: FAIL: %s differ:\n  %s\n  %s" % (key, a[key], b[key]))
        return 1
    if a.get("misuse", 0) or b.get("misuse", 0):
        print("gpu-plugins: FAIL: cistern recorded misuse")
        return 1
    print("gpu-plugins: %s identical (%s)" % (key, a[key] if key == "checksum" else a[key][-1]))
    return 0


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 2
    command = argv[1]
    if command == "torch-train":
        torch_train(argv[2], argv[3], argv[4] if len(argv) > 4 else None)
    elif command == "cupy":
        cupy_run(argv[2], argv[3])
    elif command == "compare":
        return compare(argv[2], argv[3])
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""The optimizer step alone, on MobileNetV1's 83 parameter tensors: standard vs foreach vs fused.

python scripts/bench_optimizer.py [--device auto] [--width 1.0] [--optimizer sgd] [--json FILE]
Prints ms/step (median of --repeats runs of --iterations steps) and aten ops dispatched per step.
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def variants(device):
    """(label, build_optimizer impl, multi-tensor foreach path) for this device."""
    fused = "NpuFused (torch_npu)" if device.type == "npu" else "fused (fused=True)"
    return [("standard (foreach=False)", "standard", False),
            ("foreach (multi-tensor)", "standard", True), (fused, "fused", False)]


def build(model, name, impl, foreach, device):
    from mobilenet.optim import build_optimizer
    optimizer = build_optimizer(model, name, impl, lr=0.1, momentum=0.9, weight_decay=1e-4,
                                device=device)
    for group in optimizer.param_groups:  # torch reads the flag at every step
        group["foreach"] = foreach or group["foreach"]
    return optimizer


def measure(optimizer, device, iterations, repeats):
    from mobilenet.bench import count_ops
    from mobilenet.device import synchronize
    for _ in range(3):  # lazy state (momentum buffers, fused buffers) and caches
        optimizer.step()
    ops = count_ops(optimizer.step)
    times = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        for _ in range(iterations):
            optimizer.step()
        synchronize(device)
        times.append(1000 * (time.perf_counter() - start) / iterations)
    return statistics.median(times), ops


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--device", default="auto", choices=["auto", "npu", "cuda", "cpu"])
    p.add_argument("--width", type=float, default=1.0)
    p.add_argument("--optimizer", default="sgd", choices=["sgd", "adam", "adamw", "rmsprop"])
    p.add_argument("--iterations", type=int, default=50)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args(argv)

    import torch

    from mobilenet.device import describe, resolve_device
    from mobilenet.model import MobileNetV1
    device = resolve_device(args.device)
    rows = []
    for label, impl, foreach in variants(device):
        torch.manual_seed(0)
        model = MobileNetV1(args.width).to(device)
        for p_ in model.parameters():
            p_.grad = torch.randn_like(p_) * 1e-3
        optimizer = build(model, args.optimizer, impl, foreach, device)
        ms, ops = measure(optimizer, device, args.iterations, args.repeats)
        rows.append({"variant": label, "ms_per_step": ms, "ops_per_step": ops})
    base = rows[0]
    print(f"{args.optimizer} step on MobileNetV1 x{args.width} ({sum(1 for _ in model.parameters())} "
          f"tensors), {describe(device)}")
    print("| variant | ms/step | ops/step | time vs standard | ops vs standard |\n|---|---|---|---|---|")
    for r in rows:
        r["time_ratio"] = r["ms_per_step"] / base["ms_per_step"]
        r["ops_ratio"] = r["ops_per_step"] / base["ops_per_step"]
        print(f"| {r['variant']} | {r['ms_per_step']:.3f} | {r['ops_per_step']} | "
              f"{r['time_ratio']:.2f}x | {r['ops_ratio']:.3f}x |")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": str(device), "optimizer": args.optimizer,
                                               "width": args.width, "rows": rows}, indent=2) + "\n")
    return rows


if __name__ == "__main__":
    main()

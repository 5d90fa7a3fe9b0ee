"""The optimizer step alone, on MobileNetV1's 83 parameter tensors: loop vs foreach vs fused
(plus torch_npu's NpuFused on npu).

python scripts/bench_optimizer.py [--device auto] [--width 1.0] [--optimizer sgd] [--json FILE]
Prints ms/step (median of --repeats runs of --iterations steps) and aten ops dispatched per step.
"""
import argparse
import json
import statistics
import time
from pathlib import Path



def implementations(device, name):
    """The implementations this device runs, the first being the baseline of the ratios."""
    from mobilenet.optim import ALGORITHMS
    found = ["loop", "foreach"] + ["fused"] * ALGORITHMS[name].fused_kernel
    return found + ["npu_fused"] * (device.type == "npu")


def build(model, name, implementation):
    from mobilenet.optim import ALGORITHMS, build_optimizer
    defaults = {"momentum": 0.9, "nesterov": False, "betas": (0.9, 0.999), "eps": 1e-8, "alpha": 0.99}
    hyper = {key: defaults[key] for key in ALGORITHMS[name].hyperparameters}
    return build_optimizer(model, implementation=implementation, name=name, lr=0.1,
                           weight_decay=1e-4, **hyper)


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

    from mobilenet.device import choose_device, describe, open_device
    from mobilenet.model import MobileNetV1
    from mobilenet.optim import describe_optimizer
    device = open_device(choose_device(args.device))
    rows = []
    for implementation in implementations(device, args.optimizer):
        torch.manual_seed(0)
        model = MobileNetV1(args.width).to(device)
        for p_ in model.parameters():
            p_.grad = torch.randn_like(p_) * 1e-3
        optimizer = build(model, args.optimizer, implementation)
        ms, ops = measure(optimizer, device, args.iterations, args.repeats)
        rows.append({"variant": implementation, "class": describe_optimizer(args.optimizer, implementation),
                     "ms_per_step": ms, "ops_per_step": ops})
    base = rows[0]
    print(f"{args.optimizer} step on MobileNetV1 x{args.width} ({sum(1 for _ in model.parameters())} "
          f"tensors), {describe(device)}")
    print("| implementation | ms/step | ops/step | time vs loop | ops vs loop |\n|---|---|---|---|---|")
    for r in rows:
        r["time_ratio"] = r["ms_per_step"] / base["ms_per_step"]
        r["ops_ratio"] = r["ops_per_step"] / base["ops_per_step"]
        print(f"| {r['class']} | {r['ms_per_step']:.3f} | {r['ops_per_step']} | "
              f"{r['time_ratio']:.2f}x | {r['ops_ratio']:.3f}x |")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": str(device), "optimizer": args.optimizer,
                                               "width": args.width, "rows": rows}, indent=2) + "\n")
    return rows


if __name__ == "__main__":
    main()

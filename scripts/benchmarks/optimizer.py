"""The optimizer step alone, on a model's parameter tensors (MobileNetV1's 83 by default): loop vs
foreach vs fused (plus torch_npu's NpuFused on npu).

python scripts/bench.py optimizer [--device auto] [--model mobilenet_v1] [--width 1.0] [--algorithm sgd] [--json FILE]
Prints ms/step (median over --rounds interleaved rounds of --iterations steps, with the spread and
the other processes' CPU share per round) and aten ops dispatched per step.
"""
import time


def implementations(device, name):
    """The implementations this device runs, the first being the baseline of the ratios."""
    from mobilenet.optim import ALGORITHMS
    found = ["loop", "foreach"] + ["torch_fused"] * ("fused" in ALGORITHMS[name].kernels)
    return found + ["npu_fused"] * (device.type == "npu")


def build(model, name, implementation):
    from mobilenet.optim import ALGORITHMS, build_optimizer
    defaults = {"momentum": 0.9, "nesterov": False, "betas": (0.9, 0.999), "eps": 1e-8, "alpha": 0.99}
    hyper = {key: defaults[key] for key in ALGORITHMS[name].hyperparameters}
    return build_optimizer(model, implementation=implementation, name=name, lr=0.1,
                           weight_decay=1e-4, **hyper)


def prepare(optimizer, device, iterations):
    """(aten ops of one step, a function returning ms/step over ``iterations`` steps)."""
    from benchmarks.harness import count_ops
    from mobilenet.device import synchronize
    for _ in range(3):  # lazy state (momentum buffers, fused buffers) and caches
        optimizer.step()

    def ms_per_step():
        synchronize(device)
        start = time.perf_counter()
        for _ in range(iterations):
            optimizer.step()
        synchronize(device)
        return 1000 * (time.perf_counter() - start) / iterations
    return count_ops(optimizer.step), ms_per_step


def main(argv=None):
    from benchmarks.harness import benchmark_parser
    from mobilenet.device import DEVICES
    from mobilenet.model import MODELS
    from mobilenet.optim import ALGORITHMS
    p = benchmark_parser(__doc__, rounds=7)
    p.add_argument("--device", default="auto", choices=DEVICES)
    p.add_argument("--model", default="mobilenet_v1", choices=sorted(MODELS))
    p.add_argument("--width", type=float, default=1.0)
    p.add_argument("--algorithm", default="sgd", choices=sorted(ALGORITHMS),
                   help="optim.name; each implementation of it is timed")
    p.add_argument("--iterations", type=int, default=50)
    args = p.parse_args(argv)

    import torch

    from benchmarks.harness import interleave, markdown_table, write_json
    from mobilenet.device import choose_device, describe, open_device
    from mobilenet.model import build_model
    from mobilenet.optim import describe_optimizer
    device = open_device(choose_device(args.device))
    ops, timers = {}, {}
    for implementation in implementations(device, args.algorithm):
        torch.manual_seed(0)
        model = build_model({"name": args.model, "width_mult": args.width, "num_classes": 1000}).to(device)
        for p_ in model.parameters():
            p_.grad = torch.randn_like(p_) * 1e-3
        optimizer = build(model, args.algorithm, implementation)
        ops[implementation], timers[implementation] = prepare(optimizer, device, args.iterations)
    rounds = interleave(timers, args.rounds)
    base = next(iter(ops))
    print(f"{args.algorithm} step on {args.model} x{args.width} ({sum(1 for _ in model.parameters())} "
          f"tensors), {describe(device)}; {rounds.describe()}")
    rows = []
    for name in ops:
        ratio = rounds.ratio(name, base)
        row = {"variant": name, "class": describe_optimizer(args.algorithm, name),
               "ms_per_step": rounds.median(name), "ms_spread": rounds.spread(name),
               "ops_per_step": ops[name], "time_ratio": ratio[0], "time_ratio_spread": ratio[1:],
               "ops_ratio": ops[name] / ops[base]}
        rows.append(row)
    print(markdown_table(["implementation", "ms/step (median, min-max)", "ops/step",
                          f"time vs {base} (median, min-max)", f"ops vs {base}"],
                         [[row["class"], rounds.cell(row["variant"], digits=3), row["ops_per_step"],
                           rounds.ratio_cell(row["variant"], base), f"{row['ops_ratio']:.3f}x"] for row in rows]))
    write_json(args.json, {"device": str(device), "optimizer": args.algorithm, "width": args.width,
                           "rows": rows, **rounds.to_json()})
    return rows


if __name__ == "__main__":
    main()

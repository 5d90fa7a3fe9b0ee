"""The launch budget of one training step: aten ops dispatched (kernel launches on an accelerator),
phase by phase, for each optimizer implementation and amp level.

python scripts/bench.py ops [--device auto] [--width 1.0] [--resolution 224] [--levels O0 O1 O2]
                            [--dtype bfloat16|float16] [--ema-decay 0] [--json FILE] [key.sub=value ...]
Phases: input (copy to the device, normalise, layout), forward, loss, backward, unscale (amp: the
fp32 master grads and the overflow check), optimizer (O2: and the masters copied back), zero_grad,
ema, scheduler. Counted with a TorchDispatchMode on the step after 3 warm-up steps; the counts do
not depend on the batch size.
"""

from benchmarks.harness import AMP_DTYPES, AMP_LEVELS, ROOT



def budgets(args, overrides):
    """[{implementation, amp, phase counts..., total}] for every implementation and level."""
    from benchmarks.harness import op_budget
    from mobilenet.measure import PHASES
    from mobilenet.config import build_config, resolve
    from mobilenet.device import open_device
    from mobilenet.optim import SETTINGS
    rows = []
    for level in args.levels:
        for name, settings in SETTINGS.items():
            cfg = resolve(build_config(ROOT / "configs" / "synthetic.yaml", [
                f"device={args.device}", f"model.width_mult={args.width}",
                f"model.resolution={args.resolution}", f"data.batch_size={args.batch_size}",
                f"amp.level={level}", f"amp.dtype={args.dtype}", "amp.backend=native",
                f"train.ema_decay={args.ema_decay}", *settings, *overrides]))
            counts = op_budget(cfg, open_device(cfg["derived"]["device"]))
            rows.append({"implementation": cfg["derived"]["optimizer_implementation"], "amp": level, **counts,
                         "total": sum(counts[p] for p in PHASES)})
    return rows


def main(argv=None):
    from benchmarks.harness import benchmark_parser
    from mobilenet.device import DEVICES
    p = benchmark_parser(__doc__, rounds=None)  # counts, not times
    p.add_argument("--device", default="auto", choices=DEVICES)
    p.add_argument("--width", type=float, default=1.0)
    p.add_argument("--resolution", type=int, default=224)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--levels", nargs="+", default=AMP_LEVELS)
    p.add_argument("--dtype", default="bfloat16", choices=AMP_DTYPES)
    p.add_argument("--ema-decay", type=float, default=0.0)
    args, overrides = p.parse_known_args(argv)
    from benchmarks.harness import markdown_table, write_json
    from mobilenet.measure import PHASES
    rows = budgets(args, overrides)
    print(f"aten ops per training step, MobileNetV1 x{args.width} at {args.resolution}px, "
          f"amp dtype {args.dtype}" + (f", EMA {args.ema_decay}" if args.ema_decay else ""))
    print(markdown_table(["implementation", "amp", *PHASES, "total"],
                         [[row["implementation"], row["amp"], *(row[p] for p in PHASES), row["total"]]
                          for row in rows]))
    write_json(args.json, {"width": args.width, "resolution": args.resolution, "dtype": args.dtype,
                           "phases": PHASES, "rows": rows})
    return rows


if __name__ == "__main__":
    main()

"""Training img/s with train.compile (torch.compile of the model and the optimizer step) against
eager, under amp O0 and O1, on the demo model and on the full model.

python scripts/bench.py compile [--models demo full] [--levels O0 O1] [--dtype bfloat16]
                                [--rounds 3] [--steps 12] [--json FILE] [key.sub=value ...]
demo: the bundled demo recipe (width 0.25 at 32, batch 32); full: width 1.0 at 224, batch 16,
synthetic images. Each variant is a short run of the app's own loop in this process (img/s of its
log intervals after the first; a compiled run's first two steps, which compile, are left out as in
any run; the synthetic set is sized to hold the steps).
Compilation happens once per graph in the process, so it stays out of every round. Variants take
turns for --rounds rounds (reversed every other round); the table shows medians with min-max and
the ratio to eager of the same model and level. Rounds in which other processes took over a
quarter of the machine are dropped.
"""

from benchmarks.harness import AMP_DTYPES, ROOT

MODELS = {"demo": (ROOT / "configs" / "demo.yaml", ["data.path=digits"]),
          "full": (ROOT / "configs" / "synthetic.yaml",
                   ["model.width_mult=1.0", "model.resolution=224", "data.batch_size=16", "data.workers=0"])}


def main(argv=None):
    from benchmarks.harness import benchmark_parser
    p = benchmark_parser(__doc__, rounds=3)
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--levels", nargs="+", default=["O0", "O1"])
    p.add_argument("--dtype", default="bfloat16", choices=AMP_DTYPES)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--log-every", type=int, default=4)
    args, overrides = p.parse_known_args(argv)
    from mobilenet.device import cpu_model
    from benchmarks.harness import interleave, markdown_table, training_img_per_s, write_json
    variants = {}
    for model in args.models:
        config, settings = MODELS[model]
        for level in args.levels:
            for mode in ("eager", "compiled"):
                extra = [*settings, f"amp.level={level}", f"amp.dtype={args.dtype}", "amp.backend=native",
                         f"train.compile={mode == 'compiled'}", *overrides]
                variants[f"{model} {level} {mode}"] = (lambda config=config, extra=extra: training_img_per_s(
                    config, extra, steps=args.steps, log_every=args.log_every))
    for measure in variants.values():  # compile every graph once, before the rounds
        measure()
    rounds = interleave(variants, args.rounds)
    print(f"{cpu_model()}; amp dtype {args.dtype}; {rounds.describe()}")
    rows, table = [], []
    for name in variants:
        model, level, mode = name.split()
        base = f"{model} {level} eager"
        ratio = rounds.ratio(name, base)
        rows.append({"model": model, "amp": level, "step": mode, "img_per_s": rounds.median(name),
                     "spread": rounds.spread(name), "vs_eager": ratio[0], "vs_eager_spread": ratio[1:]})
        table.append([model, level, mode, rounds.cell(name), rounds.ratio_cell(name, base)])
    print(markdown_table(["model", "amp", "step", "img/s (median, min-max)", "vs eager (median, min-max)"], table))
    write_json(args.json, {"cpu": cpu_model(), "rows": rows, **rounds.to_json()})
    return rows


if __name__ == "__main__":
    main()

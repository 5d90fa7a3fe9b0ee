"""Training img/s under every amp level x optimizer, on the full model and on the demo model, to
show where bfloat16 pays on this CPU (or float16/bfloat16 on an accelerator).

python scripts/bench.py amp [--dtype bfloat16] [--levels O0 O1 O2] [--rounds 3] [--steps 12]
                            [--models full demo] [--json FILE]
full: width 1.0 at 224, batch 32, synthetic images; demo: the bundled demo recipe (width 0.25 at
32, batch 32, the digits). Each variant is a short run of the app's own loop in this process
(img/s after its first log interval); the variants take turns for --rounds rounds (reversed every
other round) and the table shows medians with their spread and the ratio to O0 of the same model
and optimizer. Rounds in which other processes took over a quarter of the machine are dropped.
"""

from benchmarks.harness import AMP_DTYPES, AMP_LEVELS, ROOT

MODELS = {"full": (ROOT / "configs" / "synthetic.yaml",
                   ["model.width_mult=1.0", "model.resolution=224", "data.batch_size=32", "data.workers=0"]),
          "demo": (ROOT / "configs" / "demo.yaml", ["data.path=digits"])}
OPTIMIZERS = {"standard": ["optim.impl=standard"], "fused": ["optim.impl=fused"]}


def main(argv=None):
    from benchmarks.harness import benchmark_parser
    p = benchmark_parser(__doc__, rounds=3)
    p.add_argument("--dtype", default="bfloat16", choices=AMP_DTYPES)
    p.add_argument("--levels", nargs="+", default=AMP_LEVELS)
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--steps", type=int, default=12)
    args, overrides = p.parse_known_args(argv)
    from mobilenet.device import cpu_bf16_features, cpu_model
    from benchmarks.harness import interleave, markdown_table, training_img_per_s, write_json
    variants = {}
    for model in args.models:
        config, settings = MODELS[model]
        for level in args.levels:
            for impl, optim in OPTIMIZERS.items():
                extra = [*settings, *optim, f"amp.level={level}", f"amp.dtype={args.dtype}",
                         "amp.backend=native", *overrides]
                variants[(model, level, impl)] = (lambda config=config, extra=extra:
                                                  training_img_per_s(config, extra, steps=args.steps))
    named = {" ".join(key): fn for key, fn in variants.items()}
    rounds = interleave(named, args.rounds)
    print(f"amp dtype {args.dtype}; {cpu_model()}; {rounds.describe()}")
    rows, table = [], []
    for model, level, impl in variants:
        name, base = f"{model} {level} {impl}", f"{model} O0 {impl}"
        ratio = rounds.ratio(name, base) if base in named else (float("nan"),) * 3
        rows.append({"model": model, "amp": level, "optimizer": impl, "img_per_s": rounds.median(name),
                     "spread": rounds.spread(name), "vs_O0": ratio[0], "vs_O0_spread": ratio[1:]})
        table.append([model, level, impl, rounds.cell(name), rounds.ratio_cell(name, base) if base in named else "-"])
    print(markdown_table(["model", "amp", "optimizer", "img/s (median, min-max)", "vs O0 (median, min-max)"], table))
    write_json(args.json, {"dtype": args.dtype, "cpu_bf16_features": cpu_bf16_features(), "rows": rows,
                           **{k: v for k, v in rounds.to_json().items() if k != "rounds"}})
    return rows


if __name__ == "__main__":
    main()

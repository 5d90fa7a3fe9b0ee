"""What gradient accumulation costs per image: A forwards of batch b accumulated into one optimizer
step, against plain steps of b, and one batch of A x b beside them.

python scripts/bench.py accumulation [--accumulation 4] [--batch-size 8] [--width 1.0]
                                     [--resolution 224] [--rounds 3] [--steps 8] [--json FILE]
The synthetic recipe, width 1.0 at 224 px by default (the step compute-bound). Each variant is a
short run of the app's own loop in this process (img/s of its log intervals after the first; a
step of A forwards counts A x b images). Variants take turns for --rounds rounds (reversed every
other round); the table shows medians with min-max and the ratio to plain steps of b.
"""

from benchmarks.harness import ROOT


def main(argv=None):
    from benchmarks.harness import benchmark_parser
    p = benchmark_parser(__doc__, rounds=3)
    p.add_argument("--accumulation", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--width", type=float, default=1.0)
    p.add_argument("--resolution", type=int, default=224)
    p.add_argument("--steps", type=int, default=8)
    args, overrides = p.parse_known_args(argv)
    from benchmarks.harness import interleave, markdown_table, training_img_per_s, write_json
    from mobilenet.device import cpu_model
    a, b = args.accumulation, args.batch_size
    common = [f"model.width_mult={args.width}", f"model.resolution={args.resolution}", "data.workers=0", *overrides]
    cases = {f"plain steps of {b}": [f"data.batch_size={b}"],
             f"{a} forwards of {b} a step": [f"data.batch_size={b}", f"train.grad_accum_steps={a}"],
             f"one batch of {a * b}": [f"data.batch_size={a * b}"]}
    config = ROOT / "configs" / "synthetic.yaml"
    variants = {name: (lambda extra=extra: training_img_per_s(config, [*common, *extra], steps=args.steps,
                                                              log_every=args.steps // 2))
                for name, extra in cases.items()}
    rounds = interleave(variants, args.rounds)
    base = f"plain steps of {b}"
    print(f"{cpu_model()}; synthetic, width {args.width:g} at {args.resolution} px; {rounds.describe()}")
    print(markdown_table(["step", "img/s (median, min-max)", f"vs {base} (median, min-max)"],
                         [[name, rounds.cell(name), rounds.ratio_cell(name, base)] for name in variants]))
    rows = [{"step": name, "img_per_s": rounds.median(name), "spread": rounds.spread(name),
             "vs_plain": rounds.ratio(name, base)} for name in variants]
    write_json(args.json, {"cpu": cpu_model(), "rows": rows, **rounds.to_json()})
    return rows


if __name__ == "__main__":
    main()

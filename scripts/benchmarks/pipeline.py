"""End-to-end training against the same training step fed from memory: how much the input
pipeline costs (data.workers, decoding, augmentation, copies, the loop's own work).

python scripts/bench.py pipeline [--config configs/demo.yaml] [--workers 0 1] [--rounds 5]
                                 [--steps 40] [--json FILE] [key.sub=value ...]
"end to end" is engine.run (train.py's loop) for --steps steps, its img/s from its progress
intervals after the first; "from memory" is the same TrainStep (same model, optimizer, amp) over
batches prepared beforehand, plus the LR schedule's step, timed over the same steps. The variants
take turns in one process for --rounds rounds (reversed every other round); the ratios are
medians of the rounds' ratios, and rounds in which other processes took more than a quarter of
the machine are dropped.
"""
import time
from pathlib import Path

from benchmarks.harness import ROOT



def build(args, overrides):
    from mobilenet.config import build_config
    return build_config(args.config, [*overrides, f"train.max_steps_per_epoch={args.steps}",
                                      "train.epochs=1", f"train.log_every={args.log_every}"])


def from_memory(args, overrides):
    """A function returning the img/s of the TrainStep and the LR schedule over batches that the
    loader made beforehand."""
    from mobilenet.config import resolve
    from mobilenet.data.datasets import build_loaders
    from mobilenet.data.sources import build_datasets
    from mobilenet.device import open_device, synchronize
    from mobilenet.state import TrainingState
    cfg = resolve(build(args, overrides))
    device = open_device(cfg["derived"]["device"])
    train_set, val_set = build_datasets(cfg["data"], cfg["model"], cfg["augment"])
    state = TrainingState(cfg, device, steps_per_epoch=args.steps)
    loader, _ = build_loaders(train_set, val_set, cfg["data"], cfg["seed"])
    loader.sampler.set_epoch(0)
    batches = [b for _, b in zip(range(args.steps), state.step.batches(loader))]
    state.step.train()

    def measure():
        for images, labels in batches[:args.log_every]:  # as end to end, the first interval is left out
            state.train_on([(images, labels)])
        synchronize(device)
        start = time.perf_counter()
        for images, labels in batches[args.log_every:]:
            state.train_on([(images, labels)])
        synchronize(device)
        return (len(batches) - args.log_every) * cfg["derived"]["global_batch"] / (time.perf_counter() - start)
    return measure


def main(argv=None):
    from benchmarks.harness import benchmark_parser
    p = benchmark_parser(__doc__)
    p.add_argument("--config", default=str(ROOT / "configs" / "demo.yaml"))
    p.add_argument("--workers", type=int, nargs="*", help="data.workers values (default: the recipe's)")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--log-every", type=int, default=4)
    args, overrides = p.parse_known_args(argv)
    from benchmarks.harness import interleave, markdown_table, training_img_per_s, write_json
    variants = {"from memory": from_memory(args, overrides)}
    for workers in args.workers or [None]:
        name = "end to end" + (f", data.workers={workers}" if workers is not None else "")
        extra = [f"data.workers={workers}"] if workers is not None else []
        variants[name] = lambda extra=extra: training_img_per_s(args.config, [*overrides, *extra],
                                                                args.steps, args.log_every)
    rounds = interleave(variants, args.rounds)
    print(f"{Path(args.config).name} {' '.join(overrides)}: {args.steps} steps; {rounds.describe()}")
    report = {"config": args.config, "overrides": overrides, **rounds.to_json(),
              "img_per_s": {name: rounds.median(name) for name in variants},
              "ratio": {name: rounds.ratio(name, "from memory")[0] for name in variants}}
    print(markdown_table(["variant", "img/s (median, min-max)", "vs from memory (median, min-max)"],
                         [[name, rounds.cell(name), rounds.ratio_cell(name, "from memory")] for name in variants]))
    write_json(args.json, report)
    return report


if __name__ == "__main__":
    main()

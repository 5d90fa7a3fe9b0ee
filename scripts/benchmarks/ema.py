"""The training step with an EMA of the weights: none, the app's WeightEMA (multi-tensor ops over
lists built once) and torch's AveragedModel (what the app used before), for the loop and the fused
optimizer.

python scripts/bench.py ema [--width 0.25] [--resolution 32] [--batch-size 32] [--steps 30]
                            [--rounds 5] [--json FILE] [key.sub=value ...]
Each variant is the app's TrainStep over batches made beforehand (synthetic images), ms per step
after 3 warm-up steps; variants take turns for --rounds rounds (reversed every other round); the
table shows medians with min-max, the ratio to the same optimizer without EMA, and the aten ops
of one EMA update. Rounds in which other processes took over a quarter of the machine are dropped.
"""
import time

from benchmarks.harness import ROOT

DECAY = 0.9999


class TorchAveragedModel:
    """torch's AveragedModel behind the update() that TrainStep calls (the app's EMA before)."""

    def __init__(self, net, decay):
        from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
        self.net = net
        self.averaged = AveragedModel(net, multi_avg_fn=get_ema_multi_avg_fn(decay), use_buffers=True)

    def update(self):
        self.averaged.update_parameters(self.net)


def timed_step(args, overrides, impl, ema):
    """A function returning ms per step of the TrainStep for optimizer ``impl`` and ``ema``
    (none | app | torch), and the aten ops of one EMA update."""

    from benchmarks.harness import count_ops
    from mobilenet.config import build_config, resolve
    from mobilenet.device import open_device, synchronize
    from benchmarks.harness import synthetic_batch
    from mobilenet.optim import SETTINGS
    from mobilenet.state import TrainingState
    cfg = resolve(build_config(ROOT / "configs" / "synthetic.yaml", [
        f"model.width_mult={args.width}", f"model.resolution={args.resolution}", "model.num_classes=10",
        f"data.batch_size={args.batch_size}", f"train.ema_decay={DECAY if ema != 'none' else 0}",
        *SETTINGS[impl], *overrides]))
    device = open_device(cfg["derived"]["device"])
    state = TrainingState(cfg, device, steps_per_epoch=1)
    step = state.step
    if ema == "torch":
        step.ema = TorchAveragedModel(step.net, DECAY)
    step.train()
    images, labels = next(iter(state.step.batches(synthetic_batch(cfg))))
    for _ in range(3):
        step(images, labels)
    ops = count_ops(step.ema.update) if step.ema is not None else 0

    def measure():
        synchronize(device)
        start = time.perf_counter()
        for _ in range(args.steps):
            step(images, labels)
        synchronize(device)
        return 1000 * (time.perf_counter() - start) / args.steps
    return measure, ops


def main(argv=None):
    from benchmarks.harness import benchmark_parser
    p = benchmark_parser(__doc__)
    p.add_argument("--width", type=float, default=0.25)
    p.add_argument("--resolution", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--steps", type=int, default=30)
    args, overrides = p.parse_known_args(argv)
    from mobilenet.device import cpu_model
    from benchmarks.harness import interleave, markdown_table, write_json
    variants, ops = {}, {}
    for impl in ("loop", "torch_fused"):
        for ema in ("none", "app", "torch"):
            name = f"{impl}, EMA {ema}"
            variants[name], ops[name] = timed_step(args, overrides, impl, ema)
    rounds = interleave(variants, args.rounds)
    print(f"MobileNetV1 x{args.width} at {args.resolution}px, batch {args.batch_size}, EMA decay {DECAY}; "
          f"{cpu_model()}; {rounds.describe()}")
    rows, table = [], []
    for name in variants:
        base = name.split(",")[0] + ", EMA none"
        ratio = rounds.ratio(name, base)
        rows.append({"variant": name, "ms_per_step": rounds.median(name), "spread": rounds.spread(name),
                     "vs_no_ema": ratio[0], "vs_no_ema_spread": ratio[1:], "ema_ops": ops[name]})
        table.append([name, rounds.cell(name, digits=2), rounds.ratio_cell(name, base), ops[name]])
    print(markdown_table(["variant", "ms/step (median, min-max)", "vs no EMA (median, min-max)",
                          "ops per EMA update"], table))
    write_json(args.json, {"rows": rows, **rounds.to_json()})
    return rows


if __name__ == "__main__":
    main()

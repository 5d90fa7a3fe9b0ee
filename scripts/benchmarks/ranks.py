"""What keeping the ranks equal costs at each epoch's end: the checksum of every tensor and number
a rank must share (the rank check's shared_state, a behaviour of a run of several processes: weights or O2
masters, buffers, optimizer, scheduler, loss scaler, EMA, the network as trained), against one training step,
per implementation and amp level. Without that behaviour (a forker removed it) there is nothing to time.

python scripts/bench.py ranks [--width 1.0] [--resolution 32] [--batch-size 32] [--steps 5]
                              [--rounds 5] [--json FILE] [key.sub=value ...]
In one process: the checksums are what each rank computes; the check then gathers one int64 per
tensor from every rank (one all_gather of a few KiB) and the BatchNorm sync broadcasts the buffers
(one broadcast per dtype), which a world of one skips: they are not in these figures. Variants take
turns (interleaved rounds, medians with min-max; rounds with other load above a quarter dropped).
"""
import time

from benchmarks.harness import ROOT



def timed(args, overrides, impl, level):
    """Functions returning ms per training step and ms of one agreement checksum; the tensor count."""
    import torch
    from benchmarks.harness import synthetic_batch
    from mobilenet.config import build_config, resolve
    from mobilenet.device import open_device, synchronize
    from mobilenet.distributed import checksum
    from mobilenet.optim import SETTINGS
    from mobilenet.behaviours import behaviours_for
    from mobilenet.state import TrainingState
    cfg = resolve(build_config(ROOT / "configs" / "synthetic.yaml", [
        f"model.width_mult={args.width}", f"model.resolution={args.resolution}",
        f"data.batch_size={args.batch_size}", f"amp.level={level}", *SETTINGS[impl], *overrides]))
    shared_state = next(b for b in behaviours_for() if hasattr(b, "shared_state")).shared_state
    device = open_device(cfg["derived"]["device"])
    state = TrainingState(cfg, device, steps_per_epoch=1000)
    state.step.train()
    images, labels = next(iter(state.step.batches(synthetic_batch(cfg))))
    for _ in range(3):
        state.train_on([(images, labels)])

    def step_ms():
        synchronize(device)
        start = time.perf_counter()
        for _ in range(args.steps):
            state.train_on([(images, labels)])
        synchronize(device)
        return 1000 * (time.perf_counter() - start) / args.steps

    def check_ms():
        synchronize(device)
        start = time.perf_counter()
        torch.stack([checksum(value, device) for _, value in shared_state(state)]).cpu()
        return 1000 * (time.perf_counter() - start)
    return step_ms, check_ms, len(shared_state(state))


def main(argv=None):
    from benchmarks.harness import benchmark_parser, interleave, markdown_table, write_json
    from mobilenet.device import cpu_model
    p = benchmark_parser(__doc__)
    p.add_argument("--width", type=float, default=1.0)
    p.add_argument("--resolution", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--steps", type=int, default=5)
    args, overrides = p.parse_known_args(argv)
    variants, tensors = {}, {}
    for impl, level in (("loop", "O0"), ("torch_fused", "O0"), ("torch_fused", "O2")):
        step, check, tensors[impl, level] = timed(args, overrides, impl, level)
        variants[f"{impl} {level} step"], variants[f"{impl} {level} check"] = step, check
    rounds = interleave(variants, args.rounds)
    print(f"MobileNetV1 x{args.width} at {args.resolution}px, batch {args.batch_size}; {cpu_model()}; "
          f"{rounds.describe()}")
    rows, table = [], []
    for (impl, level), count in tensors.items():
        step, check = f"{impl} {level} step", f"{impl} {level} check"
        ratio = rounds.ratio(check, step)
        rows.append({"implementation": impl, "amp": level, "tensors": count, "step_ms": rounds.median(step),
                     "check_ms": rounds.median(check), "check_in_steps": ratio[0], "spread": ratio[1:]})
        table.append([f"{impl}, {level}", count, rounds.cell(step, digits=2), rounds.cell(check, digits=2),
                      rounds.ratio_cell(check, step)])
    print(markdown_table(["implementation, amp", "tensors checked", "ms per step", "ms per check",
                          "check in steps (median, min-max)"], table))
    write_json(args.json, {"rows": rows, **rounds.to_json()})
    return rows


if __name__ == "__main__":
    main()

"""train.py's training speed against a plain hand-written loop: same model, data, batch, optimizer.

python scripts/bench.py train-loop [--width 0.5] [--resolution 128] [--batch-size 32] [--steps 30]
                                   [--rounds 5] [--json FILE]
Synthetic data, fused SGD, fp32, one process; each runs --steps steps after 5 warm-up steps.
train.py runs as configured (channels_last on cpu/cuda) and with channels_last off, which leaves
only its loop machinery (prefetch, logging, checks) to compare. The runs take turns, in one process,
for --rounds rounds (reversed every other round); the ratios are medians of the rounds' ratios (a
shared machine's speed drifts), rounds in which other processes took over a quarter of it dropped.
"""
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def plain_loop(args, device):
    """The loop a user would write: DataLoader of float tensors, forward, backward, step."""
    import torch
    from torch.utils.data import DataLoader

    from mobilenet.data import SyntheticImages
    from mobilenet.device import synchronize
    from mobilenet.model import MobileNetV1
    torch.manual_seed(0)
    model = MobileNetV1(args.width, 1000).to(device).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4, fused=True)
    data = SyntheticImages(args.batch_size * (args.steps + 5), args.resolution, 1000)
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True, drop_last=True,
                        num_workers=args.workers)
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
    for step, (images, labels) in enumerate(loader):
        if step == 5:
            synchronize(device)
            start = time.perf_counter()
        images = ((images.float() / 255 - mean) / std).to(device)
        loss = torch.nn.functional.cross_entropy(model(images), labels.to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    synchronize(device)
    return args.batch_size * args.steps / (time.perf_counter() - start)


def train_py(args, device, *overrides):
    """img/s of the app's own loop (engine.run, in this process as the plain loop) over the same
    steps, from its 5-step log intervals after the first."""
    from mobilenet.harness import training_img_per_s
    return training_img_per_s(ROOT / "configs" / "synthetic.yaml", [
        f"device={device.type}", "optim.impl=fused", f"model.width_mult={args.width}",
        f"model.resolution={args.resolution}", f"data.batch_size={args.batch_size}",
        f"data.workers={args.workers}", f"data.synthetic_size={args.batch_size * (args.steps + 5)}",
        "schedule.name=cosine", *overrides], steps=args.steps + 5, log_every=5)


def main(argv=None):
    from mobilenet.harness import benchmark_parser
    p = benchmark_parser(__doc__)
    p.add_argument("--width", type=float, default=0.5)
    p.add_argument("--resolution", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--device", default="auto", choices=["auto", "npu", "cuda", "cpu"])
    args = p.parse_args(argv)
    from mobilenet.device import choose_device, open_device
    device = open_device(choose_device(args.device))
    runs = {"plain loop": lambda: plain_loop(args, device),
            "train.py": lambda: train_py(args, device),
            "train.py, channels_last off (the loop's own cost)":
                lambda: train_py(args, device, "model.channels_last=false")}
    from mobilenet.harness import interleave, markdown_table, write_json
    rounds = interleave(runs, args.rounds)
    report = {**rounds.to_json(), "img_per_s": {name: rounds.median(name) for name in runs},
              "ratio": {name: rounds.ratio(name, "plain loop")[0] for name in runs}}
    print(f"MobileNetV1 x{args.width} at {args.resolution}px, batch {args.batch_size}, {args.steps} steps, "
          f"fused SGD, fp32, {device}; {rounds.describe()}")
    print(markdown_table(["loop", "img/s (median, min-max)", "vs plain loop (median, min-max)"],
                         [[name, rounds.cell(name), rounds.ratio_cell(name, "plain loop")] for name in runs]))
    write_json(args.json, report)
    return report


if __name__ == "__main__":
    main()

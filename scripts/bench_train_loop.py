"""train.py's training speed against a plain hand-written loop: same model, data, batch, optimizer.

python scripts/bench_train_loop.py [--width 0.5] [--resolution 128] [--batch-size 32] [--steps 40]
Synthetic data, fused SGD, fp32, one process; both run --steps steps after 5 warm-up steps.
"""
import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


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


def train_py(args, device):
    """img/s of train.py over the same steps: its 5-step log intervals after the first."""
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([sys.executable, str(ROOT / "train.py"), "--data", "synthetic", "--optimizer", "fused",
                        "--device", device.type, "--output", out, "--epochs", "1",
                        f"model.width_mult={args.width}", f"model.resolution={args.resolution}",
                        f"data.batch_size={args.batch_size}", f"data.workers={args.workers}",
                        f"data.synthetic_size={args.batch_size * (args.steps + 5)}",
                        "train.log_every=5", "schedule.name=cosine"], check=True, stdout=subprocess.DEVNULL)
        records = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    rates = [r["img_per_s"] for r in records if r["kind"] == "train"][1:]
    return len(rates) / sum(1 / rate for rate in rates)  # equal images per interval


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--width", type=float, default=0.5)
    p.add_argument("--resolution", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--device", default="auto", choices=["auto", "npu", "cuda", "cpu"])
    args = p.parse_args(argv)
    from mobilenet.device import resolve_device
    device = resolve_device(args.device)
    rows = {"plain loop": plain_loop(args, device), "train.py": train_py(args, device)}
    print(f"MobileNetV1 x{args.width} at {args.resolution}px, batch {args.batch_size}, {args.steps} steps, "
          f"fused SGD, fp32, {device}\n| loop | img/s |\n|---|---|")
    for name, rate in rows.items():
        print(f"| {name} | {rate:.1f} |")
    print(f"train.py / plain loop: {rows['train.py'] / rows['plain loop']:.2f}x")
    return rows


if __name__ == "__main__":
    main()

"""Table, JSON and plot of a standard-vs-fused comparison: python scripts/compare_report.py DIR

DIR holds the run directories standard/ and fused/ (scripts/compare_optimizers.sh makes them).
"""
import json
import sys
from pathlib import Path

ROWS = [("img/s", "img_per_s", "{:.1f}"), ("step time (ms)", "step_ms", "{:.2f}"),
        ("optimizer step (ms)", "optimizer_ms", "{:.3f}"),
        ("optimizer share of step", "optimizer_share", "{:.1%}"),
        ("ops per optimizer step", "optimizer_ops_per_step", "{}"),
        ("data-wait share", "data_wait_share", "{:.1%}"), ("final train loss", "final_loss", "{:.4f}"),
        ("val top-1", "top1", "{:.2f}"), ("peak memory (MiB)", "peak_memory_mb", "{:.0f}")]


def load_run(folder):
    summary = json.loads((folder / "summary.json").read_text())
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    summary["final_loss"] = train[-1]["loss"]
    return summary, train


def plot(runs, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (speed, loss) = plt.subplots(1, 2, figsize=(11, 4))
    for name, (_, train) in runs.items():
        steps = [r["step"] for r in train]
        speed.plot(steps, [r["img_per_s"] for r in train], label=name)
        loss.plot(steps, [r["loss"] for r in train], label=name)
    speed.set(title="throughput", xlabel="step", ylabel="img/s")
    loss.set(title="training loss", xlabel="step", ylabel="loss")
    for ax in (speed, loss):
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(folder):
    folder = Path(folder)
    runs = {name: load_run(folder / name) for name in ("standard", "fused")}
    std, fused = runs["standard"][0], runs["fused"][0]
    print(f"{std['optimizer_class']} vs {fused['optimizer_class']} on {std['device']}, amp {std['amp']}, "
          f"global batch {std['global_batch']}")
    print("| | standard | fused | fused / standard |\n|---|---|---|---|")
    report = {"standard": std, "fused": fused, "ratio": {}}
    for label, key, fmt in ROWS:
        a, b = std.get(key), fused.get(key)
        if a is None or b is None:
            continue
        ratio = b / a if a else float("nan")
        report["ratio"][key] = ratio
        print(f"| {label} | {fmt.format(a)} | {fmt.format(b)} | {ratio:.3f}x |")
    (folder / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(runs, folder / "report.png")
    print(f"wrote {folder / 'report.json'}, {folder / 'report.png'}; "
          f"TensorBoard: tensorboard --logdir {folder}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/compare")

"""Table, JSON and plot of an optimizer comparison: python scripts/compare_report.py DIR

DIR holds the run directories loop/, foreach/ and fused/, and each one's -breakdown/ run
(scripts/compare_optimizers.sh makes them). Throughput, loss and accuracy come from the runs
without device syncs; the step-time breakdown rows from the -breakdown runs, which sync the device
around the optimizer's phases (their times are longer than the others'). Ratios are to the loop,
the seed article's baseline.
"""
import json
import sys
from pathlib import Path

SYNCED = " (run with device syncs)"
ROWS = [("img/s", "img_per_s", "{:.1f}"), ("step time (ms)" + SYNCED, "step_ms", "{:.2f}"),
        ("optimizer step (ms)" + SYNCED, "optimizer_ms", "{:.3f}"),
        ("optimizer share of step" + SYNCED, "optimizer_share", "{:.1%}"),
        ("ops per optimizer step", "optimizer_ops_per_step", "{}"),
        ("ops per training step (forward to EMA)", "step_ops_per_step", "{}"),
        ("data-wait share", "data_wait_share", "{:.1%}"),
        ("other processes' CPU share (no ratio)", "other_cpu_share", "{:.1%}"),
        ("final train loss", "final_loss", "{:.4f}"),
        ("val top-1", "top1", "{:.2f}"), ("peak memory (MiB)", "peak_memory_mb", "{:.0f}")]


BREAKDOWN = ("step_ms", "optimizer_ms", "optimizer_share", "optimizer_ops_per_step", "step_ops_per_step")


def load_run(folder):
    """The run's summary (with the breakdown figures of its -breakdown run) and train records."""
    summary = json.loads((folder / "summary.json").read_text())
    synced = json.loads((folder.parent / f"{folder.name}-breakdown" / "summary.json").read_text())
    summary.update({key: synced.get(key) for key in BREAKDOWN})
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
        steps = [r.get("global_step", r.get("step")) for r in train]
        speed.plot(steps, [r["img_per_s"] for r in train], label=name)
        loss.plot(steps, [r["loss"] for r in train], label=name)
    speed.set(title="throughput", xlabel="global step", ylabel="img/s")
    loss.set(title="training loss", xlabel="global step", ylabel="loss")
    for ax in (speed, loss):
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


RUNS = ("loop", "foreach", "fused")


def main(folder):
    folder = Path(folder)
    runs = {name: load_run(folder / name) for name in RUNS}
    summaries = {name: summary for name, (summary, _) in runs.items()}
    loop = summaries["loop"]
    print(" vs ".join(s["optimizer_class"] for s in summaries.values()) +
          f" on {loop['device']}, amp {loop['amp']}, global batch {loop['global_batch']}")
    print("| | loop | foreach | fused (--optimizer fused) | foreach / loop | fused / loop |\n|---|---|---|---|---|---|")
    report = {**summaries, "ratio": {}, "ratio_foreach": {}}
    for label, key, fmt in ROWS:
        values = [summaries[name].get(key) for name in RUNS]
        if None in values:
            continue
        if key == "other_cpu_share":
            print(f"| {label} | " + " | ".join(fmt.format(v) for v in values) + " | | |")
            continue
        ratios = [v / values[0] if values[0] else float("nan") for v in values[1:]]
        report["ratio_foreach"][key], report["ratio"][key] = ratios
        print(f"| {label} | " + " | ".join(fmt.format(v) for v in values) +
              "".join(f" | {r:.3f}x" for r in ratios) + " |")
    (folder / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(runs, folder / "report.png")
    print(f"wrote {folder / 'report.json'}, {folder / 'report.png'}; "
          f"TensorBoard: tensorboard --logdir {folder}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/compare")

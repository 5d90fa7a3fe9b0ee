"""A host-bound model of the training step, from counted launches and a measured launch cost, and
what it predicts for the standard-vs-fused speedup as the batch grows.

python scripts/bench.py host-model [--device auto] [--width 1.0] [--resolution 224] [--amp O0]
                             [--batches 1 4 16] [--rounds 3] [--json FILE]
1. c: the host cost of one launch, timed on a one-element op (on an accelerator: without sync).
2. N: aten ops of a whole step per implementation (scripts/bench.py ops's count).
3. k: compute per image, from the fused step at the largest batch: (T - N c) / b.
Synchronous device (cpu): T(b) = N c + b k. Asynchronous device (cuda, npu): the host launches
while the device computes, T(b) = max(N c, b k). The script measures loop and fused step times at
--batches (interleaved rounds) and prints predicted against measured ratios, then the async
model's speedup by batch, and what the seed article's 1200 -> 1800 img/s at batch 256 implies.
"""
import time

from benchmarks.harness import AMP_LEVELS, ROOT

ARTICLE = {"batch": 256, "standard": 1200.0, "fused": 1800.0}  # img/s on Ascend, the seed article


def launch_us(device, launches=20000):
    """Host microseconds per launch of a one-element add (median of 5)."""
    import statistics

    import torch

    from mobilenet.device import synchronize
    a, b, out = (torch.ones(1, device=device) for _ in range(3))
    times = []
    for _ in range(5):
        synchronize(device)
        start = time.perf_counter()
        for _ in range(launches):
            torch.add(a, b, out=out)
        times.append((time.perf_counter() - start) / launches * 1e6)
        synchronize(device)
    return statistics.median(times)


def step_timer(cfg, device, batch, steps=3):
    """A function returning ms per TrainStep at ``batch`` (synthetic batch in memory)."""
    from mobilenet.device import synchronize
    from benchmarks.harness import synthetic_batch
    from mobilenet.state import TrainingState
    state = TrainingState(cfg, device, steps_per_epoch=1)
    step = state.step
    step.train()
    images, labels = next(iter(state.step.batches(synthetic_batch(cfg, batch))))
    step(images, labels)

    def ms():
        synchronize(device)
        start = time.perf_counter()
        for _ in range(steps):
            step(images, labels)
        synchronize(device)
        return (time.perf_counter() - start) / steps * 1000
    return ms


def parser():
    from benchmarks.harness import benchmark_parser
    from mobilenet.device import DEVICES
    p = benchmark_parser(__doc__, rounds=3)
    p.add_argument("--device", default="auto", choices=DEVICES)
    p.add_argument("--width", type=float, default=1.0)
    p.add_argument("--resolution", type=int, default=224)
    p.add_argument("--amp", default="O0", choices=AMP_LEVELS)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16])
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    from benchmarks.harness import interleave, markdown_table, op_budget, write_json
    from mobilenet.measure import PHASES
    from mobilenet.config import build_config, resolve
    from mobilenet.device import open_device
    from mobilenet.optim import SETTINGS
    configs = {impl: resolve(build_config(ROOT / "configs" / "synthetic.yaml", [
        f"device={args.device}", f"model.width_mult={args.width}", f"model.resolution={args.resolution}",
        f"amp.level={args.amp}", "amp.dtype=bfloat16", "amp.backend=native", *settings]))
        for impl, settings in SETTINGS.items() if impl != "foreach"}
    device = open_device(configs["loop"]["derived"]["device"])
    c = launch_us(device)
    counts = {impl: sum(op_budget(cfg, device)[p] for p in PHASES if p != "input")
              for impl, cfg in configs.items()}
    timers = {f"{impl} b{b}": step_timer(cfg, device, b) for impl, cfg in configs.items() for b in args.batches}
    rounds = interleave(timers, args.rounds)
    small, big = min(args.batches), max(args.batches)
    k = (rounds.median(f"torch_fused b{big}") - counts["torch_fused"] * c / 1000) / big  # ms per image
    # the same line fitted through the fused step at the smallest and largest batch: its intercept
    # over N is what a launch of this step's real ops costs the host, beside the one-element add
    k_fit = (rounds.median(f"torch_fused b{big}") - rounds.median(f"torch_fused b{small}")) / max(big - small, 1)
    c_fit = (rounds.median(f"torch_fused b{small}") - small * k_fit) / counts["torch_fused"] * 1000
    sync = device.type == "cpu"
    print(f"MobileNetV1 x{args.width} at {args.resolution}px, amp {args.amp}, {device}: launch cost c = "
          f"{c:.2f} us; launches per step N = {counts['loop']} (loop), {counts['torch_fused']} (fused); compute "
          f"k = {k:.3f} ms/image (fused at batch {big}); {rounds.describe()}")
    print(f"fitted through the fused step at batches {small} and {big}: {c_fit:.1f} us per launch, "
          f"k = {k_fit:.3f} ms/image")
    print(f"model ({'synchronous: T = N c + b k' if sync else 'asynchronous: T = max(N c, b k)'}) against "
          f"measured step times")

    def predict(n, b, launch, per_image):
        return (n * launch / 1000 + b * per_image) if sync else max(n * launch / 1000, b * per_image)
    rows = []
    for b in args.batches:
        measured = rounds.ratio(f"loop b{b}", f"torch_fused b{b}")
        rows.append({"batch": b, "loop_ms": rounds.median(f"loop b{b}"), "fused_ms": rounds.median(f"torch_fused b{b}"),
                     "predicted_ratio": predict(counts["loop"], b, c, k) / predict(counts["torch_fused"], b, c, k),
                     "predicted_ratio_fitted": (predict(counts["loop"], b, c_fit, k_fit) /
                                                predict(counts["torch_fused"], b, c_fit, k_fit)),
                     "measured_ratio": measured[0], "measured_spread": measured[1:]})
    print(markdown_table(["batch", "loop ms (measured)", "fused ms (measured)", "loop/fused predicted, c of one add",
                          "predicted, fitted c", "measured (median, min-max)"],
                         [[r["batch"], f"{r['loop_ms']:.1f}", f"{r['fused_ms']:.1f}", f"{r['predicted_ratio']:.3f}x",
                           f"{r['predicted_ratio_fitted']:.3f}x", rounds.ratio_cell(f"loop b{r['batch']}",
                                                                                f"torch_fused b{r['batch']}")]
                          for r in rows]))
    c_article, ceiling = article_reading(counts)
    write_json(args.json, {"device": str(device), "launch_us": c, "launch_us_fitted": c_fit, "launches": counts,
                           "ms_per_image": k, "rows": rows, "article_launch_us": c_article,
                           "host_bound_ceiling": ceiling, **rounds.to_json()})
    return rows


def article_reading(counts):
    """The seed article (standard host-bound at 1200 img/s with batch 256 fixes c; fused at 1800)
    read with these launch counts, printed; returns (its launch cost in us, the host-bound ceiling)."""
    n_std, n_fused, batch = counts["loop"], counts["torch_fused"], ARTICLE["batch"]
    c_article = batch / ARTICLE["standard"] / n_std * 1e6
    ceiling = n_std / n_fused
    print(f"\nseed article ({ARTICLE['standard']:.0f} -> {ARTICLE['fused']:.0f} img/s, batch {batch}, 1.5x), "
          f"async model with these counts: the standard step is host-bound at 1200 img/s when one launch "
          f"costs {c_article:.0f} us; the fused step's host time is then {n_fused * c_article / 1000:.0f} ms "
          f"({batch / (n_fused * c_article / 1e6):.0f} img/s if still host-bound: a {ceiling:.2f}x ceiling), "
          f"so 1.5x means the device computes at most {ARTICLE['fused']:.0f} img/s "
          f"({1e6 / ARTICLE['fused']:.0f} us an image) and the fused step is device-bound there.")
    return c_article, ceiling


if __name__ == "__main__":
    main()

"""What feeds the step from real JPEGs: the app's own train loader over a folder of photos encoded as
ImageNet's are, and over the prepared set made from it (scripts/prepare_data.py).

python scripts/bench.py feed [--data DIR] [--images 768] [--resolution 224] [--batch-size 64]
                             [--steps 8] [--max-sides N ...] [--rounds 3] [--json FILE] [key.sub=value ...]
Without --data it writes the photos (benchmarks.harness.write_imagenet_like: quality 96, 4:4:4,
three quarters 500x375, the rest larger, grayscale or CMYK; the folder's MIX.json says the mix),
then prepares them at the default settings. For each source:
  cost     one core's milliseconds per image, every image once in one thread: read (the file, or
           the memory map's slice, and the header), decode, crop and resize (with the flip), and
           collation into a batch; also for sets prepared at each of --max-sides
  augment  one core's milliseconds per image of each augmentation (data/transforms.py: every policy
           row, random erasing at p=1, MixUp/CutMix on a batch) against the folder's decode, crop
           and flip alone, and the cores that feed 10,000 img/s with each (read and collation too)
  feed     img/s the app's train loader delivers alone, with 0 workers, 1, every usable core, and
           what data.workers auto takes (after each loader's first batch, two epochs)
  training the app's loop (engine.run) from the source, decoded by the loader's workers and on the
           device (data.decode), against synthetic images in the same rounds: img/s, the ratio to
           synthetic and the share of the time spent waiting for data
key.sub=value settings apply to the training runs (the model, amp, optimizer, device); the
recipe is configs/imagenet.yaml. Variants take turns (interleaved rounds, medians with min-max).
"""
import random
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.harness import ROOT



def sources(args, tmp):
    """{"folder": root, "prepared": root, "prepared N": root ...}: the photos (written unless --data),
    their prepared set at the default settings, and one more for each other --max-sides."""
    from benchmarks.harness import write_imagenet_like
    from prepare_data import prepare
    folder = Path(args.data) if args.data else write_imagenet_like(Path(tmp) / "photos", args.images)
    made = {"folder": folder}
    for side in [DEFAULT_SIDE, *(side for side in args.max_sides if side != DEFAULT_SIDE)]:
        name = "prepared" if side == DEFAULT_SIDE else f"prepared {side}"
        made[name] = Path(tmp) / name.replace(" ", "-")
        prepare(folder, made[name], max_side=side, say=lambda line, end="\n": None)
    return made


DEFAULT_SIDE = 384  # scripts/prepare_data.py's --max-side


def stored_kb(root):
    """KB per training image as stored: the folder's files, or the prepared set's shards."""
    from mobilenet.data.prepared import is_prepared, manifest
    if is_prepared(root):
        split = manifest(root)["splits"]["train"]
        return split["bytes"] / split["images"] / 1024
    sizes = [p.stat().st_size for p in (Path(root) / "train").rglob("*") if p.is_file()]
    return sum(sizes) / len(sizes) / 1024


def train_set(root, resolution):
    from mobilenet.config import DEFAULTS
    from mobilenet.data.sources import build_datasets
    data = {**DEFAULTS["data"], "path": str(root)}
    train, _ = build_datasets(data, {"resolution": resolution, "num_classes": len(classes_of(root))},
                              DEFAULTS["augment"])
    return train


def classes_of(root):
    from mobilenet.data.prepared import is_prepared, manifest
    if is_prepared(root):
        return manifest(root)["splits"]["train"]["classes"]
    return sorted(p.name for p in (Path(root) / "train").iterdir() if p.is_dir())


def stage_costs(dataset, resolution, batch):
    """A function returning {stage: ms of one core per image} over every image of ``dataset``."""
    import torch
    from mobilenet.data.transforms import largest_reduction, resize

    crop = dataset.transform

    def measure():
        spent = dict.fromkeys(("read", "decode", "crop/resize", "collation"), 0.0)
        outputs, count = [], 0
        for index in range(len(dataset)):
            rng = random.Random(index)
            start = time.perf_counter()
            try:
                image = dataset.read(index)
            except OSError:
                continue
            read = time.perf_counter()
            # TrainCrop.__call__'s steps, timed apart
            top, left, height, width = crop.params(image.height, image.width, rng)
            pixels = image.decode(largest_reduction(height, width, crop.size))
            decoded = time.perf_counter()
            sy, sx = pixels.shape[1] / image.height, pixels.shape[2] / image.width
            top, left = round(top * sy), round(left * sx)
            out = resize(pixels[:, top:top + round(height * sy), left:left + round(width * sx)], crop.size, crop.size)
            outputs.append(out.flip(-1) if rng.random() < 0.5 else out)
            done = time.perf_counter()
            spent["read"] += read - start
            spent["decode"] += decoded - read
            spent["crop/resize"] += done - decoded
            count += 1
            if len(outputs) == batch:
                start = time.perf_counter()
                torch.stack(outputs)
                spent["collation"] += time.perf_counter() - start
                outputs = []
        return {stage: 1000 * seconds / count for stage, seconds in spent.items()}
    return measure


def augment_variants(dataset, batch):
    """{name: a function returning one core's ms per image}: the crop and flip alone, then with
    each policy row, with random erasing (every image), and a batch's MixUp or CutMix."""
    import torch

    from mobilenet.config import DEFAULTS
    from mobilenet.data.transforms import POLICIES, SampleAugment
    from mobilenet.training import BatchMix
    images = [dataset.read(index) for index in range(len(dataset))]
    crop = dataset.transform
    rows = {"decode, crop and flip": crop}
    for name in POLICIES:
        if name != "none":
            rows[f"+ {name}"] = SampleAugment(crop, {**DEFAULTS["augment"], "policy": name}, "bilinear")
    rows["+ random erasing"] = SampleAugment(crop, {**DEFAULTS["augment"], "random_erase": 1.0}, "bilinear")

    def per_image(transform):
        def measure():
            start = time.perf_counter()
            for seed, image in enumerate(images):
                transform(image, seed)
            return 1000 * (time.perf_counter() - start) / len(images)
        return measure
    variants = {name: per_image(transform) for name, transform in rows.items()}
    pixels = torch.randn(batch, 3, crop.size, crop.size)
    for key in ("mixup_alpha", "cutmix_alpha"):
        mix = BatchMix({"mixup_alpha": 0.0, "cutmix_alpha": 0.0, key: 1.0}, 1000, seed=0)

        def measure(mix=mix):
            start = time.perf_counter()
            for step in range(8):
                mix(pixels, torch.zeros(batch, dtype=torch.long), epoch=0, step=step, virtual_rank=0)
            return 1000 * (time.perf_counter() - start) / (8 * batch)
        variants[f"+ {key.split('_')[0]} (on the batch; on the host here)"] = measure
    return variants


def augment_table(args, dataset, folder_ms):
    """Each augmentation's cost against the crop alone, measured and printed."""
    import torch

    from benchmarks.harness import interleave, markdown_table
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        costs = interleave(augment_variants(dataset, args.batch_size), args.rounds)
    finally:
        torch.set_num_threads(threads)
    base = "decode, crop and flip"
    report = {name: {"ms": costs.median(name), "spread": costs.spread(name), "vs_crop": costs.ratio(name, base)}
              for name in costs.values[0]}
    def added(name, row):  # a policy's time includes the crop's; a batch's mix adds to it
        return row["ms"] if "batch" in name else row["ms"] - report[base]["ms"]
    print(f"\naugmentation, one core, {args.resolution} px ({costs.describe()}):")
    print(markdown_table(
        ["variant", "ms per image (median, min-max)", "x the plain crop's time", "cores per 10,000 img/s"],
        [[name, costs.cell(name, digits=3), costs.ratio_cell(name, base), f"{10 * (folder_ms + added(name, r)):.0f}"]
         for name, r in report.items()]),
          flush=True)
    return report


def feed_rate(dataset, batch, workers):
    """A function returning the img/s the app's train loader delivers with ``workers`` workers,
    from its first batch to the end of the second epoch."""
    from mobilenet.data.datasets import build_loaders
    loader, _ = build_loaders(dataset, dataset, {"batch_size": batch, "val_batch_size": batch}, seed=0,
                              workers=workers)

    def measure():
        images, start = 0, None
        for epoch in range(2):
            loader.sampler.set_epoch(epoch)
            for batch_images, _ in loader:
                if start is None:
                    start = time.perf_counter()
                    continue
                images += len(batch_images)
        return images / (time.perf_counter() - start)
    return measure


def main(argv=None):
    from benchmarks.harness import benchmark_parser, write_json
    from mobilenet.device import cpu_model, usable_cores
    p = benchmark_parser(__doc__, rounds=3)
    p.add_argument("--data", help="an ImageFolder root with train/ and val/ (default: written photos)")
    p.add_argument("--images", type=int, default=768, help="photos to write (without --data)")
    p.add_argument("--resolution", type=int, default=224)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--steps", type=int, default=8, help="training steps measured (after a warm-up interval)")
    p.add_argument("--max-sides", type=int, nargs="*", default=[], help="also the cost of sets prepared at these")
    args, overrides = p.parse_known_args(argv)
    cores = usable_cores()
    with tempfile.TemporaryDirectory() as tmp:
        roots = sources(args, tmp)
        sets = {name: train_set(root, args.resolution) for name, root in roots.items()}
        mix = (Path(roots["folder"]) / "MIX.json").read_text() if not args.data else args.data
        print(f"{cpu_model()}; {cores} usable cores; {len(sets['folder'])} photos: {' '.join(mix.split())}", flush=True)
        report = {"cores": cores, "photos": mix}
        main_sources = {name: root for name, root in roots.items() if name in ("folder", "prepared")}
        # each table printed as soon as it is measured: a part cut at its time limit keeps the ones before
        report.update(cost_table(args, sets, roots))
        report["augment"] = augment_table(args, sets["folder"], sum(report["cost"]["folder"].values()))
        report["feed"] = feed_table(args, sets, main_sources, cores)
        report["training"] = training_table(args, roots, main_sources, overrides)
    write_json(args.json, report)
    return report


def cost_table(args, sets, roots):
    """One core's cost per image by stage, per source, measured and printed."""
    import torch

    from benchmarks.harness import interleave, markdown_table
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one core's work, as in one loader worker
    try:
        costs = interleave({name: stage_costs(dataset, args.resolution, args.batch_size)
                            for name, dataset in sets.items()}, args.rounds)
    finally:
        torch.set_num_threads(threads)
    stages = list(costs.values[0]["folder"])
    cost = {name: {stage: costs.median(name, stage) for stage in stages} for name in sets}
    ratios = {name: sum(cost["folder"].values()) / sum(each.values())
              for name, each in cost.items() if name != "folder"}
    sizes = {name: stored_kb(root) for name, root in roots.items()}
    print(f"\ncost, one core, {args.resolution} px ({costs.describe()}):")
    print(markdown_table(["source", *(f"{stage} ms" for stage in stages), "total ms", "KB per image"],
                         [[name, *(f"{each[s]:.3f}" for s in stages), f"{sum(each.values()):.3f}", f"{sizes[name]:.0f}"]
                          for name, each in cost.items()]))
    for name, ratio in ratios.items():
        print(f"a core feeds {ratio:.2f}x as many images from the {name} set as from the folder", flush=True)
    return {"cost": cost, "cost_ratio": ratios, "kb_per_image": sizes}


def feed_table(args, sets, main_sources, cores):
    """The loader alone by worker count, per source, measured and printed."""
    from benchmarks.harness import interleave, markdown_table
    from mobilenet.data.sources import auto_workers
    counts = {name: {"0": 0, "1": 1, f"{cores} (every usable core)": cores,
                     f"{auto_workers(dict(path=str(root), cache_mb=0), 1)} (auto)":
                         auto_workers(dict(path=str(root), cache_mb=0), 1)}
              for name, root in main_sources.items()}
    feed = interleave({f"{name}|{label}": feed_rate(sets[name], args.batch_size, workers)
                       for name in main_sources for label, workers in counts[name].items()}, args.rounds)
    report = {f"{name}|{label}": {"img_per_s": feed.median(f"{name}|{label}"), "spread": feed.spread(f"{name}|{label}")}
              for name in main_sources for label in counts[name]}
    print(f"\nfeed alone, batch {args.batch_size} ({feed.describe()}):")
    print(markdown_table(["source", "loader workers", "img/s (median, min-max)"],
                         [[*key.split("|"), feed.cell(key, digits=0)] for key in report]), flush=True)
    return report


def training_table(args, roots, main_sources, overrides):
    """Training from each source and decode against synthetic images, measured and printed."""
    from benchmarks.harness import interleave, markdown_table, training_rate
    recipe = ROOT / "configs" / "imagenet.yaml"
    common = [f"model.resolution={args.resolution}", f"model.num_classes={len(classes_of(roots['folder']))}",
              f"data.batch_size={args.batch_size}", *overrides]
    runs = {"synthetic": lambda: training_rate(recipe, [*common, "data.path=synthetic"], args.steps * 2,
                                               args.steps)}
    for name, root in main_sources.items():
        for decode in ("workers", "device"):
            runs[f"{name}, decode {decode}"] = (lambda path=root, decode=decode: training_rate(
                recipe, [*common, f"data.path={path}", f"data.decode={decode}"], args.steps * 2, args.steps))
    training = interleave(runs, args.rounds)
    report = {}
    for name in runs:
        ratios = [training.values[i][name]["img_per_s"] / training.values[i]["synthetic"]["img_per_s"]
                  for i in training.kept]
        report[name] = {"img_per_s": training.median(name, "img_per_s"),
                        "data_wait": training.median(name, "data_wait"),
                        "vs_synthetic": statistics.median(ratios), "spread": (min(ratios), max(ratios))}
    print(f"\ntraining, {' '.join(common)} ({training.describe()}):")
    print(markdown_table(["data", "img/s (median)", "vs synthetic (median, min-max)", "data wait (median)"],
                         [[name, f"{r['img_per_s']:.1f}", f"{r['vs_synthetic']:.2f}x ({r['spread'][0]:.2f}-"
                           f"{r['spread'][1]:.2f})", f"{r['data_wait']:.0%}"] for name, r in report.items()]),
          flush=True)
    return report


if __name__ == "__main__":
    main()

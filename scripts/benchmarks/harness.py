"""The benchmark harness, above the app's package: variants measured in interleaved rounds that stay true
on a shared machine, the app's own loop timed over a short run, the launch budget of a step."""
import argparse
import contextlib
import io
import json
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from mobilenet.config import CHOICES, build_config, resolve
from mobilenet.engine import run
from mobilenet.errors import UsageError
from mobilenet.measure import COMPILE_STEPS, PHASES, OpCounter, OtherLoad, PhaseOps
from mobilenet.training import no_phase
from mobilenet.state import TrainingState


ROOT = Path(__file__).resolve().parents[2]  # the checkout
AMP_LEVELS, AMP_DTYPES = sorted(CHOICES["amp.level"]), sorted(CHOICES["amp.dtype"])  # O0 O1 O2; bfloat16 float16


@dataclass
class Rounds:
    """Measurements of variants taken in interleaved rounds; rounds in which other processes took
    more than ``max_other`` of the machine are dropped (all kept if every round was loaded)."""
    values: list          # per round: {variant: measurement}
    other: list           # per round: the other processes' share of the machine
    max_other: float

    @property
    def kept(self):
        kept = [i for i, share in enumerate(self.other) if share <= self.max_other]
        return kept or list(range(len(self.values)))

    def median(self, name, key=None):
        """The median of ``name``'s measurements (of their ``key``, where a measurement is a dict)."""
        return statistics.median(self.values[i][name] if key is None else self.values[i][name][key]
                                 for i in self.kept)

    def spread(self, name):
        """(min, max) over the kept rounds."""
        kept = [self.values[i][name] for i in self.kept]
        return min(kept), max(kept)

    def ratios(self, name, base):
        """Per kept round: measurement of ``name`` / that of ``base`` (the same round)."""
        return [self.values[i][name] / self.values[i][base] for i in self.kept]

    def ratio(self, name, base):
        """(median, min, max) of the per-round ratios."""
        ratios = self.ratios(name, base)
        return statistics.median(ratios), min(ratios), max(ratios)

    def cell(self, name, digits=1):
        """'median (min-max)' of ``name``'s measurements, for a table."""
        low, high = self.spread(name)
        return f"{self.median(name):.{digits}f} ({low:.{digits}f}-{high:.{digits}f})"

    def ratio_cell(self, name, base):
        """'1.23x (1.10-1.30)': the median and spread of ``name``'s ratio to ``base``, for a table."""
        ratio, low, high = self.ratio(name, base)
        return f"{ratio:.2f}x ({low:.2f}-{high:.2f})"

    def describe(self):
        dropped = len(self.values) - len(self.kept)
        loads = ", ".join(f"{share:.0%}" for share in self.other)
        note = (f"{dropped} dropped for other load above {self.max_other:.0%}" if len(self.kept) < len(self.values)
                else f"none above {self.max_other:.0%}" if max(self.other) <= self.max_other
                else f"all above {self.max_other:.0%}: none dropped, read with care")
        return f"{len(self.values)} interleaved rounds; other processes' CPU per round: {loads} ({note})"

    def to_json(self):
        return {"rounds": self.values, "other_cpu_share": self.other, "max_other": self.max_other,
                "kept_rounds": self.kept}


def benchmark_parser(doc, rounds=5):
    """The argument parser every benchmark starts from: its docstring as help, --json, and
    --rounds (``rounds`` by default) unless ``rounds`` is None (a benchmark that counts, not times)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if rounds is not None:
        parser.add_argument("--rounds", type=int, default=rounds, help="interleaved rounds")
    parser.add_argument("--json", help="also write the numbers to this file")
    return parser


def markdown_table(columns, rows):
    """A markdown table of ``columns`` (names) and ``rows`` (lists of cells), as printed text."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return "\n".join(lines + ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows])


def write_json(path, report):
    """``report`` as indented JSON at ``path`` (nothing without a path)."""
    if path:
        Path(path).write_text(json.dumps(report, indent=2) + "\n")


def interleave(variants, rounds=5, max_other=0.25):
    """Runs every variant (name -> function returning a measurement) once per round, in the given
    order on even rounds and reversed on odd ones, so that a slow spell hits all of them; records
    the other processes' CPU share in each round."""
    values, other = [], []
    names = list(variants)
    for r in range(rounds):
        with OtherLoad() as load:
            values.append({name: variants[name]() for name in (names if r % 2 == 0 else names[::-1])})
        other.append(load.share)
    return Rounds(values, other, max_other)


def training_img_per_s(config, overrides, steps=12, log_every=4):
    """The img/s of training_rate (below)."""
    return training_rate(config, overrides, steps, log_every)["img_per_s"]


def training_rate(config, overrides, steps=12, log_every=4):
    """{"img_per_s", "data_wait"} of the app's own loop (engine.run, in this process, no device syncs
    but the log intervals' own) over ``steps`` steps of one epoch of ``config`` with ``overrides``:
    the harmonic mean of its progress intervals after the first, and the share of their time spent
    waiting for data (which holds the warm-up; under train.compile
    the compiling steps are left out before it, as in any run). Synthetic data is sized to hold the
    steps; an epoch of other data that holds fewer is refused in one line (a UsageError), so no
    figure is a warm-up rate (``interval_note`` says which intervals). Writes nothing that stays."""
    if steps % log_every or steps < 2 * log_every:
        raise UsageError(f"benchmark: {steps} steps in log intervals of {log_every}: give a multiple of "
                         f"{log_every}, at least {2 * log_every} (the first interval is the warm-up)")
    with tempfile.TemporaryDirectory() as out, contextlib.redirect_stdout(io.StringIO()):
        cfg = build_config(config, [*overrides, "train.epochs=1", f"train.log_every={log_every}"],
                           settings={"output": out})
        derived = resolve(cfg)["derived"]
        compile_steps = COMPILE_STEPS if derived["compile"] else 0
        cfg["train"]["max_steps_per_epoch"] = steps + compile_steps
        if cfg["data"]["path"] == "synthetic":
            cfg["data"]["synthetic_size"] = (steps + compile_steps) * derived["global_batch"]
        run(resolve(cfg))
        records = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    rates = [r["img_per_s"] for r in records if r["kind"] == "train"]
    if len(rates) < steps // log_every:
        raise UsageError(f"benchmark: an epoch of --data {cfg['data']['path']} held "
                         f"{len(rates) * log_every} of the {steps + compile_steps} steps this measurement "
                         f"needs; use more images or fewer steps")
    rates = rates[1:]  # the warm-up interval
    waits = [r["data_wait"] for r in records if r["kind"] == "train"][1:]
    return {"img_per_s": len(rates) / sum(1 / rate for rate in rates),  # equal images per interval
            "data_wait": sum(wait / rate for wait, rate in zip(waits, rates)) / sum(1 / rate for rate in rates)}


def interval_note(steps, log_every):
    """Which intervals training_img_per_s measures, for a benchmark's header."""
    return (f"the app's img/s: intervals 2-{steps // log_every} of {log_every} steps each (the first, "
            f"warm-up, left out; under compile, the compiling steps before it too)")


def synthetic_batch(cfg, batch=None, seed=0):
    """[(uint8 images, labels)]: one batch of random images for ``cfg``'s model, as a loader gives."""
    size, batch = cfg["model"]["resolution"], batch or cfg["data"]["batch_size"]
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, 256, (batch, 3, size, size), dtype=torch.uint8, generator=generator),
             torch.randint(0, cfg["model"]["num_classes"], (batch,), generator=generator))]


def count_ops(fn):
    """The aten ops that ``fn()`` dispatches."""
    with OpCounter() as counter:
        fn()
    return counter.count


def op_budget(cfg, device, warmup=3):
    """{phase: aten ops dispatched} of one training step of the resolved ``cfg`` on ``device``,
    after ``warmup`` steps (lazy optimizer state): the input copy and normalisation, the
    TrainStep's phases and the LR schedule's step. Each op is a kernel launch on an accelerator."""
    state = TrainingState(cfg, device, steps_per_epoch=100)
    state.step.train()
    raw = synthetic_batch(cfg)

    def prefetch():
        return next(iter(state.step.batches(raw)))
    for _ in range(warmup):
        state.train_on([prefetch()])
    with OpCounter() as counter:
        images, labels = prefetch()
    counts = {"input": counter.count, **dict.fromkeys(PHASES, 0)}  # and the step's phases, then the schedule's
    phases = PhaseOps()
    state.step.phase = phases.phase
    state.step(images, labels)
    state.step.phase = no_phase
    counts.update(phases.counts)
    counts["scheduler"] = count_ops(state.scheduler.step)
    return counts


# ImageNet's training JPEGs: mostly about 500x375 (either way up), saved at quality ~96 without
# chroma subsampling; a share far larger, a few grayscale and CMYK.
IMAGENET_LIKE = {"500x375, either way up": 0.75, "long side 800-2000": 0.17, "grayscale": 0.05, "CMYK": 0.03}


def write_imagenet_like(root, count, classes=2, seed=0):
    """``count`` JPEGs cut from scikit-learn's sample photos and encoded as ImageNet's are (quality
    96, 4:4:4), in the IMAGENET_LIKE mix, as an ImageFolder with train/ (``count`` images in
    ``classes`` classes) and val/ (an eighth as many); root/MIX.json says the mix. Returns root."""
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_sample_images

    rng = np.random.default_rng(seed)
    photos = [Image.fromarray(a) for a in load_sample_images().images]
    kinds = list(IMAGENET_LIKE)
    made = dict.fromkeys(kinds, 0)
    for split, images in (("train", count), ("val", max(classes, count // 8))):
        for i in range(images):
            kind = kinds[int(rng.choice(len(kinds), p=list(IMAGENET_LIKE.values())))]
            if kind == "long side 800-2000":
                long_side = int(rng.integers(800, 2001))
                size = (long_side, long_side * 3 // 4)
            else:
                size = (500, 375) if rng.random() < 0.5 else (375, 500)
            photo = photos[i % len(photos)]
            w, h = photo.size
            crop_w, crop_h = int(w * rng.uniform(0.6, 1)), int(h * rng.uniform(0.6, 1))
            left, top = int(rng.integers(0, w - crop_w + 1)), int(rng.integers(0, h - crop_h + 1))
            image = photo.crop((left, top, left + crop_w, top + crop_h)).resize(size, Image.BICUBIC)
            image = image.convert({"grayscale": "L", "CMYK": "CMYK"}.get(kind, "RGB"))
            folder = Path(root) / split / f"class{i % classes}"
            folder.mkdir(parents=True, exist_ok=True)
            image.save(folder / f"{i:05d}.JPEG", quality=96, subsampling=0)
            made[kind] += split == "train"
    sizes = [p.stat().st_size for p in (Path(root) / "train").rglob("*.JPEG")]
    (Path(root) / "MIX.json").write_text(json.dumps({
        "train_images": count, "val_images": max(classes, count // 8), "quality": 96, "chroma": "4:4:4",
        "mix": made, "mean_kb": round(sum(sizes) / len(sizes) / 1024, 1)}, indent=2) + "\n")
    return Path(root)
"""Validation: each process scores its exact share of the val set (no padding), summed over all,
so the top-1 equals one process evaluating the same weights."""
import json
from pathlib import Path
from typing import NamedTuple

import torch

from mobilenet import checkpoint as ckpt
from mobilenet.device import peak_memory_mb
from mobilenet.distributed import all_reduce_sum
from mobilenet.distributed import all_reduce_max


class Accuracy(NamedTuple):
    top1: float
    top5: float
    scored: int    # val images counted
    left_out: int  # unreadable val images (label -1), counted in neither

    def note(self):
        unreadable = f", {self.left_out} unreadable left out" if self.left_out else ""
        return f"{self.scored} images{unreadable}"


def accuracy_line(top1, top5, note="", prefix=""):
    """`` * Prec@1 X Prec@5 Y  (note)``; awk field 3 is the top-1 (without ``prefix``)."""
    return f" *{prefix} Prec@1 {top1:.3f} Prec@5 {top5:.3f}" + (f"  ({note})" if note else "")


def validate(r):
    """{'': Accuracy} of the network, and {'EMA': ...} of its average, over ``r.val_loader``."""
    step = r.step
    return {label: accuracy(net, watched(step.batches(r.val_loader), r.watchdog), step.precision.autocast,
                            r.device)
            for label, net in step.eval_nets().items()}


def watched(batches, watchdog):
    """``batches``, each a watchdog beat, each wait its 'val-data' wait."""
    iterator = iter(batches)
    while True:
        with watchdog.waiting("val-data"):
            batch = next(iterator, None)
        if batch is None:
            return
        watchdog.beat()
        yield batch


@torch.no_grad()
def accuracy(net, batches, autocast, device):
    """Top-1/top-5 (%) over ``batches``; each process counts its exact share, summed over all.
    Samples labelled -1 (unreadable files) are left out of the counts and reported."""
    net.eval()
    counts = torch.zeros(4, device=device, dtype=torch.float64)  # top1, top5, scored, left out
    for images, labels in batches:
        with autocast():
            logits = net(images)
        scored = labels >= 0
        hits = logits.topk(min(5, logits.shape[1]), dim=1).indices.eq(labels[:, None]) & scored[:, None]
        counts += torch.stack([hits[:, 0].sum(), hits.any(dim=1).sum(), scored.sum(),
                               (~scored).sum()]).double()
    all_reduce_sum(counts)
    top1, top5, total, left_out = counts.tolist()
    return Accuracy(100 * top1 / max(total, 1), 100 * top5 / max(total, 1), int(total), int(left_out))


def write_summary(r, results, totals=None):
    """summary.json of run ``r`` from the last ``results`` and the ``totals`` trained; returns it."""
    cfg, derived = r.cfg, r.cfg["derived"]
    final = results[""]
    images, seconds, wait = (totals[key] for key in ("images", "seconds", "data_wait_s")) if totals else (0, 0.0, 0.0)
    summary = {"top1": final.top1, "top5": final.top5, "best_top1": r.state.best_top1, "epochs": r.state.epoch,
               "global_step": r.state.global_step, "val_images_scored": final.scored,
               **({"ema_top1": results["EMA"].top1, "ema_top5": results["EMA"].top5} if "EMA" in results else {}),
               "img_per_s": images / seconds if seconds else 0.0, "first_step_s": r.clock.first_step_s,
               "data_wait_share": wait / seconds if seconds else 0.0,
               # other processes' share of the CPU, as the benchmarks report it
               "other_cpu_share": totals["other_load"].so_far() if totals else 0.0,
               "optimizer": cfg["optim"]["impl"], "optimizer_implementation": derived["optimizer_implementation"],
               "optimizer_class": derived["optimizer_class"],
               "device": r.device.type, "amp": cfg["amp"]["level"], "amp_backend": derived["amp_backend"],
               "world_size": r.world.size, "global_batch": derived["global_batch"],
               "peak_memory_mb": round(peak_memory_mb(r.device), 1), "unreadable_images": unreadable_files(r)}
    if r.breakdown is not None and totals:
        summary.update(r.breakdown.summary(seconds, wait, images / derived["global_batch"]))
    if r.world.is_main:
        path = Path(cfg["output"]) / "summary.json"
        with r.watchdog.writing(path):
            ckpt.save_atomic((json.dumps(summary, indent=2) + "\n").encode(), path, "the summary")
    return summary


def read_summary(path, say):
    """A finished run's summary.json; {} (said) when it is missing or damaged."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        say(f"note: {path} is unreadable ({type(e).__name__}); the checkpoints are intact")
        return {}


def unreadable_files(r):
    """Train and val files found unreadable by any process."""
    return sum(int(unreadable_anywhere(loader.dataset, r.device).sum()) for loader in (r.train_loader, r.val_loader))


def unreadable_anywhere(dataset, device):
    """Flags of ``dataset``'s files found unreadable by any process (each process flags what it read)."""
    # on the device: nccl and hccl reduce only device tensors
    return all_reduce_max(dataset.unreadable.to(device, torch.int32)).bool().cpu()

"""Validation: each process scores its exact share of the val set (no padding), summed over all,
so the top-1 equals one process evaluating the same weights."""
from typing import NamedTuple

import torch

from mobilenet.distributed import all_reduce_sum


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
    """{'': Accuracy} of the network, and {'EMA': ...} of its average when there is one, over
    ``r.val_loader``; each batch is a beat of ``r.watchdog``."""
    step = r.state.train_step
    return {label: accuracy(net, watched(step.batches(r.val_loader), r.watchdog), step.precision.autocast,
                            r.device)
            for label, net in step.eval_nets().items()}


def watched(batches, watchdog):
    """``batches``, each a beat of the watchdog, the wait for each its 'val-data' wait (not
    'data': a stop signal waits for the end of validation)."""
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

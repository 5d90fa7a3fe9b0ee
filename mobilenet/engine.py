"""Training and evaluation: builds everything from the config, runs the epochs, writes the run."""
import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml
from torch import nn

from mobilenet import checkpoint as ckpt
from mobilenet.amp import build_precision
from mobilenet.config import UsageError
from mobilenet.data import DevicePrefetcher, build_datasets, build_loaders
from mobilenet.device import describe, peak_memory_mb, resolve_device, synchronize
from mobilenet.distributed import all_reduce_sum, destroy, init_process_group, world_from_env, wrap_ddp
from mobilenet.logging import RunLogger
from mobilenet.model import MobileNetV1, load_weights, unwrap_state_dict
from mobilenet.optim import build_optimizer, build_scheduler, describe_optimizer


@dataclass
class Trainer:
    cfg: dict
    world: object
    device: torch.device
    model: nn.Module           # what the step calls (DDP-wrapped in distributed runs)
    net: nn.Module             # the bare MobileNetV1
    precision: object
    optimizer: torch.optim.Optimizer
    scheduler: object
    train_loader: object
    val_loader: object
    log: RunLogger
    criterion: nn.Module
    epoch: int = 0             # epochs completed
    best_top1: float = 0.0


def run(cfg, resume=None, evaluate_only=False):
    """Trains (or only evaluates) as ``cfg`` says; returns the summary dict (rank 0 writes it)."""
    world = world_from_env()
    device = resolve_device(cfg["device"], world.local_rank)
    init_process_group(world, device)
    try:
        trainer = build_trainer(cfg, world, device)
        if resume:
            restore(trainer, resume)
        if evaluate_only:
            top1, top5 = evaluate(trainer)
            trainer.log.info(f" * Acc@1 {top1:.3f} Acc@5 {top5:.3f}")
            return {"top1": top1, "top5": top5}
        return fit(trainer)
    finally:
        destroy()


def build_trainer(cfg, world, device):
    torch.manual_seed(cfg["seed"] + world.rank)
    run_dir = Path(cfg["output"])
    log = RunLogger(run_dir, enabled=world.is_main)
    train_set, val_set = build_datasets(cfg["data"], cfg["model"])
    net = MobileNetV1(cfg["model"]["width_mult"], cfg["model"]["num_classes"])
    if cfg["model"]["pretrained"]:
        load_weights(net, ckpt.load_checkpoint(cfg["model"]["pretrained"]), cfg["model"]["pretrained"])
    if cfg["model"]["sync_bn"] and world.size > 1:
        if device.type == "cpu":
            raise UsageError("model.sync_bn=true needs cuda or npu (torch has no SyncBatchNorm on cpu)")
        net = nn.SyncBatchNorm.convert_sync_batchnorm(net)
    memory_format = torch.channels_last if cfg["model"]["channels_last"] else torch.contiguous_format
    net = net.to(device, memory_format=memory_format)
    precision = build_precision(cfg["amp"], device)
    optimizer = make_optimizer(cfg, precision.optimizer_params(net), net, device, world)
    net, optimizer = precision.initialize(net, optimizer)
    model = wrap_ddp(net, world, device)
    train_loader, val_loader = build_loaders(train_set, val_set, cfg["data"], cfg["seed"],
                                             world.rank, world.size, device.type != "cpu")
    steps = steps_per_epoch(cfg, train_loader)
    scheduler = build_scheduler(optimizer, cfg["schedule"], optimizer.defaults["lr"], steps,
                                cfg["train"]["epochs"])
    criterion = nn.CrossEntropyLoss(label_smoothing=cfg["train"]["label_smoothing"])
    if world.is_main:
        (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    log.info(f"device {describe(device)}, {world.size} process(es); optimizer "
             f"{describe_optimizer(optimizer)}; amp {cfg['amp']['level']} ({precision.backend})")
    log.info(f"data {cfg['data']['path']}: {len(train_set)} train / {len(val_set)} val images, "
             f"batch {cfg['data']['batch_size']} per process x {world.size} = "
             f"{cfg['data']['batch_size'] * world.size} global, {steps} steps/epoch")
    return Trainer(cfg, world, device, model, net, precision, optimizer, scheduler, train_loader,
                   val_loader, log, criterion)


def make_optimizer(cfg, params, net, device, world):
    o = cfg["optim"]
    lr = o["lr"]
    if o["lr_scale_batch"] > 0:  # linear scaling rule: lr per lr_scale_batch images
        lr = lr * cfg["data"]["batch_size"] * world.size / o["lr_scale_batch"]
    return build_optimizer(net, o["name"], o["impl"], lr, o["momentum"], o["weight_decay"], device,
                           o["nesterov"], o["no_decay_bn_bias"], o["betas"], o["eps"], o["alpha"],
                           params=params)


def steps_per_epoch(cfg, loader):
    limit = cfg["train"]["max_steps_per_epoch"]
    return min(len(loader), limit) if limit > 0 else len(loader)


def fit(t):
    """Epochs of training and validation; checkpoints and the summary at the end."""
    cfg, log = t.cfg, t.log
    saver = ckpt.CheckpointSaver(cfg["output"], cfg["train"]["keep_checkpoints"])
    train_images = train_time = 0.0
    top1 = top5 = 0.0
    for epoch in range(t.epoch, cfg["train"]["epochs"]):
        images, seconds = train_one_epoch(t, epoch)
        train_images, train_time = train_images + images, train_time + seconds
        top1, top5 = evaluate(t)
        t.epoch = epoch + 1
        is_best = top1 > t.best_top1
        t.best_top1 = max(t.best_top1, top1)
        log.info(f" * Acc@1 {top1:.3f} Acc@5 {top5:.3f}  (epoch {epoch}, best {t.best_top1:.3f})")
        log.record("val", t.epoch * len_steps(t), epoch=epoch, top1=top1, top5=top5,
                   epoch_time_s=seconds)
        if t.world.is_main:
            saver.save(checkpoint_state(t), t.epoch, is_best)
    summary = {"top1": top1, "top5": top5, "best_top1": t.best_top1, "epochs": t.epoch,
               "img_per_s": train_images / train_time if train_time else 0.0,
               "optimizer": cfg["optim"]["impl"], "optimizer_class": describe_optimizer(t.optimizer),
               "device": t.device.type, "amp": cfg["amp"]["level"], "world_size": t.world.size,
               "global_batch": cfg["data"]["batch_size"] * t.world.size,
               "peak_memory_mb": round(peak_memory_mb(t.device), 1)}
    if t.world.is_main:
        out = Path(cfg["output"])
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        log.info(f"top-1 {top1:.2f}%, {summary['img_per_s']:.1f} img/s. Run directory {out}: "
                 f"config.yaml, checkpoints/last.pt and best.pt, metrics.jsonl, summary.json; "
                 f"TensorBoard: tensorboard --logdir {out}")
    log.close()
    return summary


def len_steps(t):
    return steps_per_epoch(t.cfg, t.train_loader)


def train_one_epoch(t, epoch):
    """One pass over the training data; returns (images seen by all processes, seconds)."""
    t.model.train()
    if t.cfg["train"]["freeze_bn"]:
        for module in t.net.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                module.eval()
    t.train_loader.sampler.set_epoch(epoch)
    steps, log_every = len_steps(t), t.cfg["train"]["log_every"]
    batch_global = t.cfg["data"]["batch_size"] * t.world.size
    loss_sum = torch.zeros((), device=t.device)
    start = interval_start = time.perf_counter()
    interval_steps = 0
    batches = prefetch(t, t.train_loader)
    for i, (images, labels) in enumerate(batches):
        if i == steps:
            break
        with t.precision.autocast():
            loss = t.criterion(t.model(images).float(), labels)
        t.precision.backward(loss, t.optimizer)
        t.precision.step(t.model, t.optimizer)
        t.precision.zero_grad(t.model, t.optimizer)
        t.scheduler.step()
        loss_sum += loss.detach().float()
        interval_steps += 1
        if (i + 1) % log_every == 0 or i + 1 == steps:
            synchronize(t.device)
            now = time.perf_counter()
            loss_mean = all_reduce_sum(loss_sum).item() / interval_steps / t.world.size
            log_step(t, epoch, i + 1, steps, loss_mean,
                     batch_global * interval_steps / (now - interval_start))
            loss_sum.zero_()
            interval_start, interval_steps = now, 0
    synchronize(t.device)
    return steps * batch_global, time.perf_counter() - start


def prefetch(t, loader):
    return DevicePrefetcher(loader, t.device, t.cfg["model"]["channels_last"],
                            t.precision.input_dtype)


def log_step(t, epoch, step, steps, loss, img_per_s):
    lr = t.optimizer.param_groups[0]["lr"]
    extra = {k: float(v) for k, v in t.precision.metrics().items()}
    extras = "".join(f"  {k} {v:g}" for k, v in extra.items())
    t.log.info(f"Epoch: [{epoch}][{step:>{len(str(steps))}}/{steps}]  loss {loss:.4f}  "
               f"lr {lr:.5f}  img/s {img_per_s:.1f}{extras}")
    t.log.record("train", epoch * steps + step, epoch=epoch, loss=loss, lr=lr,
                 img_per_s=img_per_s, **extra)


@torch.no_grad()
def evaluate(t):
    """Top-1/top-5 (%) over the whole val set; each process counts its exact share."""
    t.net.eval()
    counts = torch.zeros(3, device=t.device, dtype=torch.float64)  # top1, top5, images
    for images, labels in prefetch(t, t.val_loader):
        with t.precision.autocast():
            logits = t.net(images)
        k = min(5, logits.shape[1])
        hits = logits.topk(k, dim=1).indices.eq(labels[:, None])
        counts += torch.stack([hits[:, 0].sum(), hits.any(dim=1).sum(),
                               torch.tensor(len(labels), device=t.device)]).double()
    all_reduce_sum(counts)
    top1, top5, total = counts.tolist()
    return 100 * top1 / total, 100 * top5 / total


def checkpoint_state(t):
    return {"epoch": t.epoch, "arch": "mobilenet_v1", "state_dict": t.precision.model_state_dict(t.net),
            "best_prec1": t.best_top1, "optimizer": t.optimizer.state_dict(),
            "scheduler": t.scheduler.state_dict(), "amp": t.precision.state_dict(),
            "config": t.cfg}


def restore(t, resume):
    """Loads a checkpoint of ours ('auto': the newest valid one in the run directory)."""
    if resume == "auto":
        found = ckpt.load_latest(t.cfg["output"])
        if found is None:
            t.log.info(f"--resume auto: no checkpoint in {t.cfg['output']}, starting fresh")
            return
        resume, state = found
    else:
        state = ckpt.load_checkpoint(resume)
    load_weights(t.net, state, str(resume))
    t.precision.load_model_state_dict(t.net, unwrap_state_dict(state))
    if "optimizer" in state and "scheduler" in state:
        t.optimizer.load_state_dict(state["optimizer"])
        t.scheduler.load_state_dict(state["scheduler"])
        if state.get("amp"):
            t.precision.load_state_dict(state["amp"])
        t.epoch, t.best_top1 = state["epoch"], float(state["best_prec1"])
    t.log.info(f"resumed from {resume} (epoch {t.epoch})")

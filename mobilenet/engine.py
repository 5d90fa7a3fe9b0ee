"""Training and evaluation: builds everything from the config, runs the epochs, writes the run."""
import json
import math
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from mobilenet import checkpoint as ckpt
from mobilenet.amp import build_precision
from mobilenet.bench import StepBreakdown, profiler
from mobilenet.config import UsageError
from mobilenet.data import DevicePrefetcher, build_datasets, build_loaders
from mobilenet.device import describe, device_module, peak_memory_mb, resolve_device, synchronize
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
    steps: int                 # per epoch (fixed: the loader shortens when resuming mid-epoch)
    ema: AveragedModel | None  # moving average of the weights (train.ema_decay > 0)
    breakdown: StepBreakdown
    epoch: int = 0             # epochs completed
    step: int = 0              # batches done in the epoch under way
    best_top1: float = 0.0


class StopOnSignal:
    """SIGTERM/SIGINT ask the run to stop after the current step (a second SIGINT interrupts).

    Distributed ranks agree through an all-reduce at log steps and epoch ends, so all stop at the
    same step; a single process stops at the next step."""

    def __init__(self, world, device):
        self.world, self.device, self.received = world, device, None

    def __enter__(self):
        self.previous = {s: signal.signal(s, self.handle) for s in (signal.SIGTERM, signal.SIGINT)}
        return self

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    def handle(self, signum, frame):
        self.received = signal.Signals(signum).name
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def should_stop(self, can_sync):
        if self.world.size == 1:
            return self.received is not None
        if not can_sync:
            return False
        flag = torch.tensor(float(self.received is not None), device=self.device)
        return all_reduce_sum(flag).item() > 0


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
    if cfg["model"]["channels_last"] == "auto":
        cfg["model"]["channels_last"] = device.type != "npu"
    memory_format = torch.channels_last if cfg["model"]["channels_last"] else torch.contiguous_format
    net = net.to(device, memory_format=memory_format)
    precision = build_precision(cfg["amp"], device)
    optimizer = make_optimizer(cfg, precision.optimizer_params(net), net, device, world)
    net, optimizer = precision.initialize(net, optimizer)
    ema = build_ema(net, cfg["train"]["ema_decay"], precision)
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
                   val_loader, log, criterion, steps, ema,
                   StepBreakdown(device, cfg["train"]["measure_breakdown"]))


def make_optimizer(cfg, params, net, device, world):
    o = cfg["optim"]
    lr = o["lr"]
    if o["lr_scale_batch"] > 0:  # linear scaling rule: lr per lr_scale_batch images
        lr = lr * cfg["data"]["batch_size"] * world.size / o["lr_scale_batch"]
        if world.is_main:
            print(f"lr {o['lr']:g} per {o['lr_scale_batch']} images -> {lr:g} for the global batch "
                  f"{cfg['data']['batch_size'] * world.size}", flush=True)
    return build_optimizer(net, o["name"], o["impl"], lr, o["momentum"], o["weight_decay"], device,
                           o["nesterov"], o["no_decay_bn_bias"], o["betas"], o["eps"], o["alpha"],
                           params=params)


def build_ema(net, decay, precision):
    if decay <= 0:
        return None
    if precision.level == "O2":
        raise UsageError("train.ema_decay: an average of half-precision weights loses the small "
                         "updates; use amp O0 or O1 with EMA")
    return AveragedModel(net, multi_avg_fn=get_ema_multi_avg_fn(decay), use_buffers=True)


def steps_per_epoch(cfg, loader):
    limit = cfg["train"]["max_steps_per_epoch"]
    return min(len(loader), limit) if limit > 0 else len(loader)


def fit(t):
    """Epochs of training and validation; checkpoints and the summary at the end."""
    cfg, log = t.cfg, t.log
    saver = ckpt.CheckpointSaver(cfg["output"], cfg["train"]["keep_checkpoints"])
    train_images = train_time = 0.0
    top1 = top5 = 0.0
    ema_metrics = {}
    trace = profiler(t.device, Path(cfg["output"]) / "profile", cfg["train"]["profile"] and t.world.is_main)
    with StopOnSignal(t.world, t.device) as stop, trace as prof:
        while t.epoch < cfg["train"]["epochs"]:
            epoch = t.epoch
            images, seconds = train_one_epoch(t, epoch, stop, prof)
            train_images, train_time = train_images + images, train_time + seconds
            if t.step < t.steps:  # stopped by a signal mid-epoch
                return stopped(t, saver, stop)
            top1, top5 = evaluate(t)
            t.epoch, t.step = epoch + 1, 0
            is_best = top1 > t.best_top1
            t.best_top1 = max(t.best_top1, top1)
            log.info(f" * Acc@1 {top1:.3f} Acc@5 {top5:.3f}  (epoch {epoch}, best {t.best_top1:.3f})")
            ema_metrics = evaluate_ema(t)
            log.record("val", t.epoch * t.steps, epoch=epoch, top1=top1, top5=top5,
                       epoch_time_s=seconds, **ema_metrics)
            if t.world.is_main:
                saver.save(checkpoint_state(t), t.epoch, is_best)
            if t.epoch < cfg["train"]["epochs"] and stop.should_stop(can_sync=True):
                return stopped(t, saver, stop)
    # on the device: nccl and hccl reduce only device tensors
    unreadable = int(all_reduce_sum(torch.tensor(unreadable_count(t), device=t.device)).item())
    summary = {"top1": top1, "top5": top5, "best_top1": t.best_top1, "epochs": t.epoch,
               **ema_metrics,
               "img_per_s": train_images / train_time if train_time else 0.0,
               "optimizer": cfg["optim"]["impl"], "optimizer_class": describe_optimizer(t.optimizer),
               "device": t.device.type, "amp": cfg["amp"]["level"], "world_size": t.world.size,
               "global_batch": cfg["data"]["batch_size"] * t.world.size,
               "peak_memory_mb": round(peak_memory_mb(t.device), 1), "unreadable_images": unreadable,
               **t.breakdown.summary(train_time, train_images / (cfg["data"]["batch_size"] * t.world.size))}
    if unreadable:
        log.info(f"warning: {unreadable} reads of unreadable images were skipped (see the warnings)")
    if t.world.is_main:
        out = Path(cfg["output"])
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        log.info(f"top-1 {top1:.2f}%, {summary['img_per_s']:.1f} img/s. Run directory {out}: "
                 f"config.yaml, checkpoints/last.pt and best.pt, metrics.jsonl, summary.json; "
                 f"TensorBoard: tensorboard --logdir {out}")
    log.close()
    return summary


def stopped(t, saver, stop):
    """After SIGTERM/SIGINT: a resumable last.pt, and how to resume."""
    if t.world.is_main:
        saver.save_last(checkpoint_state(t))
    t.log.info(f"{stop.received or 'a signal on another rank'}: stopped at epoch {t.epoch} step "
               f"{t.step}, saved {saver.last}. Resume with the same command plus "
               f"--output {t.cfg['output']} --resume auto")
    t.log.close()
    return None


def unreadable_count(t):
    counter = getattr(t.train_loader.dataset, "unreadable", None)
    return counter.value if counter is not None else 0


def train_one_epoch(t, epoch, stop, prof):
    """Trains from batch ``t.step`` to the end of the epoch, or until ``stop`` says so.
    Returns (images seen by all processes, seconds)."""
    t.model.train()
    if t.cfg["train"]["freeze_bn"]:
        for module in t.net.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                module.eval()
    first = t.step
    t.train_loader.sampler.set_epoch(epoch, first * t.cfg["data"]["batch_size"])
    steps, log_every = t.steps, t.cfg["train"]["log_every"]
    batch_global = t.cfg["data"]["batch_size"] * t.world.size
    loss_sum = torch.zeros((), device=t.device)
    start = interval_start = time.perf_counter()
    interval_steps = 0
    t.breakdown.start_wait()
    for i, (images, labels) in enumerate(prefetch(t, t.train_loader), start=first):
        if i == steps:
            break
        t.breakdown.end_wait()
        with t.precision.autocast():
            loss = t.criterion(t.model(images).float(), labels)
        t.precision.backward(loss, t.optimizer)
        t.breakdown.optimizer_step(lambda: optimizer_step(t))
        if t.ema is not None:
            t.ema.update_parameters(t.net)
        t.scheduler.step()
        loss_sum += loss.detach().float()
        interval_steps += 1
        t.step = i + 1
        at_log = t.step % log_every == 0 or t.step == steps
        if at_log:
            synchronize(t.device)
            now = time.perf_counter()
            loss_mean = all_reduce_sum(loss_sum).item() / interval_steps / t.world.size
            check_finite(t, loss_mean, epoch)
            log_step(t, epoch, t.step, steps, loss_mean,
                     batch_global * interval_steps / (now - interval_start))
            loss_sum.zero_()
            interval_start, interval_steps = now, 0
        prof.step()
        if stop.should_stop(can_sync=at_log):
            break
        t.breakdown.start_wait()
    synchronize(t.device)
    return (t.step - first) * batch_global, time.perf_counter() - start


def optimizer_step(t):
    t.precision.step(t.model, t.optimizer)
    t.precision.zero_grad(t.model, t.optimizer)


def check_finite(t, loss_mean, epoch):
    """A non-finite loss ends the run unless dynamic loss scaling skips such steps."""
    if not math.isfinite(loss_mean) and not t.precision.dynamic_loss_scale:
        raise UsageError(f"the loss became {loss_mean} in epoch {epoch} before step {t.step}: "
                         f"stopped; nothing saved after {t.cfg['output']}/checkpoints/last.pt")


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


def evaluate(t):
    return accuracy(t.net, prefetch(t, t.val_loader), t.precision.autocast, t.device)


def evaluate_ema(t):
    """{'ema_top1', 'ema_top5'} of the averaged weights, or {} without EMA."""
    if t.ema is None:
        return {}
    top1, top5 = accuracy(t.ema.module, prefetch(t, t.val_loader), t.precision.autocast, t.device)
    t.log.info(f" * EMA Acc@1 {top1:.3f} Acc@5 {top5:.3f}")
    return {"ema_top1": top1, "ema_top5": top5}


@torch.no_grad()
def accuracy(net, batches, autocast, device):
    """Top-1/top-5 (%) over ``batches``; each process counts its exact share, summed over all."""
    net.eval()
    counts = torch.zeros(3, device=device, dtype=torch.float64)  # top1, top5, images
    for images, labels in batches:
        with autocast():
            logits = net(images)
        hits = logits.topk(min(5, logits.shape[1]), dim=1).indices.eq(labels[:, None])
        counts += torch.stack([hits[:, 0].sum(), hits.any(dim=1).sum(),
                               torch.tensor(len(labels), device=device)]).double()
    all_reduce_sum(counts)
    top1, top5, total = counts.tolist()
    return 100 * top1 / total, 100 * top5 / total


def rng_states(device):
    states = {"torch": torch.get_rng_state()}
    module = device_module(device)
    if module is not None:
        states["device"] = module.get_rng_state()
    return states


def checkpoint_state(t):
    return {"epoch": t.epoch, "step": t.step, "rng": rng_states(t.device), "arch": "mobilenet_v1",
            "state_dict": t.precision.model_state_dict(t.net),
            "best_prec1": t.best_top1, "optimizer": t.optimizer.state_dict(),
            "scheduler": t.scheduler.state_dict(), "amp": t.precision.state_dict(),
            "ema": t.ema.state_dict() if t.ema is not None else None,
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
        if t.ema is not None and state.get("ema"):
            t.ema.load_state_dict(state["ema"])
        t.epoch, t.step, t.best_top1 = state["epoch"], state["step"], float(state["best_prec1"])
        torch.set_rng_state(state["rng"]["torch"])
        if "device" in state["rng"] and device_module(t.device) is not None:
            device_module(t.device).set_rng_state(state["rng"]["device"])
    t.log.info(f"resumed from {resume} (epoch {t.epoch}, step {t.step})")

"""The run: ``run`` builds it from the resolved config (``build_run``, the resume's two calls), then
``fit`` trains its epochs (``train_one_epoch``, ``end_epoch``). Behaviours enter at named points."""
import math
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch

from mobilenet import checkpoint as ckpt, resume as resume_policy
from mobilenet.behaviours import behaviours_for
from mobilenet.config import differing_settings, thaw
from mobilenet.data.datasets import WorkerSignals, build_loaders, data_record
from mobilenet.data.sources import build_datasets
from mobilenet.device import describe, open_device
from mobilenet.distributed import (any_rank, any_rank_restarted, destroy, every_rank, host_group, init_process_group,
                                   world_from_env)
from mobilenet.errors import TrainingFailure, UsageError, mark_started, stop_signals
from mobilenet.logging import RunLogger, progress_line, run_directory
from mobilenet.measure import COMPILE_STEPS, EpochMeter, OtherLoad, RunClock, StepBreakdown, named_phase, profiler
from mobilenet.state import TrainingState
from mobilenet.validation import Accuracy, accuracy_line, read_summary, validate, write_summary
from mobilenet.watchdog import Watchdog, kill_loader_workers


@dataclass
class Run:
    """What the loop carries."""
    cfg: dict
    world: object
    device: torch.device
    state: TrainingState       # the step, the position, the schedule: everything a checkpoint holds
    train_loader: object
    val_loader: object
    log: RunLogger
    worker_signals: WorkerSignals
    watchdog: Watchdog         # train.stall_timeout (started by fit)
    clock: RunClock            # the first step, compiling steps, the last validation
    behaviours: list           # entered at the named points (mobilenet/behaviours)
    breakdown: StepBreakdown | None = None

    @property
    def step(self):
        """What trains: the state's TrainStep."""
        return self.state.step


STUCK_DATA_WAIT_S = 5.0  # a stop signal during a data wait this long stops at once (a stuck loader)


class StopRequested(BaseException):
    """A stop signal during a stuck wait for a batch (BaseException: the DataLoader lets it pass)."""


class StopOnSignal:
    """A stop signal to any process stops every rank after the same step: each votes after its wait
    for the batch, in a host reduction. A rank stuck in its wait leaves it (StopRequested) and votes
    with its peers. Once the run saves (``saving()``) signals are ignored."""

    def __init__(self, world, watchdog):
        self.world, self.watchdog, self.received = world, watchdog, None

    def __enter__(self):
        if self.world.size > 1:
            host_group()  # made by every rank at the same point
        self.previous = {s: signal.signal(s, self.handle) for s in stop_signals()}
        self.previous[signal.SIGALRM] = signal.signal(signal.SIGALRM, self.look_again)
        return self

    def __exit__(self, *exc):
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self.previous.pop(signal.SIGALRM))
        if self.received is None:
            for sig, handler in self.previous.items():
                signal.signal(sig, handler)

    def handle(self, signum, frame):
        first = self.received is None
        self.received = signal.Signals(signum).name
        if first and self.watchdog.waiting_for == "data":
            self.stop_if_stuck()

    def stop_if_stuck(self):
        """After a data wait of STUCK_DATA_WAIT_S: stop now; else look again then (SIGALRM)."""
        waited = self.watchdog.wait_seconds()
        if waited > STUCK_DATA_WAIT_S:
            raise StopRequested(self.received)
        signal.setitimer(signal.ITIMER_REAL, STUCK_DATA_WAIT_S - waited + 0.1)

    def look_again(self, signum, frame):
        if self.received is not None and self.watchdog.waiting_for == "data":
            self.stop_if_stuck()

    def saving(self):
        """The run saves and ends now: from here on, signals are ignored."""
        signal.setitimer(signal.ITIMER_REAL, 0)
        for sig in self.previous:
            signal.signal(sig, signal.SIG_IGN)

    def vote(self, save_due=False):
        """Vote(stop, save), alike on every rank: any rank's stop signal, rank 0's periodic save."""
        return Vote(*any_rank(self.received is not None, save_due))


class Vote(NamedTuple):
    stop: bool
    save: bool


def run(cfg, *, resume=None, evaluate_only=False, start_over=False):
    """Trains (or only evaluates) as the resolved ``cfg`` says; returns the summary (None when a
    signal stopped it). ``resume``: a checkpoint or 'auto' (the newest valid one), which a torchrun
    restart takes, falling back to ``resume``. ``start_over`` trains over a run directory's run."""
    if "derived" not in cfg:
        raise TypeError("run() takes a resolved config: run(resolve(build_config(...)))")
    if evaluate_only and not (resume or cfg["model"]["pretrained"]):
        raise UsageError("--evaluate needs weights: --resume FILE or model.pretrained=FILE")
    world = world_from_env()
    if world.size != cfg["derived"]["world_size"]:  # resolve() decided it; the processes must agree
        raise UsageError(f"the config was resolved for {cfg['derived']['world_size']} process(es), but "
                         f"{world.size} run: resolve it in the processes that train")
    card = cfg["device_id"] if cfg["device_id"] is not None else world.local_rank
    device = open_device(cfg["derived"]["device"], card, cfg["train"]["deterministic"])
    watchdog = Watchdog(cfg["train"]["stall_timeout"], world, cfg["data"]["path"], Path(cfg["output"]) / "checkpoints")
    init_process_group(world, device, watchdog.collective_wait)
    mark_started()
    try:
        restarted = any_rank_restarted(world) and not evaluate_only
        fallback = None
        if restarted:  # every rank resumes, from the one checkpoint rank 0 picks (restore)
            resume, fallback = "auto", resume
        # rank 0 holds the run directory; evaluation writes nothing
        with run_directory(cfg["output"], resume=resume, start_over=start_over, main=world.is_main,
                           claim=world.is_main and not evaluate_only) as log:
            if restarted:
                log.info(f"torchrun restart {world.restart}: every rank resumes from rank 0's newest checkpoint")
            if resume:  # first: its global batch is kept, on any number of processes
                cfg, chosen = resume_policy.prepare(cfg, resume, log, fallback=fallback, evaluate_only=evaluate_only)
            r = build_run(cfg, world, device, log, watchdog)
            check_same_job(r)
            if resume:
                resume_policy.restore(r, chosen, evaluate_only=evaluate_only)
            if evaluate_only:
                return evaluate_only_run(r)
            enter(r, "at_start")
            if r.state.finished and not r.state.awaiting_validation:
                return already_complete(r)
            r.log.start(config=r.state.records["config"], resumed_at=r.state.resumed_at)  # once it is known to start
            return fit(r)
    finally:
        destroy()


def build_run(cfg, world, device, log, watchdog):
    derived, data = cfg["derived"], cfg["data"]
    train_set, val_set = build_datasets(data, cfg["model"], cfg["augment"], decode=derived["decode"])
    worker_signals = WorkerSignals()
    train_loader, val_loader = build_loaders(train_set, val_set, data, cfg["seed"], world.rank,
                                             world.size, device.type != "cpu", worker_signals,
                                             workers=derived["workers"], decode=derived["decode"],
                                             accumulation=derived["grad_accum_steps"], reps=cfg["augment"]["ra_reps"])
    limit = cfg["train"]["max_steps_per_epoch"]
    steps = min(train_loader.sampler.steps, limit) if limit > 0 else train_loader.sampler.steps
    state = TrainingState(cfg, device, steps, rank=world.rank,
                          records={"config": thaw(cfg), "data": {"train": data_record(train_set),
                                                                  "val": data_record(val_set)}})
    for line in run_description(cfg, device=device, images=(len(train_set), len(val_set)), steps=steps):
        log.info(line)
    breakdown = StepBreakdown(device) if cfg["train"]["measure_breakdown"] else None
    if breakdown is not None:
        state.step.phase = breakdown.phase
    elif cfg["train"]["profile"]:  # the phases as ranges in the trace
        state.step.phase = named_phase
    return Run(cfg, world, device, state, train_loader, val_loader, log, worker_signals,
               watchdog, RunClock(compiled=derived["compile"] is not None), behaviours_for(), breakdown)


def run_description(cfg, *, device, images, steps):
    """The lines that open a run's log; ``images``: (train, val)."""
    derived, data, optim = cfg["derived"], cfg["data"], cfg["optim"]
    optimizer = derived["optimizer_class"]
    scaled = f" ({optim['lr']:g} per {optim['lr_scale_batch']} images)" if optim["lr_scale_batch"] else ""
    auto = " (auto: from the usable cores)" if data["workers"] == "auto" else ""
    forwards = derived["grad_accum_steps"]
    accumulated = f" x {forwards} forwards accumulated" if forwards > 1 else ""
    return [f"device {describe(device)}, {derived['world_size']} process(es); optimizer {optimizer}; amp "
            f"{cfg['amp']['level']} ({derived['amp_backend']})",
            f"data {data['path']}: {images[0]} train / {images[1]} val images, batch {data['batch_size']} per "
            f"process x {derived['world_size']}{accumulated} = {derived['global_batch']} global, {steps} steps/epoch, "
            f"lr {derived['lr']:g}{scaled}",
            f"data.workers {derived['workers']}{auto}; data.decode {derived['decode_why']}; "
            f"train.compile {derived['compile_why']}",
            *(f"command line: {note}" for note in derived["command_line"]),
            *(f"note: {note}" for note in derived["not_taken"])]


def check_same_job(r):
    """Every rank has rank 0's config (less PER_PROCESS) and data, else one line on every rank."""
    everyone = every_rank((r.cfg, r.state.records["data"]))
    settings, data = everyone[0]
    for rank, (their_settings, their_data) in enumerate(everyone[1:], start=1):
        differ = differing_settings(settings, their_settings)
        if differ:
            key, theirs, ours = differ[0]
            raise UsageError(f"rank {rank} was given other settings than rank 0: {key} is {theirs!r} there, "
                             f"{ours!r} on rank 0{f' (and {len(differ) - 1} more)' if len(differ) > 1 else ''}; "
                             f"start every process of the job with the same command and settings")
        changed = resume_policy.data_changes(data, their_data, then="on rank 0", here="there")
        if changed:
            raise UsageError(f"rank {rank} reads other data than rank 0 ({changed}); every node needs the "
                             f"same copy of the dataset")


def enter(r, point, *args):
    """The behaviours' named ``point`` (at_start, at_log, at_epoch_end), where they define it."""
    for behaviour in r.behaviours:
        if hasattr(behaviour, point):
            getattr(behaviour, point)(r, *args)


def evaluate_only_run(r):
    results = validate(r)
    if not results[""].scored:
        raise UsageError(f"--data {r.cfg['data']['path']}: none of the {results[''].left_out} val images "
                         f"could be read (see the warnings); nothing to evaluate")
    for label, result in results.items():
        r.log.info(accuracy_line(result.top1, result.top5, result.note(), prefix=f" {label}" if label else ""))
    return {"top1": results[""].top1, "top5": results[""].top5, "val_images_scored": results[""].scored}


def already_complete(r):
    """--resume of a finished run: says so and leaves its files as they are."""
    summary = read_summary(Path(r.cfg["output"]) / "summary.json", r.log.info)
    train = r.cfg["train"]
    cap = f", {train['max_steps']} steps at most (train.max_steps)" if train["max_steps"] else ""
    r.log.info(f"{r.cfg['output']} is complete: {r.state.epoch} of {train['epochs']} epochs{cap} trained "
               f"(best top-1 {r.state.best_top1:.3f}); nothing to do. To train longer, raise --epochs"
               f"{' or train.max_steps' if cap else ''}.")
    return summary


def fit(r):
    """Epochs of training and validation, then the summary; an epoch trained but not validated is
    validated first. Every save gathers every rank's random states; rank 0 writes."""
    cfg = r.cfg
    saver = ckpt.CheckpointSaver(cfg["output"], cfg["train"]["keep_checkpoints"], writing=r.watchdog.writing)
    totals = {"images": 0, "seconds": 0.0, "data_wait_s": 0.0, "other_load": OtherLoad()}
    results = {"": Accuracy(0.0, 0.0, 0, 0)}
    run_start, epoch_seconds = time.perf_counter(), 0.0
    periodic = ckpt.Every(cfg["train"]["checkpoint_every_minutes"] if r.world.is_main else 0)
    trace = Path(cfg["output"]) / "profile"
    with (r.watchdog, StopOnSignal(r.world, r.watchdog) as stop, r.worker_signals.protect(),
          profiler(r.device, trace, cfg["train"]["profile"] and r.world.is_main) as prof):
        r.state.start_random_states()
        while True:
            if r.state.awaiting_validation:
                if stop.vote(save_due=periodic.due()).save:  # the epoch's last step, before its validation
                    save_last_if_finite(r, saver)
                results = end_epoch(r, saver, epoch_seconds=epoch_seconds)
                if not r.state.finished and stop.vote().stop:
                    return stopped(r, saver, stop)
            if r.state.finished:
                return finish(r, totals, results)  # a signal now waits until the summary is written
            meter = EpochMeter(device=r.device, world_size=r.world.size, global_batch=cfg["derived"]["global_batch"],
                               run_start=run_start, at_step=r.state.global_step, sync_wait=r.breakdown is not None)
            train_one_epoch(r, meter, stop, prof, periodic=periodic, save=lambda: save_last_if_finite(r, saver))
            for key, value in meter.totals(r.state.global_step).items():  # images, seconds, data_wait_s
                totals[key] += value
            epoch_seconds = meter.seconds
            if not r.state.awaiting_validation:  # stopped by a signal
                return stopped(r, saver, stop)


def train_one_epoch(r, meter, stop, prof, *, periodic, save):
    """Trains from ``r.state.epoch_step`` to the epoch's end or a stop; ``save()`` between steps when
    ``periodic`` is due. Steps that compile are timed apart and left out of the rates."""
    state, log_every = r.state, r.cfg["train"]["log_every"]
    r.step.train(freeze_bn=r.cfg["train"]["freeze_bn"])
    r.train_loader.sampler.set_epoch(state.epoch, state.epoch_step)
    for batches in timed_steps(r, meter):
        # every rank votes here, one whose wait was stuck too (None), and learns of rank 0's save
        vote = stop.vote(save_due=periodic.due())
        if vote.stop:
            break
        if vote.save:
            save()
        loss = state.train_on(batches, after_each=r.watchdog.beat)
        compiled, compile_s = r.clock.after_step(meter, state.global_step, state.mid_epoch)
        if compile_s is not None:
            r.log.info(f"compile: the first {COMPILE_STEPS} steps took {compile_s:.1f} s (tracing and "
                       f"code generation), left out of the rates")
        if not compiled:
            meter.add(loss)
            if state.epoch_step % log_every == 0 or not state.mid_epoch:
                loss_mean, interval = meter.interval_loss(), meter.end_interval(state.global_step)
                check_finite(r, loss_mean)
                log_interval(r, loss_mean, interval)
            r.watchdog.beat(state.global_step)
        prof.step()
        if state.finished:
            break


def timed_steps(r, meter):
    """The epoch's remaining steps, each its train.grad_accum_steps batches, all on the device before
    the step votes (a rank stuck in a later wait must vote, not hold its peers in the all-reduce).
    A stop during a stuck wait gives None, the loader's workers killed."""
    forwards = r.cfg["derived"]["grad_accum_steps"]
    batches = iter(r.step.batches(r.train_loader))
    for _ in range(r.state.steps_per_epoch - r.state.epoch_step):
        step = []
        try:
            while len(step) < forwards:
                with meter.waiting(), r.watchdog.waiting("data"), r.step.phase("data"):
                    step.append(next(batches))
        except StopRequested:
            kill_loader_workers()
            yield None
            return
        except StopIteration:
            return
        yield step


def check_finite(r, loss_mean):
    """A non-finite loss ends the run unless dynamic loss scaling skips such steps."""
    if not math.isfinite(loss_mean) and not r.step.skips_bad_steps():
        raise TrainingFailure(f"the loss became {loss_mean} in epoch {r.state.epoch} before batch "
                              f"{r.state.epoch_step}: stopped; nothing saved after "
                              f"{r.cfg['output']}/checkpoints/last.pt")


def log_interval(r, loss, interval):
    """The progress line, metrics.jsonl and TensorBoard for the interval; then ``at_log``."""
    state, steps = r.state, r.state.steps_per_epoch
    in_epoch = min(steps - state.epoch_step, state.steps_left)
    after_epoch = state.steps_left - in_epoch  # steps of the epochs after this one
    eta_epoch = in_epoch * interval.step_time + r.clock.val_seconds
    eta_run = eta_epoch + after_epoch * interval.step_time + math.ceil(after_epoch / steps) * r.clock.val_seconds
    lr, extras = r.step.lr(), r.step.metrics()
    r.log.info(progress_line(epoch=state.epoch, step=state.epoch_step, steps=steps, eta_epoch=eta_epoch,
                             eta_run=eta_run, img_per_s=r.cfg["derived"]["global_batch"] / interval.step_time,
                             data_wait=interval.data_wait, loss=loss, lr=lr, elapsed=interval.elapsed,
                             extras=extras))
    r.log.scalars("train", state.global_step, epoch=state.epoch, loss=loss, lr=lr,
                  img_per_s=interval.img_per_s, data_wait=interval.data_wait, **extras)
    enter(r, "at_log", interval)


def end_epoch(r, saver, epoch_seconds):
    """Validation of what rank 0 saves, its lines and records, ``at_epoch_end``, the checkpoints."""
    r.step.sync_buffers()
    val_start = time.perf_counter()
    results = validate(r)
    r.clock.val_seconds = time.perf_counter() - val_start
    enter(r, "at_epoch_end", results)  # after validation, before the save
    epoch, own = r.state.epoch, results[""]
    is_best = r.state.validated(own.top1, own.scored)
    r.log.info(accuracy_line(own.top1, own.top5, f"epoch {epoch}, best {r.state.best_top1:.3f}; {own.note()}"))
    ema = {}
    if "EMA" in results:
        ema = {"ema_top1": results["EMA"].top1, "ema_top5": results["EMA"].top5}
        r.log.info(accuracy_line(results["EMA"].top1, results["EMA"].top5, prefix=" EMA"))
    r.log.scalars("val", r.state.global_step, epoch=epoch, top1=own.top1, top5=own.top5,
                  epoch_time_s=epoch_seconds, **ema)
    checkpoint = r.state.state_dict()  # every rank: their random states are gathered
    if r.world.is_main:
        saver.save(checkpoint, r.state.epoch, is_best)
    if not own.scored:
        raise UsageError(f"--data {r.cfg['data']['path']}: none of the {own.left_out} val images could be "
                         f"read (see the warnings), so there is no accuracy; the training is saved in "
                         f"{saver.last}: fix the val files, then resume with --resume auto")
    return results


def finish(r, totals, results):
    """summary.json and the closing line."""
    summary = write_summary(r, results, totals)
    if summary["unreadable_images"]:
        r.log.info(f"warning: {summary['unreadable_images']} unreadable image files were skipped (see the warnings)")
    if r.world.is_main:
        out = Path(r.cfg["output"])
        written = " and ".join(name for name in ("last.pt", "best.pt") if (out / "checkpoints" / name).exists())
        r.log.info(f"top-1 {summary['top1']:.2f}%, {summary['img_per_s']:.1f} images/s. Run directory {out}: "
                   f"config.yaml, checkpoints/{written}, metrics.jsonl, summary.json; "
                   f"TensorBoard: tensorboard --logdir {out}")
    r.log.close()
    return summary


def save_last_if_finite(r, saver):
    """last.pt between log intervals, unless the weights diverged since the last loss check."""
    if not r.step.weights_finite():  # alike on every rank: they hold the same weights
        raise TrainingFailure(f"the weights became non-finite in epoch {r.state.epoch} before batch "
                              f"{r.state.epoch_step}: stopped; nothing saved after {saver.last}")
    checkpoint = r.state.state_dict()
    if r.world.is_main:
        saver.save_last(checkpoint)


def stopped(r, saver, stop):
    """After SIGTERM/SIGINT/SIGHUP: a resumable last.pt, and how to resume."""
    stop.saving()
    save_last_if_finite(r, saver)
    r.log.info(f"{stop.received or 'a signal on another rank'}: stopped at epoch {r.state.epoch} batch "
               f"{r.state.epoch_step}, saved {saver.last}. Resume with the same command plus "
               f"--output {r.cfg['output']} --resume auto")
    r.log.close()
    return None

"""train.py's command line into a resolved config: its flags, the data folder, ``key.sub=value``
settings, and the dialects of pytorch/examples' and ModelZoo's main.py and torchvision's train.py
(each flag the one setting it means there, said in derived.command_line). Later layers win: the
recipe (--config), flags, ``key.sub=value``; two that set one setting differently are a UsageError.
"""
import argparse
import math
import os
import re
from pathlib import Path

import torch

from mobilenet.config import CHOICES, FLAGS, build_config, coerce_setting, parse_override, resolve
from mobilenet.errors import UsageError
from mobilenet.measure import PROFILED_STEPS
from mobilenet.model import MODELS, model_name

LEVELS, DEVICES = sorted(CHOICES["amp.level"]), sorted(CHOICES["device"])
CONFIGS = Path(__file__).resolve().parent.parent / "configs"
OVERRIDE = re.compile(r"^[A-Za-z_][\w.]*=")

class OneLineParser(argparse.ArgumentParser):
    """argparse's own errors (an unknown flag, a bad value) as one line, like every other error."""

    def error(self, message):
        raise UsageError(f"{message} (python train.py --help lists the flags)")


def build_parser(description=None):
    p = OneLineParser(description=description, allow_abbrev=False)  # no flag is reached by a prefix
    p.add_argument("--config", help="YAML config (default: demo.yaml without --data, "
                   "synthetic.yaml with --data synthetic, imagenet.yaml with a folder)")
    p.add_argument("--optimizer", choices=sorted(CHOICES["optim.impl"], reverse=True),  # standard, fused
                   help="optim.impl")
    p.add_argument("--data", help="an ImageFolder root with train/ and val/, a prepared set of one "
                   "(scripts/prepare_data.py), 'synthetic' or 'digits'")
    p.add_argument("--device", choices=DEVICES)
    p.add_argument("--amp", choices=LEVELS, nargs="?", const="O1",
                   help="amp.level; alone, O1 (torchvision's --amp: autocast and a dynamic loss scale)")
    p.add_argument("--epochs", type=int, help="train.epochs")
    p.add_argument("--grad-accum-steps", type=int, metavar="N",
                   help="forwards of data.batch_size per process and optimizer step (train.grad_accum_steps)")
    p.add_argument("--output", help="run directory (default runs/<config>-<optimizer>)")
    p.add_argument("--resume", help="checkpoint to resume from, or 'auto' for the newest in --output")
    p.add_argument("--start-over", action="store_true",
                   help="train from scratch in an --output that holds a run, removing its files")
    p.add_argument("-e", "--evaluate", "--test-only", action="store_true",
                   help="only evaluate (weights from --resume or model.pretrained)")
    p.add_argument("--compile", action="store_true", default=None,
                   help="torch.compile the model's forward and backward and the optimizer's step (not "
                        "torch_npu's NpuFused* step) (train.compile=true)")
    p.add_argument("--profile", action="store_true", default=None,
                   help="write a profiler trace of a few steps to <output>/profile (TensorBoard)")
    p.add_argument("positionals", nargs="*", metavar="DIR | key.sub=value",
                   help="the data folder (as main.py DIR; same as --data), and any config setting")
    add_dialect_flags(p)
    add_torchvision_flags(p)
    return p


def split_positionals(positionals):
    """(data folder or None, key.sub=value overrides): a positional without '=' is the folder."""
    overrides = [p for p in positionals if OVERRIDE.match(p)]
    folders = [p for p in positionals if not OVERRIDE.match(p)]
    if len(folders) > 1:
        raise UsageError(f"one data folder at most, got {' '.join(folders)} (settings are key.sub=value)")
    return (folders[0] if folders else None), overrides


def default_config(data, torchvision=False):
    """The recipe of data.path's source (the demo without one); torchvision's under its dialect."""
    from mobilenet.data.sources import source_of
    return CONFIGS / ("torchvision.yaml" if torchvision else f"{source_of(data or 'digits').recipe}.yaml")


def flag_settings(args, folder, processes):
    """{setting: (value, origin)} from the flags and the folder, and the notes; contradictions refused."""
    sources = [(flag, {key: getattr(args, flag.removeprefix("--").replace("-", "_"))}, None)
               for key, flag in FLAGS.items()]
    sources.append(("DIR (positional)", {"data.path": folder}, None))
    sources += dialect_settings(args, processes)
    chosen, notes = {}, []
    for origin, settings, note in sources:
        for key, value in settings.items():
            if value is None:
                continue
            value = coerce_setting(key, value, origin)
            if key in chosen and chosen[key][0] != value:
                hint = (f" (a setting is key.sub=value: '{value}' reads as the data folder)"
                        if origin == "DIR (positional)" else "")
                raise UsageError(f"{chosen[key][1]} {chosen[key][0]!r} and {origin} {value!r} contradict each "
                                 f"other ({key}); give one{hint}")
            chosen[key] = (value, origin)
        if note:
            notes.append(note)
    return chosen, notes


def check_overrides(chosen, overrides):
    """A key.sub=value that contradicts a flag is a UsageError (a value a flag only implies gives way)."""
    for text in overrides:
        key, value = parse_override(text)
        if key in chosen and not chosen[key][1].endswith("(implied)"):
            value = coerce_setting(key, value, f"override '{text}'")
            if value != chosen[key][0]:
                raise UsageError(f"{chosen[key][1]} and {text} contradict each other; give one")


def config_from_args(args, probe=True):
    """The resolved config; under --distributed this process's rank goes into its environment first."""
    folder, overrides = split_positionals(args.positionals)
    ranks = modelzoo_ranks(args, os.environ)
    if ranks:
        os.environ.update(ranks[0])
        if "OMP_NUM_THREADS" in ranks[0]:
            torch.set_num_threads(int(ranks[0]["OMP_NUM_THREADS"]))
    chosen, notes = flag_settings(args, folder, node_processes())
    notes = ([ranks[1]] if ranks else []) + notes
    check_overrides(chosen, overrides)
    data = chosen.get("data.path", (None,))[0]
    config_path = Path(args.config) if args.config else default_config(data, torchvision_dialect(args))
    settings = {key: value for key, (value, _) in chosen.items()}
    return resolve(build_config(config_path, overrides, settings), name=config_path.stem,
                   command_line=notes, probe=probe)


# The dialects: pytorch/examples' imagenet/main.py and ModelZoo's MobileNetV1 main.py.

# Their launcher flags, which mean nothing in one train.py process: refused, naming what to run instead.
PER_CARD = "start one process per card with bash train.sh --nproc N"
REFUSED = {
    "--multiprocessing-distributed": (0, PER_CARD),
    "--rank": (1, "give the node's rank: bash train.sh --node-rank R (torchrun numbers the processes)"),
    "--dist-url": (1, "the ranks meet at MASTER_ADDR:MASTER_PORT (127.0.0.1:29688 under --distributed, as "
                      "main.py sets them); set those, or start the job with bash train.sh --master-addr HOST "
                      "--master-port PORT"),
    "--dist-backend": (1, "drop it: the backend follows the device (hccl on npu, nccl on cuda, gloo on "
                          "cpu; see --device)"),
    "--addr": (1, "give it to the launcher: bash train.sh --addr HOST (= --master-addr HOST)"),
    "--device-list": (1, "give it to the launcher: bash train.sh --device-list 0,1,.. (a process per card)"),
    "--device_list": (1, "give it to the launcher: bash train.sh --device_list 0,1,.. (a process per card)"),
    "--start-epoch": (1, "resume instead: --resume FILE|auto (the epoch comes from the checkpoint)"),
}
# --distributed as ModelZoo's main.py: the ranks meet here unless the environment says otherwise
MODELZOO_MASTER = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29688"}
MODELZOO_LOSS_SCALE = 1024.0  # main.py's --loss-scale-value default, which --apex uses


def refusal(guidance):
    class Refuse(argparse.Action):
        def __call__(self, parser, namespace, values, option_string=None):
            raise UsageError(f"{option_string}: train.py does not take it; {guidance}")
    return Refuse


def add_dialect_flags(p):
    g = p.add_argument_group(
        "flags of pytorch/examples imagenet/main.py and Ascend ModelZoo's main.py",
        "Each sets one setting with the meaning it has there; the log and config.yaml "
        "(derived.command_line) say what each became. Per node means over this node's processes "
        "(torchrun's LOCAL_WORLD_SIZE, 1 without torchrun).")
    g.add_argument("-b", "--batch-size", "--batch_size", type=int, metavar="N",
                   help="the batch of this node's processes together, divided among them "
                        "(data.batch_size is per process); must divide evenly")
    g.add_argument("--lr", "--learning-rate", type=float, dest="learning_rate", metavar="LR",
                   help="the learning rate, used as given (optim.lr; optim.lr_scale_batch=0)")
    g.add_argument("--momentum", type=float, metavar="M", help="optim.momentum")
    g.add_argument("--wd", "--weight-decay", type=float, dest="weight_decay", metavar="W",
                   help="optim.weight_decay")
    g.add_argument("-j", "--workers", type=int, metavar="N",
                   help="loader workers of this node, divided among its processes rounding up "
                        "(data.workers is per process)")
    g.add_argument("-p", "--print-freq", type=int, metavar="N", help="train.log_every")
    g.add_argument("--seed", type=int, help="seed")
    g.add_argument("--dummy", action="store_true", default=None, help="synthetic data (--data synthetic)")
    g.add_argument("--no-accel", action="store_true", default=None, help="train on the cpu (--device cpu)")
    g.add_argument("-a", "--arch", metavar="ARCH",
                   help=f"model.name: {', '.join(MODELS)} or a classification model of torchvision's "
                        f"(mobilenet, ModelZoo's name, is mobilenet_v1)")
    g.add_argument("--pretrained", action="store_true", default=None,
                   help="refused: main.py downloads torchvision weights; here pass model.pretrained=FILE")
    g.add_argument("--apex", action="store_true", default=None,
                   help="mixed precision at --apex-opt-level (default O1): amp.level; apex where "
                        "importable, else torch's native amp (amp.backend=auto)")
    g.add_argument("--apex-opt-level", "--opt-level", choices=LEVELS, dest="opt_level",
                   help="amp.level, with --apex")
    g.add_argument("--loss-scale-value", type=float, metavar="S",
                   help="static loss scale, -1 for dynamic (amp.loss_scale), with --apex")
    g.add_argument("--max_steps", type=int, dest="max_steps_per_epoch", metavar="N",
                   help="ModelZoo's: every epoch ends after N+2 batches, as main.py's loop breaks "
                        "(train.max_steps_per_epoch=N+2); 0: no cap")
    g.add_argument("--max-steps", "--stop-step-num", type=int, dest="max_steps", metavar="N",
                   help="stop after N training steps in all (train.max_steps)")
    g.add_argument("--prof", action="store_true", default=None,
                   help="profile, then stop: train.profile (a trace of steps 3-12 in <output>/profile; "
                        "no output.prof) and train.max_steps=12")
    g.add_argument("--device_id", "--device-id", "--gpu", type=int, dest="device_id", metavar="N",
                   help="the card of this one process (device_id); with --distributed each rank takes "
                        "card RANK_ID, as main.py does")
    g.add_argument("--distributed", action="store_true", default=None,
                   help="one rank of a job whose processes you start yourself, ModelZoo's way: RANK_SIZE "
                        "and RANK_ID in the environment make it rank --dist-rank x RANK_SIZE + RANK_ID of "
                        "--world-size x RANK_SIZE; -b and -j divide by RANK_SIZE; MASTER_ADDR/MASTER_PORT "
                        "default to 127.0.0.1:29688")
    g.add_argument("--world-size", type=int, metavar="N", help="nodes of a --distributed job (default 1)")
    g.add_argument("--dist-rank", type=int, metavar="R", help="this node's index in a --distributed job "
                   "(default 0)")
    launch = p.add_argument_group("their launcher flags", "refused by train.py, each naming what to run "
                                  "instead; train.sh maps --addr and --device-list")
    for flag, (nargs, guidance) in REFUSED.items():
        launch.add_argument(flag, nargs=nargs, metavar="X", action=refusal(guidance), help=guidance)


def node_processes():
    """Processes of this run on this node: torchrun's LOCAL_WORLD_SIZE, 1 without torchrun."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", 1))


def dialect_settings(args, processes):
    """[(origin, {setting: value}, note)] for the dialect flags given; the note says what each became."""
    found = []
    check_step_caps(args)

    def add(origin, settings, note=None):
        found.append((origin, settings,
                      note or f"{origin} = " + ", ".join(f"{k}={v}" for k, v in settings.items())))
    add_batch_and_workers(args, add, processes)
    if args.learning_rate is not None:
        add(f"--lr {args.learning_rate:g}", {"optim.lr": args.learning_rate, "optim.lr_scale_batch": 0})
    for value, flag, key in ((args.momentum, "--momentum", "optim.momentum"),
                             (args.weight_decay, "--wd/--weight-decay", "optim.weight_decay"),
                             (args.print_freq, "-p/--print-freq", "train.log_every"),
                             (args.seed, "--seed", "seed"),
                             (args.max_steps, "--max-steps/--stop-step-num", "train.max_steps")):
        if value is not None:
            add(f"{flag} {value:g}", {key: value})
    if args.max_steps_per_epoch:  # main.py: `if args.max_steps and i > args.max_steps: break` after batch i
        add(f"--max_steps {args.max_steps_per_epoch}", {"train.max_steps_per_epoch": args.max_steps_per_epoch + 2},
            f"--max_steps {args.max_steps_per_epoch} = train.max_steps_per_epoch {args.max_steps_per_epoch + 2} "
            f"(ModelZoo's loop trains N+2 batches an epoch; every epoch still validates)")
    if args.prof:
        add("--prof", {"train.profile": True, "train.max_steps": PROFILED_STEPS + 2},
            f"--prof = train.profile, stopping after step {PROFILED_STEPS + 2}: a trace of steps 3-"
            f"{PROFILED_STEPS + 2} in <output>/profile (TensorBoard's format; main.py's output.prof is "
            f"not written)")
    add_device_id(args, add)
    if args.dummy:
        add("--dummy", {"data.path": "synthetic"})
    if args.no_accel:
        add("--no-accel", {"device": "cpu"})
    if args.arch is not None:
        name = model_name(args.arch)
        if name is None:
            raise UsageError(f"-a/--arch {args.arch}: this app trains {', '.join(MODELS)} and torchvision's "
                             f"classification models (mobilenet is mobilenet_v1, ModelZoo's); width and "
                             f"resolution are model.width_mult and model.resolution")
        add(f"-a/--arch {args.arch}", {"model.name": name})
    if args.pretrained:
        raise UsageError("--pretrained: main.py downloads torchvision's weights; here start from a "
                         "checkpoint file (ours or ModelZoo's): model.pretrained=FILE")
    add_amp(args, add)
    if torchvision_dialect(args):
        torchvision_settings(args, add)
    return found


def add_batch_and_workers(args, add, processes):
    """-b and -j: per node in main.py, divided among ``processes``; per process in torchvision's."""
    if torchvision_dialect(args):
        if args.batch_size is not None:
            add(f"-b/--batch-size {args.batch_size}", {"data.batch_size": args.batch_size,
                                                       "data.val_batch_size": args.batch_size},
                f"-b/--batch-size {args.batch_size} = data.batch_size and data.val_batch_size {args.batch_size} "
                f"per process (torchvision's)")
        if args.workers is not None:
            add(f"-j/--workers {args.workers}", {"data.workers": args.workers})
        return
    if args.batch_size is not None:
        if args.batch_size % processes:
            raise UsageError(f"-b/--batch-size {args.batch_size}: the batch of this node's {processes} "
                             f"processes must divide among them; pass a multiple of {processes}")
        per_process = args.batch_size // processes
        add(f"-b/--batch-size {args.batch_size}", {"data.batch_size": per_process},
            f"-b/--batch-size {args.batch_size} for the node = data.batch_size {per_process} per "
            f"process x {processes}")
    if args.workers is not None:
        per_process = math.ceil(args.workers / processes)
        add(f"-j/--workers {args.workers}", {"data.workers": per_process},
            f"-j/--workers {args.workers} for the node = data.workers {per_process} per process x "
            f"{processes}")


def check_step_caps(args):
    """--max-steps and ModelZoo's --max_steps: a UsageError for a count that means nothing."""
    if args.max_steps is not None and args.max_steps < 1:
        raise UsageError(f"--max-steps/--stop-step-num {args.max_steps}: give at least 1 step (without "
                         f"the flag the run has no step cap)")
    if args.max_steps_per_epoch is not None and args.max_steps_per_epoch < 0:
        raise UsageError(f"--max_steps {args.max_steps_per_epoch}: give 0 (no cap) or more; ModelZoo's "
                         f"--max_steps N trains N+2 batches an epoch")


def add_amp(args, add):
    """--apex [--apex-opt-level L] [--loss-scale-value S], as ModelZoo's main.py reads them."""
    if not args.apex:
        for value, flag in ((args.opt_level, "--apex-opt-level"), (args.loss_scale_value, "--loss-scale-value")):
            if value is not None:
                raise UsageError(f"{flag} applies with --apex only (main.py ignores it without); add "
                                 f"--apex, or use --amp {LEVELS[1]}|{LEVELS[2]}")
        return
    level = args.opt_level or "O1"
    add(f"--apex{' --apex-opt-level ' + args.opt_level if args.opt_level else ''}", {"amp.level": level})
    if args.loss_scale_value is None:
        add("--apex (implied)", {"amp.loss_scale": MODELZOO_LOSS_SCALE},
            f"--apex without --loss-scale-value = amp.loss_scale {MODELZOO_LOSS_SCALE:g} (main.py's default)")
    else:
        scale = "dynamic" if args.loss_scale_value == -1 else args.loss_scale_value
        add(f"--loss-scale-value {args.loss_scale_value:g}", {"amp.loss_scale": scale})


def add_device_id(args, add):
    """--device_id N: the card of a single process; with --distributed main.py takes RANK_ID instead."""
    if args.device_id is None:
        return
    if args.distributed:
        add(f"--device_id {args.device_id}", {}, f"--device_id {args.device_id}: ignored with --distributed "
            f"(each rank takes card RANK_ID, as main.py does)")
    else:
        add(f"--device_id {args.device_id}", {"device_id": args.device_id})


def modelzoo_ranks(args, env):
    """For --distributed (ModelZoo's way: RANK_SIZE processes, each with its RANK_ID): this process's
    torch.distributed environment and the note that says so; None without the flag."""
    if not args.distributed:
        for value, flag in ((args.world_size, "--world-size"), (args.dist_rank, "--dist-rank")):
            if value is not None:
                raise UsageError(f"{flag} applies with --distributed only (ModelZoo's own launch); to "
                                 f"start the processes here use bash train.sh --nproc N --nnodes M --node-rank R")
        return None
    if "LOCAL_RANK" in env:
        raise UsageError("--distributed: this process was started by torchrun (train.sh --nproc), which "
                         "numbers the ranks itself; drop --distributed")
    if "RANK_SIZE" not in env or "RANK_ID" not in env:
        raise UsageError("--distributed: set RANK_SIZE (the processes on this node) and RANK_ID (this "
                         "one's index, 0..RANK_SIZE-1) for each process you start, as ModelZoo's "
                         "train_performance_8p.sh does, or start them with bash train.sh --nproc N")
    try:
        rank_size, rank_id = int(env["RANK_SIZE"]), int(env["RANK_ID"])
    except ValueError:
        raise UsageError(f"--distributed: RANK_SIZE and RANK_ID must be whole numbers, got "
                         f"{env['RANK_SIZE']!r} and {env['RANK_ID']!r}") from None
    nodes, node = args.world_size or 1, args.dist_rank or 0
    if not (rank_size >= 1 and 0 <= rank_id < rank_size and nodes >= 1 and 0 <= node < nodes):
        raise UsageError(f"--distributed: RANK_ID {rank_id} must lie in 0..RANK_SIZE-1 (RANK_SIZE "
                         f"{rank_size}) and --dist-rank {node} in 0..--world-size-1 ({nodes})")
    ranks = {"RANK": node * rank_size + rank_id, "WORLD_SIZE": nodes * rank_size, "LOCAL_RANK": rank_id,
             "LOCAL_WORLD_SIZE": rank_size}
    ranks.update({key: env.get(key, value) for key, value in MODELZOO_MASTER.items()})
    if rank_size > 1:  # as torchrun does for several processes on a node, unless set
        ranks["OMP_NUM_THREADS"] = env.get("OMP_NUM_THREADS", 1)
    ranks = {key: str(value) for key, value in ranks.items()}
    note = (f"--distributed = rank {ranks['RANK']} of {ranks['WORLD_SIZE']} (--dist-rank {node} x RANK_SIZE "
            f"{rank_size} + RANK_ID {rank_id}), meeting at {ranks['MASTER_ADDR']}:{ranks['MASTER_PORT']}")
    return ranks, note


# torchvision's references/classification/train.py: its own flags (those it shares with main.py are
# above; -b and -j per process here), each the setting it sets, as given.
TORCHVISION = {"--data-path": "data.path", "--output-dir": "output", "--lr-step-size": "schedule.step_epochs",
               "--lr-gamma": "schedule.gamma", "--lr-warmup-epochs": "schedule.warmup_epochs",
               "--lr-warmup-method": "schedule.warmup_method", "--lr-warmup-decay": "schedule.warmup_start_factor",
               "--lr-min": "schedule.min_lr", "--label-smoothing": "train.label_smoothing",
               "--mixup-alpha": "augment.mixup_alpha", "--cutmix-alpha": "augment.cutmix_alpha",
               "--auto-augment": "augment.policy", "--ra-magnitude": "augment.ra_magnitude",
               "--augmix-severity": "augment.augmix_severity", "--random-erase": "augment.random_erase",
               "--interpolation": "data.interpolation", "--train-crop-size": "data.train_resolution",
               "--val-crop-size": "model.resolution", "--norm-weight-decay": "optim.norm_weight_decay",
               "--bias-weight-decay": "optim.bias_weight_decay", "--clip-grad-norm": "train.clip_grad_norm",
               "--sync-bn": "model.sync_bn", "--use-deterministic-algorithms": "train.deterministic"}
# Its flags that set more than one setting, or none: what each does here (torchvision_settings).
TORCHVISION_OWN = {
    "--model": "model.name (a torchvision classifier, or mobilenet_v1)",
    "--opt": "sgd | sgd_nesterov | rmsprop (torch's, eps 0.0316, alpha 0.9, as there) | adamw: optim.name",
    "--lr-scheduler": "steplr | cosineannealinglr | exponentiallr (steplr every epoch): schedule.name",
    "--val-resize-size": "the validation resize before its crop: data.val_resize_ratio = crop / this",
    "--ra-sampler": "repeated augmentation, --ra-reps times (augment.ra_reps)",
    "--ra-reps": "with --ra-sampler (default 3)",
    "--model-ema": "train.ema_decay and train.ema_steps, as there: decay 1 - (1 - --model-ema-decay) x "
                   "processes x batch x --model-ema-steps / epochs",
    "--model-ema-steps": "with --model-ema (default 32)", "--model-ema-decay": "with --model-ema (default 0.99998)",
    "--cache-dataset": "said and ignored: the folder is listed at each start (seconds; scripts/prepare_data.py "
                       "makes a faster set)",
    "--backend": "said and ignored: images are tensors here (its 'tensor' backend)",
    "--use-v2": "said and ignored: the policies are transforms.v2's here always",
}
TORCHVISION_REFUSED = {
    "--weights": "it downloads torchvision's weights; start from a file here: model.pretrained=FILE",
    "--transformer-embedding-decay": "this app splits the weight decay for norm layers and biases only "
                                     "(--norm-weight-decay, --bias-weight-decay)",
}
SWITCHES = {"--sync-bn", "--use-deterministic-algorithms", "--ra-sampler", "--model-ema", "--cache-dataset", "--use-v2"}
NUMBERS = {"--val-resize-size": int, "--ra-reps": int, "--model-ema-steps": int, "--model-ema-decay": float}


def add_torchvision_flags(p):
    g = p.add_argument_group("flags of torchvision's references/classification/train.py",
                             "Each as it is there; -b/--batch-size and -j/--workers are per process under them. "
                             "Without --config its defaults are configs/torchvision.yaml.")
    for flag, meaning in {**TORCHVISION, **TORCHVISION_OWN}.items():
        if flag in SWITCHES:
            g.add_argument(flag, action="store_true", default=None, dest=dest(flag), help=meaning)
        else:
            g.add_argument(flag, dest=dest(flag), metavar="X", help=meaning, type=NUMBERS.get(flag, str))
    for flag, guidance in TORCHVISION_REFUSED.items():
        g.add_argument(flag, nargs=1, metavar="X", action=refusal(guidance), help=f"refused: {guidance}")


def dest(flag):
    return "tv_" + flag.removeprefix("--").replace("-", "_")


def torchvision_dialect(args):
    """Whether a flag of torchvision's train.py that the other dialects do not have is given."""
    return any(getattr(args, dest(flag), None) is not None for flag in (*TORCHVISION, *TORCHVISION_OWN))


def torchvision_settings(args, add):
    """The settings of torchvision's train.py flags given (``add(origin, settings, note)``)."""
    def given(flag):
        return getattr(args, dest(flag))
    for flag, setting in TORCHVISION.items():
        if given(flag) in (True, None):
            if given(flag):
                add(flag, {setting: True})
            continue
        add(f"{flag} {given(flag)}", {setting: number_or_text(given(flag))})
    if given("--model") is not None:
        if model_name(given("--model")) is None:
            raise UsageError(f"--model {given('--model')}: this app trains {', '.join(MODELS)} and torchvision's "
                             f"classification models by name")
        add(f"--model {given('--model')}", {"model.name": model_name(given("--model"))})
    if given("--opt") is not None:
        add(f"--opt {given('--opt')}", opt_settings(given("--opt")))
    if given("--lr-scheduler") is not None:
        add(f"--lr-scheduler {given('--lr-scheduler')}", scheduler_settings(given("--lr-scheduler"), args))
    if given("--val-resize-size") is not None:
        crop, size = number_or_text(given("--val-crop-size") or 224), given("--val-resize-size")
        if not isinstance(crop, int) or not crop >= 1 or size < 1:
            raise UsageError(f"--val-resize-size {size} --val-crop-size {crop}: give two sizes of 1 pixel or more")
        add(f"--val-resize-size {size}", {"data.val_resize_ratio": crop / size},
            f"--val-resize-size {size} = data.val_resize_ratio {crop}/{size} (a {crop} crop of the image resized "
            f"to {size})")
    if given("--ra-sampler"):
        add("--ra-sampler", {"augment.ra_reps": 3 if given("--ra-reps") is None else given("--ra-reps")})
    if given("--model-ema"):
        add("--model-ema", ema_settings(args))
    for flag, needs in (("--ra-reps", "--ra-sampler"), ("--model-ema-steps", "--model-ema"),
                        ("--model-ema-decay", "--model-ema")):
        if given(flag) is not None and not given(needs):
            add(flag, {}, f"{flag} {given(flag)}: ignored without {needs}, as there")
    for flag in ("--cache-dataset", "--backend", "--use-v2"):
        if given(flag) is not None:
            add(flag, {}, f"{flag}: {TORCHVISION_OWN[flag]}")


def number_or_text(text):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def opt_settings(name):
    """--opt NAME as torchvision's train.py builds it."""
    settings = {"sgd": {"optim.name": "sgd", "optim.nesterov": False},
                "sgd_nesterov": {"optim.name": "sgd", "optim.nesterov": True},
                "rmsprop": {"optim.name": "rmsprop", "optim.eps": 0.0316, "optim.alpha": 0.9},
                "adamw": {"optim.name": "adamw"}}
    if name.lower() not in settings:
        raise UsageError(f"--opt {name}: torchvision's train.py takes sgd, sgd_nesterov, rmsprop or adamw")
    return settings[name.lower()]


def scheduler_settings(name, args):
    """--lr-scheduler NAME; exponentiallr is the step schedule at every epoch (gamma --lr-gamma)."""
    settings = {"steplr": {"schedule.name": "step"}, "cosineannealinglr": {"schedule.name": "cosine"},
                "exponentiallr": {"schedule.name": "step", "schedule.step_epochs": 1}}
    if name.lower() not in settings:
        raise UsageError(f"--lr-scheduler {name}: torchvision's train.py takes steplr, cosineannealinglr or "
                         f"exponentiallr")
    if name.lower() == "exponentiallr" and getattr(args, dest("--lr-step-size")) is not None:
        raise UsageError("--lr-step-size applies to steplr; exponentiallr decays by --lr-gamma every epoch")
    return settings[name.lower()]


def ema_settings(args):
    """--model-ema: train.py's decay, adjusted to the processes, batch, steps and epochs, and its steps."""
    steps, decay = (getattr(args, dest(flag)) for flag in ("--model-ema-steps", "--model-ema-decay"))
    steps, decay = 32 if steps is None else steps, 0.99998 if decay is None else decay
    if steps < 1 or not 0 <= decay < 1:
        raise UsageError(f"--model-ema-steps {steps} --model-ema-decay {decay:g}: give at least 1 step and a "
                         f"decay in [0, 1)")
    processes, batch = int(os.environ.get("WORLD_SIZE", 1)), args.batch_size or 32
    alpha = min(1.0, (1.0 - decay) * processes * batch * steps / (args.epochs or 90))
    return {"train.ema_decay": 1.0 - alpha, "train.ema_steps": steps}

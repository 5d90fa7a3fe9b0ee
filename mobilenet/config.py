"""Configuration: ``build_config`` merges the defaults, a YAML file and ``key.sub=value`` overrides,
checking every value; ``resolve`` computes once what depends on the machine or on other settings
into the ``derived`` section of a read-only config. Every user mistake raises UsageError."""
import copy
import math
from pathlib import Path

import yaml

from mobilenet.amp import LEVELS
from mobilenet.data.transforms import INTERPOLATIONS, POLICIES, per_sample, policy_settings
from mobilenet.device import without_cuda_graphs
from mobilenet.device import DEVICES
from mobilenet.errors import UsageError
from mobilenet.model import MODELS, OPTIONAL as MODEL_OPTIONAL, last_side, model_row, relative_cost
from mobilenet.optim import ALGORITHMS, SCHEDULES, WARMUP, algorithm_settings, check_settings, schedule_settings

DEFAULTS = {
    "seed": 0,
    "device": "auto",              # auto | npu | cuda | cpu
    "output": None,                # run directory; default runs/<config>-<optimizer>
    "device_id": None,             # the card of a single process; None: the local rank's
    "model": {
        "name": "mobilenet_v1",    # a row of model.MODELS, or a torchvision classifier by name
        "width_mult": 1.0,         # channel width multiplier (models without one: noted, ignored)
        "num_classes": 1000,
        "resolution": 224,
        "channels_last": "auto",   # auto: on for cpu and cuda (measured faster), off for npu
        "sync_bn": False,          # SyncBatchNorm across processes (cuda/npu, more than one process)
        "pretrained": None,        # checkpoint to initialise the weights from (ours or ModelZoo)
    },
    "data": {
        "path": None,              # a folder with train/ and val/, a prepared set, synthetic, digits
        "batch_size": 256,         # per process, and per forward (a micro-step under accumulation)
        "global_batch": "auto",    # images an optimizer step, all processes (auto: as the batch gives)
        "val_batch_size": 256,
        "workers": "auto",         # loader processes per process; auto: from the usable cores
        "hflip": True,
        "min_scale": 0.08,         # RandomResizedCrop lower area bound
        "train_resolution": "auto",  # the training crop's side; auto: model.resolution
        "interpolation": "bilinear",  # bilinear | bicubic | nearest: the crops' resize and the policy's
        "val_resize_ratio": 0.875, # val: resize to resolution/ratio, centre-crop resolution
        "synthetic_size": 2048,    # images per epoch for data.path=synthetic
        "strict": False,           # an unreadable image stops the run instead of being skipped
        "cache_mb": 0,             # >0: this many MiB of images decoded at start and kept in memory
        "decode": "auto",          # workers | device (nvJPEG on cuda); auto: device where a start-up
                                   # probe finds it gives the workers' pixels, faster
    },
    "optim": {
        "name": "sgd",             # sgd | adam | adamw | rmsprop (optim.ALGORITHMS)
        "impl": "standard",        # standard | fused
        "lr": 0.1,                 # for the global batch; see lr_scale_batch
        "lr_scale_batch": 0,       # >0: lr is per this many images and scales with the global batch
        "weight_decay": 1.0e-4,
        "norm_weight_decay": "auto",  # of normalisation layers' parameters; auto: weight_decay
        "bias_weight_decay": "auto",  # of every bias; auto: as the others of its layer
        "foreach": "auto",         # standard only: auto = torch's own choice for the device
        # and each algorithm's own settings, from its row of optim.ALGORITHMS
        **{name: setting.default for name, setting in algorithm_settings().items()},
    },
    "schedule": {
        "name": "step",            # step | cosine (optim.SCHEDULES)
        # and each schedule's own settings, from its row of optim.SCHEDULES, and optim.WARMUP's
        **{name: setting.default for name, setting in schedule_settings().items()},
    },
    "augment": {
        "policy": "none",          # after the crop and flip: a row of data.transforms.POLICIES
        # and each policy's own settings, from its row
        **{name: setting.default for name, setting in policy_settings().items()},
        "random_erase": 0.0,       # the chance that RandomErasing blanks a box of an image
        "mixup_alpha": 0.0,        # >0: MixUp of each batch, its Beta(alpha, alpha) (soft targets)
        "cutmix_alpha": 0.0,       # >0: CutMix; with both, one of the two per batch
        "ra_reps": 1,              # >1: repeated augmentation, each image this many times in a row
    },
    "amp": {
        "level": "O0",             # O0 (fp32) | O1 (autocast) | O2 (half model, fp32 masters)
        "dtype": "float16",        # float16 | bfloat16
        "loss_scale": "dynamic",   # dynamic | a number
        "backend": "auto",         # auto (Ascend apex on npu when importable) | apex | native
    },
    "train": {
        "epochs": 90,
        "grad_accum_steps": "auto",  # forwards per process an optimizer step; auto: what
                                   # data.global_batch or a resume's checkpoint asks, else 1
        "label_smoothing": 0.0,
        "clip_grad_norm": 0.0,     # >0: the grads' total norm clipped to this before each step
        "ema_decay": 0.0,          # >0: an exponential moving average of the weights, also evaluated
        "ema_steps": 1,            # the EMA updates after every N-th step of an epoch (its first too)
        "log_every": 50,           # steps between progress lines
        "keep_checkpoints": 0,     # also keep the last K epoch checkpoints
        "max_steps_per_epoch": 0,  # >0: cut every epoch short (ModelZoo's --max_steps N is N+2 here)
        "max_steps": 0,            # >0: stop the run after this many steps in all
        "checkpoint_every_minutes": 0.0,  # >0: also save last.pt within an epoch this often
        "measure_breakdown": False,  # time data waits and optimizer steps (syncs the device)
        "profile": False,          # torch.profiler trace of this process's steps 3-12 in <output>/profile
        "compile": "auto",         # torch.compile the model and the optimizer step; auto: on for cuda
                                   # when compiling is a small share of the run
        "resume_next_epoch": False,  # a mid-epoch checkpoint resumes at the next epoch's start
        "stall_timeout": 900.0,    # >0: a process without progress this long ends (mobilenet.watchdog)
        "deterministic": False,    # torch.use_deterministic_algorithms
        "freeze_bn": False,        # BatchNorm uses its running statistics while training
    },
}

CHOICES = {
    "device": set(DEVICES),
    "optim.name": ALGORITHMS.keys(),  # live: an entry added to the table is a choice
    "optim.impl": {"standard", "fused"},
    "schedule.name": SCHEDULES.keys(),
    "amp.level": set(LEVELS),
    "amp.dtype": {"float16", "bfloat16"},
    "amp.backend": {"auto", "apex", "native"},
    "data.decode": {"auto", "workers", "device"},
    "data.interpolation": set(INTERPOLATIONS),
    "augment.policy": POLICIES.keys(),
    "schedule.warmup_method": {"linear", "constant"},
}
FLAGS = {"optim.impl": "--optimizer", "data.path": "--data", "device": "--device", "amp.level": "--amp",
         "train.epochs": "--epochs", "output": "--output", "train.profile": "--profile",
         "train.compile": "--compile", "train.grad_accum_steps": "--grad-accum-steps"}
AUTO_OR_BOOL = {"model.channels_last", "optim.foreach", "train.compile"}
AUTO_OR_INT = {"data.workers", "data.global_batch", "train.grad_accum_steps", "data.train_resolution"}
AUTO_OR_NUMBER = {"optim.norm_weight_decay", "optim.bias_weight_decay"}
OPTIONAL_INT = {"device_id"}
# The interval every number must lie in (each element of a list), as the message shows it.
RANGES = {
    "seed": "[0, 4294967295]",  # torch and numpy seed generators take 32 bits at least
    "model.width_mult": "(0, inf)", "model.num_classes": "[1, inf)", "model.resolution": "[1, inf)",
    "data.batch_size": "[1, inf)", "data.global_batch": "[1, inf)", "train.grad_accum_steps": "[1, inf)",
    "data.val_batch_size": "[1, inf)", "data.workers": "[0, inf)",
    "data.min_scale": "(0, 1]", "data.val_resize_ratio": "[0.1, 1]", "data.synthetic_size": "[1, inf)",
    "data.cache_mb": "[0, inf)", "data.train_resolution": "[1, inf)",
    "optim.norm_weight_decay": "[0, inf)", "optim.bias_weight_decay": "[0, inf)",
    **{f"augment.{name}": setting.interval for name, setting in policy_settings().items()},
    "augment.random_erase": "[0, 1]", "augment.mixup_alpha": "[0, inf)", "augment.cutmix_alpha": "[0, inf)",
    "augment.ra_reps": "[1, inf)", "train.clip_grad_norm": "[0, inf)", "train.ema_steps": "[1, inf)",
    "optim.lr": "(0, inf)", "optim.lr_scale_batch": "[0, inf)", "optim.weight_decay": "[0, inf)",
    **{f"optim.{name}": setting.interval for name, setting in algorithm_settings().items() if setting.interval},
    **{f"schedule.{name}": setting.interval for name, setting in schedule_settings().items() if setting.interval},
    "train.epochs": "[1, inf)", "train.label_smoothing": "[0, 1)", "train.ema_decay": "[0, 1)",
    "train.log_every": "[1, inf)", "train.keep_checkpoints": "[0, inf)",
    "train.max_steps_per_epoch": "[0, inf)", "train.max_steps": "[0, inf)",
    "train.checkpoint_every_minutes": "[0, inf)",
    "train.stall_timeout": "[0, inf)",
}


def describe_range(interval):
    """'positive', 'at least 1' or 'in [0, 1)'."""
    low, high = interval[1:-1].split(", ")
    if high == "inf":
        return "positive" if interval[0] == "(" and low == "0" else f"at least {low}"
    if interval[0] == "[" and interval[-1] == "]":
        return f"at least {low} and at most {high}"
    return f"in {interval}"


def in_range(value, interval):
    """Whether ``value`` lies in ``interval``, written as '[0, 1)' (inf for no bound)."""
    low, high = (float(bound) for bound in interval[1:-1].split(","))
    above = value > low or (interval[0] == "[" and value == low)
    below = value < high or (interval[-1] == "]" and value == high)
    return above and below


def load_yaml(path):
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except OSError as e:
        raise UsageError(f"--config {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise UsageError(f"--config {path}: invalid YAML{where} ({problem})") from None
    if not isinstance(data, dict):
        raise UsageError(f"--config {path}: expected a mapping of settings")
    return data


def parse_override(text):
    """``a.b=value`` -> (["a", "b"], parsed YAML value)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise UsageError(f"override '{text}': expected key.sub=value")
    try:
        return key, yaml.safe_load(value) if value else None
    except yaml.YAMLError:
        raise UsageError(f"override '{text}': cannot parse the value") from None


def parent_of(cfg, dotted, origin):
    """The dict that holds setting ``dotted`` in ``cfg``; an unknown setting is a UsageError."""
    node, parts = cfg, dotted.split(".")
    for part in parts[:-1]:
        if not isinstance(node.get(part), dict):
            raise UsageError(f"{origin}: unknown setting '{dotted}'")
        node = node[part]
    if parts[-1] not in node or isinstance(node[parts[-1]], dict):
        raise UsageError(f"{origin}: unknown setting '{dotted}'")
    return node


def set_key(cfg, dotted, value, origin):
    parent_of(cfg, dotted, origin)[dotted.rsplit(".", 1)[-1]] = coerce_setting(dotted, value, origin)


def coerce_setting(dotted, value, origin):
    """``value`` checked and converted for setting ``dotted`` (its type, choices and range)."""
    default = parent_of(DEFAULTS, dotted, origin)[dotted.rsplit(".", 1)[-1]]
    return coerce(dotted, default, value, origin)


def coerce(dotted, default, value, origin):
    """Checks ``value`` against the default's type; ints are accepted where floats are."""
    def bad(expected):
        return UsageError(f"{origin}: '{dotted}' must be {expected}, got {value!r}")
    if value is None and default is not None:  # `key=`, `key=null`, `key: ~`
        raise UsageError(f"{origin}: '{dotted}' needs a value (default {default!r}); got none")
    if dotted in OPTIONAL_INT:
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise bad("a card number (0 or more), or null")
        return value
    if default is None or value is None:
        if value is not None and not isinstance(value, (str, int, float)):
            raise bad("a string")
        return value if value is None or isinstance(value, str) else str(value)
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise bad("true or false")
    elif isinstance(default, float):
        value = to_number(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad("a number")
        value = float(value)
    elif isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad("an integer")
    elif isinstance(default, list):
        value = [to_number(v) for v in value] if isinstance(value, list) else value
        if (not isinstance(value, list) or len(value) != len(default)
                or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in value)):
            raise bad(f"a list of {len(default)} numbers")
    elif dotted in AUTO_OR_BOOL:
        if value not in ("auto", True, False):
            raise bad("auto, true or false")
    elif dotted in AUTO_OR_INT:
        if value != "auto" and (isinstance(value, bool) or not isinstance(value, int)):
            raise bad("auto or an integer")
    elif dotted in AUTO_OR_NUMBER:
        value = to_number(value) if value != "auto" else value
        if value != "auto" and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise bad("auto or a number")
    elif dotted == "amp.loss_scale":
        value = to_number(value) if value != "dynamic" else value
        if value != "dynamic" and (isinstance(value, bool) or not isinstance(value, (int, float))
                                   or not 0 < value < math.inf):  # nan and inf: every step skipped
            raise bad("'dynamic' or a positive number")
    elif not isinstance(value, str):
        raise bad("a string")
    if dotted in CHOICES and value not in CHOICES[dotted]:
        raise bad("one of " + "|".join(sorted(CHOICES[dotted])))
    if dotted == "model.name" and model_row(value) is None:
        raise bad(f"one of {'|'.join(MODELS)} (model.MODELS) or a classification model of torchvision's "
                  f"(torchvision.models.list_models(module=torchvision.models))")
    if any(isinstance(v, float) and not math.isfinite(v) for v in (value if isinstance(value, list) else [value])):
        raise bad("a finite number")
    interval = RANGES.get(dotted) if value != "auto" else None
    if interval and not all(in_range(v, interval) for v in (value if isinstance(value, list) else [value])):
        raise bad(describe_range(interval))
    return value


def to_number(value):
    """YAML 1.1 reads 1e-4 (no dot) as a string; take it as the number it is meant to be."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    return value


def flatten(data, prefix=""):
    for key, value in data.items():
        if isinstance(value, dict):
            yield from flatten(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def build_config(config_path=None, overrides=(), settings=None):
    """Defaults <- YAML file <- ``settings`` (from the flags) <- ``key.sub=value`` overrides."""
    cfg = copy.deepcopy(DEFAULTS)
    if config_path:
        data = load_yaml(config_path)
        data.pop("derived", None)  # a run's config.yaml: recomputed by resolve() for this machine
        for key, value in flatten(data):
            set_key(cfg, key, value, f"--config {config_path}")
    for key, value in (settings or {}).items():
        set_key(cfg, key, value, FLAGS.get(key, key))
    for text in overrides:
        key, value = parse_override(text)
        set_key(cfg, key, value, f"override '{text}'")
    return cfg


# Settings that may differ between a job's processes: where things are and how each is fed.
PER_PROCESS = {"device_id", "output", "data.path", "data.workers", "data.cache_mb", "derived.workers",
               "derived.decode", "derived.decode_why", "derived.command_line"}


def differing_settings(ours, theirs):
    """[(setting, theirs, ours)] where two resolved configs differ outside PER_PROCESS."""
    ours, theirs = (dict(flatten(thaw(cfg))) for cfg in (ours, theirs))
    keys = sorted((ours.keys() | theirs.keys()) - PER_PROCESS, key=lambda key: (key.startswith("derived."), key))
    return [(key, theirs.get(key), ours.get(key)) for key in keys if ours.get(key) != theirs.get(key)]


class Frozen(dict):
    """A dict that refuses changes: the resolved config (nested Frozen dicts and tuples)."""

    def _read_only(self, *args, **kwargs):
        raise TypeError("the resolved config is read-only: change settings before resolve()")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = __ior__ = _read_only

    def __reduce__(self):  # copy and pickle rebuild it whole instead of item by item
        return type(self), (dict(self),)


def freeze(value):
    if isinstance(value, dict):
        return Frozen({k: freeze(v) for k, v in value.items()})
    return tuple(freeze(v) for v in value) if isinstance(value, list) else value


def thaw(value):
    """Plain dicts and lists again (for YAML, JSON and checkpoints)."""
    if isinstance(value, dict):
        return {k: thaw(v) for k, v in value.items()}
    return [thaw(v) for v in value] if isinstance(value, (list, tuple)) else value


def resolve(cfg, *, name="run", world=None, command_line=(), probe=True):
    """The run's read-only config: ``cfg`` plus ``derived``, computed here once. ``output`` defaults
    to runs/<name>-<optim.impl>; ``world`` to torchrun's; ``probe``: whether data.decode auto may
    measure the card (not in the launcher's check)."""
    from mobilenet.amp import choose_backend
    from mobilenet.data.sources import auto_workers, choose_decode, source_name
    from mobilenet.device import choose_compile, choose_device
    from mobilenet.distributed import world_from_env
    from mobilenet.optim import choose_implementation, describe_optimizer

    world = world or world_from_env()
    device = choose_device(cfg["device"])
    data, model, optim, amp = cfg["data"], cfg["model"], cfg["optim"], cfg["amp"]
    accumulation, global_batch, lr = batches(cfg, world.size)
    channels_last = model["channels_last"]
    amp_backend = choose_backend(amp["level"], amp["backend"], device)
    derived = {
        "device": device, "world_size": world.size, "grad_accum_steps": accumulation, "global_batch": global_batch,
        "lr": lr,
        # torch_npu keeps its own internal layouts; channels-last measured faster on cpu and cuda
        "channels_last": device != "npu" if channels_last == "auto" else channels_last,
        "optimizer_implementation": choose_implementation(name=optim["name"], impl=optim["impl"], device=device,
                                                          foreach=optim["foreach"], amp_backend=amp_backend),
        "amp_backend": amp_backend,
        "command_line": list(command_line) + device_id_notes(cfg["device_id"], device, world.size),
        "workers": auto_workers(data, world.local_size) if data["workers"] == "auto" else data["workers"],
    }
    # torch.compile's backend and mode for the device, or None: eager; and why
    derived["compile"], derived["compile_why"] = choose_compile(
        cfg["train"]["compile"], device, steps=steps_counted_up_to(cfg, global_batch), batch=data["batch_size"],
        cost=lambda: relative_cost(model), eager_only=eager_only(cfg, derived), accumulation=accumulation)
    derived["optimizer_class"] = describe_optimizer(optim["name"], derived["optimizer_implementation"], optim["impl"])
    derived["decode"], derived["decode_why"] = choose_decode(data["decode"], device, workers=derived["workers"],
                                                             card=cfg["device_id"] or world.local_rank, probe=probe,
                                                             per_sample=per_sample(cfg))
    derived["source"] = source_name(data["path"]) if data["path"] is not None else None  # a key of SOURCES
    derived["not_taken"] = settings_not_taken(cfg, derived["source"] or "folder")
    check_combinations(cfg, derived)
    resolved = copy.deepcopy(cfg)
    resolved["output"] = cfg["output"] or f"runs/{name}-{optim['impl']}"
    resolved["derived"] = derived
    return freeze(resolved)


def settings_not_taken(cfg, source_name):
    """A line for each setting given that the chosen row of one of the five tables does not take:
    ignored, and said. A row names its settings within its section, or whole ('augment.policy')."""
    from mobilenet.data.sources import DATA_OPTIONAL, SOURCES
    source = SOURCES[source_name]
    policy = cfg["augment"]["policy"]
    rows = [("optim", cfg["optim"]["name"], ALGORITHMS[cfg["optim"]["name"]].hyperparameters, algorithm_settings()),
            ("model", cfg["model"]["name"], model_row(cfg["model"]["name"]).takes, MODEL_OPTIONAL),
            ("data", source_name, source.takes, DATA_OPTIONAL),
            ("schedule", cfg["schedule"]["name"], {**SCHEDULES[cfg["schedule"]["name"]].settings, **WARMUP},
             schedule_settings()),
            ("augment", f"augment.policy={policy}", POLICIES[policy].settings, policy_settings())]
    lines = []
    for section, row, takes, optional in rows:
        def dotted(key):
            return key if "." in key else f"{section}.{key}"
        named = ", ".join(dotted(key) for key in (sorted(takes) or optional))
        for key in optional:
            value = flat(cfg, dotted(key))
            if key not in takes and value != flat(DEFAULTS, dotted(key)):
                lines.append(f"{dotted(key)}={value}: {row} does not take it (it takes "
                             f"{named if takes else 'none of ' + named}); ignored")
    return lines


def flat(cfg, dotted):
    """The setting ``dotted`` ('data.hflip') of ``cfg``."""
    return parent_of(cfg, dotted, dotted)[dotted.rsplit(".", 1)[-1]]


def batches(cfg, processes, global_batch=None):
    """(accumulation, global batch, lr) for ``processes``: processes x data.batch_size x the
    accumulation, from whichever setting is given (or ``global_batch``, a checkpoint's, where both
    are auto); the LR scales under optim.lr_scale_batch."""
    data, train, optim = cfg["data"], cfg["train"], cfg["optim"]
    per_step = processes * data["batch_size"]
    given = data["global_batch"] if data["global_batch"] != "auto" else global_batch
    if train["grad_accum_steps"] != "auto":
        accumulation = train["grad_accum_steps"]
        if given is not None and given != per_step * accumulation and data["global_batch"] != "auto":
            raise UsageError(f"data.global_batch={given} and train.grad_accum_steps={accumulation} contradict each "
                             f"other: {processes} process(es) x data.batch_size {data['batch_size']} x {accumulation} "
                             f"is {per_step * accumulation}; give one")
    elif given is not None:
        if given % per_step:
            raise UsageError(f"data.global_batch={given}: {processes} process(es) x data.batch_size "
                             f"{data['batch_size']} = {per_step} images a forward cannot fill it exactly; give a "
                             f"data.batch_size that divides {given // processes if given % processes == 0 else given} "
                             f"per process, or another number of processes")
        accumulation = given // per_step
    else:
        accumulation = 1
    global_batch = per_step * accumulation
    lr = optim["lr"] * global_batch / optim["lr_scale_batch"] if optim["lr_scale_batch"] else optim["lr"]
    return accumulation, global_batch, lr


def with_global_batch(cfg, global_batch):
    """A new read-only ``cfg`` at a checkpoint's global batch, its accumulation and LR to match."""
    derived = dict(cfg["derived"])
    derived["grad_accum_steps"], derived["global_batch"], derived["lr"] = batches(cfg, derived["world_size"],
                                                                                  global_batch)
    derived["compile"], derived["compile_why"] = without_cuda_graphs(derived["compile"], derived["compile_why"],
                                                                     derived["grad_accum_steps"])
    return freeze({**thaw(cfg), "derived": thaw(derived)})


def device_id_notes(device_id, device, world_size):
    """[] or the note that device_id is ignored here; a UsageError where it cannot hold."""
    from mobilenet.device import card_count
    if device_id is None:
        return []
    if world_size > 1:
        raise UsageError(f"device_id {device_id}: it chooses the card of a single process; in a job of "
                         f"{world_size} each process takes its local rank's card (bash train.sh "
                         f"--device-list chooses the cards)")
    if device == "cpu":
        return [f"device_id {device_id}: no accelerator here (device cpu); ignored"]
    if device_id >= card_count(device):
        raise UsageError(f"device_id {device_id}: this machine shows {card_count(device)} {device} card(s), "
                         f"numbered from 0")
    return []


def steps_counted_up_to(cfg, global_batch):
    """A function: the run's steps, its images counted only up to ``limit`` steps' worth."""
    from mobilenet.data.sources import train_images
    data, train = cfg["data"], cfg["train"]

    def steps(limit):
        per_epoch = train_images(data, limit * global_batch) // global_batch
        if train["max_steps_per_epoch"]:
            per_epoch = min(per_epoch, train["max_steps_per_epoch"])
        every = train["epochs"] * per_epoch
        return min(every, train["max_steps"]) if train["max_steps"] else every
    return steps


def eager_only(cfg, derived):
    """What needs the eager step, or None (train.compile auto stays off; true is refused)."""
    if derived["amp_backend"] == "apex":
        return "apex amp patches the model and optimizer as it runs, which torch.compile cannot trace"
    if cfg["train"]["measure_breakdown"]:
        return "train.measure_breakdown times and counts the step's phases eagerly"
    return None


def check_combinations(cfg, derived):
    """Settings that are valid alone but not together."""
    side = last_side(cfg["model"]["name"], cfg["model"]["resolution"])
    if side is not None and cfg["data"]["batch_size"] * side * side == 1 and not cfg["train"]["freeze_bn"]:
        raise UsageError(f"data.batch_size=1 at model.resolution={cfg['model']['resolution']}: the last "
                         f"BatchNorm would normalise one value per channel (a {side}x{side} map); use a "
                         f"batch of 2 or more, a resolution above 32, or train.freeze_bn=true")
    if cfg["model"]["sync_bn"] and derived["world_size"] > 1 and derived["device"] == "cpu":
        raise UsageError("model.sync_bn=true needs cuda or npu (torch has no SyncBatchNorm on cpu)")
    if cfg["train"]["ema_decay"] > 0 and cfg["amp"]["level"] == "O2":
        raise UsageError("train.ema_decay: an average of half-precision weights loses the small "
                         "updates; use amp O0 or O1 with EMA")
    if 0 < cfg["train"]["stall_timeout"] < 1:
        raise UsageError(f"train.stall_timeout={cfg['train']['stall_timeout']:g}: give 0 (no watchdog) or at "
                         f"least 1 second; the run would end between two steps")
    check_settings(cfg["optim"])
    if cfg["augment"]["policy"] != "none" and cfg["data"]["interpolation"] == "bicubic":
        raise UsageError(f"data.interpolation=bicubic with augment.policy={cfg['augment']['policy']}: "
                         f"transforms.v2's policies on tensors take nearest or bilinear; give one of them")
    if cfg["schedule"]["min_lr"] > derived["lr"]:
        raise UsageError(f"schedule.min_lr={cfg['schedule']['min_lr']:g} is above the learning rate "
                         f"{derived['lr']:g}; it is the floor the cosine schedule decays to")
    if derived["amp_backend"] == "apex" and cfg["amp"]["dtype"] != "float16":
        raise UsageError(f"amp.dtype={cfg['amp']['dtype']} under apex: Ascend's apex casts to float16 only; "
                         f"use amp.dtype=float16, or amp.backend=native for {cfg['amp']['dtype']}")
    needs_eager = eager_only(cfg, derived)
    if cfg["train"]["compile"] is True and needs_eager:
        raise UsageError(f"train.compile=true: {needs_eager}; leave train.compile at auto or off")
    if cfg["optim"]["impl"] == "fused" and cfg["optim"]["foreach"] != "auto":
        raise UsageError("optim.foreach chooses between the loop and foreach of optim.impl=standard; "
                         "leave it at auto with optim.impl=fused")

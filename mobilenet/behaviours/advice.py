"""Advice lines, each said once a run at a log interval: where bfloat16 pays on this CPU, and what
to do when the loader stays the bottleneck. Their inputs are read once, at the first interval."""
from mobilenet.data.sources import SOURCES
from mobilenet.device import cpu_bf16_features, usable_cores
from mobilenet.model import multiply_adds


class Advice:
    data_wait = None

    def at_log(self, r, interval):
        once = []
        if self.data_wait is None:  # the first interval
            once = [bf16_hint(r.cfg)]
            self.data_wait = DataWaitHint(r.cfg["derived"]["workers"], usable_cores() // r.world.local_size,
                                          SOURCES[r.cfg["derived"]["source"]].preparable)
        for line in [*once, self.data_wait.line(interval.data_wait)]:
            if line:
                r.log.info(line)


class DataWaitHint:
    """One line, once, when the data wait is SHARE of the step for INTERVALS intervals in a row."""
    SHARE, INTERVALS = 0.3, 3

    def __init__(self, workers, cores, preparable):
        self.workers, self.cores, self.preparable = workers, cores, preparable
        self.slow, self.given = 0, False

    def line(self, data_wait):
        """The hint after an interval with ``data_wait``, or None."""
        self.slow = self.slow + 1 if data_wait >= self.SHARE else 0
        if self.slow < self.INTERVALS or self.given:
            return None
        self.given = True
        prepare = ("prepare the data once (python scripts/prepare_data.py DIR DST, then --data DST: about half "
                   "the CPU per image), " if self.preparable else "")
        workers, cores = self.workers, self.cores
        more = f"give it more cores (data.workers is {workers}" + (
            f", of {cores} usable: raise it)" if workers < cores - 1 else f" of {cores} usable cores)")
        return (f"hint: the loop waited for data {data_wait:.0%} of the time for {self.INTERVALS} log intervals: "
                f"the loader cannot keep up; {prepare}{more}, keep a small dataset in memory "
                f"(data.cache_mb) or use faster storage")


# img/s of bfloat16 autocast (O1) over fp32 (O0), {(width_mult, resolution): ratio}: batch 32,
# channels_last, fused SGD, median of 2 interleaved rounds on a 2-core Intel Sapphire Rapids with
# AMX-BF16 and AVX512-BF16 (docs/performance.md).
BF16_GAIN = {(0.25, 64): 0.82, (0.25, 128): 1.03, (0.25, 224): 1.05,
             (0.5, 64): 0.64, (0.5, 128): 0.87, (0.5, 224): 1.33,
             (1.0, 64): 0.80, (1.0, 128): 1.06, (1.0, 224): 1.61}
BF16_PAYS = 1.3       # the gain worth a hint
BF16_MIN_BATCH = 32   # smaller batches were not measured


def bf16_hint(cfg, features=None):
    """A hint for a cpu run at O0 on an AMX-BF16 CPU with a model where bf16 paid; else None."""
    model, batch = cfg["model"], cfg["data"]["batch_size"]
    features = cpu_bf16_features() if features is None else features
    if (cfg["derived"]["device"] != "cpu" or cfg["amp"]["level"] != "O0" or "AMX-BF16" not in features
            or batch < BF16_MIN_BATCH):
        return None
    own = multiply_adds(model["name"], model["width_mult"], model["resolution"])
    paid = {(width, resolution): multiply_adds("mobilenet_v1", width, resolution)
            for (width, resolution), gain in BF16_GAIN.items() if gain >= BF16_PAYS}
    below = [key for key, macs in paid.items() if macs <= own and key[1] <= model["resolution"]]
    if not below:
        return None
    width, resolution = max(below, key=paid.get)
    gain = BF16_GAIN[width, resolution]
    return (f"hint: this CPU has AMX-BF16 units; bfloat16 trained {gain:.2f}x as fast as fp32 with MobileNetV1 at "
            f"width {width:g} / {resolution} px, batch 32 (measured on a 2-core Sapphire Rapids): try --amp O1 "
            f"amp.dtype=bfloat16")

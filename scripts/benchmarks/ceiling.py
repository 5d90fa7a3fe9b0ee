"""The app's training loop against plain loops under the same settings: how close the app comes to
what this machine does.

python scripts/bench.py ceiling [--cases KIND/BATCH/LEVEL-DTYPE/IMPL ...] [--steps 40] [--log-every 10]
                                [--rounds 3] [--device auto] [--json FILE] [key.sub=value ...]
A case is a step kind, a batch, an amp level and dtype, and an optimizer implementation, e.g.
eager/256/O2-float16/torch_fused. The model and data are configs/synthetic.yaml's (width 1.0 at 224,
random images) with the key.sub=value settings given; channels_last as the app resolves it. For
each case, in one process, the variants take turns for --rounds rounds (reversed every other round):
  app           engine.run, train.py's own loop (its progress intervals after the first, warm-up)
  plain loader  plain_step (below), fed by the same DataLoader as the app (the dataset, sampler,
                workers and pinned memory the app builds), each batch copied and normalised plainly
  plain static  plain_step on one device-resident batch: the ceiling without input
Step kinds: eager; compiled (the app with train.compile=true; plain_step's model under torch.compile
with the same backend and mode: reduce-overhead CUDA graphs on cuda); graphed (cuda: plain_step's
whole step captured as one CUDA graph, replayed on the static batch; the app's graphed step is its
compiled one). Plain warms up for --log-every steps and is timed over the rest, as the app.
The headline is app / plain (median and min-max of the rounds' ratios). Rounds in which other
processes took over a quarter of the machine are dropped.
"""
import contextlib
import itertools
import time

from benchmarks.harness import AMP_DTYPES, AMP_LEVELS, ROOT

KINDS = ("eager", "compiled", "graphed")
IMPLEMENTATIONS = ("loop", "foreach", "torch_fused")


def parse_case(text):
    """'eager/256/O2-float16/torch_fused' -> {kind, batch, level, dtype, implementation}."""
    from mobilenet.errors import UsageError
    try:
        kind, batch, amp, implementation = text.split("/")
        level, dtype = amp.split("-")
        case = {"kind": kind, "batch": int(batch), "level": level, "dtype": dtype,
                "implementation": implementation}
    except ValueError:
        raise UsageError(f"--cases {text}: expected KIND/BATCH/LEVEL-DTYPE/IMPL, e.g. "
                         f"eager/256/O2-float16/torch_fused") from None
    if (kind not in KINDS or implementation not in IMPLEMENTATIONS or level not in AMP_LEVELS
            or dtype not in AMP_DTYPES):
        raise UsageError(f"--cases {text}: kind {'|'.join(KINDS)}, level O0|O1|O2, dtype float16|bfloat16, "
                         f"implementation {'|'.join(IMPLEMENTATIONS)}")
    if kind == "graphed" and level == "O1" and dtype == "float16":
        raise UsageError(f"--cases {text}: a graphed step needs bfloat16 at O1 (a GradScaler reads the "
                         f"host every step) or O2 (a static loss scale)")
    return case


def app_overrides(case, device, overrides):
    """The app's settings for ``case`` (the plain loop builds from the same resolved config)."""
    from mobilenet.optim import SETTINGS
    return [f"device={device}", f"data.batch_size={case['batch']}", f"amp.level={case['level']}",
            f"amp.dtype={case['dtype']}", "amp.backend=native", *SETTINGS[case["implementation"]],
            f"train.compile={case['kind'] == 'compiled'}",
            *(["amp.loss_scale=1024"] if case["level"] == "O2" else []), *overrides]  # O2: static, as plain


class PlainLoop:
    """The loop a user writes, for one case: plain_step over batches from the app's own DataLoader or
    one static batch. Built once; each measurement trains on."""

    def __init__(self, case, cfg, device):
        import torch
        from mobilenet.data.datasets import build_loaders
        from mobilenet.data.sources import build_datasets
        from mobilenet.training import IMAGENET_MEAN, IMAGENET_STD
        from mobilenet.errors import UsageError
        from mobilenet.model import MobileNetV1
        from mobilenet.optim import build_optimizer
        self.case, self.cfg, self.device = case, cfg, device
        torch.manual_seed(0)
        self.layout = torch.channels_last if cfg["derived"]["channels_last"] else torch.contiguous_format
        self.net = MobileNetV1(cfg["model"]["width_mult"], cfg["model"]["num_classes"]).to(
            device, memory_format=self.layout)
        dtype = getattr(torch, case["dtype"])
        self.half = dtype if case["level"] == "O2" else None
        if self.half:  # half model but BatchNorm; fp32 masters for the optimizer
            self.net.to(self.half)
            for module in self.net.modules():
                if isinstance(module, torch.nn.BatchNorm2d):
                    module.float()
            self.masters = [p.detach().float().requires_grad_() for p in self.net.parameters()]
            for master in self.masters:
                master.grad = torch.zeros_like(master)
            if cfg["amp"]["loss_scale"] == "dynamic":
                raise UsageError("ceiling: the plain O2 loop has a static loss scale; give amp.loss_scale=N")
            self.scale = float(cfg["amp"]["loss_scale"])
        self.optimizer = build_optimizer(self.masters if self.half else self.net, implementation=case["implementation"],
                                         lr=0.01, momentum=0.9, weight_decay=1e-4)  # torch's SGD
        self.autocast = dtype if case["level"] == "O1" else None
        self.scaler = torch.amp.GradScaler(device.type) if self.autocast == torch.float16 else None
        self.model = self.net
        if case["kind"] == "compiled":
            self.model = torch.compile(self.net, **cfg["derived"]["compile"])
        train, val = build_datasets(cfg["data"], cfg["model"], cfg["augment"])
        self.loader, _ = build_loaders(train, val, cfg["data"], cfg["seed"], pin_memory=device.type != "cpu",
                                       workers=cfg["derived"]["workers"])
        self.mean = torch.tensor(IMAGENET_MEAN, device=device).view(1, 3, 1, 1) * 255
        self.std = torch.tensor(IMAGENET_STD, device=device).view(1, 3, 1, 1) * 255
        self.static = self.to_device(next(iter(self.loader)))
        self.graph = None
        if case["kind"] == "graphed":
            self.capture()

    def to_device(self, batch):
        images, labels = batch
        images = images.to(self.device, non_blocking=True).float().sub_(self.mean).div_(self.std)
        images = images.to(self.half or images.dtype).contiguous(memory_format=self.layout)
        return images, labels.to(self.device, non_blocking=True)

    def plain_step(self, images, labels):  # the plain loop's whole step
        import torch
        import torch.nn.functional as F
        autocast = (torch.autocast(self.device.type, dtype=self.autocast, cache_enabled=self.graph is None)
                    if self.autocast else contextlib.nullcontext())  # no cast cache in a CUDA graph
        with autocast:
            loss = F.cross_entropy(self.model(images).float(), labels)
        if self.scaler:  # O1 float16
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
        elif self.half:  # O2: half grads into the fp32 masters, unscaled, stepped, copied back
            (loss * self.scale).backward()
            master_grads = [m.grad for m in self.masters]
            torch._foreach_copy_(master_grads, [p.grad for p in self.net.parameters()])
            torch._foreach_div_(master_grads, self.scale)
            self.optimizer.step()
            with torch.no_grad():
                torch._foreach_copy_(list(self.net.parameters()), self.masters)
        else:
            loss.backward()
            self.optimizer.step()
        (self.net if self.half else self.optimizer).zero_grad(set_to_none=True)  # O2: the masters' stay
        return loss.detach()

    def capture(self):
        """plain_step as one CUDA graph over the static batch (torch's whole-network capture), in
        ``self.graph``."""
        import torch
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                self.plain_step(*self.static)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()  # set first: plain_step reads it
        with torch.cuda.graph(self.graph):
            self.plain_step(*self.static)

    def img_per_s(self, steps, warmup, from_loader):
        from mobilenet.device import synchronize
        if from_loader:
            batches = (self.to_device(batch) for batch in self.loader)
        else:
            batches = itertools.repeat(self.static)
        for step in range(steps):
            if step == warmup:
                synchronize(self.device)
                start = time.perf_counter()
            if self.graph is not None:
                self.graph.replay()
            else:
                self.plain_step(*next(batches))
        synchronize(self.device)
        return self.case["batch"] * (steps - warmup) / (time.perf_counter() - start)


def case_name(case):
    return f"{case['kind']} b{case['batch']} {case['level']} {case['dtype']} {case['implementation']}"


def main(argv=None):
    from benchmarks.harness import benchmark_parser
    from mobilenet.device import DEVICES
    p = benchmark_parser(__doc__, rounds=3)
    p.add_argument("--cases", nargs="+", default=["eager/64/O1-bfloat16/torch_fused"])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--device", default="auto", choices=DEVICES)
    args, overrides = p.parse_known_args(argv)
    from mobilenet.config import build_config, resolve
    from mobilenet.device import choose_device, describe, open_device
    from mobilenet.device import cpu_model
    from mobilenet.errors import UsageError
    from benchmarks.harness import interleave, interval_note, markdown_table, training_img_per_s, write_json
    cases = [parse_case(text) for text in args.cases]
    device = open_device(choose_device(args.device))
    if device.type != "cuda" and any(case["kind"] == "graphed" for case in cases):
        raise UsageError("--cases graphed/...: CUDA graphs need a cuda device")
    config = ROOT / "configs" / "synthetic.yaml"
    variants, plains = {}, {}
    for case in cases:
        name, extra = case_name(case), app_overrides(case, device.type, overrides)
        extra.append(f"data.synthetic_size={args.steps * case['batch']}")  # as the app's run sizes it
        cfg = resolve(build_config(config, extra))
        plain = plains[name] = PlainLoop(case, cfg, device)
        if case["kind"] != "graphed":
            variants[f"{name}|app"] = (lambda extra=extra: training_img_per_s(
                config, extra, steps=args.steps, log_every=args.log_every))
            variants[f"{name}|plain loader"] = (lambda plain=plain: plain.img_per_s(
                args.steps, args.log_every, from_loader=True))
        variants[f"{name}|plain static"] = (lambda plain=plain: plain.img_per_s(
            args.steps, args.log_every, from_loader=False))
    first_call_s = {}
    for name, measure in variants.items():  # compiling, capture and first-use costs stay out of the rounds
        start = time.perf_counter()
        measure()
        first_call_s[name] = time.perf_counter() - start
    rounds = interleave(variants, args.rounds)
    print(f"{describe(device)}; {cpu_model()}; synthetic images, width {cfg['model']['width_mult']:g} at "
          f"{cfg['model']['resolution']} px, channels_last {cfg['derived']['channels_last']}, "
          f"data.workers {cfg['derived']['workers']}; {interval_note(args.steps, args.log_every)}; "
          f"{rounds.describe()}")
    rows, table = results(cases, variants, rounds, first_call_s)
    print(markdown_table(["case", "app img/s", "plain loader img/s", "plain static img/s",
                          "app / plain loader", "app / plain static"], table))
    print("first calls, s (compiling, capture and warm-up, then the measured steps): " + "; ".join(
        f"{name.replace('|', ' ')} {seconds:.1f}" for name, seconds in first_call_s.items()))
    write_json(args.json, {"device": describe(device), "cpu": cpu_model(), "steps": args.steps,
                           "log_every": args.log_every, "overrides": overrides, "rows": rows, **rounds.to_json()})
    return rows


def results(cases, variants, rounds, first_call_s):
    """(a row per case for the json, a row per case for the table): each variant's median and
    spread, the app against each plain loop."""
    rows, table = [], []
    for case in cases:
        name = case_name(case)
        have = {v.split("|")[1] for v in variants if v.startswith(name + "|")}
        row = {**case, "img_per_s": {v: rounds.median(f"{name}|{v}") for v in have},
               "first_call_s": {v: first_call_s[f"{name}|{v}"] for v in have},
               "spread": {v: rounds.spread(f"{name}|{v}") for v in have}}
        cells = [rounds.cell(f"{name}|{v}", 0) if v in have else "-" for v in ("app", "plain loader", "plain static")]
        for base in ("plain loader", "plain static"):
            if "app" in have:
                row[f"app/{base}"] = rounds.ratio(f"{name}|app", f"{name}|{base}")
                cells.append(rounds.ratio_cell(f"{name}|app", f"{name}|{base}"))
            else:
                cells.append("-")
        rows.append(row)
        table.append([name, *cells])
    return rows, table


if __name__ == "__main__":
    main()

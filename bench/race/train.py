#!/usr/bin/python3
"""One worker of the race (bench/vs_torch.sh): trains --model on its shard with --system.

  ddp        torch DistributedDataParallel, gloo allreduce (MASTER at --master)
  powersgd   DDP + powerSGD_hook (rank --powersgd-rank, from step --powersgd-start)
  fp16       DDP + default_hooks.fp16_compress_hook
  adaps      adaps.torch.DistributedOptimizer in local mode (servers run --optimizer=mean),
             dense pushes and pulls
  adacomp    the same with AdaComp pushes and recompressed pulls

Every system runs the same torch optimizer (SGD, momentum 0.9, cosine learning rate over the
whole run) on the same shard (every world-th image of the first --train-size), the same
batches and the same initial values. --model gpt is the accuracy zoo's character-level
transformer instead (bench/accuracy/zoo_models.py: AdamW, warm-up then cosine, clipping at
1.0, 16 sequences of 32 characters a worker and step, --steps steps, held-out bits/char):
DDP and its hooks compress the gradient before AdamW, as their users run them; adaps runs
adaps.torch's defaults in local mode (the servers run --optimizer=mean). The clock counts training steps only: every
--eval-every steps all ranks stop it, rank 0 evaluates on --test-size test images, all meet
at a barrier, and the clock restarts. Rank 0 writes a JSON result to --out.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "accuracy"))
import zoo_models  # noqa: E402
import adaps.blas  # noqa: E402

DDP_SYSTEMS = ("ddp", "powersgd", "fp16")
# Models of the accuracy zoo (bench/accuracy/zoo_models.py) the race can run, each with its
# own optimizer, schedule, batches and held-out metric.
TASKS = ("gpt",)
ADAPS_SYSTEMS = ("adaps", "adacomp")


def parse():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--system", required=True, choices=DDP_SYSTEMS + ADAPS_SYSTEMS)
    ap.add_argument("--model", default="mlp", choices=sorted(common.MODELS) + list(TASKS))
    ap.add_argument("--steps", type=int, default=300,
                    help="--model gpt: the run's length (its schedule spans it)")
    ap.add_argument("--rank", type=int, default=0, help="DDP rank (adaps: the scheduler's)")
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--master", default="127.0.0.1:29500", help="DDP: rank 0's addr:port")
    ap.add_argument("--scheduler", default="", help="adaps: tcp://host:port")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--train-size", type=int, default=16000)
    ap.add_argument("--test-size", type=int, default=10000)
    ap.add_argument("--batch-size", type=int, default=32, help="per worker")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--eval-every", type=int, default=25)
    ap.add_argument("--powersgd-rank", type=int, default=4)
    ap.add_argument("--powersgd-start", type=int, default=2,
                    help="PowerSGD's dense warm-up steps (torch's minimum is 2)")
    ap.add_argument("--adaps-mode", default="server", choices=("server", "local"),
                    help="adaps.torch mode: server (the servers run the momentum SGD, "
                         "--optimizer=momentum) or local (--optimizer=mean)")
    ap.add_argument("--adacomp-pull", default="recompressed", choices=("recompressed", "dense"))
    ap.add_argument("--adacomp-recipe", default="dgc", choices=("dgc", "plain"),
                    help="adacomp in server mode: dgc = the main command's defaults "
                         "(docs/accuracy.md): momentum correction (each worker pushes its "
                         "velocity, the servers run plain SGD; vs_torch.sh starts them with "
                         "--optimizer=sgd --pull_bin_size=100) and biases at bin size 100; "
                         "plain = the servers run the momentum, every tensor at its layer's T")
    ap.add_argument("--adacomp-1d-bin", type=int, default=0,
                    help="dgc recipe: bin size of every 1-D parameter (biases and BatchNorm "
                         "weights); 0 = biases at 100, BatchNorm weights at --adacomp-fc-bin")
    ap.add_argument("--adacomp-fc-bin", type=int, default=0,
                    help="AdaComp bin size of the non-conv layers; 0 = adaps.torch's (500)")
    ap.add_argument("--momentum-masking", default="off", choices=("on", "off"),
                    help="adacomp with the dgc recipe: DGC's momentum factor masking, each "
                         "worker clears its velocity where its last push sent it "
                         "(adaps.Worker.last_sent)")
    ap.add_argument("--lr-in-push", default="off", choices=("on", "off"),
                    help="adacomp with the dgc recipe: each worker pushes lr_t / lr_0 times its "
                         "velocity and the servers keep lr_0 (error feedback on the update, "
                         "as in EF-SGD): what the residue holds back is applied later at the "
                         "learning rate of the step that computed it, not at the (cosine-"
                         "decayed) rate of the step that sends it. off: the servers get the "
                         "scheduler's lr_t each step")
    ap.add_argument("--adacomp-warmup-steps", type=int, default=0,
                    help="adacomp: DGC's sparsity warm-up over the first N steps: each "
                         "tensor's push bin size grows geometrically from "
                         "--adacomp-warmup-bin to its own (adaps.Worker.set_bin_size; "
                         "tensors fused with others keep theirs). 0: off")
    ap.add_argument("--adacomp-warmup-bin", type=int, default=10,
                    help="the bin size of the warm-up's first step")
    ap.add_argument("--adacomp-cooldown-steps", type=int, default=0,
                    help="adacomp: over the last N steps each tensor's push bin size falls "
                         "geometrically from its own to --adacomp-cooldown-bin (denser "
                         "pushes while the learning rate anneals). 0: off")
    ap.add_argument("--adacomp-cooldown-bin", type=int, default=50,
                    help="the bin size of the cool-down's last step")
    ap.add_argument("--final-pull", default="off", choices=("auto", "off"),
                    help="auto: adacomp with recompressed pulls, before the last evaluation "
                         "rank 0 loads the servers' exact parameters (DistributedOptimizer."
                         "pull_parameters, one dense pull, on the clock; the replica's "
                         "accuracy is printed too). off (default): evaluate the replica; the "
                         "two measured the same (docs/benchmarks.md, the race's notes)")
    ap.add_argument("--compression-threads", type=int, default=1,
                    help="adaps: the worker's compression pool (0: compress on the calling "
                         "thread, decode on the I/O thread)")
    ap.add_argument("--local-steps", type=int, default=1,
                    help="adacomp in local mode (the transformer, or --adaps-mode local): "
                         "exchange every H steps (adaps.torch's local_steps; each worker "
                         "runs its own optimizer between exchanges). 1: every step")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-steps", type=int, default=0,
                    help="stop after N steps (0: the whole run); the cosine schedule still "
                         "spans the whole run. For the slowest systems on the slowest links: "
                         "their step time is measured over the first N steps and the summary "
                         "extrapolates their time to the target (bench/race/summarize.py)")
    ap.add_argument("--system-name", default="",
                    help="the system's name in the result (default --system), e.g. "
                         "adacomp-colo for adacomp with a server beside every worker")
    ap.add_argument("--out", default="", help="rank 0's JSON result")
    ap.add_argument("--label", default="", help="stored in the result")
    ap.add_argument("--data-dir", default=common.DATA_DIR)
    return ap.parse_args()


class Ddp:
    """torch.distributed + DDP, with an optional comm hook."""

    def __init__(self, a, model, optimizer=None):
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel
        self.dist = dist
        dist.init_process_group("gloo", init_method="tcp://" + a.master, rank=a.rank,
                                world_size=a.world)
        self.rank = a.rank
        if a.system == "powersgd":
            # One bucket: with gloo and DDP's default buckets (1 MB, then 25 MB) the
            # PowerSGD hook hung in Reducer::finalize_backward on the CNN (two buckets);
            # the MLP fits the first bucket anyway.
            dist._DEFAULT_FIRST_BUCKET_BYTES = 1 << 30
            self.model = DistributedDataParallel(model, bucket_cap_mb=1024)
        else:
            self.model = DistributedDataParallel(model)
        if a.system == "powersgd":
            from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps
            state = ps.PowerSGDState(process_group=None,
                                     matrix_approximation_rank=a.powersgd_rank,
                                     start_powerSGD_iter=a.powersgd_start, random_seed=a.seed)
            self.model.register_comm_hook(state, ps.powerSGD_hook)
        elif a.system == "fp16":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
            self.model.register_comm_hook(None, default_hooks.fp16_compress_hook)
        self.opt = optimizer or torch.optim.SGD(model.parameters(), lr=a.lr,
                                                momentum=a.momentum)

    def synchronize(self):
        """The gradients are averaged when backward returns."""

    def barrier(self):
        self.dist.barrier()

    def traffic(self):
        return {}

    def stop(self):
        # No destroy_process_group(): after a PowerSGD run one rank spun in it at full CPU
        # for minutes once its peers had left. A barrier, then the process exits.
        self.dist.barrier()
        sys.stdout.flush()
        os._exit(0)


def make_worker(a):
    import adaps
    # Ten minutes to form, as adaps.launch gives: 16 workers importing torch on a loaded
    # machine take minutes, and DDP's rendezvous waits as long.
    return adaps.Worker(scheduler=a.scheduler, register_timeout=600.0, request_timeout=300.0,
                        compression_threads=a.compression_threads)


class Adaps:
    """adaps.torch.DistributedOptimizer: server mode (the servers run the torch optimizer's
    momentum SGD with its hyper-parameters, rank 0 sends the scheduler's learning rate) or
    local mode (the servers answer each step's mean gradient, the torch optimizer runs
    here)."""

    def __init__(self, a, model, optimizer=None, worker=None):
        import adaps
        import adaps.torch
        self.worker = worker or make_worker(a)
        self.rank = self.worker.rank
        self.model = model
        dense = a.system == "adaps"
        self.final_pull, self.warmup = None, []
        if a.local_steps > 1 and (dense or (optimizer is None and a.adaps_mode != "local")):
            raise SystemExit("race: --local-steps needs adacomp in local mode")
        local = {"local_steps": a.local_steps} if a.local_steps > 1 else {}
        if optimizer is not None:  # a zoo task: its optimizer, adaps.torch's defaults
            self.opt = adaps.torch.DistributedOptimizer(
                optimizer, model, self.worker, compression="dense" if dense else None, **local)
            self.synchronize = self.opt.synchronize
            return
        # Momentum correction (DGC; worker/app/trainer/exchange.h MomentumCorrection): the
        # velocity u = m u + g is what gets compressed and pushed; the servers run SGD.
        self.correct = (not dense and a.adaps_mode == "server" and a.adacomp_recipe == "dgc")
        if self.correct:
            # In a hook on each parameter, before the gradient reaches .grad: adaps.torch
            # pushes .grad during backward and refuses a gradient changed after it.
            masking = a.momentum_masking == "on"
            # --lr-in-push: train() sets push_scale[0] = lr_t / lr_0 before each step.
            self.lr_in_push = a.lr_in_push == "on"
            self.push_scale = [1.0]
            for n, p in model.named_parameters():
                p.register_hook(self._velocity_hook(a.momentum, self.worker if masking else None,
                                                    n, self.push_scale))
        server_opt = "mean" if a.adaps_mode == "local" else "momentum"
        bin_sizes = None
        if self.correct:
            server_opt = "sgd"
            if a.adacomp_1d_bin > 0:
                bin_sizes = {n: a.adacomp_1d_bin for n, p in model.named_parameters()
                             if p.dim() == 1}
            else:
                bin_sizes = {n: 100 for n, p in model.named_parameters()
                             if n.endswith(".bias") and p.dim() == 1}
        self.opt = adaps.torch.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=a.lr,
                            momentum=0.0 if self.correct else a.momentum), model,
            self.worker, server_optimizer=server_opt,
            compression="dense" if dense else "adacomp",
            pull="dense" if dense else a.adacomp_pull, bin_sizes=bin_sizes,
            bin_size=a.adacomp_fc_bin or None, **local)
        # (name, its own bin size) of the tensors whose bin sizes follow the schedule
        self.warmup = []
        self.warmup_steps, self.warmup_bin = a.adacomp_warmup_steps, a.adacomp_warmup_bin
        self.cooldown_steps, self.cooldown_bin = a.adacomp_cooldown_steps, a.adacomp_cooldown_bin
        self.total_steps = None  # set by train()
        if not dense and (self.warmup_steps > 0 or self.cooldown_steps > 0):
            self.warmup = [(e.name, e.bin_size) for e in self.opt._params]
        self.final_pull = None
        if not dense and a.adacomp_pull == "recompressed" and a.final_pull == "auto":
            self.final_pull = self.opt.pull_parameters

    @staticmethod
    def _velocity_hook(momentum, worker=None, name=None, scale=(1.0,)):
        """u = m u + g, pushed (times scale[0]) instead of g; with `worker`, u is first
        cleared where the last push of `name` sent it (DGC's momentum factor masking)."""
        state = {}

        def hook(grad):
            u = state.get("u")
            if u is None:
                u = state["u"] = torch.zeros_like(grad)
            elif worker is not None:
                sent = torch.from_numpy(worker.last_sent(name))
                if sent.numel():
                    u.view(-1).index_fill_(0, sent, 0.0)
            u.mul_(momentum).add_(grad)
            return u.clone() if scale[0] == 1.0 else u * scale[0]
        return hook


    @staticmethod
    def _geometric(a, b, f):
        return max(1, round(a * (b / a) ** f))

    def before_step(self, step):
        """--adacomp-warmup-steps, --adacomp-cooldown-steps: the bin sizes of this step's
        pushes."""
        if not self.warmup:
            return
        start_cool = self.total_steps - self.cooldown_steps
        if self.warmup_steps < step < start_cool:
            return
        import adaps
        keep = []
        for name, own in self.warmup:
            if step < self.warmup_steps:
                t = min(own, self._geometric(self.warmup_bin, own, step / self.warmup_steps))
            elif step >= start_cool and self.cooldown_steps > 0:
                f = (step - start_cool + 1) / self.cooldown_steps
                t = min(own, self._geometric(own, self.cooldown_bin, f))
            else:
                t = own
            try:
                self.worker.set_bin_size(name, t)
            except adaps.Error as err:
                if err.code != adaps.FAILED_PRECONDITION:  # (fused: keeps its own)
                    raise
                continue
            keep.append((name, own))
        self.warmup = keep

    def barrier(self):
        self.worker.barrier()

    def traffic(self):
        t = self.opt.traffic()
        return {k: sum(d[k] for d in t.values())
                for k in ("push_dense", "push_wire", "pull_dense", "pull_wire")}

    def stop(self):
        import adaps
        try:
            self.worker.stop()
        except adaps.Error as err:  # the run is over; the scheduler ends it by its silence
            print("race: leaving the cluster: %s" % err, file=sys.stderr, flush=True)


def train(a, sysobj, raw_model, x_train, y_train, x_test, y_test):
    model, opt = sysobj.model, sysobj.opt
    steps_per_epoch = len(x_train) // a.batch_size
    total = steps_per_epoch * a.epochs
    # --lr-in-push: the schedule runs on a stand-in optimizer and reaches the workers' pushes
    # as a factor; the servers keep the initial learning rate.
    lr_in_push = getattr(sysobj, "lr_in_push", False)
    sysobj.total_steps = total
    sched_opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=a.lr) \
        if lr_in_push else opt
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(sched_opt, T_max=total)
    evals, step_times = [], []
    final = None
    clock, step = 0.0, 0
    rx0, tx0 = common.netdev_bytes()
    for epoch in range(a.epochs):
        for idx in common.batches(len(x_train), a.batch_size, a.seed, epoch):
            t0 = time.perf_counter()
            if lr_in_push:
                sysobj.push_scale[0] = sched_opt.param_groups[0]["lr"] / a.lr
            if hasattr(sysobj, "before_step"):
                sysobj.before_step(step)
            opt.zero_grad()
            loss = F.cross_entropy(model(x_train[idx]), y_train[idx])
            loss.backward()
            opt.step()
            sched.step()
            dt = time.perf_counter() - t0
            clock += dt
            step_times.append(dt)
            step += 1
            stop_early = 0 < a.max_steps <= step < total
            final_pull = getattr(sysobj, "final_pull", None) if step == total else None
            if final_pull is not None and sysobj.rank == 0:
                # The trained model is the servers' (rank 0 would save it): one dense pull,
                # on the clock; the replica's accuracy is kept for the record.
                replica_acc = common.evaluate(raw_model, x_test, y_test)
                t1 = time.perf_counter()
                final_pull()
                pulled_s = time.perf_counter() - t1
                clock += pulled_s
                final = dict(replica_acc=replica_acc, seconds=pulled_s)
                print("final pull of the servers' parameters: %.2f s (the replica's test_acc "
                      "%.4f)" % (pulled_s, replica_acc), flush=True)
            if step % a.eval_every == 0 or step == total or stop_early:
                acc = common.evaluate(raw_model, x_test, y_test) if sysobj.rank == 0 else None
                sysobj.barrier()  # off the clock: nobody computes ahead while rank 0 evaluates
                if sysobj.rank == 0:
                    evals.append((step, clock, acc))
                    print("step %4d  loss %.4f  test_acc %.4f  train_time %.1f s" %
                          (step, loss.item(), acc, clock), flush=True)
            if stop_early:
                break
        if 0 < a.max_steps <= step < total:
            break
    rx1, tx1 = common.netdev_bytes()
    return dict(evals=evals, step_times=step_times, steps=step,
                rx_bytes=rx1 - rx0, tx_bytes=tx1 - tx0, final_pull=final)


def train_task(a, sysobj, task):
    """A zoo task's loop: its schedule, batches, clipping and held-out metric, clocked as
    train() clocks a classifier's."""
    model, opt = sysobj.model, sysobj.opt
    evals, step_times = [], []
    clock = 0.0
    rx0, tx0 = common.netdev_bytes()
    steps = a.steps if a.max_steps <= 0 else min(a.steps, a.max_steps)
    for step in range(steps):
        t0 = time.perf_counter()
        for g in opt.param_groups:
            g["lr"] = task.lr_at(step)
        x, y = task.batch(step)
        opt.zero_grad()
        loss = task.loss(model(x), y)
        loss.backward()
        if task.clip:
            sysobj.synchronize()  # the averaged gradient is what is clipped, as in DDP
            torch.nn.utils.clip_grad_norm_(task.model.parameters(), task.clip)
        opt.step()
        dt = time.perf_counter() - t0
        clock += dt
        step_times.append(dt)
        if (step + 1) % a.eval_every == 0 or step + 1 == steps:
            metric = task.evaluate() if sysobj.rank == 0 else None
            sysobj.barrier()
            if sysobj.rank == 0:
                evals.append((step + 1, clock, metric))
                print("step %4d  loss %.4f  %s %.4f  train_time %.1f s" %
                      (step + 1, loss.item(), task.metric, metric, clock), flush=True)
    rx1, tx1 = common.netdev_bytes()
    return dict(evals=evals, step_times=step_times, steps=steps,
                rx_bytes=rx1 - rx0, tx_bytes=tx1 - tx0, final_pull=None)


def task_compute_ms(a, rank, steps=20):
    """compute_ms for a zoo task: forward and backward of a fresh copy on its batches."""
    task = zoo_models.make_task(a.model, rank, a.world, a.seed, a.steps)
    times = []
    for i in range(steps + 3):
        x, y = task.batch(i)
        t0 = time.perf_counter()
        task.model.zero_grad()
        task.loss(task.model(x), y).backward()
        times.append(time.perf_counter() - t0)
    times = sorted(times[3:])
    return 1e3 * times[len(times) // 2]


def write_result(a, r, model, wall, traffic, blas, compute_ms, metric, higher_is_better,
                 total_steps):
    steady = sorted(r["step_times"][5:] or r["step_times"])
    res = dict(system=a.system_name or a.system, model=a.model, label=a.label, seed=a.seed,
               world=a.world, batch_size=a.batch_size, epochs=a.epochs,
               train_size=a.train_size, test_size=a.test_size, lr=a.lr,
               momentum=a.momentum, adacomp_recipe=a.adacomp_recipe
               if a.system == "adacomp" else None,
               lr_in_push=a.lr_in_push if a.system == "adacomp" else None,
               adacomp_bins=dict(one_d=a.adacomp_1d_bin, fc=a.adacomp_fc_bin)
               if a.system == "adacomp" else None,
               local_steps=a.local_steps,
               params=sum(p.numel() for p in model.parameters()),
               steps=r["steps"], total_steps=total_steps,
               max_steps=a.max_steps, evals=r["evals"], metric=metric,
               higher_is_better=higher_is_better,
               train_time=sum(r["step_times"]) + (r["final_pull"] or {}).get("seconds", 0.0),
               wall_time=wall, step_ms_mean=1e3 * sum(r["step_times"]) / r["steps"],
               step_ms_median=1e3 * steady[len(steady) // 2],
               rx_bytes=r["rx_bytes"], tx_bytes=r["tx_bytes"], library_traffic=traffic,
               final_pull=r["final_pull"], blas=blas, compute_ms=compute_ms,
               compute_share=compute_ms / (1e3 * steady[len(steady) // 2]))
    with open(a.out, "w") as f:
        json.dump(res, f)


def main():
    a = parse()
    torch.set_num_threads(1)  # the workers (+ servers) share the machine's cores
    if a.model in TASKS:
        return main_task(a)
    model = common.make_model(a.model, a.seed)
    if a.system in DDP_SYSTEMS:
        sysobj = Ddp(a, model)
    else:
        sysobj = Adaps(a, model)
    rank = sysobj.rank
    x_train, y_train = common.load_split(a.data_dir, "train")
    x_test, y_test = common.load_split(a.data_dir, "test")
    x_train, y_train = x_train[:a.train_size][rank::a.world], y_train[:a.train_size][rank::a.world]
    x_test, y_test = x_test[:a.test_size], y_test[:a.test_size]
    blas = adaps.blas.blas_info(measure=rank == 0)
    compute_ms = None
    if rank == 0:
        adaps.blas.warn_if_reference(blas)
        compute_ms = common.compute_ms(common.make_model(a.model, a.seed), x_train, y_train,
                                        a.batch_size)
    sysobj.barrier()
    wall0 = time.time()
    r = train(a, sysobj, model, x_train, y_train, x_test, y_test)
    wall = time.time() - wall0
    traffic = sysobj.traffic()
    # Every rank's bytes reach rank 0's file through stdout (the driver collects them).
    print("RACE_BYTES rank %d steps %d rx %d tx %d" % (rank, r["steps"], r["rx_bytes"],
                                                       r["tx_bytes"]), flush=True)
    if rank == 0 and a.out:
        write_result(a, r, model, wall, traffic, blas, compute_ms, metric="test accuracy",
                     higher_is_better=True,
                     total_steps=a.epochs * (len(x_train) // a.batch_size))
    sysobj.stop()


def main_task(a):
    a.batch_size, a.epochs, a.train_size, a.test_size = 16, None, None, None  # the task's
    worker = None
    if a.system in ADAPS_SYSTEMS:
        worker = make_worker(a)  # the scheduler gives the rank, which the batches need
    rank = worker.rank if worker is not None else a.rank
    task = zoo_models.make_task(a.model, rank, a.world, a.seed, a.steps)
    if a.system in DDP_SYSTEMS:
        sysobj = Ddp(a, task.model, task.optimizer)
    else:
        sysobj = Adaps(a, task.model, task.optimizer, worker)
    blas = adaps.blas.blas_info(measure=rank == 0)
    compute_ms = None
    if rank == 0:
        adaps.blas.warn_if_reference(blas)
        compute_ms = task_compute_ms(a, rank)
    sysobj.barrier()
    wall0 = time.time()
    r = train_task(a, sysobj, task)
    wall = time.time() - wall0
    traffic = sysobj.traffic()
    print("RACE_BYTES rank %d steps %d rx %d tx %d" % (rank, r["steps"], r["rx_bytes"],
                                                       r["tx_bytes"]), flush=True)
    if rank == 0 and a.out:
        write_result(a, r, task.model, wall, traffic, blas, compute_ms, metric=task.metric,
                     higher_is_better=task.higher_is_better, total_steps=a.steps)
    sysobj.stop()


if __name__ == "__main__":
    main()

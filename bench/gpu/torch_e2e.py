"""The GPU check's end-to-end run (bench/gpu-check.sh runs it; docs/gpu.md): the zoo's
character transformer (bench/accuracy/zoo_models.py's CharGpt, here at --width, --layers and
--ctx, on random tokens: this times steps, it does not measure accuracy) trained with AdamW on
one GPU for --steps steps, three ways:

  dense    plain torch, no adaps: the step the exchange should hide behind
  device   adaps.torch with its defaults (local mode: each worker's own AdamW step pushed,
           the exact mean pulled; --exchange, --pull change them) on the worker library's
           device path (residues on the GPU, AdaComp there, only the update to the host)
  staged   the same with the gradients staged through pinned host memory and compressed on
           the CPU (adaps.torch's path where the library has no CUDA)

Each adaps run starts an adaps-scheduler and --servers adaps-servers (--optimizer=mean) from
--bin, with LD_LIBRARY_PATH=--lib, and one worker in this process. Prints one JSON line per
run: the median ms per step after --warmup steps, the push and pull wire bytes per step, and
the worker's compress seconds per step; then a SUMMARY line (device step / dense step, target
<= 1.1; staged step / device step).

    python3 bench/gpu/torch_e2e.py --bin .gpu/bin --lib .gpu/lib [--steps 100]

--cpu runs the same on the CPU with the device emulated in host memory (adaps.Worker(
emulate_devices=True)): a check of this script, and of the path, on a machine without a GPU.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn as nn

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "bench", "accuracy"))
from zoo_models import CharGpt  # noqa: E402  (the zoo's transformer)


class Gpt(CharGpt):
    """The zoo's CharGpt, its mask and positions made on the model's device."""

    def forward(self, x):
        n = x.shape[1]
        mask = torch.triu(torch.full((n, n), float("-inf"), device=x.device), 1)
        h = self.tok(x) + self.pos(torch.arange(n, device=x.device))
        for b in self.blocks:
            h = b(h, mask)
        return self.head(self.ln(h))


def start_cluster(args, tmp):
    env = dict(os.environ, LD_LIBRARY_PATH=args.lib)
    port_file = os.path.join(tmp, "port")
    procs = [subprocess.Popen(
        [os.path.join(args.bin, "adaps-scheduler"), "--num_servers=%d" % args.servers,
         "--num_workers=1", "--port_file=" + port_file, "--log_level=warn"], env=env)]
    end = time.time() + 20
    while not (os.path.exists(port_file) and open(port_file).read().strip()):
        if time.time() > end:
            raise RuntimeError("adaps-scheduler wrote no port")
        time.sleep(0.05)
    address = "tcp://127.0.0.1:" + open(port_file).read().strip()
    for _ in range(args.servers):
        procs.append(subprocess.Popen(
            [os.path.join(args.bin, "adaps-server"), "--scheduler=" + address,
             "--optimizer=mean", "--log_level=warn"], env=env))
    return address, procs


def synchronize(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def run(args, way):
    torch.manual_seed(0)
    dev = torch.device("cpu" if args.cpu else "cuda")
    model = Gpt(args.vocab, d=args.width, layers=args.layers, heads=args.heads,
                ctx=args.ctx).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    procs, worker = [], None
    result = {"way": way, "params": sum(p.numel() for p in model.parameters())}
    tmp = tempfile.mkdtemp(prefix="adaps-gpu-e2e-")
    try:
        if way != "dense":
            import adaps
            import adaps.torch
            if way == "staged":
                adaps.CUDA_BUILT = False  # adaps.torch then stages CUDA gradients
            address, procs = start_cluster(args, tmp)
            worker = adaps.Worker(scheduler=address, register_timeout=60, request_timeout=60,
                                  emulate_devices=args.cpu and way == "device")
            settings = {k: v for k, v in (("exchange", args.exchange), ("pull", args.pull))
                        if v}
            opt = adaps.torch.DistributedOptimizer(opt, model, worker, **settings)
        gen = torch.Generator(device=dev).manual_seed(1)
        times = []
        for step in range(args.steps):
            x = torch.randint(0, args.vocab, (args.batch, args.ctx), device=dev, generator=gen)
            synchronize(dev)
            t0 = time.perf_counter()
            opt.zero_grad()
            out = model(x[:, :-1])
            loss = nn.functional.cross_entropy(out.reshape(-1, args.vocab),
                                               x[:, 1:].reshape(-1))
            loss.backward()
            opt.step()
            synchronize(dev)
            if step >= args.warmup:
                times.append(time.perf_counter() - t0)
        result["ms_per_step"] = round(1e3 * statistics.median(times), 3)
        result["loss"] = round(float(loss), 4)
        if worker is not None:
            names = [n for n in worker.tensor_names()]
            traffic = [worker.traffic(n) for n in names]
            result["push_bytes_per_step"] = sum(t["push_wire_bytes"] for t in traffic) // args.steps
            result["pull_bytes_per_step"] = sum(t["pull_wire_bytes"] for t in traffic) // args.steps
            result["compress_ms_per_step"] = round(
                1e3 * sum(t["compress_seconds"] for t in traffic) / args.steps, 3)
            result["on_device"] = sum(1 for e in opt._exchange.entries
                                      if getattr(e, "out_dev", None) is not None) \
                if hasattr(opt, "_exchange") else None
    finally:
        if worker is not None:
            worker.stop()
        for p in procs:
            p.kill()
            p.wait()
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", required=True, help="adaps-scheduler and adaps-server")
    ap.add_argument("--lib", default="", help="their LD_LIBRARY_PATH")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--servers", type=int, default=4)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--ctx", type=int, default=129)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--ways", default="dense,device,staged")
    ap.add_argument("--exchange", default="", help="adaps.torch's (default: its default)")
    ap.add_argument("--pull", default="", help="adaps.torch's (default: its default)")
    ap.add_argument("--cpu", action="store_true", help="the device emulated in host memory")
    args = ap.parse_args()
    if not args.cpu and not torch.cuda.is_available():
        print("NO GPU: torch.cuda.is_available() is False")
        return 2
    results = {}
    for way in args.ways.split(","):
        results[way] = run(args, way)
        print(json.dumps(results[way]), flush=True)
    if {"dense", "device"} <= set(results):
        ratio = results["device"]["ms_per_step"] / results["dense"]["ms_per_step"]
        staged = (results["staged"]["ms_per_step"] / results["device"]["ms_per_step"]
                  if "staged" in results else float("nan"))
        print("SUMMARY: device step %.2fx the dense step (target <= 1.1: %s); staged step "
              "%.2fx the device step" % (ratio, "met" if ratio <= 1.1 else "NOT met", staged))
    return 0


if __name__ == "__main__":
    sys.exit(main())

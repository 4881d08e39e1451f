#!/usr/bin/python3
"""Data-parallel CNN training on Fashion-MNIST through adaps (AdaComp by default).

    /usr/bin/python3 -m adaps.launch -n 2 examples/pytorch/train_fashion_mnist.py
    /usr/bin/python3 -m adaps.launch -n 2 --server-optimizer sgd \\
        examples/pytorch/train_fashion_mnist.py --epochs 3 --train-size 60000

Each worker trains on its share (every num_workers-th image) of the first --train-size
training images; each worker's torch optimizer (local mode, the launcher's default) or,
with --server-optimizer sgd, the servers apply SGD. Prints the loss as it goes, test accuracy per epoch, and the compression per
layer type from the worker's traffic counters. Data: Debian's dataset-fashion-mnist
(/usr/share/datasets/fashion-mnist, gzipped IDX files).
"""
import argparse
import gzip
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import adaps
import adaps.progress
import adaps.torch

DATA_DIR = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    magic, = struct.unpack(">I", data[:4])
    ndim = magic & 0xFF
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load_split(data_dir, split):
    prefix = "train" if split == "train" else "t10k"
    def find(name):
        for cand in (name + ".gz", name):
            p = os.path.join(data_dir, cand)
            if os.path.exists(p):
                return p
        sys.exit("missing %s in %s (apt-get install dataset-fashion-mnist)" % (name, data_dir))
    images = read_idx(find(prefix + "-images-idx3-ubyte"))
    labels = read_idx(find(prefix + "-labels-idx1-ubyte"))
    x = torch.from_numpy(images.astype(np.float32) / 255.0).unsqueeze(1)
    x = (x - 0.2860) / 0.3530
    return x, torch.from_numpy(labels.astype(np.int64))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 5, padding=2)
        self.conv2 = nn.Conv2d(16, 32, 5, padding=2)
        self.fc1 = nn.Linear(32 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def evaluate(model, x, y, batch=1000):
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(x), batch):
            correct += (model(x[i:i + batch]).argmax(1) == y[i:i + batch]).sum().item()
    model.train()
    return correct / len(x)


def push_compression(opt):
    """Dense over wire bytes of every push so far (None before the first)."""
    t = opt.traffic().values()
    wire = sum(d["push_wire"] for d in t)
    return sum(d["push_dense"] for d in t) / wire if wire else None


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--train-size", type=int, default=24000,
                    help="first N training images, shared out over the workers")
    ap.add_argument("--test-size", type=int, default=2000)
    ap.add_argument("--max-steps", type=int, default=0, help="stop after this many steps")
    ap.add_argument("--batch-size", type=int, default=32, help="per worker")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.0,
                    help="local mode (the launcher's default), or servers running sgd "
                         "(the workers' momentum correction) or momentum")
    ap.add_argument("--compression", default=None,
                    help="default: adaps.launch --compression, else adacomp")
    ap.add_argument("--conv-bin-size", type=int, default=None, help="default 50")
    ap.add_argument("--bin-size", type=int, default=None, help="default 500")
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--data-dir", default=DATA_DIR)
    a = ap.parse_args()

    torch.manual_seed(a.seed)
    if "OMP_NUM_THREADS" in os.environ:
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    worker = adaps.worker_from_env()
    rank, size = worker.rank, worker.num_workers
    x_train, y_train = load_split(a.data_dir, "train")
    x_test, y_test = load_split(a.data_dir, "test")
    x_train, y_train = x_train[:a.train_size][rank::size], y_train[:a.train_size][rank::size]
    x_test, y_test = x_test[:a.test_size], y_test[:a.test_size]

    model = Net()
    opt = adaps.torch.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum), model, worker,
        compression=a.compression, conv_bin_size=a.conv_bin_size, bin_size=a.bin_size)
    print("rank %d/%d: %d training images, mode %s, compression %s" %
          (rank, size, len(x_train), opt.mode, opt.compression), flush=True)

    step, start = 0, time.time()
    steps_per_epoch = len(x_train) // a.batch_size
    done = False
    for epoch in range(a.epochs):
        perm = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(epoch))
        running = 0.0
        progress = adaps.progress.Progress(steps_per_epoch, epoch=epoch, epochs=a.epochs,
                                           rank=rank, batch_size=a.batch_size)
        for b in range(steps_per_epoch):
            idx = perm[b * a.batch_size:(b + 1) * a.batch_size]
            opt.zero_grad()
            loss = F.cross_entropy(model(x_train[idx]), y_train[idx])
            loss.backward()
            opt.step()
            step += 1
            running += loss.item()
            progress.update(b + 1, loss=loss.item(), compression=lambda: push_compression(opt))
            if step % a.log_every == 0:
                progress.write("step %5d  loss %.4f  (%.1f s)" % (step, running / a.log_every,
                                                                 time.time() - start))
                running = 0.0
            if a.max_steps and step >= a.max_steps:
                done = True
                break
        progress.close()
        # With local steps (adaps.launch --local-steps H) every worker's model is its own
        # between exchanges: this exchanges the steps since the last one, so every worker
        # evaluates the job's model (collective; nothing to do without local steps).
        opt.exchange_now()
        acc = evaluate(model, x_test, y_test)
        print("epoch %d  step %d  test accuracy %.4f" % (epoch + 1, step, acc), flush=True)
        if done:
            break
    print("compression by layer type (rank %d):\n%s" % (rank, opt.traffic_report()),
          flush=True)
    print("final test accuracy %.4f" % acc, flush=True)
    worker.stop()


if __name__ == "__main__":
    main()

"""Shared pieces of the race (bench/vs_torch.sh): data, models, evaluation, byte counters.

Every configuration trains exactly these models on exactly these shards with the same seed,
so the only difference between two runs is how the gradients travel.
"""
import gzip
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

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
    """(images N x 1 x 28 x 28 float32 normalised, labels int64) of 'train' or 'test'."""
    prefix = "train" if split == "train" else "t10k"

    def find(name):
        for cand in (name + ".gz", name):
            p = os.path.join(data_dir, cand)
            if os.path.exists(p):
                return p
        sys.exit("race: missing %s in %s (apt-get install dataset-fashion-mnist)"
                 % (name, data_dir))
    images = read_idx(find(prefix + "-images-idx3-ubyte"))
    labels = read_idx(find(prefix + "-labels-idx1-ubyte"))
    x = torch.from_numpy(images.astype(np.float32) / 255.0).unsqueeze(1)
    x = (x - 0.2860) / 0.3530
    return x, torch.from_numpy(labels.astype(np.int64))


class Mlp(nn.Module):
    """The Fashion-MNIST MLP of the examples (adaps-worker --model=mlp): 784-256-128-10,
    235,146 parameters (0.94 MB of float32)."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 256)
        self.fc2 = nn.Linear(256, 128)
        self.fc3 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc3(F.relu(self.fc2(x)))


class BnCnn(nn.Module):
    """A CNN with BatchNorm and 1,017,002 parameters (4.07 MB), cheap to compute on a CPU:
    conv 5x5 1->16, BN, ReLU, pool; conv 3x3 16->32, BN, ReLU, pool; fc 1568->640, BN,
    ReLU; fc 640->10. Most parameters sit in fc1, as in VGG-style nets, so the network
    carries 4 MB a step while the compute stays at ~2.3 M multiply-adds an image."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 5, padding=2)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(32)
        self.fc1 = nn.Linear(32 * 7 * 7, 640)
        self.bn3 = nn.BatchNorm1d(640)
        self.fc2 = nn.Linear(640, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        x = F.relu(self.bn3(self.fc1(x.flatten(1))))
        return self.fc2(x)


MODELS = {"mlp": Mlp, "cnn": BnCnn}


def make_model(name, seed):
    torch.manual_seed(seed)  # every rank builds identical initial values
    return MODELS[name]()


def evaluate(model, x, y, batch=1000):
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(x), batch):
            correct += (model(x[i:i + batch]).argmax(1) == y[i:i + batch]).sum().item()
    model.train()
    return correct / len(x)


def netdev_bytes(iface="eth0"):
    """(rx bytes, tx bytes) of iface in this process's network namespace, or (0, 0)."""
    try:
        with open("/proc/net/dev") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name.strip() == iface:
                    fields = rest.split()
                    return int(fields[0]), int(fields[8])
    except OSError:
        pass
    return 0, 0


def batches(n, batch_size, seed, epoch):
    """Index batches of one epoch over a shard of n examples: the same on every run."""
    g = torch.Generator().manual_seed(seed * 1000 + epoch)
    perm = torch.randperm(n, generator=g)
    for b in range(n // batch_size):
        yield perm[b * batch_size:(b + 1) * batch_size]


def compute_ms(model, x, y, batch_size, steps=20):
    """Median ms of one forward and backward of `model` alone (no exchange, no optimizer) on
    this machine: the compute part of a step, which a race's step time is compared with."""
    times = []
    for i in range(steps + 3):
        idx = slice((i * batch_size) % max(1, len(x) - batch_size),
                    (i * batch_size) % max(1, len(x) - batch_size) + batch_size)
        t0 = time.perf_counter()
        model.zero_grad()
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        times.append(time.perf_counter() - t0)
    times = sorted(times[3:])
    return 1e3 * times[len(times) // 2]

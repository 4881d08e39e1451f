#!/usr/bin/python3
"""Data-parallel character-level LSTM language model through adaps (AdaComp by default).

    /usr/bin/python3 -m adaps.launch -n 2 --server-optimizer adam \\
        examples/pytorch/train_char_lstm.py
    /usr/bin/python3 -m adaps.launch -n 2 --server-optimizer mean \\
        examples/pytorch/train_char_lstm.py --steps 3000 --seq-len 64 --batch-size 32 --hidden 256

The text is the licence texts Debian ships in /usr/share/common-licenses (GPL-3,
Apache-2.0, LGPL-3, MPL-2.0, GFDL-1.3 concatenated, about 94 KB); the last 10% is held out.
Covers recurrent layers as the AdaComp paper does (bin size 500 for LSTM, embedding and
linear layers). Prints training loss and held-out bits per character, a sample of generated
text, and the compression per layer type. With --server-optimizer adam the servers run Adam
with this script's hyper-parameters; with mean the local torch Adam steps.
"""
import argparse
import math
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import adaps
import adaps.torch

LICENSES = ["GPL-3", "Apache-2.0", "LGPL-3", "MPL-2.0", "GFDL-1.3"]


def load_text(directory, names):
    parts = []
    for n in names:
        with open(os.path.join(directory, n), encoding="utf-8", errors="replace") as f:
            parts.append(f.read())
    return "\n".join(parts)


class CharLSTM(nn.Module):
    def __init__(self, vocab, embed, hidden):
        super().__init__()
        self.embed = nn.Embedding(vocab, embed)
        self.lstm = nn.LSTM(embed, hidden, batch_first=True)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, x, state=None):
        h, state = self.lstm(self.embed(x), state)
        return self.out(h), state


def held_out_bpc(model, data, seq_len, sequences=32):
    model.eval()
    n = (len(data) - 1) // seq_len
    n = min(n, sequences)
    x = data[:n * seq_len].view(n, seq_len)
    y = data[1:n * seq_len + 1].view(n, seq_len)
    with torch.no_grad():
        logits, _ = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
    model.train()
    return loss.item() / math.log(2)


def sample(model, itos, stoi, prompt="The ", length=120):
    model.eval()
    x = torch.tensor([[stoi[c] for c in prompt if c in stoi]])
    out, state = list(prompt), None
    with torch.no_grad():
        logits, state = model(x, state)
        for _ in range(length):
            probs = F.softmax(logits[0, -1] / 0.8, dim=0)
            c = torch.multinomial(probs, 1).item()
            out.append(itos[c])
            logits, state = model(torch.tensor([[c]]), state)
    model.train()
    return "".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--seq-len", type=int, default=48)
    ap.add_argument("--batch-size", type=int, default=16, help="per worker")
    ap.add_argument("--embed", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--lr", type=float, default=5e-3)
    ap.add_argument("--clip", type=float, default=1.0,
                    help="gradient-norm clip (local mode only: applied to this worker's own "
                         "gradient with the default update exchange, to the mean gradient "
                         "with --exchange gradient)")
    ap.add_argument("--compression", default=None,
                    help="default: adaps.launch --compression, else adacomp")
    ap.add_argument("--bin-size", type=int, default=None, help="default 500")
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--text-dir", default="/usr/share/common-licenses")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()

    torch.manual_seed(a.seed)
    if "OMP_NUM_THREADS" in os.environ:
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    text = load_text(a.text_dir, LICENSES)
    itos = sorted(set(text))
    stoi = {c: i for i, c in enumerate(itos)}
    data = torch.tensor([stoi[c] for c in text], dtype=torch.int64)
    split = int(len(data) * 0.9)
    train, valid = data[:split], data[split:]

    worker = adaps.worker_from_env()
    rank, size = worker.rank, worker.num_workers
    model = CharLSTM(len(itos), a.embed, a.hidden)
    base = torch.optim.Adam(model.parameters(), lr=a.lr)
    opt = adaps.torch.DistributedOptimizer(base, model, worker, compression=a.compression,
                                           bin_size=a.bin_size)
    print("rank %d/%d: %d characters (vocabulary %d), mode %s, compression %s" %
          (rank, size, len(data), len(itos), opt.mode, opt.compression), flush=True)
    print("held-out bits/char before training %.3f" % held_out_bpc(model, valid, a.seq_len),
          flush=True)

    gen = torch.Generator().manual_seed(a.seed * 1000 + rank)
    start, running = time.time(), 0.0
    for step in range(1, a.steps + 1):
        starts = torch.randint(0, len(train) - a.seq_len - 1, (a.batch_size,), generator=gen)
        x = torch.stack([train[s:s + a.seq_len] for s in starts.tolist()])
        y = torch.stack([train[s + 1:s + a.seq_len + 1] for s in starts.tolist()])
        opt.zero_grad()
        logits, _ = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        loss.backward()
        if opt.mode == "local" and a.clip > 0:
            opt.synchronize()  # exchange="gradient": p.grad becomes the mean; else stays own
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        opt.step()
        running += loss.item()
        if step % a.log_every == 0:
            opt.exchange_now()  # local steps: every worker evaluates the job's model
            print("step %5d  train loss %.3f  held-out bits/char %.3f  (%.1f s)" %
                  (step, running / a.log_every, held_out_bpc(model, valid, a.seq_len),
                   time.time() - start), flush=True)
            running = 0.0
    opt.exchange_now()
    bpc = held_out_bpc(model, valid, a.seq_len)
    if rank == 0:
        print("sample: %r" % sample(model, itos, stoi), flush=True)
    print("compression by layer type (rank %d):\n%s" % (rank, opt.traffic_report()),
          flush=True)
    print("final held-out bits/char %.3f" % bpc, flush=True)
    worker.stop()


if __name__ == "__main__":
    main()

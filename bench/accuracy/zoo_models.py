"""The accuracy zoo's models, data and recipes (bench/accuracy/zoo.py runs them).

Each entry of MODELS builds a task: the model, its torch optimizer and learning-rate
schedule (a function of the step), the batches of one worker, and the held-out metric.
Every task is deterministic given the seed: the same initial values (rank 0's, broadcast),
the same batches per rank and the same schedule for every system compared.

  mlp    Fashion-MNIST, 784-256-10 MLP, SGD momentum 0.9, cosine         test accuracy
  cnn    Fashion-MNIST, 2 conv + BatchNorm + fc, SGD momentum 0.9, cosine test accuracy
  lstm   char-level LSTM LM (examples/pytorch/train_char_lstm.py), Adam   held-out bits/char
  gpt    char-level causal transformer (2 blocks of nn.MultiheadAttention held-out bits/char
         + MLP), AdamW (weight decay 0.01), linear warm-up then cosine,
         gradient clipping at 1.0
  embed  next-word model over hashed word n-grams: nn.EmbeddingBag of     held-out bits/word
         65,536 rows (most of the gradient; rows a step does not touch
         get zero gradient) + a linear softmax over the 1,000 most
         common words, Adam
  gru    a model the defaults were not tuned on (added after them, as a    held-out bits/char
         check): char-level 2-layer GRU LM + LayerNorm, AdamW (weight
         decay 0.05), 5% warm-up then cosine, clipping at 0.5
  wordgpt a third check, added after the defaults: a word-level      held-out bits/word
         causal transformer whose output layer is tied to its 2,000-row
         token embedding (GPT-2's layout), AdamW in two param groups,
         10% warm-up then cosine, clipping at 1.0
  mlp-adam, cnn-adam  the guard: the mlp and cnn trained with Adam   test accuracy
         (lr 1e-3, cosine) instead of SGD, where a setting that helps
         the language models can cost the 0.3 pp bound
  vit    a second check, added after the defaults: a small vision          test accuracy
         transformer on Fashion-MNIST (7x7 patches, class token, 2 blocks
         of width 64), AdamW in two param groups (weight decay 0.05; none
         on biases, norms and position embeddings), 10% warm-up then
         cosine, clipping at 1.0
  gpt128 a fourth check, added after the defaults: the zoo's own      held-out bits/char
         transformer (the gpt above at width 128, Adam lr 3e-3 with a
         cosine schedule and no warm-up, clipping at 1.0, batch 16)
  lstm-rmsprop, lstm-adagrad, cnn-rmsprop, cnn-adagrad  checks of      held-out bits/char,
         optimizers other than Adam and SGD (added with their defaults):   test accuracy
         the lstm with RMSprop (lr 2e-3) or Adagrad (lr 2e-2), cosine,
         clipping at 1.0; the cnn with RMSprop (lr 1e-3) or Adagrad
         (lr 0.02), cosine; lstm-nadam, lstm-radam: the lstm with NAdam
         or RAdam (lr 5e-3)
  mlp-sgd, cnn-sgd, lstm-sgd  plain-SGD checks: the mlp, cnn and lstm     test accuracy,
         with torch.optim.SGD and no momentum (lr 0.3, 0.2, 1.0), cosine,  held-out bits/char
         the lstm clipped at 1.0 (docs/accuracy.md "Plain SGD"); gru-sgd: a
         blind check added after those defaults, the gru with plain SGD
         (lr 1.0, 5% warm-up then cosine, clipping at 0.5)
  encoder a blind check added 2026-12-04 (the defaults as they were):  test accuracy
         BERT's shape, small: which of the ten licences a window of 32
         words comes from; word embeddings (2,000 words) and learned
         positions, 2 pre-norm nn.TransformerEncoder layers of width 64
         (dropout 0.1), mean pooling, AdamW in two param groups (weight
         decay 0.01 on matrices), 10% warm-up then cosine, clipping at 1.0
  nanogpt a blind check added 2026-12-05 (the defaults as they were):  held-out bits/char
         nanoGPT's model and shakespeare_char recipe scaled down: 4 blocks
         of width 64, context 64, no biases, dropout 0.2, tied embedding;
         AdamW 1e-3, betas (0.9, 0.99), weight decay 0.1 on every matrix,
         2% warm-up then cosine to lr / 10, clipping at 1.0
  moe    a blind check added 2026-12-05: the gpt with Switch-MoE MLPs  held-out bits/char
         (4 experts, top-1 routing, load-balancing loss at 0.01), the
         gpt's AdamW recipe

Text: the licence texts of Debian's base-files (/usr/share/common-licenses: GPL-3,
Apache-2.0, LGPL-3, MPL-2.0, GFDL-1.3, Artistic, GPL-2, LGPL-2.1, MPL-1.1, CC0-1.0; 303 KB),
the last 10% held out. Images: Debian's dataset-fashion-mnist.
"""
import collections
import gzip
import math
import os
import re
import struct
import tempfile
import zlib

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

FMNIST = "/usr/share/datasets/fashion-mnist"
LICENSES = ["GPL-3", "Apache-2.0", "LGPL-3", "MPL-2.0", "GFDL-1.3", "Artistic", "GPL-2",
            "LGPL-2.1", "MPL-1.1", "CC0-1.0"]
LICENSE_DIR = "/usr/share/common-licenses"
# The language models' text: the licences above, or the files given to zoo.py --text.
TEXT_FILES = [os.path.join(LICENSE_DIR, n) for n in LICENSES]
# "recipe": each model's own schedule; "constant" (zoo.py --schedule constant): the peak
# learning rate after the recipe's warm-up, never decayed (a plain `Adam(lr=1e-3)` loop);
# "step": after the warm-up, the peak divided by 10 at half the steps and again at three
# quarters (torch's MultiStepLR with gamma 0.1, the classic ResNet recipe's shape);
# "wsd": warm-up-stable-decay, what most language-model recipes now use: a linear warm-up
# over the first 5% of the steps, the peak held to 80%, then a linear decay to 0.
SCHEDULES = ("recipe", "constant", "step", "wsd")
SCHEDULE = "recipe"
# The Fashion-MNIST models but dwnet are scored on the first this many of the 10,000 test
# images (zoo.py --test-size): 2,000 by default. An accuracy near 0.89 on 2,000 images has a
# sampling error of 0.7 pp (0.3 on all 10,000), and one ViT setting run twice ended 0.9 pp
# apart on them: where a gap of a few tenths matters, score on all.
IMAGE_TEST_SIZE = 2000


def _step_factor(step, steps):
    """--schedule step: 0.1 per milestone passed (steps // 2, 3 * steps // 4)."""
    return 0.1 ** sum(step >= m for m in (steps // 2, 3 * steps // 4))


def _wsd(lr, step, steps):
    """--schedule wsd: 5% warm-up, the peak to 80% of the steps, a linear decay to 0."""
    warm, stable = max(1, int(round(0.05 * steps))), int(0.8 * steps)
    if step < warm:
        return lr * (step + 1) / warm
    if step < stable:
        return lr
    return lr * max(0.0, (steps - step) / max(1, steps - stable))


def _read_idx(path):
    with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
        data = f.read()
    ndim = struct.unpack(">I", data[:4])[0] & 0xFF
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def fashion_mnist(split, rows=slice(None)):
    """Fashion-MNIST's images (normalized, N x 1 x 28 x 28) and labels; rows picks the
    images before they become floats, so a worker of 64 holds its shard (3 MB), not the
    188 MB of the whole training set."""
    prefix = "train" if split == "train" else "t10k"

    def find(name):
        for cand in (name + ".gz", name):
            if os.path.exists(os.path.join(FMNIST, cand)):
                return os.path.join(FMNIST, cand)
        raise SystemExit("missing %s in %s (apt-get install dataset-fashion-mnist)"
                         % (name, FMNIST))
    x = torch.from_numpy(_read_idx(find(prefix + "-images-idx3-ubyte"))[rows]
                         .astype(np.float32))
    x = ((x / 255.0 - 0.2860) / 0.3530).unsqueeze(1)
    y = torch.from_numpy(_read_idx(find(prefix + "-labels-idx1-ubyte"))[rows]
                         .astype(np.int64))
    return x, y


def corpus_text():
    parts = []
    for path in TEXT_FILES:
        with open(path, encoding="utf-8", errors="replace") as f:
            parts.append(f.read())
    return "\n".join(parts)


def _warmed(lr, steps, warmup, decay):
    """A linear warm-up over `warmup` steps, then decay(t) * lr with t from 0 to 1 (or what
    --schedule says instead: constant, step)."""
    def at(step):
        if SCHEDULE == "wsd":
            return _wsd(lr, step, steps)
        if step < warmup:
            return lr * (step + 1) / warmup
        if SCHEDULE == "constant":
            return lr
        if SCHEDULE == "step":
            return lr * _step_factor(step, steps)
        return lr * decay((step - warmup) / max(1, steps - warmup))
    return at


def cosine(lr, steps, warmup=0):
    return _warmed(lr, steps, warmup, lambda t: 0.5 * (1.0 + math.cos(math.pi * t)))


# -- models ----------------------------------------------------------------------------
class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(784, 256), nn.Linear(256, 10)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


class Cnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(1, 16, 5, padding=2), nn.BatchNorm2d(16)
        self.conv2, self.bn2 = nn.Conv2d(16, 32, 5, padding=2), nn.BatchNorm2d(32)
        self.fc = nn.Linear(32 * 7 * 7, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return self.fc(x.flatten(1))


class CharLstm(nn.Module):
    def __init__(self, vocab, embed=32, hidden=128):
        super().__init__()
        self.embed = nn.Embedding(vocab, embed)
        self.lstm = nn.LSTM(embed, hidden, batch_first=True)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, x):
        return self.out(self.lstm(self.embed(x))[0])


class CharGru(nn.Module):
    def __init__(self, vocab, embed=48, hidden=96):
        super().__init__()
        self.embed = nn.Embedding(vocab, embed)
        self.gru = nn.GRU(embed, hidden, num_layers=2, batch_first=True)
        self.norm = nn.LayerNorm(hidden)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, x):
        return self.out(self.norm(self.gru(self.embed(x))[0]))


class WordLstm(nn.Module):
    """PyTorch's word_language_model example (RNNModel, LSTM, --tied): a 2-layer LSTM of
    200 units over 200-wide word embeddings, dropout 0.2, the output layer tied to the
    embedding."""
    def __init__(self, vocab, width=200, dropout=0.2):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(vocab, width)
        self.rnn = nn.LSTM(width, width, num_layers=2, dropout=dropout, batch_first=True)
        self.decoder = nn.Linear(width, vocab)
        self.decoder.weight = self.encoder.weight
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)

    def forward(self, x):
        return self.decoder(self.drop(self.rnn(self.drop(self.encoder(x)))[0]))


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class CharGpt(nn.Module):
    def __init__(self, vocab, d=64, layers=2, heads=4, ctx=32, block=Block):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(block(d, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, x):
        n = x.shape[1]
        mask = torch.triu(torch.full((n, n), float("-inf")), 1)
        h = self.tok(x) + self.pos(torch.arange(n))
        for b in self.blocks:
            h = b(h, mask)
        return self.head(self.ln(h))


class SwitchMlp(nn.Module):
    """A Switch Transformer's sparse MLP: a router sends each token to one of `experts` GELU
    MLPs (top-1, the output scaled by the router's probability); `aux` is the step's load-
    balancing loss (experts x the sum over experts of the fraction of tokens routed there
    times the mean router probability), which the task adds to the loss at 0.01."""
    def __init__(self, d, experts=4, hidden=2):
        super().__init__()
        self.router = nn.Linear(d, experts, bias=False)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(d, hidden * d), nn.GELU(), nn.Linear(hidden * d, d))
            for _ in range(experts))
        self.aux = torch.zeros(())

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        probs = self.router(x).softmax(-1)
        gate, choice = probs.max(-1)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            sel = choice == e
            if sel.any():
                out[sel] = expert(x[sel]) * gate[sel].unsqueeze(1)
        routed = torch.bincount(choice, minlength=len(self.experts)).float() / x.shape[0]
        self.aux = len(self.experts) * (routed * probs.mean(0)).sum()
        return out.view(shape)


class MoeBlock(Block):
    """The gpt's block with its MLP replaced by a Switch MLP of 4 experts."""
    def __init__(self, d, heads):
        super().__init__(d, heads)
        self.mlp = SwitchMlp(d)


class MoeGpt(CharGpt):
    """The char-level gpt (width 64, 2 blocks, context 32) with sparse MoE MLPs: each token's
    MLP is one of 4 experts, so an expert's weights get gradient only from the tokens routed
    to it."""
    def __init__(self, vocab, d=64, layers=2, heads=4, ctx=32):
        super().__init__(vocab, d, layers, heads, ctx, block=MoeBlock)

    def aux_loss(self):
        return sum(b.mlp.aux for b in self.blocks)


class NanoGptBlock(nn.Module):
    """nanoGPT's block: pre-norm LayerNorms without bias, causal self-attention from one
    fused q/k/v projection, a GELU MLP of 4x, dropout on the attention and the residuals."""
    def __init__(self, d, heads, dropout):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.ln1.bias, self.ln2.bias = None, None
        self.c_attn = nn.Linear(d, 3 * d, bias=False)
        self.attn_proj = nn.Linear(d, d, bias=False)
        self.fc = nn.Linear(d, 4 * d, bias=False)
        self.mlp_proj = nn.Linear(4 * d, d, bias=False)
        self.drop = nn.Dropout(dropout)

    def forward(self, x, mask):
        b, n, d = x.shape
        q, k, v = self.c_attn(self.ln1(x)).split(d, dim=2)
        q, k, v = (t.view(b, n, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        a = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads) + mask
        y = (self.drop(a.softmax(-1)) @ v).transpose(1, 2).reshape(b, n, d)
        x = x + self.drop(self.attn_proj(y))
        return x + self.drop(self.mlp_proj(F.gelu(self.fc(self.ln2(x)))))


class NanoGpt(nn.Module):
    """nanoGPT's model (Karpathy's GPT class) scaled down: 4 blocks of width 64, 4 heads,
    context 64, dropout 0.2, no biases, the output layer tied to the token embedding, normal
    initial values of std 0.02 (0.02 / sqrt(2 * layers) for the residual projections)."""
    def __init__(self, vocab, d=64, layers=4, heads=4, ctx=64, dropout=0.2):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(NanoGptBlock(d, heads, dropout) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.ln.bias = None
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, x):
        n = x.shape[1]
        mask = torch.triu(torch.full((n, n), float("-inf")), 1)
        h = self.drop(self.tok(x) + self.pos(torch.arange(n)))
        for b in self.blocks:
            h = b(h, mask)
        return self.head(self.ln(h))


class CharTcn(nn.Module):
    """A temporal convolutional network: dilated causal Conv1d blocks (kernel 3, dilations
    1, 2, 4, 8), each pre-normed per position (LayerNorm: nothing of the future) with a
    residual connection, over character embeddings."""

    def __init__(self, vocab, d=96, dilations=(1, 2, 4, 8)):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.convs = nn.ModuleList(nn.Conv1d(d, d, 3, dilation=k) for k in dilations)
        self.norms = nn.ModuleList(nn.LayerNorm(d) for _ in dilations)
        self.ln, self.out = nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, x):
        h = self.embed(x)  # (batch, time, d)
        for conv, norm in zip(self.convs, self.norms):
            pad = 2 * conv.dilation[0]  # causal: only the past
            h = h + F.gelu(conv(F.pad(norm(h).transpose(1, 2), (pad, 0)))).transpose(1, 2)
        return self.out(self.ln(h))


class WordGpt(CharGpt):
    """CharGpt with its output layer tied to the token embedding (no bias)."""

    def __init__(self, vocab, d=64, ctx=32):
        super().__init__(vocab, d=d, ctx=ctx)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight
        nn.init.normal_(self.tok.weight, std=0.02)  # GPT-2's: logits start near uniform


class TinyVit(nn.Module):
    """7x7 patches of a 28x28 image (16 tokens) and a class token, 2 pre-norm blocks."""

    def __init__(self, d=64, layers=2, heads=4, patch=7):
        super().__init__()
        self.patch = patch
        self.embed = nn.Linear(patch * patch, d)
        self.cls = nn.Parameter(torch.zeros(1, 1, d))
        self.pos = nn.Parameter(torch.randn(1, (28 // patch) ** 2 + 1, d) * 0.02)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, 10)

    def forward(self, x):
        p = self.patch
        x = x.view(-1, 28 // p, p, 28 // p, p).permute(0, 1, 3, 2, 4).flatten(3).flatten(1, 2)
        h = torch.cat([self.cls.expand(x.shape[0], -1, -1), self.embed(x)], 1) + self.pos
        for b in self.blocks:
            h = b(h, None)
        return self.head(self.ln(h[:, 0]))


class Mixer(nn.Module):
    """MLP-Mixer: 4x4 patches (49 tokens), 3 blocks of a token-mixing MLP (across patches)
    and a channel-mixing MLP, pre-norm, width 64, mean pooling."""

    def __init__(self, d=64, layers=3, patch=4):
        super().__init__()
        self.patch, tokens = patch, (28 // patch) ** 2
        self.embed = nn.Linear(patch * patch, d)
        self.norms1 = nn.ModuleList(nn.LayerNorm(d) for _ in range(layers))
        self.norms2 = nn.ModuleList(nn.LayerNorm(d) for _ in range(layers))
        self.tokens = nn.ModuleList(
            nn.Sequential(nn.Linear(tokens, 2 * tokens), nn.GELU(), nn.Linear(2 * tokens, tokens))
            for _ in range(layers))
        self.channels = nn.ModuleList(
            nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
            for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, 10)

    def forward(self, x):
        p = self.patch
        x = x.view(-1, 28 // p, p, 28 // p, p).permute(0, 1, 3, 2, 4).flatten(3).flatten(1, 2)
        h = self.embed(x)  # (batch, tokens, d)
        for n1, tok, n2, ch in zip(self.norms1, self.tokens, self.norms2, self.channels):
            h = h + tok(n1(h).transpose(1, 2)).transpose(1, 2)
            h = h + ch(n2(h))
        return self.head(self.ln(h).mean(1))


class ResBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.b2(self.c2(F.relu(self.b1(self.c1(x)))))
        return F.relu(y + (x if self.down is None else self.down(x)))


class ResNet(nn.Module):
    """A small ResNet (a 16-channel stem, three basic blocks of 16, 32, 64 channels, global
    average pooling): the CIFAR recipe's layout at Fashion-MNIST's size."""
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16))
        self.blocks = nn.Sequential(ResBlock(16, 16, 1), ResBlock(16, 32, 2),
                                    ResBlock(32, 64, 2))
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        x = self.blocks(F.relu(self.stem(x)))
        return self.fc(x.mean((2, 3)))


class DwNet(nn.Module):
    """MobileNet's block: a 3x3 stem of 32 channels, then three depthwise-separable blocks
    (a depthwise 3x3 convolution and a pointwise 1x1 one, BatchNorm and SiLU after each;
    32 -> 64 -> 128 -> 128 channels, strides 2, 2, 1), global average pooling, a linear head."""
    def __init__(self):
        super().__init__()

        def conv(cin, cout, k, stride=1, groups=1):
            return [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
                    nn.BatchNorm2d(cout), nn.SiLU()]
        layers = conv(1, 32, 3)
        for cin, cout, stride in ((32, 64, 2), (64, 128, 2), (128, 128, 1)):
            layers += conv(cin, cin, 3, stride, groups=cin) + conv(cin, cout, 1)
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(128, 10)

    def forward(self, x):
        return self.fc(self.features(x).mean((2, 3)))


class AutoEncoder(nn.Module):
    """784-256-32-256-784: reconstruction of the (normalized) image, a regression loss."""
    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(784, 256), nn.GELU(), nn.Linear(256, 32))
        self.dec = nn.Sequential(nn.Linear(32, 256), nn.GELU(), nn.Linear(256, 784))

    def forward(self, x):
        return self.dec(self.enc(x.flatten(1)))


def one_cycle(lr, steps, warm=0.3):
    """OneCycleLR's shape: lr / 25 rising linearly to lr over the first 30%, then a cosine
    to lr / 1e4."""
    up = max(1, int(steps * warm))

    def at(step):
        if SCHEDULE == "wsd":
            return _wsd(lr, step, steps)
        if step < up:
            return lr / 25 + (lr - lr / 25) * step / up
        if SCHEDULE == "constant":
            return lr
        if SCHEDULE == "step":
            return lr * _step_factor(step, steps)
        t = (step - up) / max(1, steps - up)
        return lr / 1e4 + (lr - lr / 1e4) * 0.5 * (1.0 + math.cos(math.pi * t))
    return at


def _decay_groups(model, weight_decay):
    """Weight decay on matrices only (biases, norms, embeddings of positions: none), as
    most transformer recipes do: two param groups."""
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "pos" not in n]
    other = [p for n, p in model.named_parameters() if p.dim() < 2 or "pos" in n]
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": other, "weight_decay": 0.0}]


class TextEncoder(nn.Module):
    """BERT's shape, small: character embeddings and learned positions, pre-norm
    nn.TransformerEncoder layers (dropout 0.1), mean pooling, a linear classifier."""

    def __init__(self, vocab, classes, d=64, layers=2, heads=4, ctx=128):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        layer = nn.TransformerEncoderLayer(d, heads, dim_feedforward=4 * d, dropout=0.1,
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers)
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, classes)

    def forward(self, x):
        h = self.tok(x) + self.pos(torch.arange(x.shape[1]))
        return self.head(self.ln(self.encoder(h)).mean(1))


class HashedNgram(nn.Module):
    """Next word from the hashed unigram, bigram and trigram before it (fastText-style)."""

    def __init__(self, rows, dim, vocab):
        super().__init__()
        self.bag = nn.EmbeddingBag(rows, dim, mode="mean")
        self.out = nn.Linear(dim, vocab)

    def forward(self, feats):
        return self.out(self.bag(feats))


# -- tasks -----------------------------------------------------------------------------
class Task:
    """model, optimizer, lr_at(step), batch(step) -> (x, y), evaluate() -> metric."""
    higher_is_better = False
    metric = "bits"


def _lm_batches(task, train, seq_len, batch, rank, seed):
    gen = torch.Generator().manual_seed(seed * 1000 + rank)

    def batch_at(step):
        starts = torch.randint(0, len(train) - seq_len - 1, (batch,), generator=gen).tolist()
        x = torch.stack([train[s:s + seq_len] for s in starts])
        y = torch.stack([train[s + 1:s + seq_len + 1] for s in starts])
        return x, y
    task.batch = batch_at


def _lm_eval(task, valid, seq_len, sequences):
    n = min((len(valid) - 1) // seq_len, sequences)
    x = valid[:n * seq_len].view(n, seq_len)
    y = valid[1:n * seq_len + 1].view(n, seq_len)

    def evaluate():
        task.model.eval()
        with torch.no_grad():
            loss = F.cross_entropy(task.model(x).flatten(0, 1), y.flatten())
        task.model.train()
        return loss.item() / math.log(2)
    task.evaluate = evaluate


def _words(text):
    """The word models' tokens: lower-case words, numbers, and each other visible character."""
    return re.findall(r"[a-z]+|[0-9]+|[^\sa-z0-9]", text.lower())


def _word_index(words, size):
    """The size - 1 commonest words numbered from 1 (0: any other word)."""
    common = collections.Counter(words).most_common(size - 1)
    return {w: i + 1 for i, (w, _) in enumerate(common)}


def _accuracy_eval(task, x, y):
    """task.evaluate: the model's accuracy on (x, y), in eval mode."""
    def evaluate():
        task.model.eval()
        with torch.no_grad():
            acc = (task.model(x).argmax(1) == y).float().mean().item()
        task.model.train()
        return acc
    task.evaluate = evaluate
    task.higher_is_better, task.metric = True, "accuracy"


def _chars():
    text = corpus_text()
    itos = sorted(set(text))
    stoi = {c: i for i, c in enumerate(itos)}
    data = torch.tensor([stoi[c] for c in text], dtype=torch.int64)
    split = int(len(data) * 0.9)
    return data[:split], data[split:], len(itos)


def _fmnist_task(task, model, rank, workers, seed, steps, batch, lr, train_size, test_size,
                 opt_cls=None):
    xs, ys = fashion_mnist("train", slice(rank, train_size, workers))
    xt, yt = fashion_mnist("test", slice(test_size))
    task.model = model
    if opt_cls is not None:  # the -adam, -adagrad, -rmsprop variants: that optimizer, cosine
        task.optimizer = opt_cls(model.parameters(), lr=lr)
        task.lr_at = cosine(lr, steps)
    elif isinstance(model, (TinyVit, Mixer)):
        task.optimizer = torch.optim.AdamW(_decay_groups(model, 0.05), lr=lr)
        task.lr_at = cosine(lr, steps, warmup=max(1, steps // 10))
        task.clip = 1.0
    else:
        task.optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
        task.lr_at = cosine(lr, steps)
    gen = torch.Generator().manual_seed(seed * 1000 + rank)
    order = [torch.randperm(len(xs), generator=gen)]
    pos = [0]

    def batch_at(step):
        if pos[0] + batch > len(xs):
            order[0], pos[0] = torch.randperm(len(xs), generator=gen), 0
        idx = order[0][pos[0]:pos[0] + batch]
        pos[0] += batch
        return xs[idx], ys[idx]
    task.batch = batch_at
    _accuracy_eval(task, xt, yt)
    task.loss = F.cross_entropy


# The Fashion-MNIST models trained with another optimizer than their own (cosine each).
_FMNIST_OPTIMIZERS = {"mlp-adam": (torch.optim.Adam, 1e-3), "cnn-adam": (torch.optim.Adam, 1e-3),
                      "cnn-adagrad": (torch.optim.Adagrad, 0.02),
                      "cnn-rmsprop": (torch.optim.RMSprop, 1e-3),
                      "mlp-sgd": (torch.optim.SGD, 0.3), "cnn-sgd": (torch.optim.SGD, 0.2)}
# The char-LSTM's optimizer and learning rate (cosine, clipping at 1.0 with each).
_LSTM_OPTIMIZERS = {"lstm": (torch.optim.Adam, 5e-3), "lstm-rmsprop": (torch.optim.RMSprop, 2e-3),
                    "lstm-adagrad": (torch.optim.Adagrad, 2e-2),
                    "lstm-nadam": (torch.optim.NAdam, 5e-3), "lstm-radam": (torch.optim.RAdam, 5e-3),
                    "lstm-sgd": (torch.optim.SGD, 1.0)}


def _adamw_recipe(task, model, steps, lr, weight_decay, warm, clip):
    """AdamW on every parameter, a linear warm-up over steps / warm then cosine, clipping."""
    task.model = model
    task.optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    task.lr_at = cosine(lr, steps, warmup=max(1, steps // warm))
    task.clip = clip


def linear_warmup_decay(lr, steps, warmup):
    """Hugging Face's get_linear_schedule_with_warmup: up over `warmup` steps, then
    linearly to 0 at `steps`."""
    return _warmed(lr, steps, warmup, lambda t: max(0.0, 1.0 - t))


# The fine-tuning checks: the model, its head's attribute, and its pretraining recipe
# (optimizer over the model, learning rate, warm-up fraction, clipping).
_FINETUNE = {
    "finetune": (TinyVit, "head",
                 lambda m: torch.optim.AdamW(_decay_groups(m, 0.05), lr=2e-3), 2e-3, 10, 1.0),
    "finetune-resnet": (ResNet, "fc",
                        lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9,
                                                  weight_decay=5e-4), 0.1, 0, 0.0),
}


def _pretrained(name, seed, quick):
    """The model trained (densely, in this process) on the Fashion-MNIST classes 0-4, its
    head replaced by a fresh one for 5 classes: a fine-tuning check's starting point."""
    cls, head, make_opt, lr, warm, clip = _FINETUNE[name]
    x, y = fashion_mnist("train")
    keep = y < 5
    x, y = x[keep], y[keep]
    model = cls()
    steps = 40 if quick else 400
    opt = make_opt(model)
    lr_at = cosine(lr, steps, warmup=steps // warm if warm else 0)
    gen = torch.Generator().manual_seed(10_000 + seed)
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        idx = torch.randint(0, len(x), (64,), generator=gen)
        opt.zero_grad()
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        if clip:
            nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
    setattr(model, head, nn.Linear(getattr(model, head).in_features, 5))
    return model


def _finetune_task(task, name, rank, workers, seed, steps, quick):
    # Blind checks added after the last default changed: fine-tuning a pretrained model,
    # the way most users start. Rank 0 pretrains (its values are everyone's at start); the
    # others build a model of the same shape. Fine-tuned on the other five classes, the
    # vision transformer with a Hugging Face Trainer's recipe (AdamW 5e-4, weight decay 0.01
    # on matrices, linear warm-up over 10% then linear decay to 0, clipping at 1.0), the
    # ResNet with torchvision's transfer-learning one (SGD 0.01, momentum 0.9, weight decay
    # 1e-4, cosine); batch 32 a worker.
    cls, head = _FINETUNE[name][:2]
    model = cls()
    setattr(model, head, nn.Linear(getattr(model, head).in_features, 5))
    if rank == 0:
        # (Kept in the temporary directory: the dense and the AdaComp runs of a seed start
        # from the same weights, pretrained once, about a minute.)
        cache = os.path.join(tempfile.gettempdir(), "adaps-zoo-%s-s%d%s.pt"
                             % (name, seed, "-quick" if quick else ""))
        if os.path.exists(cache):
            model.load_state_dict(torch.load(cache))
        else:
            model = _pretrained(name, seed, quick)
            torch.save(model.state_dict(), cache + ".tmp")
            os.replace(cache + ".tmp", cache)
    x, y = fashion_mnist("train")
    keep = y >= 5
    x, y = x[keep], y[keep] - 5
    xs, ys = x[rank::workers], y[rank::workers]
    xt, yt = fashion_mnist("test")
    keep = yt >= 5
    xt, yt = xt[keep], yt[keep] - 5
    if quick:
        xt, yt = xt[:500], yt[:500]
    task.model = model
    if name == "finetune":
        task.optimizer = torch.optim.AdamW(_decay_groups(model, 0.01), lr=5e-4)
        task.lr_at = linear_warmup_decay(5e-4, steps, max(1, steps // 10))
        task.clip = 1.0
    else:
        task.optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9,
                                         weight_decay=1e-4)
        task.lr_at = cosine(0.01, steps)
    gen = torch.Generator().manual_seed(seed * 1000 + rank)

    def batch_at(step):
        idx = torch.randint(0, len(xs), (32,), generator=gen)
        return xs[idx], ys[idx]
    task.batch = batch_at
    _accuracy_eval(task, xt, yt)
    task.loss = F.cross_entropy


def make_task(name, rank, workers, seed, steps, quick=False):
    torch.manual_seed(seed)  # rank 0's initial values are broadcast; same on every rank
    task = Task()
    task.name = name
    task.clip = 0.0
    if name in _FINETUNE:
        _finetune_task(task, name, rank, workers, seed, steps, quick)
        return task
    if name == "resnet":
        _fmnist_task(task, ResNet(), rank, workers, seed, steps, batch=32, lr=0.1,
                     train_size=4000 if quick else 60000,
                     test_size=500 if quick else IMAGE_TEST_SIZE)
        task.optimizer = torch.optim.SGD(task.model.parameters(), lr=0.1, momentum=0.9,
                                         nesterov=True, weight_decay=5e-4)
        task.lr_at = one_cycle(0.1, steps)
        task.loss = lambda logits, y: F.cross_entropy(logits, y, label_smoothing=0.1)
        return task
    if name == "dwnet":
        # A blind check (added after the last default changed, run with the defaults as
        # they were): depthwise-separable convolutions, AdamW in two param groups, warm-up
        # then cosine, label smoothing; scored on all 10,000 test images.
        _fmnist_task(task, DwNet(), rank, workers, seed, steps, batch=32, lr=2e-3,
                     train_size=4000 if quick else 60000, test_size=500 if quick else 10000)
        task.optimizer = torch.optim.AdamW(_decay_groups(task.model, 0.05), lr=2e-3)
        task.lr_at = cosine(2e-3, steps, warmup=max(1, steps // 10))
        task.loss = lambda logits, y: F.cross_entropy(logits, y, label_smoothing=0.1)
        return task
    if name == "ae":
        _fmnist_task(task, AutoEncoder(), rank, workers, seed, steps, batch=32, lr=2e-3,
                     train_size=4000 if quick else 60000,
                     test_size=500 if quick else IMAGE_TEST_SIZE, opt_cls=torch.optim.Adam)
        xt = fashion_mnist("test")[0][:500 if quick else IMAGE_TEST_SIZE]

        def evaluate():
            task.model.eval()
            with torch.no_grad():
                mse = F.mse_loss(task.model(xt), xt.flatten(1)).item()
            task.model.train()
            return mse
        images = task.batch
        task.batch = lambda step: (lambda x: (x, x.flatten(1)))(images(step)[0])
        task.evaluate = evaluate
        task.loss = F.mse_loss
        task.higher_is_better, task.metric = False, "mse"
        return task
    if name in ("mlp", "cnn", "vit", "mixer") or name in _FMNIST_OPTIMIZERS:
        opt_cls, lr = _FMNIST_OPTIMIZERS.get(name, (None, None))
        model = {"mlp": Mlp, "cnn": Cnn, "vit": TinyVit, "mixer": Mixer}[name.split("-")[0]]()
        _fmnist_task(task, model, rank, workers, seed, steps, batch=32,
                     lr=lr or {"mlp": 0.1, "cnn": 0.05, "vit": 2e-3, "mixer": 2e-3}[name],
                     opt_cls=opt_cls,
                     train_size=4000 if quick else 60000,
                     test_size=500 if quick else IMAGE_TEST_SIZE)
        return task
    if name in ("gpt", "gru", "gru-sgd", "gpt128", "tcn", "nanogpt", "moe") or \
            name in _LSTM_OPTIMIZERS:
        train, valid, vocab = _chars()
        seq_len = 32 if name in ("gpt", "gpt128", "moe") else 48
        if name == "tcn":
            # Debian's torch 1.13 (oneDNN) returns infinite gradients for these dilated
            # Conv1d layers on some batches; the reference kernels do not.
            torch.backends.mkldnn.enabled = False
            seq_len = 64
            _adamw_recipe(task, CharTcn(vocab), steps, lr=2e-3, weight_decay=0.01, warm=20,
                          clip=1.0)
        elif name == "gru":
            seq_len = 40
            _adamw_recipe(task, CharGru(vocab), steps, lr=4e-3, weight_decay=0.05, warm=20,
                          clip=0.5)
        elif name == "gru-sgd":
            # A blind check of the plain-SGD defaults (added after them): the GRU with plain
            # SGD, a 5% warm-up then cosine, clipping at 0.5.
            seq_len = 40
            task.model = CharGru(vocab)
            task.optimizer = torch.optim.SGD(task.model.parameters(), lr=1.0)
            task.lr_at = cosine(1.0, steps, warmup=max(1, steps // 20))
            task.clip = 0.5
        elif name.startswith("lstm"):
            opt_cls, lr = _LSTM_OPTIMIZERS[name]
            task.model = CharLstm(vocab)
            task.optimizer = opt_cls(task.model.parameters(), lr=lr)
            task.lr_at = cosine(lr, steps)
            task.clip = 1.0
        elif name == "nanogpt":
            # A blind check (added 2026-12-05, the defaults as they were): nanoGPT's
            # shakespeare_char recipe, scaled down: AdamW lr 1e-3, betas (0.9, 0.99), weight
            # decay 0.1 on every matrix (the tied embedding included), 2% warm-up, then cosine
            # to lr / 10, clipping at 1.0.
            seq_len = 64
            task.model = NanoGpt(vocab, ctx=seq_len)
            decay = [p for p in task.model.parameters() if p.dim() >= 2]
            other = [p for p in task.model.parameters() if p.dim() < 2]
            task.optimizer = torch.optim.AdamW(
                [{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                lr=1e-3, betas=(0.9, 0.99))
            peak = cosine(1e-3 - 1e-4, steps, warmup=max(1, steps // 50))
            task.lr_at = lambda step: peak(step) + 1e-4 * min(1.0, (step + 1) / max(1, steps // 50))
            task.clip = 1.0
        elif name == "moe":
            # A blind check (added 2026-12-05, the defaults as they were): the gpt's recipe
            # (AdamW 3e-3 on every parameter, weight decay 0.01, 10% warm-up then cosine,
            # clipping at 1.0) on a Switch-MoE transformer, with the load-balancing loss.
            _adamw_recipe(task, MoeGpt(vocab, ctx=seq_len), steps, lr=3e-3, weight_decay=0.01,
                          warm=10, clip=1.0)
        elif name == "gpt128":
            task.model = CharGpt(vocab, d=128, ctx=seq_len)
            task.optimizer = torch.optim.Adam(task.model.parameters(), lr=3e-3)
            task.lr_at = cosine(3e-3, steps)
            task.clip = 1.0
        else:
            _adamw_recipe(task, CharGpt(vocab, ctx=seq_len), steps, lr=3e-3, weight_decay=0.01,
                          warm=10, clip=1.0)
        task.metric = "bits/char"
        _lm_batches(task, train, seq_len, 16, rank, seed)
        _lm_eval(task, valid, seq_len, 16 if quick else 64)
        task.loss = lambda logits, y: F.cross_entropy(logits.flatten(0, 1), y.flatten())
        if name == "moe":
            task.loss = lambda logits, y: F.cross_entropy(
                logits.flatten(0, 1), y.flatten()) + 0.01 * task.model.aux_loss()
        return task
    if name == "embed":
        return _embed_task(task, rank, seed, steps, quick)
    if name == "encoder":
        return _encoder_task(task, rank, seed, steps, quick)
    if name in ("wordgpt", "wordlstm"):
        words = _words(corpus_text())
        index = _word_index(words, 2000)
        data = torch.tensor([index.get(w, 0) for w in words], dtype=torch.int64)
        split = int(len(data) * 0.9)
        seq_len, batch = 32, 16
        if name == "wordlstm":
            # A blind check (added after the last default changed, run with the defaults as
            # they were): the recipe of PyTorch's word_language_model example, plain SGD
            # (no momentum) at lr 20 with clipping at 0.25, batch 20, 35 words a sequence;
            # the example divides lr by 4 when the held-out loss stops falling, which 300
            # steps never reach here: constant.
            task.model = WordLstm(len(index) + 1)
            task.optimizer = torch.optim.SGD(task.model.parameters(), lr=20.0)
            task.lr_at = lambda step: 20.0
            task.clip = 0.25
            seq_len, batch = 35, 20
        else:
            task.model = WordGpt(len(index) + 1)
            task.optimizer = torch.optim.AdamW(_decay_groups(task.model, 0.01), lr=3e-3)
            task.lr_at = cosine(3e-3, steps, warmup=max(1, steps // 10))
            task.clip = 1.0
        task.metric = "bits/word"
        _lm_batches(task, data[:split], seq_len, batch, rank, seed)
        _lm_eval(task, data[split:], seq_len, 16 if quick else 64)
        task.loss = lambda logits, y: F.cross_entropy(logits.flatten(0, 1), y.flatten())
        return task
    raise ValueError("unknown model %r" % name)


def _encoder_task(task, rank, seed, steps, quick, ctx=32, batch=16):
    """Which of the ten licences a window of 32 words comes from (words as wordgpt's: the
    2,000 commonest of the licences, 0 for any other): each licence's first 90% for
    training (a licence drawn uniformly, then a window), windows of its last 10% for the
    test (the same for every seed)."""
    texts = []
    for n in LICENSES:
        with open(os.path.join(LICENSE_DIR, n), encoding="utf-8", errors="replace") as f:
            texts.append(_words(f.read()))
    index = _word_index([w for t in texts for w in t], 2000)
    coded = [torch.tensor([index.get(w, 0) for w in t], dtype=torch.int64) for t in texts]
    splits = [int(len(t) * 0.9) for t in coded]
    test_gen = torch.Generator().manual_seed(12345)
    xt, yt = [], []
    for c, (t, cut) in enumerate(zip(coded, splits)):
        held = t[cut:]
        for s in torch.randint(0, len(held) - ctx, (50 if quick else 200,), generator=test_gen):
            xt.append(held[s:s + ctx])
            yt.append(c)
    xt, yt = torch.stack(xt), torch.tensor(yt)
    gen = torch.Generator().manual_seed(seed * 1000 + rank)

    def batch_at(step):
        ys = torch.randint(0, len(coded), (batch,), generator=gen)
        xs = []
        for c in ys.tolist():
            s = torch.randint(0, splits[c] - ctx, (1,), generator=gen).item()
            xs.append(coded[c][s:s + ctx])
        return torch.stack(xs), ys
    task.model = TextEncoder(len(index) + 1, len(coded), ctx=ctx)
    task.optimizer = torch.optim.AdamW(_decay_groups(task.model, 0.01), lr=1e-3)
    task.lr_at = cosine(1e-3, steps, warmup=max(1, steps // 10))
    task.clip = 1.0
    task.batch, task.loss = batch_at, F.cross_entropy
    _accuracy_eval(task, xt, yt)
    return task


def _hash(*words):
    return zlib.crc32(" ".join(words).encode())


def _embed_task(task, rank, seed, steps, quick):
    words = _words(corpus_text())
    index = _word_index(words, 1000)
    rows = 65536
    feats, target = [], []
    for i in range(3, len(words)):
        a, b, c = words[i - 3], words[i - 2], words[i - 1]
        feats.append([_hash(c) % rows, _hash(b, c) % rows, _hash(a, b, c) % rows])
        target.append(index.get(words[i], 0))
    feats = torch.tensor(feats, dtype=torch.int64)
    target = torch.tensor(target, dtype=torch.int64)
    split = int(len(target) * 0.9)
    xt, yt = feats[split:], target[split:]
    if quick:
        xt, yt = xt[:2000], yt[:2000]
    xs, ys = feats[:split], target[:split]
    task.model = HashedNgram(rows, 32, len(index) + 1)
    task.optimizer = torch.optim.Adam(task.model.parameters(), lr=1e-2)
    task.lr_at = cosine(1e-2, steps)
    gen = torch.Generator().manual_seed(seed * 1000 + rank)

    def batch_at(step):
        idx = torch.randint(0, len(ys), (64,), generator=gen)
        return xs[idx], ys[idx]

    def evaluate():
        task.model.eval()
        with torch.no_grad():
            loss = F.cross_entropy(task.model(xt), yt)
        task.model.train()
        return loss.item() / math.log(2)
    task.batch, task.evaluate = batch_at, evaluate
    task.loss = F.cross_entropy
    task.metric = "bits/word"
    return task


MODELS = ("mlp", "cnn", "lstm", "gpt", "embed", "gru", "vit", "wordgpt", "mlp-adam",
          "cnn-adam", "gpt128", "lstm-rmsprop", "cnn-adagrad", "cnn-rmsprop", "lstm-adagrad",
          "lstm-nadam", "lstm-radam", "resnet", "ae", "tcn", "mixer", "dwnet", "wordlstm",
          "mlp-sgd", "cnn-sgd", "lstm-sgd", "gru-sgd", "encoder", "nanogpt", "moe",
          "finetune", "finetune-resnet")

"""Broadcasts from rank 0 over adaps, in Horovod's names (re-exported by adaps.torch).

    adaps.torch.broadcast_parameters(model.state_dict(), worker)   # parameters and buffers
    adaps.torch.broadcast_optimizer_state(optimizer, worker)
    obj = adaps.torch.broadcast_object(obj, worker)                # any picklable object

All three are collective: every worker calls them in the same order. They are built on
Worker.declare, which makes rank 0's initial values everyone's: the bytes to broadcast are
packed 16 bits per float32 element (every value an exact small integer, so no float
rounding or NaN pattern can alter them) into one dense tensor named
"__adaps_broadcast__/<k>". Every dtype is carried bit for bit (float16/bfloat16/float64,
integer buffers such as BatchNorm's num_batches_tracked, bool). The tensor stays declared on
the servers (about twice the broadcast's bytes); broadcasting is meant for the start and
for resuming, not for every step. Only root_rank=0 exists (Declare takes rank 0's values).
"""
import io
import zlib

import numpy as np
import torch

PREFIX = "__adaps_broadcast__/"


def _check_root(root_rank):
    if root_rank != 0:
        raise ValueError("adaps.torch: only root_rank=0 is supported (rank 0's values are the "
                         "declared ones), got %r" % (root_rank,))


def _next_name(worker):
    # Deterministic on every rank: the same broadcasts happened before, in the same order.
    k = sum(1 for n in worker.tensor_names() if n.startswith(PREFIX))
    return PREFIX + str(k)


def _broadcast_bytes(worker, data, nbytes):
    """Rank 0's `data` (bytes of length nbytes; other ranks: anything of that length or
    None) on every rank, as bytes."""
    n16 = (nbytes + 1) // 2
    values = np.zeros(max(1, n16), dtype=np.float32)
    if worker.rank == 0 and nbytes:
        raw = np.frombuffer(data, dtype=np.uint8)
        if nbytes % 2:
            raw = np.concatenate([raw, np.zeros(1, dtype=np.uint8)])
        values[:n16] = raw.view(np.uint16).astype(np.float32)
    # Only declared (never pushed): kept out of fusion buckets, which wait for every member.
    worker.declare(_next_name(worker), values, compression="dense", fuse=False)
    if not np.all((values >= 0) & (values <= 65535) & (values == np.floor(values))):
        raise RuntimeError("adaps.torch: a broadcast arrived damaged (not 16-bit integers)")
    return values[:n16].astype(np.uint16).tobytes()[:nbytes]


def _as_bytes(t):
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _layout(named):
    return ";".join("%s:%s:%s" % (n, str(t.dtype), tuple(t.shape)) for n, t in named)


def broadcast_parameters(params, worker, root_rank=0):
    """Overwrites every tensor in `params` with rank 0's values, in place.

    params: a model.state_dict() (parameters and buffers), a dict {name: tensor}, or a list
    of (name, tensor) pairs such as model.named_parameters(). Every rank must pass the same
    names, shapes and dtypes (checked: a mismatch raises ValueError on the ranks that
    differ from rank 0, and nothing is written there)."""
    _check_root(root_rank)
    named = sorted(params.items() if isinstance(params, dict) else list(params),
                   key=lambda item: item[0])
    named = [(n, t) for n, t in named if isinstance(t, torch.Tensor)]
    layout = _layout(named).encode()
    sizes = [t.numel() * t.element_size() for _, t in named]
    header = 8  # crc32 of the layout, total payload bytes
    total = header + sum(sizes)
    data = None
    if worker.rank == 0:
        body = b"".join(_as_bytes(t) for _, t in named)
        data = np.array([zlib.crc32(layout), len(body)], dtype=np.uint32).tobytes() + body
    out = _broadcast_bytes(worker, data, total)
    crc, length = np.frombuffer(out[:header], dtype=np.uint32)
    if crc != zlib.crc32(layout) or length != total - header:
        raise ValueError("adaps.torch.broadcast_parameters: rank %d's tensors (names, shapes, "
                         "dtypes) differ from rank 0's; nothing was written" % worker.rank)
    if worker.rank == 0:
        return
    offset = header
    with torch.no_grad():
        for (_, t), size in zip(named, sizes):
            chunk = bytearray(out[offset:offset + size])
            offset += size
            if size == 0:
                continue
            src = torch.frombuffer(chunk, dtype=torch.uint8).view(t.dtype).view(t.shape)
            t.copy_(src)


def broadcast_object(obj, worker, root_rank=0):
    """Rank 0's `obj` (pickled with torch.save, so tensors travel too; other ranks pass
    anything, e.g. None) on every rank. Like Horovod's broadcast_object, this unpickles
    what rank 0 sent: use it only inside a cluster you trust."""
    _check_root(root_rank)
    data = b""
    if worker.rank == 0:
        buf = io.BytesIO()
        torch.save(obj, buf)
        data = buf.getvalue()
    length = np.frombuffer(_broadcast_bytes(worker, np.array([len(data)], dtype=np.uint64)
                                            .tobytes(), 8), dtype=np.uint64)[0]
    payload = _broadcast_bytes(worker, data, int(length))
    return torch.load(io.BytesIO(payload), map_location="cpu")


def broadcast_optimizer_state(optimizer, worker, root_rank=0):
    """Loads rank 0's optimizer.state_dict() (state such as momentum buffers and every
    group's hyper-parameters) into `optimizer` on every other rank."""
    state = broadcast_object(optimizer.state_dict() if worker.rank == 0 else None, worker,
                             root_rank)
    if worker.rank != 0:
        optimizer.load_state_dict(state)

"""Runs one function per rank in threads of the test process, each with its own
adaps.Worker on a local cluster (several Workers may live in one process), so a test of
adaps.torch needs no extra interpreter and stays fast."""
import threading
import traceback

import torch

import adaps

torch.set_num_threads(1)


def one_parameter(n):
    """(p, m): a parameter of n zeros and a module that holds it as m.p."""
    p = torch.nn.Parameter(torch.zeros(n))
    m = torch.nn.Module()
    m.p = p
    return p, m


class Declared:
    """A worker that records the keyword arguments each tensor is declared with
    (self.declared[name]: compression, topk_fraction, bin_size, ...)."""

    def __init__(self, w):
        self._w, self.declared = w, {}

    def declare(self, name, *args, **kwargs):
        self.declared[name] = kwargs
        return self._w.declare(name, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._w, name)


def run_ranks(address, n, fn, timeout=60, **worker_kwargs):
    """[fn(worker) for each rank], indexed by rank; re-raises the first rank's exception.
    worker_kwargs: more arguments of each rank's adaps.Worker."""
    results = [None] * n
    errors = []

    def body():
        try:
            w = adaps.Worker(scheduler=address, register_timeout=20, request_timeout=15,
                             **worker_kwargs)
            try:
                results[w.rank] = fn(w)
            finally:
                w.stop()
        except BaseException as e:  # reported to the test below
            e.rank_traceback = traceback.format_exc()
            errors.append(e)

    threads = [threading.Thread(target=body, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a rank did not finish in %s s" % timeout
    if errors:
        raise errors[0]
    return results

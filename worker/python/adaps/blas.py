"""Which BLAS PyTorch runs on, and how fast one thread of it is.

Debian's python3-torch and python3-numpy link libblas.so.3, which on a fresh machine is the
reference implementation (about 1 GFLOP/s a core): a training step then takes 6-13x longer
than on OpenBLAS (Debian's libopenblas0-pthread, which deploy/install-deps.sh installs and
which takes libblas.so.3 over). A benchmark that times training on the reference BLAS
measures a machine no user has, so every benchmark records `blas_info()` in its results and
calls `warn_if_reference()` at start.

    info = adaps.blas.blas_info()   # {"library": ..., "kind": "openblas", "gflops_1thread": 35.2, ...}
"""
import os
import sys
import time

# A product of the shape of a small transformer's projection (2048x128 @ 128x512).
_M, _K, _N = 2048, 128, 512


def _loaded_blas_libraries():
    """Paths of the BLAS libraries mapped into this process (resolved by the kernel)."""
    found = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.rstrip("\n").split(None, 5)[-1] if line.count(" ") >= 5 else ""
                name = os.path.basename(path)
                if path.startswith("/") and any(k in name for k in
                                                ("blas", "mkl_", "libmkl", "blis", "atlas")):
                    if path not in found:
                        found.append(path)
    except OSError:
        pass
    return found


def _kind(paths, config):
    text = " ".join(paths).lower()
    # The Python package index's torch carries MKL inside libtorch_cpu (BLAS_INFO=mkl): its
    # products run there whatever else is mapped (numpy's own OpenBLAS, say).
    if "blas_info=mkl" in config.lower():
        return "mkl"
    # Debian's reference BLAS lives in .../blas/libblas.so.3 (the alternative with the lowest
    # priority). torch links libblas.so.3 itself, so where that is the reference one its
    # sgemm is the one called, even when OpenBLAS is mapped too (as LAPACK's provider).
    if any("/blas/libblas.so" in p for p in paths):
        return "reference"
    if "openblas" in text:
        return "openblas"
    if "mkl" in text or "blas_info=mkl" in config.lower():
        return "mkl"
    if "blis" in text:
        return "blis"
    if "atlas" in text:
        return "atlas"
    if "blas_info=open" in config.lower():
        return "openblas"
    return "unknown"


def gflops_one_thread(seconds=0.2):
    """Measured single-thread GFLOP/s of torch's float32 matrix product (about `seconds`)."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a = torch.randn(_M, _K)
        b = torch.randn(_K, _N)
        a @ b  # warm-up: the library loads, its buffers are allocated
        reps, start = 0, time.perf_counter()
        while True:
            a @ b
            reps += 1
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                break
        return 2.0 * _M * _K * _N * reps / elapsed / 1e9
    finally:
        torch.set_num_threads(threads)


def blas_info(measure=True):
    """{"library", "kind", "gflops_1thread", "torch_threads", "openblas_coretype"}.

    kind: "openblas", "mkl", "blis", "atlas", "reference" (Debian's libblas.so.3 from the
    reference implementation) or "unknown". gflops_1thread is None with measure=False.
    """
    import torch
    config = ""
    try:
        config = torch.__config__.show()
    except Exception:  # an old or unusual build: the mapped libraries still tell
        pass
    gflops = gflops_one_thread() if measure else None  # maps the BLAS if nothing did yet
    paths = _loaded_blas_libraries()
    kind = _kind(paths, config)
    mark = "/blas/libblas.so" if kind == "reference" else kind
    library = next((p for p in paths if mark in p.lower()), paths[0] if paths else None)
    if kind == "mkl" and "blas_info=mkl" in config.lower():
        library = "MKL inside torch " + torch.__version__
    return dict(library=library, kind=kind,
                gflops_1thread=round(gflops, 2) if gflops is not None else None,
                torch_threads=torch.get_num_threads(),
                openblas_coretype=os.environ.get("OPENBLAS_CORETYPE"))


def warn_if_reference(info, out=sys.stderr):
    """Says loudly when `info` (from blas_info) is the reference BLAS; True if it is."""
    # The library decides; the speed only where the library is unknown (a loaded machine
    # measures an optimized BLAS slow too).
    slow = info.get("kind") == "reference" or (
        info.get("kind") == "unknown" and info.get("gflops_1thread") is not None and
        info["gflops_1thread"] < 2.0)
    if slow:
        bar = "!" * 78
        print("%s\nWARNING: PyTorch runs on the reference BLAS (%s, %s GFLOP/s on one thread):\n"
              "every step's compute is several times what it is on an optimized BLAS, so\n"
              "timings from this run are not comparable to any user's. Install Debian's\n"
              "OpenBLAS: apt-get install libopenblas0-pthread (deploy/install-deps.sh does).\n%s"
              % (bar, info.get("library"), info.get("gflops_1thread"), bar), file=out,
              flush=True)
    return slow

"""adaps: the worker side of the adaps parameter server, for Python and PyTorch trainers.

    import adaps
    w = adaps.Worker(scheduler="tcp://127.0.0.1:5000")      # or adaps.worker_from_env()
    w.declare("w", values)                                    # float32 array/CPU tensor
    w.push_pull("w", grad, values).wait()                     # raises adaps.Error

Worker(scheduler, identity="", register_timeout=60.0, request_timeout=30.0,
       compact_indices=True, log_level="warn", compression_threads=1,
       curve_server_key="", curve_client_key="", emulate_devices=False)
    Registers with the scheduler and returns once the cluster formed.
    curve_server_key, curve_client_key: adaps-keygen's files (the cluster's .pub, this
    worker's own pair, listed in the cluster's --curve_allowed_clients), as adaps-worker's
    flags: the job encrypted with ZeroMQ CURVE (docs/reliability.md, "Access").
    compression_threads: the pool that encodes pushes and decodes pulls off the caller's
    thread (0: on the caller's and the I/O thread, as before the pool).
    .rank, .num_workers, .num_servers, .live_workers
        num_workers: one past the highest rank (more once workers joined a running job);
        live_workers: the workers live now, what the servers' steps average over.
    .declare(name, values, shape=None, bin_size=500, compression="adacomp",
             topk_fraction=0.001, pull="dense", fuse=True, device=-1)
        Collective (every worker, same order). Rank 0's `values` become the initial
        parameters; `values` is overwritten in place with them on every worker.
        compression: dense, adacomp, topk, sign. pull: dense, recompressed, sparse.
        pull="sparse": the step's exact change, as the new values at the elements some
        worker sent (or the dense values when smaller), so `out` is bit for bit what a
        dense pull writes. Needs servers whose step changes only those elements:
        --optimizer=mean (local mode: `out` is the step's mean gradient, 0 where no worker
        sent), sum, or sgd without weight decay; otherwise declare raises adaps.Error
        (FAILED_PRECONDITION) naming the reason: use pull="dense" or "recompressed".
        fuse=False keeps a small tensor out of fusion buckets (one not pushed every step).
    .push_pull(name, grad, out) / .push(name, grad) / .pull(name, out) -> Handle
        Asynchronous; the library reads `grad` before the call returns and writes `out`
        before the handle is done. Handle.wait(timeout=None) raises adaps.Error.
    .barrier(), .set_hyper([("learning_rate", 0.1), ...]), .checkpoint(dir)
    .traffic(name) -> dict of pushes, pulls, push/pull wire and dense bytes, and seconds
        spent compressing, decoding and (as the servers reported it) on the servers
    .last_sent(name), .pull_parameters(name, out)
        The elements the last push of `name` sent; the servers' exact parameters.
    .set_bin_size(name, bin_size)
        The AdaComp bin size of this worker's pushes of `name` from the next push on (the
        residue is kept), e.g. for a sparsity warm-up; fused tensors too.
    .close_fusion_buckets()
        Tensors declared from now on go into new fusion buckets: a group given at its own
        time each step (one of two optimizers stepped separately) waits for no other.
    .residue(name, out), .set_residue(name, values), .save_residues(path),
    .load_residues(path), .residue_checkpoint_path(directory)
        What the error feedback holds back; .checkpoint(dir) also writes this worker's
        residues to residue_checkpoint_path(dir) for load_residues after a restart.
    .push_pull_device(name, grad, out, stream=0, keep=[]) -> Handle
        For a tensor declared with device=N (a CUDA device's ordinal; the library built
        with CUDA: adaps.CUDA_BUILT): grad and out are device addresses (data_ptr() of
        float32 CUDA tensors of the tensor's length), stream the trainer's
        (torch.cuda.current_stream().cuda_stream). Its residues live on the GPU and its
        pushes are compressed there; pull "dense" or "recompressed". adaps.torch uses it
        for CUDA parameters. emulate_devices=True (ADAPS_EMULATE_DEVICES=1) keeps such
        tensors in host memory, for testing the path without a GPU.
    .slices(name), .tensor_names(), .stop()
    .leave()
        Pushes every compressed tensor's residue (nothing lost), then stops.

Arrays: NumPy float32 arrays and PyTorch CPU tensors are used in place (no copy) when
C-contiguous float32; gradients of another dtype or layout are converted (one copy).

Errors: adaps.Error (a RuntimeError) with .code (absl status code number) and .code_name
("INVALID_ARGUMENT", "UNAVAILABLE", "DEADLINE_EXCEEDED", ...); str(e) is the message.
"""
import os

from adaps._core import CUDA_BUILT, Error, Handle, Worker

__all__ = ["Error", "Handle", "Worker", "worker_from_env", "INVALID_ARGUMENT",
           "DEADLINE_EXCEEDED", "NOT_FOUND", "FAILED_PRECONDITION", "INTERNAL", "UNAVAILABLE",
           "DATA_LOSS"]

INVALID_ARGUMENT = 3
DEADLINE_EXCEEDED = 4
NOT_FOUND = 5
FAILED_PRECONDITION = 9
INTERNAL = 13
UNAVAILABLE = 14
DATA_LOSS = 15


# What adaps.torch's `compression` setting names, shared with adaps.launch's --compression.
_COMPRESSIONS = ("dense", "adacomp", "topk", "sign")
_LAYER_TYPES = ("conv", "linear", "recurrent", "embedding", "other")
# From this many workers local mode's compressed updates are pulled recompressed by default
# (adaps.torch, where the reason is); adaps.launch tells from it whether joiners would be
# refused.
_RECOMPRESSED_FROM_WORKERS = 8


def _parse_compression(text):
    """ADAPS_COMPRESSION / --compression: a name, or "TYPE:NAME,..." (a dict per layer type;
    adacomp for a type left out). ValueError for an entry without ':', an unknown or repeated
    layer type; the names themselves are the caller's to check."""
    if ":" not in text:
        return text
    out = {}
    for item in text.split(","):
        kind, sep, name = item.strip().partition(":")
        if not sep or kind not in _LAYER_TYPES or kind in out:
            raise ValueError(item)
        out[kind] = name
    return out


def _error(code, message):
    e = Error(message)
    e.code = code
    e.code_name = {INVALID_ARGUMENT: "INVALID_ARGUMENT", FAILED_PRECONDITION:
                   "FAILED_PRECONDITION", DEADLINE_EXCEEDED: "DEADLINE_EXCEEDED",
                   UNAVAILABLE: "UNAVAILABLE"}.get(code, str(code))
    return e


def _scheduler_from_launcher(env, kwargs):
    """(address, HostedJob or None) from torchrun's, Slurm's or Open MPI's variables; sets
    kwargs' register_timeout to the rendezvous default when none was given."""
    from adaps import rendezvous
    try:
        job = rendezvous.job_from_env(env)
    except rendezvous.EnvError as e:
        raise _error(INVALID_ARGUMENT, "adaps.worker_from_env: %s" % e) from None
    if job is None:
        raise _error(FAILED_PRECONDITION, "ADAPS_SCHEDULER is not set and no launcher's "
                     "variables are (torchrun's RANK/WORLD_SIZE, Slurm's SLURM_PROCID, Open "
                     "MPI's OMPI_COMM_WORLD_RANK): start the script with `python3 -m "
                     "adaps.launch`, torchrun, srun or mpirun, or pass scheduler=...")
    kwargs.setdefault("register_timeout", rendezvous.DEFAULT_TIMEOUT_S)
    try:
        return rendezvous.scheduler_for(job, env, kwargs["register_timeout"])
    except rendezvous.EnvError as e:
        code = UNAVAILABLE if job.rank == 0 else DEADLINE_EXCEEDED
        raise _error(code, "adaps.worker_from_env: %s" % e) from None


def worker_from_env(**overrides):
    """A Worker configured from the environment `python3 -m adaps.launch` sets, or that
    torchrun, Slurm's srun or Open MPI's mpirun set.

    ADAPS_SCHEDULER, ADAPS_IDENTITY, ADAPS_REGISTER_TIMEOUT_S, ADAPS_REQUEST_TIMEOUT_S,
    ADAPS_LOG_LEVEL, ADAPS_COMPRESSION_THREADS, ADAPS_CURVE_SERVER_KEY,
    ADAPS_CURVE_CLIENT_KEY; keyword arguments win over the environment.
    Without ADAPS_SCHEDULER (or scheduler=...), the job is found from the launcher's
    variables (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, SLURM_*, OMPI_COMM_WORLD_*): the
    process of rank 0 starts the job's scheduler and servers, every rank registers with it
    (adaps.rendezvous, docs/launching.md). Raises adaps.Error: INVALID_ARGUMENT for an
    incomplete or contradictory launcher environment, FAILED_PRECONDITION when there is
    none, DEADLINE_EXCEEDED when rank 0's scheduler never answered.
    """
    env = os.environ
    kwargs = {}
    if "ADAPS_SCHEDULER" in env:
        kwargs["scheduler"] = env["ADAPS_SCHEDULER"]
    if "ADAPS_IDENTITY" in env:
        kwargs["identity"] = env["ADAPS_IDENTITY"]
    if "ADAPS_REGISTER_TIMEOUT_S" in env:
        kwargs["register_timeout"] = float(env["ADAPS_REGISTER_TIMEOUT_S"])
    if "ADAPS_REQUEST_TIMEOUT_S" in env:
        kwargs["request_timeout"] = float(env["ADAPS_REQUEST_TIMEOUT_S"])
    if "ADAPS_LOG_LEVEL" in env:
        kwargs["log_level"] = env["ADAPS_LOG_LEVEL"]
    if "ADAPS_COMPRESSION_THREADS" in env:
        kwargs["compression_threads"] = int(env["ADAPS_COMPRESSION_THREADS"])
    if env.get("ADAPS_EMULATE_DEVICES") == "1":  # tests: the device path in host memory
        kwargs["emulate_devices"] = True
    for key in ("server", "client"):
        if env.get("ADAPS_CURVE_%s_KEY" % key.upper()):
            kwargs["curve_%s_key" % key] = env["ADAPS_CURVE_%s_KEY" % key.upper()]
    kwargs.update(overrides)
    hosted = None
    if "scheduler" not in kwargs:
        if kwargs.get("curve_server_key") or kwargs.get("curve_client_key"):
            raise _error(INVALID_ARGUMENT, "adaps.worker_from_env: CURVE keys need "
                         "ADAPS_SCHEDULER (an encrypted cluster started with the "
                         "executables' --curve_* flags): the job rank 0 starts from the "
                         "launcher's variables runs plaintext")
        kwargs["scheduler"], hosted = _scheduler_from_launcher(env, kwargs)
    try:
        worker = Worker(**kwargs)
    except BaseException:
        if hosted is not None:
            hosted.stop(at_once=True)  # the job never formed: nothing to wait for
        raise
    if hosted is not None:
        hosted.adopt(worker)
    if env.get("ADAPS_RANK_FILE"):
        try:
            with open(env["ADAPS_RANK_FILE"], "w") as f:
                f.write(str(worker.rank))
        except OSError:
            pass  # only the launcher's output prefix depends on it
    return worker

"""adaps.hf: Hugging Face Transformers' Trainer (and PEFT) trained through adaps.

Two lines change in a Trainer script:

    from adaps.hf import Trainer                   # instead of: from transformers import Trainer
    trainer = Trainer(model=model, args=TrainingArguments(...), train_dataset=train,
                      eval_dataset=held_out)         # as before; adaps_settings={...} optional
    trainer.train()

and it is started with the launcher, the servers in local mode:

    python3 -m adaps.launch -n 4 --server-optimizer mean train.py ...

What the Trainer then does (docs/huggingface.md):
  - the worker: adaps.worker_from_env() once per process (or adaps_worker=...), shared by
    every adaps.hf.Trainer of the process (adaps.hf.worker());
  - the optimizer the Trainer creates (args.optim, or one passed in optimizers=(opt, sched))
    is wrapped in adaps.torch.DistributedOptimizer(opt, model, worker, **adaps_settings)
    before Accelerate wraps it: the LR scheduler, Accelerate's step and GradScaler,
    clipping by args.max_grad_norm and the optimizer's checkpoint keep working; rank 0's
    model and optimizer state become everyone's at that point (collective);
  - data: rank r of W iterates its own 1/W of the training set (DistributedSampler with
    num_replicas=W, rank=r, seed=args.data_seed or args.seed, reshuffled every epoch;
    train_sampling_strategy "random" or "sequential"); every rank takes the same number of
    steps. A dataset without __len__ (an IterableDataset) must be sharded by the script
    (adaps_shard_data=False);
  - rank 0 alone logs, saves models and checkpoints (args.should_log, args.should_save,
    is_world_process_zero()); every rank evaluates the whole eval set on its own replica;
  - gradient_accumulation_steps: the micro-batches but the last run inside
    DistributedOptimizer.no_sync(), as DDP's; with the gradient exchange the step's mean is
    synchronized before clipping (with the update exchange each worker clips its own
    gradient, as on one machine);
  - local_steps=H: the steps since the last exchange are exchanged before every evaluate()
    and when train() ends (DistributedOptimizer.exchange_now), so every rank evaluates and
    keeps the same model, whatever the number of steps.

Refused with an error naming what to do instead: servers not running --optimizer=mean
(server mode), a torch.distributed job (torchrun/accelerate launch with DDP), DeepSpeed and
FSDP, several GPUs in one process (DataParallel), LOMO/layer-wise optimizers,
train_sampling_strategy other than random/sequential.
"""
import copy
import copyreg
import os

try:
    import transformers
    from transformers.trainer_utils import has_length
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("adaps.hf needs Hugging Face Transformers: pip install transformers "
                      "(and accelerate; peft for LoRA) (%s)" % (e,)) from None
import torch

import adaps
import adaps.torch

__all__ = ["Trainer", "worker", "check_args"]

_WORKER = None


def worker(given=None):
    """The process's adaps.Worker: `given` (kept from then on), else the one registered by
    the first call (adaps.worker_from_env())."""
    global _WORKER
    if given is not None:
        _WORKER = given
    elif _WORKER is None:
        _WORKER = adaps.worker_from_env()
    return _WORKER


def check_args(args):
    """ValueError for TrainingArguments adaps.hf cannot train with (nothing collective)."""
    if args.deepspeed:
        raise ValueError("adaps.hf: DeepSpeed (args.deepspeed) shards and reduces gradients "
                         "itself; adaps replaces that reduction. Drop deepspeed= to train "
                         "through adaps, or use transformers.Trainer with DeepSpeed")
    if args.fsdp:
        raise ValueError("adaps.hf: FSDP (args.fsdp) shards the model over a torch.distributed "
                         "group; adaps keeps a whole replica on every worker. Drop fsdp= to "
                         "train through adaps, or use transformers.Trainer with FSDP")
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() in ("1", "true") or \
            os.environ.get("ACCELERATE_USE_FSDP", "").lower() in ("1", "true"):
        raise ValueError("adaps.hf: Accelerate's config asks for DeepSpeed or FSDP "
                         "(ACCELERATE_USE_DEEPSPEED/ACCELERATE_USE_FSDP); start the script "
                         "with python3 -m adaps.launch, not accelerate launch")
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        raise ValueError("adaps.hf: a torch.distributed process group is initialised "
                         "(torchrun or accelerate launch running DDP): adaps replaces DDP's "
                         "all-reduce. Start the script with python3 -m adaps.launch -n N "
                         "--server-optimizer mean, or use transformers.Trainer for DDP")
    optim = str(getattr(args.optim, "value", args.optim))
    if "lomo" in optim or "layerwise" in optim:
        raise ValueError("adaps.hf: optim=%r updates the parameters inside backward, so "
                         "there is no step for adaps to exchange; use an optimizer with a "
                         "step (adamw_torch, sgd, adafactor, ...)" % (optim,))
    strategy = getattr(args, "train_sampling_strategy", "random")
    if strategy not in ("random", "sequential"):
        raise ValueError("adaps.hf: train_sampling_strategy=%r is not sharded by adaps.hf; use "
                         "'random' or 'sequential', or override _get_train_sampler with a "
                         "sampler that gives rank r of W its own part" % (strategy,))
    if args.world_size > 1 or args.n_gpu > 1:
        raise ValueError("adaps.hf: this process sees world_size=%d, n_gpu=%d: %s" % (
            args.world_size, args.n_gpu,
            "torch.distributed is set up (DDP); start with python3 -m adaps.launch instead"
            if args.world_size > 1 else "the Trainer would use DataParallel over its GPUs; "
            "give each adaps worker one GPU (CUDA_VISIBLE_DEVICES), as DDP does"))


def _ranked_args(args, rank, local_rank):
    """A copy of args whose process_index, should_log and should_save follow the adaps rank
    (world_size stays 1: the Trainer must not call torch.distributed)."""
    base = type(args)

    class AdapsArgs(base):
        process_index = property(lambda self: self._adaps_rank)
        local_process_index = property(lambda self: self._adaps_local_rank)
        should_log = property(lambda self: self._adaps_rank == 0)
        should_save = property(lambda self: self._adaps_rank == 0)

        def __reduce_ex__(self, protocol):
            # torch.save(args) in a checkpoint: pickled as the plain class (loads without
            # adaps), through the standard library's reconstructor.
            state = {k: v for k, v in self.__dict__.items()
                     if k not in ("_adaps_rank", "_adaps_local_rank")}
            return copyreg._reconstructor, (base, object, None), state

        def __copy__(self):
            new = object.__new__(type(self))
            new.__dict__.update(self.__dict__)
            return new

        def __deepcopy__(self, memo):
            new = object.__new__(type(self))
            memo[id(self)] = new
            for k, v in self.__dict__.items():
                new.__dict__[k] = copy.deepcopy(v, memo)
            return new

    AdapsArgs.__name__ = AdapsArgs.__qualname__ = base.__name__
    new = object.__new__(AdapsArgs)
    new.__dict__.update(args.__dict__)
    new._adaps_rank, new._adaps_local_rank = rank, local_rank
    return new


class Trainer(transformers.Trainer):
    """transformers.Trainer whose optimizer steps through adaps (see the module docstring).

    Extra keyword arguments: adaps_worker (an adaps.Worker; default adaps.hf.worker()),
    adaps_settings (dict of keyword arguments of adaps.torch.DistributedOptimizer:
    compression, bin_size, own_updates, ...), adaps_shard_data (default True: each rank
    iterates its own part of train_dataset; False: the script sharded it)."""

    def __init__(self, model=None, args=None, *rest, adaps_worker=None, adaps_settings=None,
                 adaps_shard_data=True, **kwargs):
        if args is None:
            args = transformers.TrainingArguments(output_dir="tmp_trainer")
        check_args(args)
        settings = dict(adaps_settings or {})
        for key in ("model", "worker", "optimizer"):
            if key in settings:
                raise ValueError("adaps.hf: adaps_settings[%r] is the Trainer's to give" % key)
        if "backward_passes_per_step" in settings:
            raise ValueError("adaps.hf: accumulate with TrainingArguments("
                             "gradient_accumulation_steps=N), not backward_passes_per_step: "
                             "the Trainer's micro-batches but the last run under no_sync()")
        w = worker(adaps_worker)
        # Server mode applies the servers' SGD/Adam and cannot honour the Trainer's clipping,
        # weight-decay groups or schedulers' per-group rates: refused before anything
        # collective.
        kind = adaps.torch._setting("server_optimizer", settings.get("server_optimizer"),
                                    "ADAPS_SERVER_OPTIMIZER", None)
        kind = adaps.torch._servers_agree(w, kind, settings.get("mode"))
        mode = settings.get("mode") or ("local" if kind == "mean" else "server")
        if mode != "local" or kind not in (None, "mean"):
            raise ValueError(
                "adaps.hf: the Trainer trains in adaps' local mode only (servers running "
                "--optimizer=mean; these run %s): start the job with python3 -m adaps.launch "
                "--server-optimizer mean, or write the loop yourself with "
                "adaps.torch.DistributedOptimizer in server mode (SGD/Adam, no clipping)"
                % (kind or "an optimizer (server mode asked for)"))
        if settings.get("server_optimizer") is None and kind is not None:
            settings.setdefault("server_optimizer", kind)
        self.adaps_worker = w
        self.adaps_settings = settings
        self.adaps_shard_data = adaps_shard_data
        self._adaps_optimizer = None
        self._adaps_synced = False
        super().__init__(model, _ranked_args(args, w.rank, w.rank), *rest, **kwargs)
        if self.is_deepspeed_enabled or self.is_fsdp_enabled:
            raise ValueError("adaps.hf: Accelerate is set up for DeepSpeed or FSDP; adaps "
                             "replaces their gradient reduction: drop that configuration")

    # -- the optimizer ----------------------------------------------------------------------
    def create_optimizer(self, model=None):
        opt = super().create_optimizer(model)
        if self._adaps_optimizer is not None:
            return opt  # a later train(): already wrapped (and prepared by Accelerate)
        self._adaps_optimizer = adaps.torch.DistributedOptimizer(
            opt, self.model if model is None else model, self.adaps_worker,
            **self.adaps_settings)
        self.optimizer = self._adaps_optimizer
        return self.optimizer

    @property
    def adaps_optimizer(self):
        """The adaps.torch.DistributedOptimizer (None before training created it)."""
        return self._adaps_optimizer

    def training_step(self, model, inputs, num_items_in_batch=None):
        # The Trainer's accumulation: the micro-batches before the last of a step do not sync
        # (accelerator.no_sync is a no-op without torch.distributed): adaps' no_sync keeps
        # their gradients in p.grad and the last pass pushes the sum.
        opt = self._adaps_optimizer
        self._adaps_synced = False  # this backward pushes: the step synchronizes again
        if opt is not None and not self.accelerator.sync_gradients:
            with opt.no_sync():
                return super().training_step(model, inputs, num_items_in_batch)
        return super().training_step(model, inputs, num_items_in_batch)

    def _adaps_synchronize(self):
        # Before the Trainer reads or clips the gradients: with the gradient exchange p.grad
        # becomes the step's mean here (a change after backward would be refused by step()),
        # with the update exchange this worker's own gradient stays (nothing to wait for).
        # Once per step, tracked here: a step that GradScaler skips (inf/NaN in the mean
        # gradient, alike on every worker) calls no step() after it.
        opt = self._adaps_optimizer
        if opt is not None and not self._adaps_synced:
            opt.synchronize()
            self._adaps_synced = True

    def _clip_grad_norm(self, model):
        self._adaps_synchronize()
        return super()._clip_grad_norm(model)

    def _get_grad_norm(self, model, grad_norm=None):
        if grad_norm is None:
            self._adaps_synchronize()
        return super()._get_grad_norm(model, grad_norm)

    # -- local steps: the job's model where it is evaluated and where training ends ----------
    def train(self, *args, **kwargs):
        out = super().train(*args, **kwargs)
        # A run whose steps are not a multiple of local_steps' H ends with every replica the
        # same (what trainer.save_model() saves on rank 0 is the job's model, as under DDP).
        self._adaps_exchange_now()
        return out

    def evaluate(self, *args, **kwargs):
        # Every rank evaluates the same model (every rank evaluates, as the Trainer does
        # during training): the local steps since the last exchange are exchanged first.
        self._adaps_exchange_now()
        return super().evaluate(*args, **kwargs)

    def _adaps_exchange_now(self):
        if self._adaps_optimizer is not None:
            self._adaps_optimizer.exchange_now()

    # -- data -------------------------------------------------------------------------------
    def _get_train_sampler(self, train_dataset=None):
        dataset = self.train_dataset if train_dataset is None else train_dataset
        if not self.adaps_shard_data:
            return super()._get_train_sampler(train_dataset)
        if dataset is None or not has_length(dataset):
            raise ValueError("adaps.hf: the training dataset has no length (an "
                             "IterableDataset), so adaps.hf cannot give each worker its own "
                             "part: shard it in the script (e.g. datasets.distributed."
                             "split_dataset_by_node(ds, rank=adaps.hf.worker().rank, "
                             "world_size=adaps.hf.worker().num_workers)) and pass "
                             "adaps_shard_data=False")
        strategy = getattr(self.args, "train_sampling_strategy", "random")
        seed = self.args.data_seed if self.args.data_seed is not None else self.args.seed
        # Padded to a multiple of W (drop_last=False): every rank takes the same number of
        # steps, as under DDP.
        return torch.utils.data.DistributedSampler(
            dataset, num_replicas=self.adaps_worker.num_workers, rank=self.adaps_worker.rank,
            shuffle=strategy == "random", seed=seed, drop_last=False)

    def get_train_dataloader(self):
        if self.adaps_shard_data and self.train_dataset is not None and \
                not has_length(self.train_dataset):
            self._get_train_sampler()  # raises: an unsized dataset is not sharded here
        return super().get_train_dataloader()

    def get_total_train_batch_size(self, args):
        # The global batch (reported and used for the samples count): every worker's.
        n = self.adaps_worker.num_workers if self.adaps_shard_data else 1
        return super().get_total_train_batch_size(args) * n

    # -- rank 0 writes ----------------------------------------------------------------------
    def is_world_process_zero(self):
        return self.adaps_worker.rank == 0

    def is_local_process_zero(self):
        return self.adaps_worker.rank == 0  # progress bars: rank 0's only

    def _save_rng_state(self, output_dir):
        # Rank 0's RNG state alone (every rank starts from the same seed, as under DDP); a
        # resumed run loads it on every rank.
        if self.adaps_worker.rank == 0:
            super()._save_rng_state(output_dir)

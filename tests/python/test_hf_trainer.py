"""adaps.hf: Hugging Face Transformers' Trainer (and PEFT LoRA) through adaps.

Real jobs (python3 -m adaps.launch, 2 workers, servers running mean) train a tiny Llama
(tests/python/hf_trainer_worker.py) on a character-level text made there; refusals are
checked without a cluster. Skipped where transformers is not installed (Debian's python3)."""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

import torch  # noqa: E402
import transformers  # noqa: E402

import adaps.hf  # noqa: E402
from conftest import run_launch  # noqa: E402
import hf_trainer_worker as hw  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "hf_trainer_worker.py")
# The single-process Trainer's held-out loss after the same 48 steps of 16 samples was
# 2.052, 2.066, 2.073 over three sampler seeds (42, 43, 44); the 2-worker adaps run
# measured 2.055 (docs/huggingface.md). 0.08 is about 4x that spread.
LOSS_TOLERANCE = 0.08


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    # Generous deadlines: importing transformers takes minutes on a loaded machine, and the
    # first worker to register waits for the last (no timing is asserted here).
    monkeypatch.setenv("ADAPS_REGISTER_TIMEOUT_S", "900")
    monkeypatch.setenv("ADAPS_REQUEST_TIMEOUT_S", "300")


def _results(out, n=2):
    return [json.load(open(os.path.join(out, "rank%d.json" % r))) for r in range(n)]


def _launch(out, extra_launch, extra_script, timeout=1200):
    rc, log = run_launch(["-n", "2", "--server-optimizer", "mean", "--python", sys.executable,
                          "--server-arg=--register_timeout_ms=900000"]
                         + extra_launch + [WORKER, out] + extra_script, timeout=timeout)
    assert rc == 0, log[-6000:]
    return log


def _only_rank0_wrote(out, log):
    assert os.path.isfile(os.path.join(out, "trainer", "final", "training_args.bin"))
    assert any(d.startswith("checkpoint-") for d in os.listdir(os.path.join(out, "trainer")))
    # Rank 1's Trainer was pointed at its own output_dir: it must not have written anything.
    rank1 = os.path.join(out, "trainer-rank1")
    assert not os.path.exists(rank1) or not any(files for _, _, files in os.walk(rank1)), \
        list(os.walk(rank1))
    assert "[r0] {'loss'" in log and "[r1] {'loss'" not in log, "only rank 0 logs"


def test_trainer_two_workers_matches_one_process(tmp_path):
    single = str(tmp_path / "single")
    p = subprocess.run([sys.executable, WORKER, single, "--single", "--batch", "16"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=1200)
    assert p.returncode == 0, p.stdout.decode(errors="replace")[-4000:]
    ref = _results(single, 1)[0]

    out = str(tmp_path / "adaps")
    # AdaComp's update exchange (the default); own_updates=off keeps every replica the same
    # (with the default "share" each model holds 1/W of its own residue).
    log = _launch(out, ["--own-updates", "off"], ["--batch", "8"])
    r0, r1 = _results(out)
    assert r0["exchange"] == "update" and r0["num_workers"] == 2
    # Each epoch (3), the two ranks' samples are disjoint and cover the training set; the
    # order changes from epoch to epoch (DistributedSampler reshuffled with the epoch).
    n, per = r0["len_train"], len(r0["seen"]) // 3
    epochs = []
    for e in range(3):
        a, b = r0["seen"][e * per:(e + 1) * per], r1["seen"][e * per:(e + 1) * per]
        assert not set(a) & set(b), "epoch %d: the ranks shared samples" % e
        assert sorted(a + b) == list(range(n))
        epochs.append(a)
    assert epochs[0] != epochs[1] != epochs[2]
    assert r0["steps"] == r1["steps"] == ref["steps"] == 48  # 3 epochs of 256 / (2 x 8)
    # The replicas are the same model, bit for bit, and rank 1 evaluates it alike.
    assert r0["checksum"] == r1["checksum"]
    assert r0["final_eval_loss"] == r1["final_eval_loss"]
    # Rank 0's model before training is the single run's (same seed); it trained.
    assert abs(r0["start_eval_loss"] - ref["start_eval_loss"]) < 1e-5
    assert r0["final_eval_loss"] < r0["start_eval_loss"] - 1.0, (r0, ref)
    assert abs(r0["final_eval_loss"] - ref["final_eval_loss"]) < LOSS_TOLERANCE, \
        (r0["final_eval_loss"], ref["final_eval_loss"])
    assert sorted(r0["exchanged"]) == sorted(r0["trained_names"])
    _only_rank0_wrote(out, log)
    # The checkpoint's training_args.bin loads without adaps, as the plain class.
    args = torch.load(os.path.join(out, "trainer", "final", "training_args.bin"),
                      weights_only=False)
    assert type(args) is transformers.TrainingArguments


@pytest.mark.parametrize("eval_steps,evaluations", [(0, 1), (18, 4)])
def test_local_steps_evaluate_and_end_on_one_model(tmp_path, eval_steps, evaluations):
    # local_steps=5 over 48 steps, evaluated every 18 (and at the end, as the Trainer does)
    # or not during training: 48 is not a multiple of 5, nor 18, and DDP's replicas are the
    # same at both. Before each evaluation and when train() ends the steps since the last
    # exchange are exchanged: every rank evaluates and keeps the same model.
    out = str(tmp_path / "adaps")
    _launch(out, ["--own-updates", "off", "--local-steps", "5"],
            ["--batch", "8", "--eval-steps", str(eval_steps)])
    r0, r1 = _results(out)
    assert r0["steps"] == r1["steps"] == 48
    # (With the evaluate() after train().)
    assert len(r0["eval_checksums"]) == evaluations
    assert r0["eval_checksums"] == r1["eval_checksums"]
    assert r0["after_train_checksum"] == r1["after_train_checksum"] == r0["checksum"]
    assert r0["final_eval_loss"] == r1["final_eval_loss"]
    assert r0["final_eval_loss"] < r0["start_eval_loss"] - 1.0


def test_lora_two_workers(tmp_path):
    peft = pytest.importorskip("peft")
    out = str(tmp_path / "lora")
    # Dense pushes: the gradient exchange, where accumulation (2 micro-batches a step) and
    # clipping (max_grad_norm=1) need the Trainer's hooks (no_sync, synchronize first).
    log = _launch(out, [], ["--lora", "--compression", "dense", "--accum", "2", "--batch",
                            "4", "--lr", "1e-2"])
    r0, r1 = _results(out)
    assert r0["exchange"] == "gradient"
    # Dense gradients averaged over 2 workers of 4 x 2 accumulated samples are the one
    # process's 8 x 2: the same held-out loss (measured equal to 7 digits).
    single = str(tmp_path / "single")
    p = subprocess.run([sys.executable, WORKER, single, "--single", "--lora", "--accum", "2",
                        "--batch", "8", "--lr", "1e-2"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=1200)
    assert p.returncode == 0, p.stdout.decode(errors="replace")[-4000:]
    ref = _results(single, 1)[0]
    assert abs(r0["final_eval_loss"] - ref["final_eval_loss"]) < 1e-3, \
        (r0["final_eval_loss"], ref["final_eval_loss"])
    assert r0["steps"] == r1["steps"] == 48  # 3 epochs of 256 / (2 x 4 x 2)
    # Only the LoRA parameters are trained and exchanged, and they moved (lora_B starts 0).
    assert r0["exchanged"] and all("lora_" in n for n in r0["exchanged"])
    assert sorted(r0["exchanged"]) == sorted(r0["trained_names"])
    assert r0["lora_max_abs"] > 1e-3
    # The base weights stayed what they were, the same everywhere; the replicas agree.
    assert r0["base_unchanged"] and r1["base_unchanged"]
    assert r0["base_checksum"] == r1["base_checksum"]
    assert r0["trained_checksum"] == r1["trained_checksum"]
    assert r0["final_eval_loss"] < r0["start_eval_loss"] - 0.1, r0
    _only_rank0_wrote(out, log)
    assert os.path.isfile(os.path.join(out, "trainer", "final", "adapter_model.safetensors"))
    # The saved adapter loads onto the base and gives rank 0's held-out loss.
    base = transformers.LlamaForCausalLM.from_pretrained(os.path.join(out, "base"))
    model = peft.PeftModel.from_pretrained(base, os.path.join(out, "trainer", "final")).eval()
    _, held_out = hw.datasets()
    batch = hw.collate([held_out[i] for i in range(len(held_out))])
    with torch.no_grad():
        loss = model(**batch).loss.item()
    assert abs(loss - r0["final_eval_loss"]) < 1e-4, (loss, r0["final_eval_loss"])


# -- refusals, without a cluster -------------------------------------------------------------
class FakeWorker:
    def __init__(self, rank=0, num_workers=2, server_optimizer="mean"):
        self.rank, self.num_workers, self.server_optimizer = rank, num_workers, server_optimizer


def _tiny():
    return transformers.LlamaForCausalLM(hw.model_config())


def _args(tmp_path, **kw):
    return transformers.TrainingArguments(output_dir=str(tmp_path / "o"), use_cpu=True,
                                          report_to="none", **kw)


def _trainer(tmp_path, worker=None, args=None, **kw):
    train, _ = hw.datasets(n_train=8, n_eval=1)
    return adaps.hf.Trainer(model=_tiny(), args=args or _args(tmp_path), train_dataset=train,
                            data_collator=hw.collate, adaps_worker=worker or FakeWorker(),
                            **kw)


def test_refuses_server_mode(tmp_path, monkeypatch):
    monkeypatch.delenv("ADAPS_SERVER_OPTIMIZER", raising=False)
    with pytest.raises(ValueError, match="--server-optimizer mean"):
        _trainer(tmp_path, FakeWorker(server_optimizer="adam"))
    monkeypatch.setenv("ADAPS_SERVER_OPTIMIZER", "sgd")
    with pytest.raises(ValueError, match="--server-optimizer mean"):
        _trainer(tmp_path, FakeWorker(server_optimizer=""))


@pytest.mark.parametrize("field,value,match", [
    ("deepspeed", "ds_config.json", "DeepSpeed"),
    ("fsdp", "full_shard", "FSDP"),
    ("optim", "lomo", "inside backward"),
    ("train_sampling_strategy", "group_by_length", "random"),
])
def test_refuses_settings(tmp_path, field, value, match):
    args = _args(tmp_path)
    object.__setattr__(args, field, value)
    with pytest.raises(ValueError, match=match):
        _trainer(tmp_path, args=args)


def test_refuses_settings_the_trainer_gives(tmp_path):
    with pytest.raises(ValueError, match="gradient_accumulation_steps"):
        _trainer(tmp_path, adaps_settings={"backward_passes_per_step": 2})
    with pytest.raises(ValueError, match="Trainer's to give"):
        _trainer(tmp_path, adaps_settings={"model": None})


def test_refuses_torch_distributed(tmp_path):
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method="file://" + str(tmp_path / "store"),
                            rank=0, world_size=1)
    try:
        with pytest.raises(ValueError, match="adaps.launch"):
            _trainer(tmp_path)
    finally:
        dist.destroy_process_group()


def test_refuses_unsized_dataset(tmp_path):
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter([])

    t = adaps.hf.Trainer(model=_tiny(), args=_args(tmp_path, max_steps=1),
                         train_dataset=Stream(), adaps_worker=FakeWorker())
    with pytest.raises(ValueError, match="split_dataset_by_node"):
        t.get_train_dataloader()


def test_rank_one_neither_logs_nor_saves(tmp_path):
    t = _trainer(tmp_path, FakeWorker(rank=1))
    assert not t.is_world_process_zero() and not t.args.should_save and not t.args.should_log
    assert t.args.process_index == 1 and t.args.world_size == 1
    t.save_model(str(tmp_path / "m"))
    assert not os.path.exists(tmp_path / "m")
    # Its sampler gives it the odd half, and rank 0 the even half, of an unshuffled set.
    t0 = _trainer(tmp_path, FakeWorker(rank=0), args=_args(
        tmp_path, train_sampling_strategy="sequential"))
    t1 = _trainer(tmp_path, FakeWorker(rank=1), args=_args(
        tmp_path, train_sampling_strategy="sequential"))
    assert list(t0._get_train_sampler()) == [0, 2, 4, 6]
    assert list(t1._get_train_sampler()) == [1, 3, 5, 7]


def test_import_error_names_pip_install():
    code = ("import sys; sys.modules['transformers'] = None\n"
            "try:\n    import adaps.hf\nexcept ImportError as e:\n    print(e)\n")
    p = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=120)
    assert "pip install transformers" in p.stdout.decode(), p.stdout

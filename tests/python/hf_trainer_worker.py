"""One rank of tests/python/test_hf_trainer.py: a tiny Llama (2 layers, width 64, built from a
config) trained on a character-level text with the Hugging Face Trainer, through adaps.hf
(or, with --single, with plain transformers.Trainer in one process: the reference).

    hf_trainer_worker.py OUT [--single] [--lora] [--batch B] [--epochs E] [--accum A]
        [--compression NAME] [--own-updates off] [--eval-steps N]

Writes OUT/rank<r>.json: the held-out loss before and after training, a checksum of the
model's parameters (all, base, trained; right after train(); at each evaluation, with
--eval-steps), the indices the train sampler gave (in order), and
what adaps exchanged. Rank 0's Trainer writes OUT/trainer (model, checkpoints); every other
rank is pointed at OUT/trainer-rank<r> (which must stay empty)."""
import argparse
import hashlib
import json
import os
import random
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402

torch.set_num_threads(1)
SEQ = 64

_SENTENCES = [
    "the quick brown fox jumps over the lazy dog.",
    "a parameter server keeps the model and the workers send it gradients.",
    "every worker reads its own part of the data and computes a gradient.",
    "compression sends only the largest elements of each bin.",
    "the residue holds back what was not sent and adds it to the next step.",
    "she sells sea shells by the sea shore.",
    "how much wood would a woodchuck chuck if a woodchuck could chuck wood?",
    "to be or not to be, that is the question.",
    "all that glitters is not gold.",
    "the rain in spain stays mainly in the plain.",
    "training a language model one character at a time is slow but simple.",
    "learning rates warm up, then decay to zero at the end of the run.",
]


def text(n_chars, seed):
    """A deterministic English text of n_chars characters made of the sentences above."""
    rng = random.Random(seed)
    out = []
    size = 0
    while size < n_chars:
        s = rng.choice(_SENTENCES) + " "
        out.append(s)
        size += len(s)
    return "".join(out)[:n_chars]


VOCAB = sorted(set("".join(_SENTENCES) + " "))


def encode(t):
    index = {c: i for i, c in enumerate(VOCAB)}
    return torch.tensor([index[c] for c in t], dtype=torch.long)


class Blocks(torch.utils.data.Dataset):
    """Non-overlapping blocks of SEQ characters; records every index it is asked for."""

    def __init__(self, ids):
        self.ids = ids
        self.seen = []

    def __len__(self):
        return len(self.ids) // SEQ

    def __getitem__(self, i):
        self.seen.append(int(i))
        x = self.ids[i * SEQ:(i + 1) * SEQ]
        return {"input_ids": x, "labels": x.clone()}


def datasets(n_train=256, n_eval=32):
    ids = encode(text((n_train + n_eval) * SEQ, seed=1234))
    return Blocks(ids[:n_train * SEQ]), Blocks(ids[n_train * SEQ:])


def model_config():
    return transformers.LlamaConfig(
        vocab_size=len(VOCAB), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=SEQ,
        tie_word_embeddings=False)


def lora_config():
    import peft
    return peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                           target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")


def checksum(named):
    h = hashlib.sha256()
    for name, t in named:
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


class EvaluatedChecksums(transformers.TrainerCallback):
    """The checksum of the model at each evaluation."""

    def __init__(self):
        self.checksums = []

    def on_evaluate(self, args, state, control, model=None, **kwargs):
        self.checksums.append(checksum(list(model.named_parameters())))


def collate(batch):
    return {k: torch.stack([b[k] for b in batch]) for k in batch[0]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--single", action="store_true")
    ap.add_argument("--lora", action="store_true")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--epochs", type=float, default=3)
    ap.add_argument("--accum", type=int, default=1)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--max-grad-norm", type=float, default=1.0)
    ap.add_argument("--compression", default=None)
    ap.add_argument("--own-updates", default=None)
    ap.add_argument("--save-steps", type=int, default=16)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--eval-steps", type=int, default=0, help="evaluate every N steps")
    a = ap.parse_args()

    if a.single:
        Trainer, rank, extra = transformers.Trainer, 0, {}
    else:
        import adaps.hf
        Trainer, rank = adaps.hf.Trainer, adaps.hf.worker().rank
        settings = {}
        if a.compression:
            settings["compression"] = a.compression
        if a.own_updates:
            settings["own_updates"] = a.own_updates
        extra = {"adaps_settings": settings}

    # Full training: a different initial model on every rank (the broadcast must unify them).
    # LoRA: the same base everywhere (a pretrained model), different adapters' initial values.
    transformers.set_seed(100 if a.lora else rank + 100)
    model = transformers.LlamaForCausalLM(model_config())
    if a.lora:
        import peft
        transformers.set_seed(rank + 100)
        if not a.single and rank == 0:
            model.save_pretrained(os.path.join(a.out, "base"))  # what the adapter loads onto
        model = peft.get_peft_model(model, lora_config())
    base_before = {n: p.detach().clone() for n, p in model.named_parameters()
                   if not p.requires_grad}
    train, held_out = datasets()
    out_dir = os.path.join(a.out, "trainer" if rank == 0 else "trainer-rank%d" % rank)
    args = transformers.TrainingArguments(
        output_dir=out_dir, per_device_train_batch_size=a.batch, per_device_eval_batch_size=32,
        num_train_epochs=a.epochs, gradient_accumulation_steps=a.accum, learning_rate=a.lr,
        warmup_steps=4, lr_scheduler_type="cosine", weight_decay=0.01,
        max_grad_norm=a.max_grad_norm, logging_steps=8, save_strategy="steps",
        save_steps=a.save_steps, save_total_limit=2, report_to="none",
        eval_strategy="steps" if a.eval_steps else "no", eval_steps=a.eval_steps or None,
        use_cpu=True, disable_tqdm=True, seed=a.seed, dataloader_num_workers=0)
    evaluated = EvaluatedChecksums()
    trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=held_out,
                      data_collator=collate, callbacks=[evaluated], **extra)
    # Every rank evaluates the same held-out set on its replica (the initial one after the
    # broadcast is only known once the optimizer exists: evaluate rank 0's start model here,
    # which is everyone's after the broadcast).
    start = trainer.evaluate()["eval_loss"]
    evaluated.checksums = []  # (the start's)
    trainer.train()
    after_train = checksum(list(trainer.model.named_parameters()))
    final = trainer.evaluate()["eval_loss"]
    trainer.save_model(os.path.join(out_dir, "final"))
    model = trainer.model
    named = list(model.named_parameters())
    result = {
        "rank": rank, "start_eval_loss": start, "final_eval_loss": final,
        "steps": trainer.state.global_step,
        "checksum": checksum(named),
        "trained_checksum": checksum([(n, p) for n, p in named if p.requires_grad]),
        "base_checksum": checksum([(n, p) for n, p in named if not p.requires_grad]),
        "base_unchanged": all(torch.equal(base_before[n], p) for n, p in named
                              if not p.requires_grad),
        "trained_names": [n for n, p in named if p.requires_grad],
        "seen": train.seen, "len_train": len(train),
        "eval_checksums": evaluated.checksums, "after_train_checksum": after_train,
        "log_history": trainer.state.log_history if rank == 0 else [],
    }
    if not a.single:
        opt = trainer.adaps_optimizer
        result["exchanged"] = opt.trained_names()
        result["exchange"] = opt.exchange
        result["num_workers"] = adaps.hf.worker().num_workers
    if a.lora:
        result["lora_max_abs"] = max(p.detach().abs().max().item() for n, p in named
                                     if "lora_B" in n)
    with open(os.path.join(a.out, "rank%d.json" % rank), "w") as f:
        json.dump(result, f)
    if not a.single:
        adaps.hf.worker().barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())

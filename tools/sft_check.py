#!/usr/bin/env python3
"""Checks a fine-tuned export with transformers (installed where it runs: the GPU machine's
python3, or any environment with torch and transformers; never the project's .venv):

    sft_check.py loss MODEL_DIR SHARD   the loss of every conversation of a tz-data shard (and its
                                        mask) run alone, the mask's targets only, over all their
                                        targets: what tz-train's --eval-every prints for that shard
                                        packed, when one evaluation batch holds all its rows
    sft_check.py chat MODEL_DIR TEXT    a greedy answer to TEXT through the tokenizer's chat
                                        template

docs/fine-tuning.md has the run this checked."""
import struct
import sys


def loss(model_dir, shard):
    import torch
    from transformers import AutoModelForCausalLM
    data = open(shard, "rb").read()
    n = struct.unpack("<3i", data[:12])[2]
    width = "H" if struct.unpack("<3i", data[:12])[1] == 1 else "I"
    tok = list(struct.unpack(f"<{n}{width}", data[1024:]))
    mask = open(shard + ".mask", "rb").read()[1024:]
    starts = [i for i in range(n) if mask[i] & 2] + [n]
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for a, b in zip(starts, starts[1:]):
            ids = torch.tensor([tok[a:b]])
            labels = torch.tensor([[t if mask[a + j] & 1 else -100
                                    for j, t in enumerate(tok[a:b])]])
            k = int((labels[0, 1:] != -100).sum())
            if k:
                total += model(input_ids=ids, labels=labels).loss.item() * k
                count += k
    print(f"transformers: {len(starts) - 1} conversations alone, {count} targets, "
          f"mean loss {total / count:.6f}")


def chat(model_dir, text):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)
    out = model.generate(**ids, max_new_tokens=32, do_sample=False)
    print("prompt:", repr(tok.decode(ids["input_ids"][0])))
    print("answer:", repr(tok.decode(out[0][ids["input_ids"].shape[1]:])))


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in ("loss", "chat"):
        sys.exit(__doc__)
    (loss if sys.argv[1] == "loss" else chat)(sys.argv[2], sys.argv[3])

#!/usr/bin/env python3
"""tools/tz-data end to end, with tokenizers trained here (nothing downloaded): JSONL and text
inputs through a glob become shards and sidecars that decode back to the documents (BOS where
the post-processor puts it, the eos between documents), split into shards of --shard-tokens and
a validation set; a vocabulary past 16 bits gives version-7 shards; tz-train trains on them with
--val-data, and refuses a sidecar whose vocabulary is larger than the model's and one made by
another tokenizer, by name. Needs the tokenizers package (tools/deps.sh installs it): without it
the test fails, it does not skip.

Usage: test_tz_data.py REPO_ROOT TZ_BIN"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

ROOT, BIN = sys.argv[1], sys.argv[2]
TZ_DATA = os.path.join(ROOT, "tools", "tz-data")
TZ_TRAIN = os.path.join(BIN, "tz-train")
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAIL: {what}", file=sys.stderr)


def run(cmd, want_rc=0):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != want_rc:
        print(p.stdout, p.stderr, sep="\n", file=sys.stderr)
    check(p.returncode == want_rc, f"{' '.join(cmd[:2])}... exited {p.returncode}, not {want_rc}")
    return p


def documents(n, seed):
    """n documents of words, some with newlines and non-ASCII text."""
    words = ("tier shard block lane fence plan memory host nvme gradient Adam loss step "
             "caf\u00e9 na\u00efve \u00fcber \u65e5\u672c").split()
    state = seed
    docs = []
    for _ in range(n):
        out = []
        state = (state * 6364136223846793005 + 1442695040888963407) % 2**64
        for _ in range(8 + state % 50):
            state = (state * 6364136223846793005 + 1442695040888963407) % 2**64
            out.append(words[(state >> 33) % len(words)])
        text = " ".join(out)
        if state % 3 == 0:
            text = text.replace(" step ", " step\n")
        docs.append(text)
    return docs


def make_tokenizer(where, docs, vocab, extra=0):
    """A byte-level BPE tokenizer trained on docs, BOS added by its post-processor, and a
    tokenizer_config.json naming bos, eos and pad; extra added tokens grow the vocabulary."""
    os.makedirs(where, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<s>", "</s>", "<pad>"],
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                             show_progress=False)
    tok.train_from_iterator(docs, tr)
    if extra:
        tok.add_tokens([f"<extra_{i}>" for i in range(extra)])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    tok.save(os.path.join(where, "tokenizer.json"))
    with open(os.path.join(where, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<s>", "eos_token": {"content": "</s>"}, "pad_token": "<pad>"}, f)
    return tok


def model_config(where, vocab):
    """A tiny Llama config.json (no weights) of vocabulary vocab."""
    os.makedirs(where, exist_ok=True)
    with open(os.path.join(where, "config.json"), "w") as f:
        json.dump({"model_type": "llama", "architectures": ["LlamaForCausalLM"],
                   "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                   "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": vocab,
                   "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
                   "tie_word_embeddings": False, "initializer_range": 0.02,
                   "hidden_act": "silu"}, f)


def read_shard(path):
    with open(path, "rb") as f:
        data = f.read()
    magic, version, n = struct.unpack("<3i", data[:12])
    check(magic == 20240520, f"{path}: magic {magic}")
    size = 2 if version == 1 else 4
    check(version in (1, 7), f"{path}: version {version}")
    check(len(data) == 1024 + n * size, f"{path}: {len(data)} bytes for {n} tokens")
    return version, list(struct.unpack(f"<{n}{'H' if size == 2 else 'I'}", data[1024:]))


def shards(out, split):
    return sorted(os.path.join(out, f) for f in os.listdir(out)
                  if f.startswith(f"data_{split}_") and f.endswith(".bin"))


def roundtrip(tmp):
    docs = documents(240, 7)
    # A JSONL document longer than a piece (--batch-bytes 2000): encoded in pieces cut after a
    # line end, its ids those of the whole, indentation and blank lines included.
    docs[5] = "".join(f"def f{i}():\n    {docs[i]}\n\n# end {i}\n" for i in range(60, 90))
    # Paragraphs (longer than a piece, shorter than two): no line end between two non-space
    # characters, so no cut ("\n\n" is one pre-token at the end of a piece, two inside one).
    docs[6] = "".join(docs[i].replace("\n", " ") + "\n\n" for i in range(90, 106))
    tok_dir = os.path.join(tmp, "model")
    tok = make_tokenizer(tok_dir, docs, 400)
    vocab = tok.get_vocab_size()
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    model_config(tok_dir, vocab)
    inputs = os.path.join(tmp, "in")
    os.makedirs(inputs)
    # Two JSONL files (the text under another field) and a text file of one document.
    with open(os.path.join(inputs, "a.jsonl"), "w") as f:
        for d in docs[:100]:
            f.write(json.dumps({"id": 1, "body": d}) + "\n")
    with open(os.path.join(inputs, "b.jsonl"), "w") as f:
        for d in docs[100:239]:
            f.write(json.dumps({"body": d}) + "\n\n")  # blank lines are no documents
    # One document of many lines, read in pieces (--batch-bytes 2000 below), encoded as one.
    text_doc = "\n".join(docs[150:240])
    with open(os.path.join(tmp, "c.txt"), "w") as f:
        f.write(text_doc)
    want = docs[:239] + [text_doc]

    out = os.path.join(tmp, "shards")
    p = run([TZ_DATA, "--tokenizer", tok_dir, "--out", out, "--field", "body",
             "--shard-tokens", "3000", "--val-docs", "12", "--progress", "none",
             "--batch-bytes", "2000",
             os.path.join(inputs, "*.jsonl"), os.path.join(tmp, "c.txt")])
    check("train: 228 documents" in p.stdout, f"tz-data's summary: {p.stdout}")
    train, val = shards(out, "train"), shards(out, "val")
    check(len(train) > 2 and len(val) == 1, f"shards {train} {val}")
    sha = __import__("hashlib").sha256(open(os.path.join(tok_dir, "tokenizer.json"), "rb")
                                       .read()).hexdigest()
    streams = {}
    for split, files in (("train", train), ("val", val)):
        ids = []
        for i, path in enumerate(files):
            version, t = read_shard(path)
            check(version == 1, f"{path}: version {version} for a vocabulary of {vocab}")
            with open(path + ".json") as f:
                side = json.load(f)
            check(side["tokens"] == len(t), f"{path}: sidecar tokens {side['tokens']} != {len(t)}")
            check(side["tokenizer_sha256"] == sha, f"{path}: sidecar hash")
            check(side["vocab_size"] == vocab, f"{path}: sidecar vocab {side['vocab_size']}")
            check((side["bos_id"], side["eos_id"], side["pad_id"]) ==
                  (bos, eos, tok.token_to_id("<pad>")), f"{path}: sidecar ids")
            check(side["split"] == split, f"{path}: sidecar split")
            if i < len(files) - 1:
                check(len(t) == 3000, f"{path}: {len(t)} tokens, not --shard-tokens 3000")
            ids += t
        streams[split] = ids
    # Decoded back: each document is BOS, its tokens, EOS, in input order (the first 12 in val).
    for split, expect in (("val", want[:12]), ("train", want[12:])):
        ids, got, cur = streams[split], [], []
        for t in ids:
            cur.append(t)
            if t == eos:
                got.append(cur)
                cur = []
        check(not cur, f"{split}: tokens after the last eos")
        check(len(got) == len(expect), f"{split}: {len(got)} documents, not {len(expect)}")
        for g, d in zip(got, expect):
            check(g[0] == bos, f"{split}: a document does not start with BOS {bos}: {g[:4]}")
            check(tok.decode(g[1:-1], skip_special_tokens=False) == d,
                  f"{split}: a document decodes to {tok.decode(g[1:-1])[:60]!r}, not {d[:60]!r}")
            check(g == tok.encode(d).ids + [eos], f"{split}: a document's ids are not encode's")
    return tok_dir, out, vocab


def train(tmp, tok_dir, out, vocab):
    train_glob, val_glob = os.path.join(out, "data_train_*.bin"), os.path.join(out, "data_val_*.bin")
    common = ["--steps", "3", "--seq", "16", "--progress", "plain", "--data", train_glob]
    p = run([TZ_TRAIN, "--model", tok_dir, *common, "--val-data", val_glob, "--eval-every", "3",
             "--export-safetensors", os.path.join(tmp, "exported")])
    check("eval loss" in p.stdout and "step 3/3" in p.stdout, f"tz-train's output: {p.stdout}")
    check(os.path.isfile(os.path.join(tmp, "exported", "config.json")), "no export")

    # A model whose vocabulary is smaller than the tokenizer's: refused by the sidecar's name,
    # before any step, even with every token of the data in range... here most are not, but the
    # sidecar is read first.
    small = os.path.join(tmp, "small")
    model_config(small, vocab - 1)
    p = run([TZ_TRAIN, "--model", small, *common], want_rc=2)
    check("data_train_000000.bin.json: the tokenizer's vocabulary (vocab_size %d) is larger "
          "than the model's (vocab_size %d)" % (vocab, vocab - 1) in p.stderr,
          f"vocabulary refusal: {p.stderr}")
    check("step 1/" not in p.stdout, "a step ran before the refusal")

    # Another tokenizer beside the model's config.json: refused, naming both files.
    other = os.path.join(tmp, "other")
    make_tokenizer(other, documents(50, 99), vocab)
    model_config(other, vocab)
    p = run([TZ_TRAIN, "--model", other, *common], want_rc=2)
    check("data_train_000000.bin.json was made by another tokenizer than %s/tokenizer.json"
          % other in p.stderr, f"tokenizer refusal: {p.stderr}")
    # ... and so is --tokenizer naming it, whatever the model directory holds.
    p = run([TZ_TRAIN, "--model", tok_dir, *common, "--tokenizer",
             os.path.join(other, "tokenizer.json")], want_rc=2)
    check("made by another tokenizer than" in p.stderr, f"--tokenizer refusal: {p.stderr}")


def wide(tmp):
    """A vocabulary past 65536 tokens (a word-level tokenizer made here): version-7 (uint32)
    shards, read by tz-train."""
    where = os.path.join(tmp, "wide")
    os.makedirs(where)
    words = {"<s>": 0, "</s>": 1, "<unk>": 2}
    words.update({f"w{i}": i + 3 for i in range(66000)})
    tok = Tokenizer(models.WordLevel(vocab=words, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(os.path.join(where, "tokenizer.json"))
    vocab = tok.get_vocab_size()
    check(vocab > 65536, f"vocabulary {vocab}")
    docs = [" ".join(f"w{(i * 7919 + k * 104729) % 66000}" for k in range(40)) for i in range(30)]
    with open(os.path.join(tmp, "w.jsonl"), "w") as f:
        for d in docs:
            f.write(json.dumps({"text": d}) + "\n")
    out = os.path.join(tmp, "wshards")
    # No tokenizer_config.json: --eot gives the id between documents.
    run([TZ_DATA, "--tokenizer", os.path.join(where, "tokenizer.json"), "--out", out,
         "--progress", "none", "--eot", "1", os.path.join(tmp, "w.jsonl")])
    version, ids = read_shard(os.path.join(out, "data_train_000000.bin"))
    check(version == 7, f"version {version} for a vocabulary of {vocab}")
    want = []
    for d in docs:
        want += tok.encode(d).ids + [1]
    check(ids == want, "version-7 tokens are not encode's")
    check(max(ids) >= 65536, "no token past 16 bits")
    model_config(where, vocab)
    run([TZ_TRAIN, "--model", where, "--steps", "1", "--seq", "16", "--data",
         os.path.join(out, "data_train_000000.bin")])


def bench(tmp, tok_dir):
    """--bench prints both rates and writes no shard."""
    out = os.path.join(tmp, "bench")
    p = run([TZ_DATA, "--tokenizer", tok_dir, "--out", out, "--bench", "1", "--field", "body",
             os.path.join(tmp, "in", "a.jsonl")])
    check("encode_batch alone" in p.stdout and "ratio" in p.stdout, f"--bench: {p.stdout}")
    check(not [f for f in os.listdir(out) if f.endswith(".bin")], "--bench wrote shards")


def bad_input(tmp, tok_dir):
    bad = os.path.join(tmp, "bad.jsonl")
    with open(bad, "w") as f:
        f.write('{"text": "a"}\n{"other": 1}\n')
    p = run([TZ_DATA, "--tokenizer", tok_dir, "--out", os.path.join(tmp, "b"), bad], want_rc=2)
    check(f"{bad}:2: no string field \"text\"" in p.stderr, f"bad JSONL: {p.stderr}")
    p = run([TZ_DATA, "--tokenizer", os.path.join(tmp, "none"), "--out", tmp, bad], want_rc=2)
    check("no such file" in p.stderr, f"missing tokenizer: {p.stderr}")
    noeos = os.path.join(tmp, "noeos")
    os.makedirs(noeos)
    shutil.copy(os.path.join(tok_dir, "tokenizer.json"), noeos)
    p = run([TZ_DATA, "--tokenizer", noeos, "--out", tmp, bad], want_rc=2)
    check("give --eot ID" in p.stderr, f"no eos: {p.stderr}")
    # issue 48 item 5: each names the file (and the byte), nothing is written, exit 2
    notutf = os.path.join(tmp, "latin1.txt")
    with open(notutf, "wb") as f:
        f.write("caf\u00e9 au lait\n".encode() + "na\u00efve".encode("latin-1") + b"\n")
    empty = os.path.join(tmp, "empty.txt")
    open(empty, "w").close()
    adir = os.path.join(tmp, "adir")
    os.makedirs(adir)
    fifo = os.path.join(tmp, "fifo.txt")
    os.mkfifo(fifo)
    one = os.path.join(tmp, "one.txt")
    with open(one, "w") as f:
        f.write("one line\n")
    for args, want in (([notutf], f"{notutf}: byte 16 is not UTF-8"),
                       ([empty], f"{empty} is empty"),
                       ([adir], f"{adir} is a directory"),
                       ([fifo], f"{fifo} is not a regular file"),
                       (["--batch-bytes", "0", one], "--batch-bytes 0: expected a positive")):
        out = os.path.join(tmp, "refused")
        p = run([TZ_DATA, "--tokenizer", tok_dir, "--out", out, *args], want_rc=2)
        check(want in p.stderr, f"{args}: wanted '{want}': {p.stderr}")
        check(not os.path.exists(out) or not os.listdir(out), f"{args}: wrote {out}")


def main():
    tmp = tempfile.mkdtemp(prefix="tz-test-tz-data-")
    try:
        tok_dir, out, vocab = roundtrip(tmp)
        train(tmp, tok_dir, out, vocab)
        wide(tmp)
        bench(tmp, tok_dir)
        bad_input(tmp, tok_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"test_tz_data: {len(failures)} failed" if failures else "test_tz_data: all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

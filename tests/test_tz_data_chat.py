#!/usr/bin/env python3
"""tools/tz-data's chat and instruction formats: conversations rendered with the tokenizer's chat
template become shards whose tokens and answer masks are transformers' (tests/data/chat: a
tokenizer, a template with {% generation %} marks and one without, 200 conversations, and what
transformers made of them: make_fixtures.py), with mask files whose headers, checksums and
document starts are checked; Alpaca and prompt-completion lines, --train-on-prompt, --eot, text
with --masks; each bad input refused with its file and line, leaving no shard; a conversation
without an answer skipped and counted. Needs the tokenizers and jinja2 packages (the project's
.venv: tools/venv.sh), not transformers: without them the test fails, it does not skip.

Then tz-train trains on the chat shards end to end: packed rows, the loss on the answers, a
packed validation set (its summary line says so), and a mask that belongs to another shard is
refused by name before any step.

Usage: test_tz_data_chat.py REPO_ROOT TZ_BIN"""
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib

from tokenizers import Tokenizer

ROOT = sys.argv[1]
TZ_TRAIN = os.path.join(sys.argv[2], "tz-train") if len(sys.argv) > 2 else None
TZ_DATA = os.path.join(ROOT, "tools", "tz-data")
FIX = os.path.join(ROOT, "tests", "data", "chat")
TARGET, DOC_START = 1, 2
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAIL: {what}", file=sys.stderr)
    return cond


def run(args, want_rc=0):
    p = subprocess.run([TZ_DATA, "--progress", "none", *args], capture_output=True, text=True)
    if p.returncode != want_rc:
        print(p.stdout, p.stderr, sep="\n", file=sys.stderr)
    check(p.returncode == want_rc, f"tz-data {' '.join(args[:6])}... exited {p.returncode}, "
          f"not {want_rc}")
    return p


def write_jsonl(path, objs):
    with open(path, "w") as f:
        for o in objs:
            f.write((o if isinstance(o, str) else json.dumps(o, ensure_ascii=False)) + "\n")
    return path


def read_shard(path):
    """(ids, mask bytes or None) of a shard, its mask file's header and its sidecar checked."""
    with open(path, "rb") as f:
        data = f.read()
    magic, version, n = struct.unpack("<3i", data[:12])
    check(magic == 20240520 and version == 1, f"{path}: magic {magic} version {version}")
    check(len(data) == 1024 + 2 * n, f"{path}: {len(data)} bytes for {n} tokens")
    ids = list(struct.unpack(f"<{n}H", data[1024:]))
    with open(path + ".json") as f:
        side = json.load(f)
    if not os.path.exists(path + ".mask"):
        check("mask" not in side and "targets" not in side, f"{path}: mask keys, no mask file")
        return ids, None
    with open(path + ".mask", "rb") as f:
        mdata = f.read()
    head = struct.unpack("<256I", mdata[:1024])
    mask = mdata[1024:]
    targets = sum(b & TARGET for b in mask)
    docs = sum(1 for b in mask if b & DOC_START)
    check(head[:7] == (20261205, 1, n, zlib.crc32(data[1024:]), zlib.crc32(mask), targets, docs),
          f"{path}.mask: header {head[:7]}, want (20261205, 1, {n}, crc32s "
          f"{zlib.crc32(data[1024:])} {zlib.crc32(mask)}, {targets}, {docs})")
    check(not any(head[7:]), f"{path}.mask: header words 7..255 not zero")
    check(len(mask) == n, f"{path}.mask: {len(mask)} mask bytes for {n} tokens")
    check(all(b in (0, TARGET, DOC_START) for b in mask),
          f"{path}.mask: a byte other than 0, 1 or 2 (a document's first token is no target)")
    check(n > 0 and mask[0] & DOC_START, f"{path}.mask: the shard does not start a document")
    check(side.get("mask") == os.path.basename(path) + ".mask" and side.get("targets") == targets
          and abs(side.get("target_fraction", -1) - targets / n) < 1e-12
          and side.get("documents") == docs and side.get("tokens") == n,
          f"{path}.json: mask keys {side}")
    return ids, mask


def shards(out, split="train"):
    return sorted(os.path.join(out, f) for f in os.listdir(out)
                  if f.startswith(f"data_{split}_") and f.endswith(".bin"))


def documents(out, split="train", fmt=None):
    """[(ids, mask)] of every document of a split, cut at the document-start bits."""
    docs = []
    for path in shards(out, split):
        ids, mask = read_shard(path)
        if fmt:
            with open(path + ".json") as f:
                check(json.load(f).get("source_format") == fmt, f"{path}.json: source_format")
        for t, m in zip(ids, mask):
            if m & DOC_START or not docs:  # (a shard that starts no document: checked above)
                docs.append(([], bytearray()))
            docs[-1][0].append(t)
            docs[-1][1].append(m)
    return docs


def bits(mask):
    """A mask's target bits as the fixture's string of 0 and 1."""
    return "".join(str(b & TARGET) for b in mask)


def load_fixtures():
    with open(os.path.join(FIX, "expected.json")) as f:
        expected = json.load(f)
    with open(os.path.join(FIX, "conversations.jsonl")) as f:
        convs = [json.loads(line)["messages"] for line in f]
    return expected, convs


def template_dirs(tmp):
    """{"default": the fixture's directory (tokenizer_config.json's list, its "default"),
    "chatml": a copy whose chat_template.jinja (the list's "chatml") wins over the list}."""
    d = os.path.join(tmp, "chatml")
    os.makedirs(d)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(FIX, f), d)
    with open(os.path.join(FIX, "tokenizer_config.json")) as f:
        named = {t["name"]: t["template"] for t in json.load(f)["chat_template"]}
    with open(os.path.join(d, "chat_template.jinja"), "w") as f:
        f.write(named["chatml"])
    return {"default": FIX, "chatml": d}, named


def same_as_fixtures(tmp, dirs, expected, n_convs):
    """Every conversation's ids and mask are transformers', in order, through shards of 3000
    tokens and a validation split of 10; shards of 250 tokens hold whole conversations, and
    worker processes render as the reader thread does."""
    conv_file = os.path.join(FIX, "conversations.jsonl")
    for name, d in dirs.items():
        want = expected[name]
        out = os.path.join(tmp, "fix-" + name)
        p = run(["--tokenizer", d, "--out", out, "--shard-tokens", "3000", "--val-docs", "10",
                 conv_file])
        check("train: 190 documents" in p.stdout, f"{name}: summary {p.stdout}")
        docs = documents(out, "val", "messages") + documents(out, "train", "messages")
        check(len(docs) == n_convs, f"{name}: {len(docs)} conversations, not {n_convs}")
        check(len(shards(out)) > 2, f"{name}: {len(shards(out))} shards of 3000 tokens")
        equal_ids = equal_masks = tokens = targets = 0
        for k, (ids, mask) in enumerate(docs[:n_convs]):
            same = ids == want["ids"][k], bits(mask) == want["masks"][k]
            if not all(same) and equal_ids + equal_masks == 2 * k:  # the first one only
                check(False, f"{name}: conversation {k}: ids or mask differ from transformers'"
                      f"\n  ids  {ids[:40]}\n  want {want['ids'][k][:40]}\n  mask {bits(mask)}"
                      f"\n  want {want['masks'][k]}")
            equal_ids += same[0]
            equal_masks += same[1]
            tokens += len(ids)
            targets += bits(mask).count("1")
        check(equal_ids == equal_masks == n_convs, f"{name}: {equal_ids} ids and {equal_masks} "
              f"masks of {n_convs} conversations equal transformers'")
        want_tokens = sum(len(x) for x in want["ids"])
        check(tokens == want_tokens, f"{name}: {tokens} tokens, not {want_tokens}")
        print(f"test_tz_data_chat: {name} template: {equal_ids} of {n_convs} conversations' ids "
              f"and {equal_masks} masks equal transformers' ({tokens} tokens, {targets} targets)")
        # Shards of 250 tokens: none holds part of a conversation; a longer one is alone. The
        # 40 longest conversations and 40 others, rendered by two worker processes (the default
        # for 4 MiB of conversations or more).
        picks = sorted(sorted(range(n_convs), key=lambda k: -len(want["ids"][k]))[:40]
                       + list(range(0, n_convs, 5)))
        picks = sorted(set(picks))
        with open(conv_file) as f:
            lines = f.readlines()
        some = write_jsonl(os.path.join(tmp, "some.jsonl"), [lines[k].rstrip("\n") for k in picks])
        out = os.path.join(tmp, "small-" + name)
        run(["--tokenizer", d, "--out", out, "--shard-tokens", "250", "--jobs", "2", some])
        longer = 0
        for path in shards(out):
            ids, mask = read_shard(path)
            starts = sum(1 for b in mask if b & DOC_START)
            check(len(ids) <= 250 or starts == 1,
                  f"{path}: {len(ids)} tokens, {starts} conversations (more than --shard-tokens "
                  "for one only)")
            longer += len(ids) > 250
        check(longer > 0, f"{name}: no conversation longer than 250 tokens")
        docs = documents(out)
        check([d[0] for d in docs] == [want["ids"][k] for k in picks]
              and [bits(d[1]) for d in docs] == [want["masks"][k] for k in picks],
              f"{name}: shards of 250, --jobs 2: ids or masks differ")


def last_run(mask):
    """mask with only its last run of targets kept: the completion's, when the prompt has
    earlier answers."""
    out, end = ["0"] * len(mask), mask.rfind("1")
    i = end
    while i >= 0 and mask[i] == "1":
        out[i] = "1"
        i -= 1
    return "".join(out)


def formats(tmp, dirs, expected, convs):
    tok = Tokenizer.from_file(os.path.join(FIX, "tokenizer.json"))
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    # Alpaca: the fixture's single-turn conversations, the user's text cut at its first blank
    # line into instruction and input (an empty or missing input: the instruction alone).
    picks = [k for k, c in enumerate(convs) if [m["role"] for m in c] == ["user", "assistant"]]
    lines = []
    for j, k in enumerate(picks):
        inst, _, extra = convs[k][0]["content"].partition("\n\n")
        line = {"instruction": inst, "output": convs[k][1]["content"]}
        if extra or j % 2:
            line["input"] = extra
        lines.append(line)
    src = write_jsonl(os.path.join(tmp, "alpaca.jsonl"), lines)
    out = os.path.join(tmp, "alpaca")
    run(["--tokenizer", FIX, "--out", out, src])
    docs = documents(out, fmt="alpaca")
    check(len(picks) >= 10 and [d[0] for d in docs] == [expected["default"]["ids"][k]
                                                        for k in picks],
          f"alpaca: {len(docs)} documents' ids are not those of the {len(picks)} conversations")
    check([bits(d[1]) for d in docs] == [expected["default"]["masks"][k] for k in picks],
          "alpaca: masks differ")

    # Prompt-completion of messages: the last answer the completion, the only target.
    picks = [k for k, c in enumerate(convs) if len(c) > 2 and c[-1]["role"] == "assistant"]
    src = write_jsonl(os.path.join(tmp, "pc.jsonl"),
                      [{"prompt": convs[k][:-1], "completion": convs[k][-1:]} for k in picks])
    for name, d in dirs.items():
        out = os.path.join(tmp, "pc-" + name)
        run(["--tokenizer", d, "--out", out, src])
        docs = documents(out, fmt="prompt-completion")
        want = expected[name]
        check([x[0] for x in docs] == [want["ids"][k] for k in picks],
              f"prompt-completion ({name}): ids differ")
        check([bits(x[1]) for x in docs] == [last_run(want["masks"][k]) for k in picks],
              f"prompt-completion ({name}): the masks are not the last answers'")
        check(any(want["masks"][k] != last_run(want["masks"][k]) for k in picks),
              f"prompt-completion ({name}): no prompt with an answer of its own")

    # Prompt-completion of strings: BOS, the text, the eos; the completion and eos the targets.
    pairs = [(f"Q: {c[0]['content']}\nA:", " " + c[1]["content"]) for c in convs[:30]
             if c[0]["role"] == "user" and c[1]["role"] == "assistant" and c[1]["content"]]
    # A character the vocabulary lacks is several byte tokens with one character's offsets: at
    # a completion's end, and on both sides of its start.
    pairs += [("Q: rare\nA: \u946b", "\u946b"), ("Q: rare\nA:", " ends \u946b\u946b")]
    src = write_jsonl(os.path.join(tmp, "pcs.jsonl"),
                      [{"prompt": p, "completion": c} for p, c in pairs])
    out = os.path.join(tmp, "pcs")
    run(["--tokenizer", FIX, "--out", out, src])
    docs = documents(out, fmt="prompt-completion")
    ok = len(docs) == len(pairs) > 5
    for (p, c), (ids, mask) in zip(pairs, docs):
        enc = tok.encode(p + c, add_special_tokens=False)
        m = "0" + "".join("1" if e > len(p) else "0" for _, e in enc.offsets) + "1"
        ok &= ids == [bos] + enc.ids + [eos] and bits(mask) == m
    check(ok, f"prompt-completion of strings: {len(docs)} documents, not BOS + the pair's ids + "
          "eos with the completion's tokens and eos the targets")

    # --train-on-prompt: every token but each conversation's first.
    out = os.path.join(tmp, "all")
    run(["--tokenizer", FIX, "--out", out, "--train-on-prompt",
         os.path.join(FIX, "conversations.jsonl")])
    docs = documents(out)
    check([d[0] for d in docs] == expected["default"]["ids"], "--train-on-prompt: ids differ")
    check(all(bytes(m) == bytes([DOC_START]) + bytes([TARGET]) * (len(m) - 1) for _, m in docs),
          "--train-on-prompt: not every token but the first a target")

    # --eot ID: one after each conversation, a target.
    out = os.path.join(tmp, "eot")
    first = write_jsonl(os.path.join(tmp, "first.jsonl"), [{"messages": c} for c in convs[:20]])
    run(["--tokenizer", FIX, "--out", out, "--eot", str(eos), first])
    docs = documents(out)
    check([d[0] for d in docs] == [x + [eos] for x in expected["default"]["ids"][:20]]
          and [bits(d[1]) for d in docs] == [x + "1" for x in expected["default"]["masks"][:20]],
          "--eot: not the conversation then the eos as a target")

    # Text with --masks: each document's first token starts it, every other one a target, no
    # document across shards; text without it has no mask file.
    texts = [" ".join(m["content"] or "" for m in c) for c in convs[:60]]
    src = write_jsonl(os.path.join(tmp, "text.jsonl"), [{"text": t} for t in texts])
    out = os.path.join(tmp, "textmask")
    run(["--tokenizer", FIX, "--out", out, "--masks", "--shard-tokens", "500", src])
    docs = documents(out, fmt="text")
    check([d[0] for d in docs] == [[bos] + tok.encode(t, add_special_tokens=False).ids + [eos]
                                   for t in texts], "text --masks: ids differ")
    check(all(bits(m) == "0" + "1" * (len(m) - 1) for _, m in docs),
          "text --masks: not every token but the first a target")
    out = os.path.join(tmp, "textplain")
    run(["--tokenizer", FIX, "--out", out, src])
    check(not [f for f in os.listdir(out) if f.endswith(".mask")], "text: a mask file")
    with open(shards(out)[0] + ".json") as f:
        side = json.load(f)
    check(not {"mask", "targets", "target_fraction", "source_format"} & set(side),
          f"text: sidecar keys of masks {sorted(side)}")


def skipped(tmp, convs):
    lines = [{"messages": convs[0]}, {"messages": [{"role": "user", "content": "hello"}]},
             {"messages": convs[1]},
             {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "x"}]}]
    src = write_jsonl(os.path.join(tmp, "skip.jsonl"), lines)
    out = os.path.join(tmp, "skip")
    p = run(["--tokenizer", FIX, "--out", out, src])
    check("2 conversations without a target token skipped" in p.stderr
          and f"{src}:2" in p.stderr, f"skipped conversations: {p.stderr}")
    check(len(documents(out)) == 2 and "train: 2 documents" in p.stdout,
          f"skipped conversations: {p.stdout}")


def bad_inputs(tmp, convs, named):
    """Each bad input after good lines (shards of 50 tokens: some closed before it): exit 2,
    the file and line named, and no shard, mask or sidecar left."""
    good = [json.dumps({"messages": c}) for c in convs[:6]]
    none_dir = os.path.join(tmp, "notemplate")
    os.makedirs(none_dir)
    shutil.copy(os.path.join(FIX, "tokenizer.json"), none_dir)
    with open(os.path.join(FIX, "tokenizer_config.json")) as f:
        cfg = json.load(f)
    del cfg["chat_template"]
    with open(os.path.join(none_dir, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f)
    unstable = os.path.join(tmp, "unstable")
    os.makedirs(unstable)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(FIX, f), unstable)
    with open(os.path.join(unstable, "chat_template.jinja"), "w") as f:
        # The last message rendered differently: a prefix's last answer is not the whole's.
        f.write(named["chatml"].replace("{{- message.content }}",
                                        "{{- message.content }}{% if loop.last %}!{% endif %}"))
    two_turns = json.dumps({"messages": [c for c in convs if sum(
        m["role"] == "assistant" for m in c) > 1][0]})
    cases = [  # (name, lines, tokenizer, extra args, the line named, words of the message)
        ("not JSON", good[:3] + ["{\"messages\": ["], FIX, [], 4, "not a JSON object"),
        ("no messages", good[:3] + ['{"text": "a"}'], FIX, [], 4, 'no "messages"'),
        ("messages not a list", good[:3] + ['{"messages": "a"}'], FIX, [], 4,
         '"messages" must be a non-empty list'),
        ("a message without role", good[:2] + ['{"messages": [{"content": "a"}]}'], FIX, [], 3,
         'string "role"'),
        ("alpaca without output", ['{"instruction": "a", "output": "b"}'] * 3
         + ['{"instruction": "a"}'], FIX, [], 4, 'no string field "output"'),
        ("a role the template refuses",
         good[:5] + ['{"messages": [{"role": "narrator", "content": "x"}]}'], FIX, [], 6,
         "refuses this conversation: Unknown role: narrator"),
        ("a template that fails", good[:3] + [json.dumps({"messages": [
            {"role": "user", "content": "a"}, {"role": "assistant", "tool_calls": 3}]})],
         os.path.join(tmp, "chatml"), [], 4, "fails to render this conversation"),
        ("no chat template", good[:3], none_dir, [], 1, "has no chat template"),
        ("unstable prefixes", [two_turns], unstable, [], 1, "does not render prefixes stably"),
        ("no format's fields", ['{"body": "x"}'], FIX, [], 1, "none of the fields"),
        ("a text file", None, FIX, ["--format", "messages"], None, "not JSONL"),
        ("--train-on-prompt of text", ['{"text": "a"}'], FIX, ["--train-on-prompt"], None,
         "--train-on-prompt"),
    ]
    # A worker process's refusal: the same, about the same line.
    refusal = next(c for c in cases if c[0] == "a role the template refuses")
    cases.append(("a refusal in a worker", refusal[1], FIX, ["--jobs", "2"], 6, refusal[5]))
    for k, (name, lines, tok_dir, extra, line, words) in enumerate(cases):
        if lines is None:
            src = os.path.join(tmp, f"bad{k}.txt")
            with open(src, "w") as f:
                f.write("plain text\n")
        else:
            src = write_jsonl(os.path.join(tmp, f"bad{k}.jsonl"), lines)
        out = os.path.join(tmp, f"bad{k}")
        p = run(["--tokenizer", tok_dir, "--out", out, "--shard-tokens", "50", *extra, src],
                want_rc=2)
        where = f"{src}:{line}" if line else src if lines is None else ""
        check(where in p.stderr and words in p.stderr,
              f"{name}: the message names neither {where!r} nor {words!r}: {p.stderr}")
        left = os.listdir(out) if os.path.isdir(out) else []
        check(not left, f"{name}: left {left}")


def train(tmp, dirs):
    """tz-train on tz-data's chat shards (the template with marks): packed rows, a packed
    validation set; then a shard's mask swapped for another's is refused before any step."""
    out = os.path.join(tmp, "train-chat")
    run(["--tokenizer", dirs["default"],
         "--out", out, "--shard-tokens", "6000", "--val-docs", "20",
         os.path.join(FIX, "conversations.jsonl")])
    model = os.path.join(tmp, "model")
    os.makedirs(model, exist_ok=True)
    vocab = Tokenizer.from_file(os.path.join(FIX, "tokenizer.json")).get_vocab_size()
    with open(os.path.join(model, "config.json"), "w") as f:
        json.dump({"model_type": "llama", "architectures": ["LlamaForCausalLM"],
                   "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                   "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": vocab,
                   "max_position_embeddings": 256, "rms_norm_eps": 1e-5,
                   "rope_theta": 10000.0, "tie_word_embeddings": False,
                   "initializer_range": 0.02, "hidden_act": "silu"}, f)
    common = [TZ_TRAIN, "--model", model, "--backend", "cpu", "--seq", "128", "--steps", "3",
              "--progress", "plain", "--data", os.path.join(out, "data_train_*.bin")]
    p = subprocess.run([*common, "--val-data", os.path.join(out, "data_val_*.bin"),
                        "--eval-every", "3"], capture_output=True, text=True)
    check(p.returncode == 0, f"tz-train on chat shards exited {p.returncode}: {p.stderr}")
    check("packed: 180 documents" in p.stdout, f"tz-train's data line: {p.stdout[:600]}")
    check("step 3/3" in p.stdout and "eval loss" in p.stdout, f"tz-train: {p.stdout[-600:]}")
    # Two epochs (ceil(2 * rows / 8) steps at micro-batch 8), and the same stopped at step 9,
    # mid-epoch, and resumed: the resumed steps are the uninterrupted run's, bit for bit.
    def losses(path):
        with open(path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        return [(r["step"], r["loss"]) for r in rows if "step" in r and not r.get("summary")]
    ep = [c for c in common if c not in ("--steps", "3")] + ["--per-device-train-batch-size", "8"]
    at = lambda *a: os.path.join(tmp, *a)
    p = subprocess.run([*ep, "--epochs", "2", "--metrics", at("whole.jsonl")],
                       capture_output=True, text=True)
    check(p.returncode == 0, f"--epochs 2: {p.stderr}")
    p = subprocess.run([*ep, "--steps", "9", "--metrics", at("parts.jsonl"), "--ckpt-dir",
                        at("ck")], capture_output=True, text=True)
    check(p.returncode == 0, f"the first 9 steps: {p.stderr}")
    p = subprocess.run([*ep, "--epochs", "2", "--metrics", at("parts.jsonl"), "--resume",
                        at("ck")], capture_output=True, text=True)
    check(p.returncode == 0, f"resumed: {p.stderr}")
    whole, parts = losses(at("whole.jsonl")), losses(at("parts.jsonl"))
    with open(at("whole.jsonl")) as f:
        epochs = [json.loads(line).get("epoch") for line in f if '"step"' in line]
    epochs = [e for e in epochs if e is not None]
    check(len(epochs) == len(whole) and 2.0 <= epochs[-1] < 2.0 + 8.0 / max(1, len(whole)),
          f"the metrics' epoch: {epochs[-3:]} over {len(whole)} steps")
    m = re.search(r"into (\d+) rows of", p.stdout)
    rows = int(m.group(1)) if m else 0
    check(len(whole) == (2 * rows + 7) // 8 and len(whole) > 2 * 9 and whole == parts,
          f"resumed mid-epoch: {len(parts)} steps, first difference "
          f"{next(((a, b) for a, b in zip(whole, parts) if a != b), None)}")
    # Another shard's mask beside the first shard: refused, naming the file, before any step.
    train_shards = shards(out)
    if len(train_shards) >= 2:
        a, b = train_shards[0], train_shards[1]
        shutil.copyfile(b + ".mask", a + ".mask")
        p = subprocess.run(common, capture_output=True, text=True)
        check(p.returncode != 0 and os.path.basename(a) + ".mask" in p.stderr
              and "step 1/" not in p.stdout, f"another shard's mask: {p.stderr} {p.stdout}")
    else:
        check(False, f"expected two training shards of 6000 tokens, got {train_shards}")


def main():
    tmp = tempfile.mkdtemp(prefix="tz-test-tz-data-chat-")
    try:
        expected, convs = load_fixtures()
        dirs, named = template_dirs(tmp)
        same_as_fixtures(tmp, dirs, expected, len(convs))
        formats(tmp, dirs, expected, convs)
        skipped(tmp, convs)
        bad_inputs(tmp, convs, named)
        if TZ_TRAIN:
            train(tmp, dirs)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"test_tz_data_chat: {len(failures)} failed" if failures
          else "test_tz_data_chat: all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

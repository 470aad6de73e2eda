#!/usr/bin/env python3
"""Makes the fixtures of tests/test_tz_data_chat.py: a small byte-level BPE tokenizer trained here,
its tokenizer_config.json with two chat templates, 200 conversations, and what transformers'
apply_chat_template makes of them with each template: the token ids, and the assistant mask.

  python3 -m venv /tmp/tfenv && /tmp/tfenv/bin/pip install transformers tokenizers jinja2
  /tmp/tfenv/bin/python tests/data/chat/make_fixtures.py

The template "default" marks the answers with {% generation %}: its mask is transformers'
return_assistant_tokens_mask=True. "chatml" has no marks: its mask is the tokens that overlap the
characters each assistant message adds to the rendering (rendered by transformers with and
without it, the conversation before it with the generation prompt), the method tz-data uses for
templates without marks. The outputs are committed; the test needs neither transformers nor this
script. Deterministic: running it again gives the same files (with the same library versions).
"""
import json
import os
import random

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

HERE = os.path.dirname(os.path.abspath(__file__))

# Llama 2 / Mistral-like, answers in {% generation %} blocks that start after the space that
# follows [/INST] (the answer's first token, " word", straddles the block's start); tool calls
# and tool results through tojson.
MARKED = """{{- bos_token }}
{%- for message in messages %}
{%- if message.role == 'system' %}
{{- '<<SYS>>\\n' + message.content | trim + '\\n<</SYS>>\\n\\n' }}
{%- elif message.role == 'user' %}
{{- '[INST] ' + message.content | trim + ' [/INST]' }}
{%- elif message.role == 'tool' %}
{{- '[TOOL_RESULTS] ' + message.content | tojson + ' [/TOOL_RESULTS]' }}
{%- elif message.role == 'assistant' %}
{{- ' ' }}
{%- generation %}
{%- if message.tool_calls is defined %}
{{- '[TOOL_CALLS] ' + message.tool_calls | tojson }}
{%- else %}
{{- message.content | trim }}
{%- endif %}
{{- eos_token }}
{%- endgeneration %}
{%- else %}
{{- raise_exception('Unknown role: ' + message.role) }}
{%- endif %}
{%- endfor %}
"""

# ChatML (Qwen 2.5-like): a default system message, no generation marks.
CHATML = """{%- if messages[0].role != 'system' %}
{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role not in ['system', 'user', 'assistant', 'tool'] %}
{{- raise_exception('Role ' + message.role + ' is not supported by this template') }}
{%- endif %}
{{- '<|im_start|>' + message.role + '\\n' }}
{%- if message.tool_calls is defined %}
{%- for call in message.tool_calls %}
{{- '<tool_call>\\n' + call.function | tojson + '\\n</tool_call>' }}
{%- endfor %}
{%- else %}
{{- message.content }}
{%- endif %}
{{- '<|im_end|>\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

WORDS = ("tier shard block lane fence plan memory host nvme gradient Adam loss step window "
         "token answer question model layer weight bias batch epoch rank world seed mask "
         "caf\u00e9 na\u00efve \u00fcber Z\u00fcrich \u65e5\u672c "
         "\u043f\u0440\u0438\u0432\u0435\u0442 the a of to and is in it that for on with as "
         "was at by").split()


def sentence(rng, lo, hi):
    words = [rng.choice(WORDS) for _ in range(rng.randint(lo, hi))]
    s = " ".join(words)
    if rng.random() < 0.2:
        s = s.replace(" the ", "\n\nthe ", 1)
    if rng.random() < 0.1:
        s = "  " + s + " "  # spaces the marked template trims and ChatML keeps
    if rng.random() < 0.1:
        s += f" {rng.randint(0, 99999)}."
    if rng.random() < 0.5:  # lower case: " word" is one token, which straddles a block's start
        return s
    return s[0].upper() + s[1:] if s[:1].isalpha() else s


def conversation(rng, i):
    """A conversation of mixed roles and lengths; every one has an assistant message and starts
    (after an optional system message) with a user message."""
    msgs = []
    if rng.random() < 0.4:
        msgs.append({"role": "system", "content": sentence(rng, 3, 15)})
    if i % 10 == 0:  # a short single turn, the shape Alpaca data has
        user = sentence(rng, 2, 12) + ("\n\n" + sentence(rng, 2, 10) if i % 20 == 0 else "")
        return msgs[:0] + [{"role": "user", "content": user},
                           {"role": "assistant", "content": sentence(rng, 1, 20)}]
    for turn in range(rng.choice((1, 1, 2, 2, 3, 4))):
        msgs.append({"role": "user", "content": sentence(rng, 1, 24)})
        if rng.random() < 0.12:  # a tool call (content null: dropped, as no content), its result
            call = {"type": "function", "function": {"name": "lookup", "arguments": {
                "city": rng.choice(("Z\u00fcrich", "Paris", "\u6771\u4eac")),
                "days": rng.randint(1, 9)}}}
            msgs.append({"role": "assistant", "content": None, "tool_calls": [call]})
            msgs.append({"role": "tool", "content": sentence(rng, 2, 8)})
        msgs.append({"role": "assistant", "content": sentence(rng, 1, 36)})
    return msgs


def train_tokenizer(convs):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<s>", "</s>", "<pad>", "<|im_start|>", "<|im_end|>"]
    tr = trainers.BpeTrainer(vocab_size=700, special_tokens=specials,
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                             show_progress=False)
    text = [m.get("content") or "" for c in convs for m in c]
    text += ["[INST] [/INST] <<SYS>> <</SYS>> [TOOL_CALLS] [TOOL_RESULTS] system user assistant "
             "tool <tool_call> </tool_call> You are a helpful assistant."] * 20
    tok.train_from_iterator(text, tr)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    return tok


def overlap_mask(offsets, spans):
    """1 for each token whose characters overlap a span, as transformers' assistant mask."""
    mask = []
    for start, end in offsets:
        mask.append(int(any(start < e and end > s for s, e in spans)))
    return mask


def main():
    rng = random.Random(20261205)
    convs = [conversation(rng, i) for i in range(200)]
    tok = train_tokenizer(convs)
    tok.save(os.path.join(HERE, "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
           "eos_token": {"__type": "AddedToken", "content": "</s>", "lstrip": False,
                         "normalized": False, "rstrip": False, "single_word": False,
                         "special": True},
           "pad_token": "<pad>",
           "chat_template": [{"name": "default", "template": MARKED},
                             {"name": "chatml", "template": CHATML}]}
    with open(os.path.join(HERE, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=1, ensure_ascii=False)
        f.write("\n")
    with open(os.path.join(HERE, "conversations.jsonl"), "w") as f:
        for c in convs:
            f.write(json.dumps({"messages": c}, ensure_ascii=False) + "\n")

    import transformers
    from transformers import AutoTokenizer
    hf = AutoTokenizer.from_pretrained(HERE)
    expected = {"transformers": transformers.__version__}
    # With marks: transformers' own assistant mask.
    ids, masks = [], []
    for c in convs:
        out = hf.apply_chat_template(c, tokenize=True, return_dict=True,
                                     return_assistant_tokens_mask=True)
        ids.append(list(out["input_ids"]))
        masks.append("".join(str(m) for m in out["assistant_masks"]))
    expected["default"] = {"ids": ids, "masks": masks}
    # Without marks: the spans each assistant message adds, from transformers' renderings.
    ids, masks = [], []
    for c in convs:
        full = hf.apply_chat_template(c, tokenize=False, chat_template="chatml")
        spans = []
        for i, m in enumerate(c):
            if m["role"] != "assistant":
                continue
            before = hf.apply_chat_template(c[:i], tokenize=False, chat_template="chatml",
                                            add_generation_prompt=True)
            after = hf.apply_chat_template(c[:i + 1], tokenize=False, chat_template="chatml")
            assert full.startswith(before) and full.startswith(after)
            spans.append((len(before), len(after)))
        enc = hf(full, add_special_tokens=False, return_offsets_mapping=True)
        ids.append(list(enc["input_ids"]))
        masks.append("".join(str(m) for m in overlap_mask(enc["offset_mapping"], spans)))
    expected["chatml"] = {"ids": ids, "masks": masks}
    with open(os.path.join(HERE, "expected.json"), "w") as f:
        # One conversation a line: compact, and a diff shows which one changed.
        f.write("{\"transformers\": %s,\n" % json.dumps(expected["transformers"]))
        for k, name in enumerate(("default", "chatml")):
            e = expected[name]
            f.write(" \"%s\": {\"ids\": [\n" % name)
            f.write(",\n".join(json.dumps(x, separators=(",", ":")) for x in e["ids"]))
            f.write("],\n  \"masks\": [\n")
            f.write(",\n".join(json.dumps(x) for x in e["masks"]))
            f.write("]}%s\n" % ("," if k == 0 else "}"))
    n = sum(len(x) for name in ("default", "chatml") for x in expected[name]["ids"])
    print(f"make_fixtures: {len(convs)} conversations, {n} tokens, transformers "
          f"{transformers.__version__}")


if __name__ == "__main__":
    main()

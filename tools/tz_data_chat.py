"""tz-data's chat and instruction formats: a JSONL line to the text of one document and the
character spans of its targets, through the tokenizer's own chat template (docs/data.md, "Chat
and instruction data").

A conversation is rendered with jinja2 in a sandbox set up as transformers' apply_chat_template
sets up its own (the same options, filters and globals), so that the text, and so the tokens, are
the ones the model is used with. The targets are the characters of the template's
{% generation %} blocks where it has them; otherwise the characters each assistant message adds
to the rendering, found by rendering the conversation's prefixes.
"""
import json
import os
import re
from datetime import datetime

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

FORMATS = ("text", "messages", "prompt-completion", "alpaca")

# Around the output of each {% generation %} block while rendering: Unicode noncharacters,
# reserved for a program's internal use, so that no text of a conversation is mistaken for one
# (a line that holds one is refused). Markers in the text, rather than offsets counted while the
# template's output streams out, stay right where jinja buffers output: a block inside a macro,
# a {% set %} block or a {% filter %} block.
OPEN, CLOSE = "\ufdd0", "\ufdd1"
GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")


class Fail(Exception):
    """An error of the input or the options: tz_data prints it as 'tz-data: ...', status 2."""


class Refused(jinja2.exceptions.TemplateError):
    """The template's own raise_exception: it refuses the conversation (a role it does not
    know, turns that do not alternate)."""


def _raise_exception(message):
    raise Refused(message)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # jinja2's own tojson escapes <, >, & and ' for HTML and takes no options; templates are
    # written against this one (Hugging Face's): plain JSON, non-ASCII text kept as it is.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


class Generation(jinja2.ext.Extension):
    """{% generation %} ... {% endgeneration %}: the enclosed output between OPEN and CLOSE."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_mark")
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _mark(self, caller):
        return OPEN + caller() + CLOSE


def token_string(cfg, key):
    """tokenizer_config.json's `key` as a string (it may be {"content": ...}), or None."""
    v = cfg.get(key)
    if isinstance(v, dict):
        v = v.get("content")
    return v if isinstance(v, str) else None


def find_template(tok_dir, cfg, cfg_path):
    """(source text, where it came from) of the chat template, or (None, None): chat_template.jinja
    beside the tokenizer wins over tokenizer_config.json's chat_template, as in transformers 4.43
    and later; a list of {name, template} gives its "default"."""
    jinja_path = os.path.join(tok_dir, "chat_template.jinja")
    if os.path.isfile(jinja_path):
        with open(jinja_path, encoding="utf-8") as f:
            return f.read(), jinja_path
    t = cfg.get("chat_template")
    if t is None:
        return None, None
    if isinstance(t, list):
        named = {e.get("name"): e.get("template") for e in t if isinstance(e, dict)}
        if not isinstance(named.get("default"), str):
            raise Fail(f"{cfg_path}: chat_template is a list with no \"default\" template (it "
                       f"has {sorted(str(n) for n in named)}): tz-data renders the default")
        return named["default"], f"{cfg_path} (chat_template \"default\")"
    if not isinstance(t, str):
        raise Fail(f"{cfg_path}: chat_template must be a string or a list of {{name, template}}")
    return t, f"{cfg_path} (chat_template)"


class Template:
    """A tokenizer's chat template, compiled, with the variables transformers gives it."""

    def __init__(self, source, where, cfg):
        self.where = where
        self.marks = GENERATION_TAG.search(source) is not None
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True,
            extensions=[jinja2.ext.loopcontrols, Generation])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            self.template = env.from_string(source)
        except jinja2.exceptions.TemplateSyntaxError as e:
            raise Fail(f"{where}: the chat template does not compile: line {e.lineno}: "
                       f"{e.message}")
        self.tokens = {k: s for k in ("bos_token", "eos_token", "pad_token", "unk_token")
                       if (s := token_string(cfg, k)) is not None}

    def render(self, messages, generation_prompt, where):
        """The text of messages, OPEN and CLOSE around each {% generation %} block's output."""
        try:
            return self.template.render(messages=messages, tools=None, documents=None,
                                        add_generation_prompt=generation_prompt, **self.tokens)
        except Refused as e:
            raise Fail(f"{where}: the chat template refuses this conversation: {e.message}")
        except Exception as e:  # jinja's or Python's, raised inside the template
            raise Fail(f"{where}: the chat template of {self.where} fails to render this "
                       f"conversation: {type(e).__name__}: {e}")

    def plain(self, messages, generation_prompt, where):
        """The text of messages, without markers."""
        text = self.render(messages, generation_prompt, where)
        return text.replace(OPEN, "").replace(CLOSE, "") if self.marks else text


def unmark(text, where):
    """(text without the markers, the character spans the outermost blocks enclosed)."""
    out, spans, at, depth, start = [], [], 0, 0, 0
    n = 0  # characters of out
    for m in re.finditer(f"[{OPEN}{CLOSE}]", text):
        out.append(text[at:m.start()])
        n += m.start() - at
        at = m.end()
        if m.group() == OPEN:
            if depth == 0:
                start = n
            depth += 1
        else:
            depth -= 1
            if depth < 0:
                raise Fail(f"{where}: the chat template's output ends a generation block that "
                           "it did not start")
            if depth == 0 and n > start:
                spans.append((start, n))
    if depth:
        raise Fail(f"{where}: the chat template's output leaves a generation block open")
    out.append(text[at:])
    return "".join(out), spans


def assistant_spans(tpl, messages, first, where):
    """(text, spans) of a conversation: the text its template renders, and the character spans of
    the assistant messages from index first on, by the template's generation marks or, without
    them, by rendering prefixes."""
    full = tpl.render(messages, False, where)
    if tpl.marks:
        text, spans = unmark(full, where)
        if first:
            # The targets start where the prompt, with the generation prompt, ends.
            prompt = tpl.plain(messages[:first], True, where)
            if not text.startswith(prompt):
                raise Fail(f"{where}: the chat template does not render prefixes stably: the "
                           "prompt with the generation prompt is not the start of the "
                           "conversation it begins (tz-data cannot tell where the completion "
                           "starts)")
            spans = [(max(s, len(prompt)), e) for s, e in spans if e > len(prompt)]
        return text, spans
    spans = []
    for i in range(first, len(messages)):
        if messages[i].get("role") != "assistant":
            continue
        before = tpl.render(messages[:i], True, where)
        after = tpl.render(messages[:i + 1], False, where)
        if not (full.startswith(before) and full.startswith(after)):
            what = (f"messages 0 to {i - 1} with the generation prompt" if
                    not full.startswith(before) else f"messages 0 to {i}")
            raise Fail(f"{where}: the chat template does not render prefixes stably: {what} "
                       "render as text that does not start the whole conversation's, so tz-data "
                       f"cannot tell which tokens are those of assistant message {i} (a template "
                       "with {% generation %} marks would say so itself)")
        if len(after) > len(before):
            spans.append((len(before), len(after)))
    return full, spans


def detect(obj, field, where):
    """The format of a first JSONL line (an object), from its fields."""
    if "messages" in obj:
        return "messages"
    if "prompt" in obj and "completion" in obj:
        return "prompt-completion"
    if "instruction" in obj and "output" in obj:
        return "alpaca"
    if field in obj:
        return "text"
    raise Fail(f"{where}: the first line has none of the fields of a format (\"messages\"; "
               f"\"prompt\" and \"completion\"; \"instruction\" and \"output\"; \"{field}\" of "
               "--field): --format names one")


def _messages(value, what, where):
    """value as a list of messages (each a dict with a string role; keys whose value is null
    dropped, as transformers does: templates test for a key, and would render null as None)."""
    if not isinstance(value, list) or not value:
        raise Fail(f"{where}: \"{what}\" must be a non-empty list of messages")
    out = []
    for k, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise Fail(f"{where}: message {k} of \"{what}\" is not an object with a string "
                       "\"role\"")
        if "content" not in m and "tool_calls" not in m:
            raise Fail(f"{where}: message {k} of \"{what}\" has no \"content\"")
        out.append({key: v for key, v in m.items() if v is not None})
    return out


def _string(obj, key, where, fmt, optional=False):
    v = obj.get(key)
    if v is None and optional:
        return ""
    if not isinstance(v, str):
        raise Fail(f"{where}: no string field \"{key}\" (a line of the {fmt} format has one)")
    return v


def conversation(obj, fmt, where):
    """(messages, index of the first message whose assistant turns are targets) of a line of a
    chat format; None for a string prompt-completion line."""
    if fmt == "messages":
        if "messages" not in obj:
            raise Fail(f"{where}: no \"messages\" (a line of the messages format has one; "
                       "--format names another)")
        return _messages(obj["messages"], "messages", where), 0
    if fmt == "alpaca":
        inst = _string(obj, "instruction", where, fmt)
        extra = _string(obj, "input", where, fmt, optional=True)
        out = _string(obj, "output", where, fmt)
        user = inst + ("\n\n" + extra if extra else "")
        return [{"role": "user", "content": user}, {"role": "assistant", "content": out}], 0
    # prompt-completion: TRL's two kinds, strings or lists of messages, each line either.
    if "prompt" not in obj or "completion" not in obj:
        raise Fail(f"{where}: no \"prompt\" and \"completion\" (a line of the prompt-completion "
                   "format has both; --format names another)")
    prompt, completion = obj["prompt"], obj["completion"]
    if isinstance(prompt, str) and isinstance(completion, str):
        return None
    if isinstance(prompt, list) and isinstance(completion, list):
        p = _messages(prompt, "prompt", where)
        return p + _messages(completion, "completion", where), len(p)
    raise Fail(f"{where}: \"prompt\" and \"completion\" must be both strings or both lists of "
               "messages")


def has_marker(line):
    low = line.lower()
    return OPEN in line or CLOSE in line or "\\ufdd0" in low or "\\ufdd1" in low


def read_json(line, where):
    """A JSONL line's object."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:  # its own line and column count from the line's start
        raise Fail(f"{where}: not a JSON object: {e.msg} at character {e.pos + 1}")
    if not isinstance(obj, dict):
        raise Fail(f"{where}: not a JSON object")
    return obj


class Doc:
    """A document with a mask: where it was read (a file, or file:line), the character spans of
    its targets in its text (None: every token is one), the ids put before its text (never
    targets) and after it (targets: the end of the answer)."""

    __slots__ = ("where", "spans", "pre", "post")

    def __init__(self, where, spans, pre, post):
        self.where, self.spans, self.pre, self.post = where, spans, pre, post


class Lines:
    """JSONL lines of a chat format to (text, Doc). Picklable (the template is compiled where it
    is used), so that worker processes can render: jinja2 is pure Python, and one core renders a
    few thousand conversations a second.

    fmt, every: the format and --train-on-prompt; template: (source, where it came from,
    tokenizer_config.json's object), or None, and no_template then the message that says so;
    text_pre, text_post, text_eot_missing: the ids around a prompt-completion pair of strings
    (and why there is no eot for one, or None); chat_post: the ids after a conversation."""

    def __init__(self, fmt, every, template, no_template, text_pre, text_post,
                 text_eot_missing, chat_post):
        self.fmt, self.every, self.template, self.no_template = fmt, every, template, no_template
        self.text_pre, self.text_post = text_pre, text_post
        self.text_eot_missing, self.chat_post = text_eot_missing, chat_post
        self.compiled = None

    def __getstate__(self):
        state = dict(self.__dict__)
        state["compiled"] = None
        return state

    def _template(self, where):
        if self.compiled is None:
            if self.template is None:
                raise Fail(f"{where}: {self.no_template}")
            self.compiled = Template(*self.template)
        return self.compiled

    def line(self, line, where):
        """(text, Doc) of one line."""
        obj = read_json(line, where)
        if has_marker(line):
            raise Fail(f"{where}: holds U+FDD0 or U+FDD1, noncharacters that tz-data uses to "
                       "mark the template's generation blocks")
        conv = conversation(obj, self.fmt, where)
        if conv is None:  # a prompt and a completion, two strings: the completion the target
            if self.text_eot_missing:
                raise Fail(f"{where}: {self.text_eot_missing}")
            prompt, text = obj["prompt"], obj["prompt"] + obj["completion"]
            spans = None if self.every else [(len(prompt), len(text))]
            return text, Doc(where, spans, self.text_pre, self.text_post)
        messages, first = conv
        tpl = self._template(where)
        if self.every:
            return tpl.plain(messages, False, where), Doc(where, None, [], self.chat_post)
        text, spans = assistant_spans(tpl, messages, first, where)
        return text, Doc(where, spans, [], self.chat_post)

    def chunk(self, lines):
        """[(text, True, True, bytes of the line, Doc)] of [(line, where)]: tz_data's pieces."""
        out = []
        for line, where in lines:
            text, doc = self.line(line, where)
            out.append((text, True, True, len(line), doc))
        return out


_lines = None  # a worker process's Lines


def worker_start(lines):
    global _lines
    _lines = lines


def worker_chunk(lines):
    return _lines.chunk(lines)

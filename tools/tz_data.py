#!/usr/bin/env python3
"""tz-data: text to the llm.c token shards tz-train reads, with a model's own tokenizer.

  tz-data --tokenizer MODEL_DIR_OR_TOKENIZER_JSON --out DIR [options] INPUT...

INPUT: text files (each file one document), JSONL files (*.jsonl, *.json: one document per
line), or a glob of them (quoted). Writes DIR/<name>_train_NNNNNN.bin (and
DIR/<name>_val_NNNNNN.bin with a validation split), each beside a sidecar <shard>.json that
tz-train checks against the model (docs/data.md).

A JSONL line is one of these formats (--format; by default the first line's fields decide):
  text               {"text": ...} (the field --field names): as a text file
  messages           {"messages": [{"role": ..., "content": ...}, ...]}
  prompt-completion  {"prompt": ..., "completion": ...}: two strings, or two lists of messages
  alpaca             {"instruction": ..., "input": ... (optional), "output": ...}
A text document is its tokens as the tokenizer's post-processor makes them (a BOS where it adds
one), then the end-of-text id: tokenizer_config.json's eos_token, or --eot. A conversation is the
text the tokenizer's chat template renders, tokenized as it is (no eot after it unless --eot).

Shards: the header of 256 little-endian int32 (magic 20240520, version, token count), then the
tokens: version 1 uint16 when the vocabulary fits in 16 bits, version 7 uint32 otherwise. Beside
each shard of a chat format (and of text with --masks) X.bin.mask says which tokens are targets:
the answers, which the loss is taken on (docs/data.md, "Chat and instruction data").

The corpus streams: a reader thread, encode_batch in the tokenizer's own thread pool, a writer
thread, with at most a few batches in flight; memory stays bounded whatever the corpus size.
"""
import argparse
import codecs
import collections
import glob
import hashlib
import json
import os
import queue
import sys
import threading
import time
import zlib
from array import array

try:
    from tokenizers import Tokenizer
    import tz_data_chat as chat
except ImportError as e:  # the message says how to get it
    sys.exit(f"tz-data: the Python package '{e.name}' is missing: run tools/tz-data (which "
             "makes the project's environment .venv with it: tools/venv.sh), not this file "
             "with another python3")

MAGIC = 20240520
HEADER_INTS = 256
FORMAT = "tierzero.tokens"
MASK_MAGIC = 20261205
MASK_VERSION = 1
TARGET, DOC_START = 1, 2  # the bits of a mask byte
CHUNK_BYTES = 256 << 10  # chat lines a worker renders at a time
JOBS_FROM_BYTES = 4 << 20  # chat input from which --jobs defaults to a process a core
Fail = chat.Fail  # an error of the input or the options: 'tz-data: ...', exit status 2


# ---- the tokenizer ----

def special_id(tok, cfg, key, path):
    """The id of tokenizer_config.json's `key` (a string or {"content": ...}), or None."""
    v = cfg.get(key)
    if isinstance(v, dict):
        v = v.get("content")
    if v is None:
        return None
    if not isinstance(v, str):
        raise Fail(f"{path}: \"{key}\" must be a token string, got {v!r}")
    i = tok.token_to_id(v)
    if i is None:
        raise Fail(f"{path}: \"{key}\" {v!r} is not a token of the tokenizer")
    return i


class Tok:
    """The tokenizer, its file's hash, its special ids, what its post-processor adds, and its
    tokenizer_config.json (the chat template's source and token strings)."""

    def __init__(self, where, eot):
        self.file = os.path.join(where, "tokenizer.json") if os.path.isdir(where) else where
        if not os.path.isfile(self.file):
            raise Fail(f"--tokenizer {where}: no such file {self.file} (a tokenizer.json, or a "
                       "model directory holding one)")
        with open(self.file, "rb") as f:
            self.sha256 = hashlib.sha256(f.read()).hexdigest()
        try:
            self.tok = Tokenizer.from_file(self.file)
        except Exception as e:  # the library's own message names what is wrong
            raise Fail(f"{self.file}: not a tokenizer the tokenizers package reads: {e}")
        self.vocab = self.tok.get_vocab_size(with_added_tokens=True)
        self.dir = os.path.dirname(os.path.abspath(self.file))
        cfg_path = os.path.join(self.dir, "tokenizer_config.json")
        cfg = {}
        if os.path.isfile(cfg_path):
            with open(cfg_path) as f:
                try:
                    cfg = json.load(f)
                except ValueError as e:
                    raise Fail(f"{cfg_path}: {e}")
        self.bos = special_id(self.tok, cfg, "bos_token", cfg_path)
        self.eos = special_id(self.tok, cfg, "eos_token", cfg_path)
        self.pad = special_id(self.tok, cfg, "pad_token", cfg_path)
        self.cfg, self.cfg_path = cfg, cfg_path
        # The eot after a text document: eos_token unless --eot says otherwise; after a
        # conversation, whose template ends its turns itself, only the one --eot ID forces.
        self.eot_missing = None
        self.chat_eot = None
        if eot is None:
            self.eot = self.eos
            if self.eos is None:
                self.eot_missing = (f"no eos_token in {cfg_path} to put between documents: give "
                                    "--eot ID (or --eot none)")
        elif eot == "none":
            self.eot = None
        else:
            try:
                self.eot = int(eot)
            except ValueError:
                raise Fail(f"--eot: expected a token id or none, got {eot!r}")
            if not 0 <= self.eot < self.vocab:
                raise Fail(f"--eot {self.eot}: not below the vocabulary size {self.vocab}")
            self.chat_eot = self.eot
        # What the post-processor puts around a document (a BOS, say): the difference between a
        # text encoded with and without special tokens. Documents are encoded without them (so a
        # file read in pieces is one document) and get these around them.
        probe = "tierzero"
        bare = self.tok.encode(probe, add_special_tokens=False).ids
        full = self.tok.encode(probe, add_special_tokens=True).ids
        at = next((i for i in range(len(full) - len(bare) + 1) if full[i:i + len(bare)] == bare),
                  None)
        if at is None:
            raise Fail(f"{self.file}: the post-processor changes a document's own tokens; "
                       "tz-data only supports one that adds tokens around it")
        self.prefix = full[:at]
        self.suffix = full[at + len(bare):]
        if self.eot is not None and self.suffix[-1:] == [self.eot]:
            self.eot = None  # the post-processor ends every document with it already
        self.tail = self.suffix + ([self.eot] if self.eot is not None else [])
        self.encode = getattr(self.tok, "encode_batch_fast", self.tok.encode_batch)

    def need_eot(self):
        """Refuses text documents when their eot is unknown."""
        if self.eot_missing:
            raise Fail(self.eot_missing)


# ---- reading: documents in pieces ----

def expand(inputs):
    files = []
    for spec in inputs:
        if any(c in spec for c in "*?["):
            got = sorted(glob.glob(spec))
            if not got:
                raise Fail(f"no file matches {spec}")
        else:
            got = [spec]
        for path in got:
            # checked without opening: a FIFO or device would block or never end
            if not os.path.lexists(path):
                raise Fail(f"no such file {path}")
            if os.path.isdir(path):
                raise Fail(f"{path} is a directory: give its files (a quoted glob such as "
                           f"'{path.rstrip('/')}/*.txt')")
            if not os.path.isfile(path):
                raise Fail(f"{path} is not a regular file (a FIFO, device or socket is not read)")
            if os.path.getsize(path) == 0:
                raise Fail(f"{path} is empty")
            files.append(path)
    return files


def utf8_error_offset(path):
    """The byte offset of path's first byte that is not UTF-8, read in pieces (the file may be
    large); -1 if there is none."""
    dec = codecs.getincrementaldecoder("utf-8")()
    off = 0
    with open(path, "rb") as f:
        while True:
            chunk = f.read(1 << 20)
            try:
                dec.decode(chunk, final=not chunk)
            except UnicodeDecodeError as e:  # e.object: the decoder's pending bytes + chunk
                return off - (len(e.object) - len(chunk)) + e.start
            if not chunk:
                return -1
            off += len(chunk)


def is_jsonl(path):
    return path.endswith((".jsonl", ".json", ".ndjson"))


def cut_point(s, limit):
    """The last i <= limit with s[i-1] a line end between two characters that are no white
    space (0: none): a pre-token boundary of byte-level tokenizers (GPT-2's and Llama 3's make
    such a line end a token of its own, "\n\n" or "\n  " would be one token), so pieces cut
    there encode as the whole does."""
    i = s.rfind("\n", 0, limit)
    while i >= 0:
        if i + 1 < len(s) and not s[i + 1].isspace() and i > 0 and not s[i - 1].isspace():
            return i + 1
        i = s.rfind("\n", 0, i)
    return 0


def first_cut(s, start, end):
    """The first cut point (as cut_point says) in [start, end), or 0."""
    i = s.find("\n", max(start - 1, 0), end)
    while i >= 0:
        if i + 1 < len(s) and not s[i + 1].isspace() and i > 0 and not s[i - 1].isspace():
            return i + 1
        i = s.find("\n", i + 1, end)
    return 0


# Cuts of a document that had no exact cut point within INEXACT_AFTER pieces (all its lines
# indented, say): made at a line end all the same, to bound memory; counted and reported.
inexact = [0]
INEXACT_AFTER = 2


def split_text(text, piece_bytes):
    """(piece, first, last) of one document: itself, or pieces of about piece_bytes."""
    first = True
    while len(text) > piece_bytes:
        cut = cut_point(text, piece_bytes) or first_cut(text, piece_bytes,
                                                        INEXACT_AFTER * piece_bytes)
        if cut == 0 and len(text) > INEXACT_AFTER * piece_bytes:
            cut = text.rfind("\n", 0, piece_bytes) + 1
            inexact[0] += cut > 0
        if cut == 0:
            break
        yield text[:cut], first, False
        text, first = text[cut:], False
    yield text, first, True


class Source:
    """How the input becomes documents: the format (chat.FORMATS) and the options that shape it.
    A document comes with a chat.Doc when shards get masks, with None otherwise."""

    def __init__(self, fmt, args, tok, jobs):
        self.fmt, self.field, self.tok, self.jobs = fmt, args.field, tok, jobs
        self.masks = fmt != "text" or args.masks
        self.every = args.train_on_prompt  # every token a target, the prompt's too
        # The sidecar's eot_id: the id after a conversation (only --eot ID puts one), or after a
        # text document (and a prompt-completion pair of strings).
        self.eot_id = tok.chat_eot if fmt in ("messages", "alpaca") else tok.eot
        # The sidecar's bos_added: what tz-data puts before a text document; a template puts a
        # conversation's BOS in its text itself.
        self.bos_added = [] if fmt in ("messages", "alpaca") else tok.prefix
        self.lines = None
        if fmt != "text":
            source, origin = chat.find_template(tok.dir, tok.cfg, tok.cfg_path)
            no_template = (f"{tok.file} has no chat template (neither chat_template.jinja beside "
                           f"it nor a chat_template in {tok.cfg_path}) to render this "
                           "conversation with: give a tokenizer that has one, or --format text "
                           "to tokenize a text field as it is")
            self.lines = chat.Lines(
                fmt, self.every, source and (source, origin, tok.cfg), no_template,
                tok.prefix, tok.tail, tok.eot_missing,
                [tok.chat_eot] if tok.chat_eot is not None else [])

    def text_doc(self, where):
        t = self.tok
        return chat.Doc(where, None, t.prefix, t.tail) if self.masks else None


def first_format(files, field):
    """The format of the first line of the first JSONL input (--format auto); text when no
    input is JSONL."""
    for path in files:
        if not is_jsonl(path):
            return "text"
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    where = f"{path}:{n}"
                    return chat.detect(chat.read_json(line, where), field, where)
    return "text"


def chat_lines(files, src):
    """(text, True, True, n, doc) for every line of chat-format JSONL files, in order: rendered
    in the reader thread, or with --jobs N by N worker processes, chunks of lines at a time, at
    most two chunks a worker in flight."""
    def chunks():
        chunk, size = [], 0
        for path in files:
            if not is_jsonl(path):
                raise Fail(f"{path}: not JSONL (.jsonl, .json, .ndjson), so not of the {src.fmt} "
                           "format: give text files with --format text")
            with open(path, encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    if line.strip():
                        chunk.append((line, f"{path}:{n}"))
                        size += len(line)
                        if size >= CHUNK_BYTES:
                            yield chunk
                            chunk, size = [], 0
        if chunk:
            yield chunk

    if src.jobs <= 1:
        for chunk in chunks():
            yield from src.lines.chunk(chunk)
        return
    import multiprocessing
    # spawn: the reader is a thread of a process with others (the writer, the tokenizer's pool),
    # which a fork would copy in whatever state they are.
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(src.jobs, initializer=chat.worker_start, initargs=(src.lines,)) as pool:
        pending = collections.deque()
        for chunk in chunks():
            pending.append(pool.apply_async(chat.worker_chunk, (chunk,)))
            if len(pending) >= 2 * src.jobs:
                yield from pending.popleft().get()
        while pending:
            yield from pending.popleft().get()


def pieces(files, src, piece_bytes):
    """(text, first, last, n, doc) for every piece of every document, in order, n the input bytes
    it stands for, doc its chat.Doc (or None: no masks): a JSONL line, or a text file read in
    pieces of about piece_bytes; a text document longer than that is cut where cut_point says,
    so that one in-flight batch stays small. A conversation is one piece, however long."""
    try:
        if src.fmt != "text":
            yield from chat_lines(files, src)
            return
        for path in files:
            yield from text_pieces(path, src.field, src, piece_bytes)
    except UnicodeDecodeError as e:
        raise not_utf8(files, e) from None


def not_utf8(files, e):
    """The refusal of a decoding error: the first file with a byte that is not UTF-8, and where."""
    for path in files:
        off = utf8_error_offset(path)
        if off >= 0:
            return Fail(f"{path}: byte {off} is not UTF-8 ({e.reason}): text and JSONL are read "
                        f"as UTF-8")
    return Fail(f"not UTF-8: {e}")


def text_pieces(path, field, src, piece_bytes):
    """pieces() of one file."""
    if is_jsonl(path):
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                where = f"{path}:{n}"
                obj = chat.read_json(line, where)
                text = obj.get(field)
                if not isinstance(text, str):
                    raise Fail(f"{where}: no string field \"{field}\" (--field names it)")
                size, doc = len(line), src.text_doc(where)
                for piece, first, last in split_text(text, piece_bytes):
                    yield piece, first, last, size, doc
                    size = 0
    else:
        with open(path, encoding="utf-8", newline="") as f:
            first = True
            carry = ""
            doc = src.text_doc(path)
            while True:
                block = f.read(piece_bytes)
                if not block:
                    break
                block = carry + block
                cut = cut_point(block, len(block))
                if cut == 0:
                    carry = block
                    continue
                carry = block[cut:]
                yield block[:cut], first, False, cut, doc
                first = False
            yield carry, first, True, len(carry), doc


def batches(files, src, batch_bytes, out_q, stop):
    """Pieces grouped into batches of about batch_bytes, put on out_q; None at the end; an
    exception is put instead when reading fails."""
    try:
        batch, size = [], 0
        for item in pieces(files, src, min(batch_bytes, 1 << 20)):
            batch.append(item)
            size += item[3]
            if size >= batch_bytes:
                out_q.put(batch)
                batch, size = [], 0
                if stop.is_set():
                    return
        if batch:
            out_q.put(batch)
        out_q.put(None)
    except BaseException as e:  # handed to the main thread, which raises it
        out_q.put(e)


# ---- writing ----

class Split:
    """The shards of one split: tokens appended, a shard closed when full, a sidecar each, and
    with masks a mask file each, whose shards start at a document and hold whole documents."""

    def __init__(self, out, name, split, tok, shard_tokens, src):
        self.out, self.name, self.split, self.tok = out, name, split, tok
        self.shard_tokens = shard_tokens
        self.version = 1 if tok.vocab <= 1 << 16 else 7
        self.code = "H" if self.version == 1 else "I"
        self.src = src
        self.masked = src.masks
        self.index = 0
        self.f = self.mf = None
        self.tokens = self.docs = self.targets = 0
        self.doc_open = False  # the current document has tokens in the current shard
        self.written = []
        self.total_tokens = self.total_docs = self.total_targets = 0

    def _open(self):
        path = os.path.join(self.out, f"{self.name}_{self.split}_{self.index:06d}.bin")
        self.path, self.tmp = path, path + ".tmp"
        self.f = open(self.tmp, "wb")
        self.f.write(bytes(HEADER_INTS * 4))
        if self.masked:
            self.mf = open(path + ".mask.tmp", "wb")
            self.mf.write(bytes(HEADER_INTS * 4))
        self.tokens = self.docs = self.targets = 0
        self.crc_tokens = self.crc_mask = 0

    def _finish_file(self, f, values, tmp, path):
        header = array("i", [0] * HEADER_INTS)
        header[:len(values)] = array("i", values)
        if sys.byteorder != "little":
            header.byteswap()
        f.seek(0)
        f.write(header.tobytes())
        f.flush()
        os.fsync(f.fileno())
        f.close()
        os.replace(tmp, path)

    def _close(self):
        self._finish_file(self.f, [MAGIC, self.version, self.tokens], self.tmp, self.path)
        self.f = None
        t = self.tok
        side = {
            "format": FORMAT, "version": 1, "shard": os.path.basename(self.path),
            "split": self.split, "shard_version": self.version,
            "tokenizer": self.tok.file, "tokenizer_sha256": t.sha256, "vocab_size": t.vocab,
            "bos_id": t.bos, "eos_id": t.eos, "pad_id": t.pad, "eot_id": self.src.eot_id,
            "bos_added": self.src.bos_added, "documents": self.docs, "tokens": self.tokens,
        }
        if self.masked:
            # The crc32s as int32 bit patterns: the header is int32, the readers take uint32.
            signed = [c - (1 << 32) if c >= 1 << 31 else c for c in (self.crc_tokens,
                                                                        self.crc_mask)]
            self._finish_file(self.mf, [MASK_MAGIC, MASK_VERSION, self.tokens, *signed,
                                        self.targets, self.docs],
                              self.path + ".mask.tmp", self.path + ".mask")
            self.mf = None
            side.update({"mask": os.path.basename(self.path) + ".mask", "targets": self.targets,
                         "target_fraction": self.targets / self.tokens,
                         "source_format": self.src.fmt})
        tmp = self.path + ".json.tmp"
        with open(tmp, "w") as f:
            json.dump(side, f, indent=1)
            f.write("\n")
        os.replace(tmp, self.path + ".json")
        self.written.append(self.path)
        self.total_tokens += self.tokens
        self.total_targets += self.targets
        self.index += 1

    def _write(self, part):
        if sys.byteorder != "little":
            part.byteswap()
        data = part.tobytes()
        self.f.write(data)
        if self.masked:
            self.crc_tokens = zlib.crc32(data, self.crc_tokens)

    def add(self, ids, first, last):
        """A piece's ids (an array of the shard's type), without masks; a document starts at
        first and may continue in the next shard."""
        if first:
            self.total_docs += 1
            self.doc_open = False
        at = 0
        while at < len(ids):
            if self.f is None:
                self._open()
            if not self.doc_open:
                self.docs += 1
                self.doc_open = True
            room = self.shard_tokens - self.tokens
            part = ids[at:at + room]
            self._write(part)
            self.tokens += len(part)
            at += len(part)
            if self.tokens == self.shard_tokens:
                self._close()
                self.doc_open = False

    def add_doc(self, ids, mask, targets):
        """A whole document with its mask (a bytearray, one byte a token, DOC_START at 0): in the
        current shard when it fits in what is left, else at the start of the next; one longer
        than --shard-tokens makes a shard of its own, that much larger."""
        if self.f is not None and self.tokens + len(ids) > self.shard_tokens:
            self._close()
        if self.f is None:
            self._open()
        self._write(ids)
        self.mf.write(mask)
        self.crc_mask = zlib.crc32(mask, self.crc_mask)
        self.tokens += len(ids)
        self.targets += targets
        self.docs += 1
        self.total_docs += 1
        if self.tokens >= self.shard_tokens:
            self._close()

    def finish(self):
        if self.f is not None and self.tokens:
            self._close()
        else:
            self._discard()

    def _discard(self):
        """Closes and removes the shard being written, if any."""
        for f in (self.f, self.mf):
            if f is not None:
                f.close()
        if self.f is not None:
            for p in (self.tmp, self.path + ".mask.tmp"):
                if os.path.exists(p):
                    os.unlink(p)
        self.f = self.mf = None

    def abort(self):
        """Removes what this split wrote: a run that fails leaves no shard, mask or sidecar."""
        self._discard()
        for path in self.written:
            for p in (path, path + ".tmp", path + ".mask", path + ".mask.tmp", path + ".json",
                      path + ".json.tmp"):
                try:
                    os.unlink(p)
                except FileNotFoundError:
                    pass
        self.written = []


def in_val(doc, args):
    """1 when document doc (0-based, in input order) is in the validation split: the first
    --val-docs, or every 1/F-th with --val-fraction F (evenly spread)."""
    if args.val_docs:
        return doc < args.val_docs
    f = args.val_fraction
    return f > 0 and int((doc + 1) * f) > int(doc * f)


def mark_targets(enc, spans, mask, at):
    """Sets TARGET in mask[at + t] for each token t of enc whose characters overlap a span, as
    transformers' return_assistant_tokens_mask does (a token cut by a span's edge is in: the
    first token of an answer often starts with the space before it); returns how many. Those are
    the tokens from one holding the span's first character to one holding its last, widened by
    the neighbours that hold part of the same character (byte-level tokens of a character that
    has no token of its own); characters no token holds (white space some pre-tokenizers drop)
    are stepped over."""
    n, count = 0, len(enc.ids)
    for start, end in spans:
        first = last = None
        for c in range(start, end):
            first = enc.char_to_token(c)
            if first is not None:
                break
        if first is None:
            continue
        for c in range(end - 1, start - 1, -1):
            last = enc.char_to_token(c)
            if last is not None:
                break
        while first > 0 and enc.token_to_chars(first - 1)[1] > start:
            first -= 1
        while last + 1 < count and enc.token_to_chars(last + 1)[0] < end:
            last += 1
        mask[at + first:at + last + 1] = bytes([TARGET]) * (last + 1 - first)
        n += last + 1 - first
    return n


def writer(in_q, splits, tok, args, progress, skipped):
    """Encoded batches from in_q into the splits, in order. A document with a mask is gathered
    whole (its pieces, when a text document is read in several) before it goes to a shard; a
    conversation without a target token goes to none, counted in skipped."""
    code = splits["train"].code
    prefix, tail = array(code, tok.prefix), array(code, tok.tail)
    doc = -1
    try:
        while True:
            item = in_q.get()
            if item is None:
                return
            metas, encs, nbytes = item
            for (first, last, d), enc in zip(metas, encs):
                if d is None:
                    if first:
                        doc += 1
                        split = splits["val"] if in_val(doc, args) else splits["train"]
                    ids = array(code, enc.ids)
                    if first and prefix:
                        ids = prefix + ids
                    if last and tail:
                        ids += tail
                    split.add(ids, first, last)
                    continue
                if first:
                    ids, mask, hits = array(code, d.pre), bytearray(len(d.pre)), 0
                at = len(ids)
                ids.extend(enc.ids)
                if d.spans is None:
                    mask += bytes([TARGET]) * len(enc.ids)
                else:
                    mask += bytes(len(enc.ids))
                    hits += mark_targets(enc, d.spans, mask, at)
                if not last:
                    continue
                ids.extend(d.post)
                mask += bytes([TARGET]) * len(d.post)
                if not ids:
                    continue
                if d.spans is not None and not hits:
                    skipped["n"] += 1
                    skipped.setdefault("first", d.where)
                    continue
                mask[0] = DOC_START  # nothing before it predicts it
                doc += 1
                split = splits["val"] if in_val(doc, args) else splits["train"]
                split.add_doc(ids, mask, mask.count(TARGET))
            progress.update(nbytes, len(metas))
            del encs, item  # an Encoding holds ~100 bytes a token: gone before the next get
    except BaseException as e:
        progress.error = e
        while in_q.get() is not None:  # drain so the encoder never blocks
            pass


class Progress:
    """One line redrawn on a terminal (stderr); nothing otherwise."""

    def __init__(self, mode, total):
        self.on = mode == "bar" or (mode == "auto" and sys.stderr.isatty())
        self.total, self.done, self.docs, self.t0, self.last = total, 0, 0, time.time(), 0
        self.error = None

    def update(self, nbytes, pieces):
        self.done += nbytes
        self.docs += pieces
        now = time.time()
        if not self.on or now - self.last < 0.2:
            return
        self.last = now
        rate = self.done / max(now - self.t0, 1e-9) / 1e6
        frac = min(self.done / self.total, 1.0) if self.total else 0
        bar = "#" * int(frac * 30)
        sys.stderr.write(f"\rtz-data [{bar:<30}] {frac * 100:5.1f}% {self.done / 1e6:.1f} MB, "
                         f"{rate:.1f} MB/s")
        sys.stderr.flush()

    def close(self):
        if self.on:
            self.last = 0  # the final figures, whenever the last redraw was
            self.update(0, 0)
            sys.stderr.write("\n")


def run(args, tok, src, files, out, skipped):
    """Reads, encodes and writes; returns the splits. A run that fails removes what it wrote."""
    os.makedirs(out, exist_ok=True)
    splits = {s: Split(out, args.name, s, tok, args.shard_tokens, src) for s in ("train", "val")}
    # The character offsets of the tokens, where masks come from spans of the text.
    offsets = src.masks and src.fmt != "text" and not src.every
    encode = tok.tok.encode_batch if offsets else tok.encode
    total = sum(os.path.getsize(p) for p in files)
    progress = Progress(args.progress, total)
    # In flight at most: two batches of text read ahead, one encoding, one encoded waiting and one
    # being written (Encoding objects, the bulk of the memory: about 100 bytes a token).
    read_q, write_q = queue.Queue(maxsize=2), queue.Queue(maxsize=1)
    stop = threading.Event()
    reader = threading.Thread(target=batches, args=(files, src, args.batch_bytes, read_q, stop),
                              daemon=True)
    wthread = threading.Thread(target=writer, args=(write_q, splits, tok, args, progress,
                                                    skipped), daemon=True)
    reader.start()
    wthread.start()
    error = None
    try:
        while True:
            batch = read_q.get()
            if batch is None:
                break
            if isinstance(batch, BaseException):
                error = batch
                break
            if progress.error:
                break
            # encode_batch releases the interpreter lock and runs on every core; reading and
            # writing the neighbouring batches go on meanwhile.
            encs = encode([p[0] for p in batch], add_special_tokens=False)
            write_q.put(([(p[1], p[2], p[4]) for p in batch], encs, sum(p[3] for p in batch)))
            del batch, encs
    finally:
        stop.set()
        write_q.put(None)
        wthread.join()
        while reader.is_alive():  # unblock a reader waiting on a full queue
            try:
                read_q.get(timeout=0.1)
            except queue.Empty:
                pass
        progress.close()
    try:
        if error:
            raise error
        if progress.error:
            raise progress.error
        for s in splits.values():
            s.finish()
    except BaseException:
        for s in splits.values():
            s.abort()
        raise
    return splits


def bench(args, tok, src, files):
    """The same documents encoded by encode_batch alone (in memory, the same batches) and by the
    whole pipeline (read, encode, write to a temporary directory): both rates side by side."""
    import tempfile
    docs = [item[0] for item in pieces(files, src, min(args.batch_bytes, 1 << 20))]
    nbytes = sum(len(d.encode("utf-8")) for d in docs)
    groups, cur, size = [], [], 0
    for d in docs:
        cur.append(d)
        size += len(d)
        if size >= args.batch_bytes:
            groups.append(cur)
            cur, size = [], 0
    if cur:
        groups.append(cur)
    best_enc = best_fast = best_all = float("inf")
    fast = getattr(tok.tok, "encode_batch_fast", None)
    for _ in range(args.bench):
        t0 = time.perf_counter()
        for g in groups:
            tok.tok.encode_batch(g, add_special_tokens=True)
        best_enc = min(best_enc, time.perf_counter() - t0)
        if fast:  # what tz-data calls: the same without the offsets
            t0 = time.perf_counter()
            for g in groups:
                fast(g, add_special_tokens=True)
            best_fast = min(best_fast, time.perf_counter() - t0)
        with tempfile.TemporaryDirectory(dir=args.out) as tmp:
            t0 = time.perf_counter()
            splits = run(args, tok, src, files, tmp, {"n": 0})
            best_all = min(best_all, time.perf_counter() - t0)
    toks = sum(s.total_tokens for s in splits.values())
    cores = len(os.sched_getaffinity(0))
    print(f"tz-data bench: {len(docs)} documents, {nbytes / 1e6:.1f} MB, {toks} tokens, "
          f"{cores} cores, best of {args.bench}")
    print(f"  Tokenizer.encode_batch alone  {best_enc:8.3f} s  {nbytes / best_enc / 1e6:8.2f} MB/s")
    if fast:
        print(f"  encode_batch_fast alone       {best_fast:8.3f} s  "
              f"{nbytes / best_fast / 1e6:8.2f} MB/s")
    print(f"  tz-data read+encode+write     {best_all:8.3f} s  {nbytes / best_all / 1e6:8.2f} MB/s")
    print(f"  ratio {best_enc / best_all:.3f} (tz-data's rate over encode_batch's)"
          + (f", {best_fast / best_all:.3f} over encode_batch_fast's" if fast else ""))


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="tz-data", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=next(p for p in __doc__.split("\n\n") if p.startswith("A JSONL line"))
        + "\n\ndocs/data.md describes the shards, the sidecars, the masks and the formats.")
    p.add_argument("inputs", nargs="+", metavar="INPUT",
                   help="text or JSONL files, or quoted globs of them")
    p.add_argument("--tokenizer", required=True,
                   help="tokenizer.json, or a model directory holding it (and tokenizer_config"
                        ".json for the special tokens)")
    p.add_argument("--out", required=True, help="the directory of the shards")
    p.add_argument("--name", default="data", help="the shards' name prefix (default data)")
    p.add_argument("--format", choices=("auto",) + chat.FORMATS, default="auto",
                   help="what a JSONL line holds (below); auto (the default): the first line's "
                        "fields decide, and every line must have them")
    p.add_argument("--field", default="text",
                   help="the JSONL field of the text of --format text (default text)")
    p.add_argument("--eot", help="the id put after every document (default: the eos_token of "
                                 "tokenizer_config.json after a text document, none after a "
                                 "conversation), or none")
    p.add_argument("--masks", action="store_true",
                   help="--format text: write mask files too (every token a target but each "
                        "document's first); the chat formats always have them")
    p.add_argument("--train-on-prompt", action="store_true",
                   help="every token a target but each document's first, the prompts' too")
    p.add_argument("--jobs", type=int, default=0, metavar="N",
                   help="processes that render conversations with the chat template (default: "
                        "one a core for 4 MiB of chat input or more; 1: the reader thread "
                        "alone)")
    p.add_argument("--shard-tokens", type=int, default=100_000_000,
                   help="tokens per shard (default 100000000, at most 2147483647)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--val-fraction", type=float, default=0.0,
                   help="this share of the documents, evenly spread, goes to the validation "
                        "shards (default 0: none)")
    g.add_argument("--val-docs", type=int, default=0,
                   help="the first N documents go to the validation shards")
    p.add_argument("--batch-bytes", type=int, default=2 << 20,
                   help="text per encode_batch call (default 2097152)")
    p.add_argument("--progress", choices=("auto", "bar", "none"), default="auto",
                   help="a progress bar on stderr: auto (when it is a terminal), bar or none")
    p.add_argument("--bench", type=int, default=0, metavar="N",
                   help="measure instead: encode_batch alone and the whole pipeline on the same "
                        "documents, best of N; writes nothing under --out (the documents are "
                        "held in memory: give a corpus that fits)")
    args = p.parse_args(argv)
    try:
        if not 1 <= args.shard_tokens <= 2**31 - 1:
            raise Fail(f"--shard-tokens {args.shard_tokens}: expected 1 to 2147483647")
        if not 0 <= args.val_fraction < 1:
            raise Fail(f"--val-fraction {args.val_fraction}: expected a number in [0, 1)")
        if args.val_docs < 0 or args.jobs < 0:
            raise Fail("--val-docs and --jobs must not be negative")
        if args.batch_bytes < 1:
            raise Fail(f"--batch-bytes {args.batch_bytes}: expected a positive number of bytes")
        tok = Tok(args.tokenizer, args.eot)
        files = expand(args.inputs)
        try:
            fmt = first_format(files, args.field) if args.format == "auto" else args.format
        except UnicodeDecodeError as e:
            raise not_utf8(files, e) from None
        if fmt == "text":
            if args.train_on_prompt and not args.masks:
                raise Fail("--train-on-prompt: the input is text (--format text, or the first "
                           "line's fields), which has no prompt, and without --masks no mask "
                           "file is written: give --masks, or leave --train-on-prompt out")
            tok.need_eot()
        jobs = args.jobs
        if not jobs:
            big = sum(os.path.getsize(f) for f in files) >= JOBS_FROM_BYTES
            jobs = len(os.sched_getaffinity(0)) if fmt != "text" and big else 1
        src = Source(fmt, args, tok, jobs)
        if args.bench:
            os.makedirs(args.out, exist_ok=True)
            bench(args, tok, src, files)
            return 0
        t0 = time.time()
        skipped = {"n": 0}
        splits = run(args, tok, src, files, args.out, skipped)
    except Fail as e:
        print(f"tz-data: {e}", file=sys.stderr)
        return 2
    except (OSError, UnicodeDecodeError) as e:
        print(f"tz-data: {e}", file=sys.stderr)
        return 1
    dt = time.time() - t0
    for s in splits.values():
        if s.written:
            targets = (f", {s.total_targets} targets ({s.total_targets / s.total_tokens:.1%})"
                       if src.masks else "")
            print(f"tz-data: {s.split}: {s.total_docs} documents, {s.total_tokens} tokens"
                  f"{targets} in {len(s.written)} shard{'s' if len(s.written) > 1 else ''} "
                  f"{s.written[0]}{' ...' if len(s.written) > 1 else ''} (v{s.version}, "
                  f"{fmt}{', masks' if src.masks else ''})")
    if skipped["n"]:
        print(f"tz-data: {skipped['n']} conversation{'s' if skipped['n'] > 1 else ''} without a "
              f"target token skipped (no assistant message); the first is {skipped['first']}",
              file=sys.stderr)
    if not splits["train"].written:
        print("tz-data: no training tokens written (empty inputs, or every document in the "
              "validation split)", file=sys.stderr)
        return 2
    if inexact[0]:
        print(f"tz-data: {inexact[0]} cuts inside documents with no line end between two "
              f"non-space characters in {INEXACT_AFTER} MiB: the tokens at those cuts may differ "
              "from encoding the document whole", file=sys.stderr)
    print(f"tz-data: {dt:.1f} s; tokenizer {tok.file} (sha256 {tok.sha256[:12]}..., vocabulary "
          f"{tok.vocab}, eot {src.eot_id})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""tz-data: text to the llm.c token shards tz-train reads, with a model's own tokenizer.

  tz-data --tokenizer MODEL_DIR_OR_TOKENIZER_JSON --out DIR [options] INPUT...

INPUT: text files (each file one document), JSONL files (*.jsonl, *.json: one document per
line, its --field), or a glob of them (quoted). Writes DIR/<name>_train_NNNNNN.bin (and
DIR/<name>_val_NNNNNN.bin with a validation split), each beside a sidecar <shard>.json that
tz-train checks against the model (docs/data.md).

Each document is its tokens as the tokenizer's post-processor makes them (a BOS where it adds
one), then the end-of-text id: tokenizer_config.json's eos_token, or --eot. Shards: the header of
256 little-endian int32 (magic 20240520, version, token count), then the tokens: version 1 uint16
when the vocabulary fits in 16 bits, version 7 uint32 otherwise.

The corpus streams: a reader thread, encode_batch in the tokenizer's own thread pool, a writer
thread, with at most a few batches in flight; memory stays bounded whatever the corpus size.
"""
import argparse
import glob
import hashlib
import json
import os
import queue
import sys
import threading
import time
from array import array

try:
    from tokenizers import Tokenizer
except ImportError:  # the message says how to get it
    sys.exit("tz-data: the Python package 'tokenizers' is missing: run tools/tz-data (which "
             "makes the project's environment .venv with it: tools/venv.sh), not this file "
             "with another python3")

MAGIC = 20240520
HEADER_INTS = 256
FORMAT = "tierzero.tokens"


class Fail(Exception):
    """An error of the input or the options: printed as 'tz-data: ...', exit status 2."""


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
    """The tokenizer, its file's hash, its special ids, and what its post-processor adds."""

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
        cfg_path = os.path.join(os.path.dirname(os.path.abspath(self.file)), "tokenizer_config.json")
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
        if eot is None:
            if self.eos is None:
                raise Fail(f"no eos_token in {cfg_path} to put between documents: give --eot ID "
                           "(or --eot none)")
            self.eot = self.eos
        elif eot == "none":
            self.eot = None
        else:
            try:
                self.eot = int(eot)
            except ValueError:
                raise Fail(f"--eot: expected a token id or none, got {eot!r}")
            if not 0 <= self.eot < self.vocab:
                raise Fail(f"--eot {self.eot}: not below the vocabulary size {self.vocab}")
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


# ---- reading: documents in pieces ----

def expand(inputs):
    files = []
    for spec in inputs:
        if any(c in spec for c in "*?["):
            got = sorted(glob.glob(spec))
            if not got:
                raise Fail(f"no file matches {spec}")
            files += got
        elif not os.path.isfile(spec):
            raise Fail(f"no such file {spec}")
        else:
            files.append(spec)
    return files


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


def pieces(files, field, piece_bytes):
    """(text, first, last, n) for every piece of every document, in order, n the input bytes it
    stands for: a JSONL line, or a text file read in pieces of about piece_bytes; a document
    longer than that is cut where cut_point says, so that one in-flight batch stays small."""
    for path in files:
        if is_jsonl(path):
            with open(path, encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        obj = json.loads(line)
                    except ValueError as e:
                        raise Fail(f"{path}:{n}: not a JSON object: {e}")
                    text = obj.get(field) if isinstance(obj, dict) else None
                    if not isinstance(text, str):
                        raise Fail(f"{path}:{n}: no string field \"{field}\" (--field names it)")
                    size = len(line)
                    for piece, first, last in split_text(text, piece_bytes):
                        yield piece, first, last, size
                        size = 0
        else:
            with open(path, encoding="utf-8", newline="") as f:
                first = True
                carry = ""
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
                    yield block[:cut], first, False, cut
                    first = False
                yield carry, first, True, len(carry)


def batches(files, field, batch_bytes, out_q, stop):
    """Pieces grouped into batches of about batch_bytes, put on out_q; None at the end; an
    exception is put instead when reading fails."""
    try:
        batch, size = [], 0
        for text, first, last, n in pieces(files, field, min(batch_bytes, 1 << 20)):
            batch.append((text, first, last, n))
            size += n
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
    """The shards of one split: tokens appended, a shard closed when full, a sidecar each."""

    def __init__(self, out, name, split, tok, shard_tokens, args):
        self.out, self.name, self.split, self.tok = out, name, split, tok
        self.shard_tokens = shard_tokens
        self.version = 1 if tok.vocab <= 1 << 16 else 7
        self.code = "H" if self.version == 1 else "I"
        self.args = args
        self.index = 0
        self.f = None
        self.tokens = self.docs = 0
        self.doc_open = False  # the current document has tokens in the current shard
        self.written = []
        self.total_tokens = self.total_docs = 0

    def _open(self):
        path = os.path.join(self.out, f"{self.name}_{self.split}_{self.index:06d}.bin")
        self.path, self.tmp = path, path + ".tmp"
        self.f = open(self.tmp, "wb")
        self.f.write(bytes(HEADER_INTS * 4))
        self.tokens = self.docs = 0

    def _close(self):
        header = array("i", [0] * HEADER_INTS)
        header[0], header[1], header[2] = MAGIC, self.version, self.tokens
        if sys.byteorder != "little":
            header.byteswap()
        self.f.seek(0)
        self.f.write(header.tobytes())
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()
        self.f = None
        os.replace(self.tmp, self.path)
        t = self.tok
        side = {
            "format": FORMAT, "version": 1, "shard": os.path.basename(self.path),
            "split": self.split, "shard_version": self.version,
            "tokenizer": self.tok.file, "tokenizer_sha256": t.sha256, "vocab_size": t.vocab,
            "bos_id": t.bos, "eos_id": t.eos, "pad_id": t.pad, "eot_id": t.eot,
            "bos_added": t.prefix, "documents": self.docs, "tokens": self.tokens,
        }
        tmp = self.path + ".json.tmp"
        with open(tmp, "w") as f:
            json.dump(side, f, indent=1)
            f.write("\n")
        os.replace(tmp, self.path + ".json")
        self.written.append(self.path)
        self.total_tokens += self.tokens
        self.index += 1

    def add(self, ids, first, last):
        """A piece's ids (an array of the shard's type); a document starts at first."""
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
            if sys.byteorder != "little":
                part.byteswap()
            self.f.write(part.tobytes())
            self.tokens += len(part)
            at += len(part)
            if self.tokens == self.shard_tokens:
                self._close()
                self.doc_open = False

    def finish(self):
        if self.f is not None and self.tokens:
            self._close()
        elif self.f is not None:
            self.f.close()
            os.unlink(self.tmp)
            self.f = None


def in_val(doc, args):
    """1 when document doc (0-based, in input order) is in the validation split: the first
    --val-docs, or every 1/F-th with --val-fraction F (evenly spread)."""
    if args.val_docs:
        return doc < args.val_docs
    f = args.val_fraction
    return f > 0 and int((doc + 1) * f) > int(doc * f)


def writer(in_q, splits, tok, args, progress):
    """Encoded batches from in_q into the splits, in order."""
    code = splits["train"].code
    prefix, tail = array(code, tok.prefix), array(code, tok.tail)
    doc = -1
    try:
        while True:
            item = in_q.get()
            if item is None:
                return
            flags, encs, nbytes = item
            for (first, last), enc in zip(flags, encs):
                if first:
                    doc += 1
                    split = splits["val"] if in_val(doc, args) else splits["train"]
                ids = array(code, enc.ids)
                if first and prefix:
                    ids = prefix + ids
                if last and tail:
                    ids += tail
                split.add(ids, first, last)
            progress.update(nbytes, len(flags))
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


def run(args, tok, files, out):
    """Reads, encodes and writes; returns the splits."""
    os.makedirs(out, exist_ok=True)
    splits = {s: Split(out, args.name, s, tok, args.shard_tokens, args) for s in ("train", "val")}
    total = sum(os.path.getsize(p) for p in files)
    progress = Progress(args.progress, total)
    # In flight at most: two batches of text read ahead, one encoding, one encoded waiting and one
    # being written (Encoding objects, the bulk of the memory: about 100 bytes a token).
    read_q, write_q = queue.Queue(maxsize=2), queue.Queue(maxsize=1)
    stop = threading.Event()
    reader = threading.Thread(target=batches, args=(files, args.field, args.batch_bytes, read_q,
                                                    stop), daemon=True)
    wthread = threading.Thread(target=writer, args=(write_q, splits, tok, args, progress),
                               daemon=True)
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
            encs = tok.encode([p[0] for p in batch], add_special_tokens=False)
            write_q.put(([p[1:3] for p in batch], encs, sum(p[3] for p in batch)))
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
    if error:
        raise error
    if progress.error:
        raise progress.error
    for s in splits.values():
        s.finish()
    return splits


def bench(args, tok, files):
    """The same documents encoded by encode_batch alone (in memory, the same batches) and by the
    whole pipeline (read, encode, write to a temporary directory): both rates side by side."""
    import tempfile
    docs = []
    for text, first, last, _ in pieces(files, args.field, min(args.batch_bytes, 1 << 20)):
        docs.append(text)
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
            splits = run(args, tok, files, tmp)
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
        epilog="docs/data.md describes the shards and the sidecar.")
    p.add_argument("inputs", nargs="+", metavar="INPUT",
                   help="text or JSONL files, or quoted globs of them")
    p.add_argument("--tokenizer", required=True,
                   help="tokenizer.json, or a model directory holding it (and tokenizer_config"
                        ".json for the special tokens)")
    p.add_argument("--out", required=True, help="the directory of the shards")
    p.add_argument("--name", default="data", help="the shards' name prefix (default data)")
    p.add_argument("--field", default="text", help="the JSONL field of the text (default text)")
    p.add_argument("--eot", help="the id put after every document (default: the eos_token of "
                                 "tokenizer_config.json), or none")
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
        if args.val_docs < 0 or args.batch_bytes < 1:
            raise Fail("--val-docs and --batch-bytes must not be negative")
        tok = Tok(args.tokenizer, args.eot)
        files = expand(args.inputs)
        if args.bench:
            os.makedirs(args.out, exist_ok=True)
            bench(args, tok, files)
            return 0
        t0 = time.time()
        splits = run(args, tok, files, args.out)
    except Fail as e:
        print(f"tz-data: {e}", file=sys.stderr)
        return 2
    except (OSError, UnicodeDecodeError) as e:
        print(f"tz-data: {e}", file=sys.stderr)
        return 1
    dt = time.time() - t0
    for s in splits.values():
        if s.written:
            print(f"tz-data: {s.split}: {s.total_docs} documents, {s.total_tokens} tokens in "
                  f"{len(s.written)} shard{'s' if len(s.written) > 1 else ''} "
                  f"{s.written[0]}{' ...' if len(s.written) > 1 else ''} (v{s.version})")
    if not splits["train"].written:
        print("tz-data: no training tokens written (empty inputs, or every document in the "
              "validation split)", file=sys.stderr)
        return 2
    if inexact[0]:
        print(f"tz-data: {inexact[0]} cuts inside documents with no line end between two "
              f"non-space characters in {INEXACT_AFTER} MiB: the tokens at those cuts may differ "
              "from encoding the document whole", file=sys.stderr)
    print(f"tz-data: {dt:.1f} s; tokenizer {tok.file} (sha256 {tok.sha256[:12]}..., vocabulary "
          f"{tok.vocab}, eot {tok.eot})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

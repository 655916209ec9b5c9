"""CIFAR-10 and CIFAR-100 from torchvision's pickled format or (CIFAR-10) an ImageFolder of JPEGs.

The ImageFolder layout (root/cifar10/{train,test}/<class>/*.jpg, class folders sorted -> labels
airplane..truck) is decoded once, in parallel processes, and cached as uint8 .npy arrays keyed by
the source path and every file's size and mtime; later starts memory-map the cache in well under
a second. torchvision's format is read directly (it is already an array), each file checked
against the official MD5 and unpickled by an unpickler that admits only numpy arrays and plain
values (torchvision's own reader would run whatever a crafted file holds); downloads (through
torchvision) are tried only when nothing is found and cfg.download is set.
"""
from __future__ import annotations

import hashlib
import io
import os
import pickle
import socket
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Optional

import numpy as np

from dataclasses import dataclass

from gravac.core.registry import option
from gravac.data.base import ImageDataset
from gravac.data.files import (DataError, cached_arrays, fingerprint, resolve_cache_dir, resolve_root,
                               undo_new_folders)
from gravac.data.registry import DATASETS
from gravac.core.schema import DatasetCfg

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
CIFAR100_MEAN, CIFAR100_STD = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)
IMAGE_EXTS = (".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".webp")
DOWNLOAD_TIMEOUT_S = 60.0


# ---------------------------------------------------------------------------------------------
# ImageFolder decoding


def _imagefolder_root(root: Path) -> Optional[Path]:
    """root/cifar10 or root itself, whichever holds train/ and test/ class folders."""
    for cand in (root / "cifar10", root):
        if (cand / "train").is_dir() and (cand / "test").is_dir():
            return cand
    return None


def _list_split(split_dir: Path) -> tuple[list[str], list[str], np.ndarray, list[tuple[str, int, int]]]:
    """Sorted class folders, their image paths (sorted by name), labels and (name, size, mtime) stats."""
    classes = sorted(e.name for e in os.scandir(split_dir) if e.is_dir())
    files, labels, stats = [], [], []
    for i, c in enumerate(classes):
        entries = sorted((e for e in os.scandir(split_dir / c) if e.name.lower().endswith(IMAGE_EXTS)),
                         key=lambda e: e.name)
        for e in entries:
            st = e.stat()
            files.append(e.path)
            stats.append((f"{split_dir.name}/{c}/{e.name}", st.st_size, st.st_mtime_ns))
        labels += [i] * len(entries)
    return classes, files, np.asarray(labels, dtype=np.int64), stats


def _decode_chunk(paths: list[str]) -> np.ndarray:
    """Decode image files to one uint8 (n, H, W, 3) array (runs in a worker process)."""
    from PIL import Image
    out = []
    for p in paths:
        with Image.open(p) as im:
            out.append(np.asarray(im.convert("RGB"), dtype=np.uint8))
    return np.stack(out)


def _decode_all(paths: list[str], procs: int) -> np.ndarray:
    """Decode in `procs` processes (serially when only one chunk, or processes are unavailable)."""
    chunks = [paths[i:i + 2000] for i in range(0, len(paths), 2000)]
    if procs > 1 and len(chunks) > 1:
        try:
            pool = ProcessPoolExecutor(procs)
        except (OSError, NotImplementedError, ImportError):
            pool = None
        if pool is not None:
            with pool:
                try:
                    return np.concatenate(list(pool.map(_decode_chunk, chunks)))
                except BrokenProcessPool:  # workers killed (e.g. no fork allowed): decode serially
                    pass
    return np.concatenate([_decode_chunk(c) for c in chunks])


def _load_imagefolder(src: Path, cfg) -> dict[str, np.ndarray]:
    listing = {s: _list_split(src / s) for s in ("train", "test")}
    classes = listing["train"][0]
    if listing["test"][0] != classes:
        raise DataError(f"cifar10 at {src}: train/ and test/ have different class folders "
                        f"({classes} vs {listing['test'][0]})")
    if sorted(classes) != sorted(CIFAR10_CLASSES):
        raise DataError(f"cifar10 at {src}: expected class folders {', '.join(CIFAR10_CLASSES)} under train/ and "
                        f"test/, found {', '.join(classes) or 'none'}")
    for s, (_, files, _, _) in listing.items():
        if not files:
            raise DataError(f"cifar10 at {src}: no images under {src / s}/<class>/ (expected *.jpg or *.png)")
    key = fingerprint(src, listing["train"][3] + listing["test"][3], extra="cifar10-imagefolder-v1")
    procs = min(2, os.cpu_count() or 1)

    def build() -> dict[str, np.ndarray]:
        try:
            return {"train_x": _decode_all(listing["train"][1], procs), "train_y": listing["train"][2],
                    "test_x": _decode_all(listing["test"][1], procs), "test_y": listing["test"][2]}
        except (OSError, ValueError) as e:  # unreadable or corrupt image, images of different sizes
            raise DataError(f"cifar10 at {src}: could not decode the images ({e})") from None

    arrays = cached_arrays(resolve_cache_dir(cfg.cache_dir), "cifar10", key, build)
    if arrays["train_x"].shape[1:] != (32, 32, 3):
        raise DataError(f"cifar10 at {src}: expected 32x32 RGB images, got {arrays['train_x'].shape[1:]}")
    return arrays


# ---------------------------------------------------------------------------------------------
# torchvision format


class _DownloadFailed(Exception):
    """Internal: torchvision's download raised; `reason` is a short description."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def _torchvision(cls, root: Path, download: bool, folder: str) -> dict[str, np.ndarray]:
    """Read torchvision's CIFAR format under root/<folder>, downloading first when asked. Raises
    FileNotFoundError when absent and not downloaded, _DownloadFailed when the download fails."""
    present = (root / folder).is_dir()
    if not present and not download:
        raise FileNotFoundError(folder)
    if not present:
        old = socket.getdefaulttimeout()
        try:
            socket.setdefaulttimeout(DOWNLOAD_TIMEOUT_S)  # never hang forever on a dead network
            with undo_new_folders(root):   # torchvision makes `root` before it downloads
                _download(cls, root)
        except RuntimeError as e:  # torchvision: the archive's MD5 differs
            raise DataError(f"the {folder} download into {root} is corrupt ({e}); try again") from None
        except OSError as e:  # URLError, timeouts, disk errors during download/extract
            raise _DownloadFailed(f"{e.__class__.__name__}: {getattr(e, 'reason', e)}") from None
        finally:
            socket.setdefaulttimeout(old)
    out = {}
    for split, files in (("train", cls.train_list), ("test", cls.test_list)):
        entries = [_read_batch(root / folder / name, md5) for name, md5 in files]
        out[f"{split}_x"] = np.vstack([e["data"] for e in entries]).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
        out[f"{split}_y"] = np.asarray([y for e in entries for y in e["labels"]], dtype=np.int64)
    return out


def _download(cls, root: Path) -> None:
    """torchvision's download of `cls`'s archive into root (checked against its MD5), extracted."""
    from torchvision.datasets.utils import download_and_extract_archive
    download_and_extract_archive(cls.url, str(root), filename=cls.filename, md5=cls.tgz_md5)


class _BatchUnpickler(pickle.Unpickler):
    """Unpickles a CIFAR batch file allowing only what the official files hold (dicts, lists,
    strings, numbers and numpy arrays): a crafted file cannot run code, as pickle.load lets it."""
    ARRAYS = {"_reconstruct": np.ndarray((0,)).__reduce__()[0], "ndarray": np.ndarray, "dtype": np.dtype}
    MODULES = ("numpy", "numpy.core.multiarray", "numpy._core.multiarray")

    def find_class(self, module: str, name: str):
        if module in self.MODULES and name in self.ARRAYS:
            return self.ARRAYS[name]
        raise pickle.UnpicklingError(f"it names {module}.{name}, which no CIFAR file holds")


def _read_batch(path: Path, md5: str) -> dict:
    """One batch file of torchvision's format ({"data": uint8 (n, 3072), "labels" or "fine_labels"}),
    read once, checked against the official file's MD5, then unpickled without running code."""
    where = f"{path.parent.name} under {path.parent.parent}"
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise DataError(f"{where} is incomplete ({path.name}: {e.strerror}); delete it and download again, "
                        "or copy a good copy there") from None
    if hashlib.md5(raw).hexdigest() != md5:
        raise DataError(f"{where} is incomplete or corrupt ({path.name} differs from the official file); delete "
                        "it and download again, or copy a good copy there")
    try:
        entry = _BatchUnpickler(io.BytesIO(raw), encoding="latin1").load()
        data = entry["data"]
        labels = entry["labels"] if "labels" in entry else entry["fine_labels"]
        ok = isinstance(data, np.ndarray) and data.dtype == np.uint8 and data.ndim == 2 and data.shape[1] == 3072 \
            and isinstance(labels, list) and len(labels) == len(data) and all(type(y) is int for y in labels)
    except Exception as e:   # a crafted or foreign pickle: refused before anything in it runs
        why = (str(e) or "?").splitlines()[0]
        raise DataError(f"{path} is not a CIFAR batch file ({type(e).__name__}: {why}); refusing to read it: "
                        "replace it with the official file") from None
    if not ok:
        raise DataError(f"{path} is not a CIFAR batch file (expected uint8 data of n x 3072 and n integer labels); "
                        "replace it with the official file")
    return {"data": data, "labels": labels}


def _where(root: Path) -> str:
    return f"set dataset.root= or GRAVAC_DATA_DIR to the folder that holds it (looked in {root})"


@dataclass
class CifarCfg(DatasetCfg):
    """download: fetch through torchvision when the files are missing (needs internet);
    augment: random crop (pad 4) + horizontal flip of training images."""
    download: bool = True
    augment: bool = True
    num_classes: int = option(10, choices=(10,))


@dataclass
class Cifar100Cfg(CifarCfg):
    num_classes: int = option(100, choices=(100,))


@DATASETS.register("cifar10", CifarCfg, task="classification")
def load_cifar10(cfg: CifarCfg) -> ImageDataset:
    """CIFAR-10: torchvision's cifar-10-batches-py or an ImageFolder of JPEGs under dataset.root"""
    root = resolve_root(cfg.root)
    if root.name == "cifar-10-batches-py":
        root = root.parent
    if (root / "cifar-10-batches-py").is_dir():
        arrays = _torchvision(_tv().CIFAR10, root, False, "cifar-10-batches-py")
    elif (src := _imagefolder_root(root)) is not None:
        arrays = _load_imagefolder(src, cfg)
    else:
        hint = (f"CIFAR-10 not found: expected {root}/cifar-10-batches-py (torchvision format) or "
                f"{root}/cifar10/{{train,test}}/<class>/*.jpg (ImageFolder); {_where(root)}")
        if not cfg.download:
            raise DataError(hint + ", or enable dataset.download=true")
        try:
            arrays = _torchvision(_tv().CIFAR10, root, True, "cifar-10-batches-py")
        except _DownloadFailed as e:
            raise DataError(f"{hint}; the download into {root} failed ({e.reason})") from None
    return ImageDataset("cifar10", arrays["train_x"], arrays["train_y"], arrays["test_x"], arrays["test_y"],
                        num_classes=10, mean=CIFAR10_MEAN, std=CIFAR10_STD, augment=cfg.augment,
                        classes=CIFAR10_CLASSES)


@DATASETS.register("cifar100", Cifar100Cfg, task="classification")
def load_cifar100(cfg: Cifar100Cfg) -> ImageDataset:
    """CIFAR-100: torchvision's cifar-100-python under dataset.root"""
    root = resolve_root(cfg.root)
    if root.name == "cifar-100-python":
        root = root.parent
    try:
        arrays = _torchvision(_tv().CIFAR100, root, cfg.download, "cifar-100-python")
    except FileNotFoundError:
        raise DataError(f"CIFAR-100 not found: no cifar-100-python folder under {root}; gravac-bench has no "
                        f"offline copy, so enable dataset.download=true where there is internet access or copy "
                        f"the extracted cifar-100-python (train, test, meta) there; {_where(root)}") from None
    except _DownloadFailed as e:
        raise DataError(f"CIFAR-100 not found: no cifar-100-python folder under {root} and the download failed "
                        f"({e.reason}); CIFAR-100 is not available offline: copy the extracted "
                        f"cifar-100-python (train, test, meta) there, or {_where(root)}") from None
    return ImageDataset("cifar100", arrays["train_x"], arrays["train_y"], arrays["test_x"], arrays["test_y"],
                        num_classes=100, mean=CIFAR100_MEAN, std=CIFAR100_STD, augment=cfg.augment)


def _tv():
    import torchvision.datasets as tvd
    return tvd

"""Tests of gravac.data: synthetic task, sharding, determinism, resume, augmentation, real datasets
(CIFAR-10 ImageFolder and PTB from $GRAVAC_DATA_DIR, skipped when absent) and error messages."""
from __future__ import annotations

import hashlib
import io
import os
import pickle
import struct
import time
import urllib.error
from pathlib import Path

import numpy as np
import pytest
import torch

from gravac.data import (DataError, ImageDataset, LMDataset, augment_batch, batchify, load_dataset, normalize)
from conftest import dataset_cfg, failure

CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def _data_dir(sub: str) -> Path:
    d = os.environ.get("GRAVAC_DATA_DIR")
    if not d:
        pytest.skip("GRAVAC_DATA_DIR is not set: point it at a folder holding cifar10/ and ptb/ to run this test")
    if not (Path(d) / sub).is_dir():
        pytest.skip(f"GRAVAC_DATA_DIR={d} has no {sub}/ folder")
    return Path(d)


def _indexed_images(n: int, size: int = 8) -> ImageDataset:
    """A dataset whose images spell out their own index: channel 0 = i % 256, channel 1 = i // 256
    (mean 0, std 1/255 makes the normalised value the raw byte)."""
    x = np.zeros((n, size, size, 3), dtype=np.uint8)
    x[..., 0] = (np.arange(n) % 256)[:, None, None]
    x[..., 1] = (np.arange(n) // 256)[:, None, None]
    y = np.arange(n) % 10
    return ImageDataset("idx", x, y, x[: n // 2], y[: n // 2], num_classes=10, mean=(0, 0, 0),
                        std=(1 / 255,) * 3, augment=False)


def _ids(x: torch.Tensor) -> np.ndarray:
    return (x[:, 0, 0, 0].round() + 256 * x[:, 1, 0, 0].round()).long().numpy()


# ---------------------------------------------------------------------------------------------- synthetic


def test_synthetic_shapes_and_determinism():
    cfg = dataset_cfg(name="synthetic", num_classes=7, image_size=12, train_size=700, test_size=140, seed=3)
    a, b = load_dataset(cfg), load_dataset(cfg)
    assert (a.task, a.num_classes, a.train_size, a.eval_size) == ("classification", 7, 700, 140)
    assert a.train_x.shape == (700, 12, 12, 3) and a.train_x.dtype == np.uint8
    assert np.array_equal(a.train_x, b.train_x) and np.array_equal(a.test_y, b.test_y)
    assert set(np.unique(a.train_y)) == set(range(7))
    assert np.bincount(a.train_y).min() == 100  # balanced
    c = load_dataset(dataset_cfg(name="synthetic", num_classes=7, image_size=12, train_size=700, test_size=140, seed=4))
    assert not np.array_equal(a.train_x, c.train_x)
    x, y = a.train_loader(0, 1, 16, 0).next_batch()
    assert x.shape == (16, 3, 12, 12) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert 0 <= y.min() and y.max() < 7


def test_synthetic_is_learnable_but_not_trivial():
    ds = load_dataset(dataset_cfg(name="synthetic"))
    tr = ds.train_x.reshape(ds.train_size, -1).astype(np.float32)
    te = ds.test_x.reshape(ds.eval_size, -1).astype(np.float32)
    centroids = np.stack([tr[ds.train_y == k].mean(0) for k in range(ds.num_classes)])
    d = (te ** 2).sum(1)[:, None] - 2 * te @ centroids.T + (centroids ** 2).sum(1)[None]
    acc = (d.argmin(1) == ds.test_y).mean()
    assert 0.3 < acc < 0.99, acc  # a linear nearest-centroid rule already sees the signal; noise keeps it < 100%
    x, _ = next(ds.eval_batches(512))
    assert abs(x.mean().item()) < 0.1 and abs(x.std().item() - 1) < 0.1  # normalised with its own stats


def test_synthetic_generation_is_fast():
    t = time.perf_counter()
    load_dataset(dataset_cfg(name="synthetic"))
    assert time.perf_counter() - t < 5.0  # ~0.5 s normally; generous for a loaded machine


# ---------------------------------------------------------------------------------------------- sharding


@pytest.mark.parametrize("world,bs", [(1, 10), (3, 8), (8, 32)])
def test_classification_shards_disjoint_and_covering(world, bs):
    n = 1000
    ds = _indexed_images(n)
    per = n // world
    seen = []
    for r in range(world):
        loader = ds.train_loader(r, world, bs, seed=5)
        assert loader.steps_per_epoch == per // bs
        assert len(loader.shard) == per
        epoch0 = np.concatenate([_ids(loader.next_batch()[0]) for _ in range(loader.steps_per_epoch)])
        assert len(set(epoch0)) == len(epoch0) and set(epoch0) <= set(loader.shard)
        assert loader.epoch == 1
        epoch1 = np.concatenate([_ids(loader.next_batch()[0]) for _ in range(loader.steps_per_epoch)])
        assert not np.array_equal(epoch0, epoch1)  # reshuffled within the shard
        seen.append(set(loader.shard.tolist()))
    union = set().union(*seen)
    assert sum(len(s) for s in seen) == len(union) == world * per  # disjoint, covering up to the remainder < world


def test_lm_shards_disjoint_and_covering():
    n, world, bs, bptt = 10_000, 3, 4, 7
    ds = LMDataset("toy", [str(i) for i in range(n)], np.arange(n), np.arange(500), bptt=bptt)
    covered = []
    for r in range(world):
        loader = ds.train_loader(r, world, bs, seed=0)
        chunk = n // world
        assert loader.steps_per_epoch == (chunk // bs - 1) // bptt
        for _ in range(loader.steps_per_epoch):
            x, y = loader.next_batch()
            assert x.shape == (bptt, bs) and x.dtype == torch.int64 and torch.equal(y, x + 1)
            covered.append(x.flatten())
        assert loader.epoch == 1
        first, _ = loader.next_batch()
        assert first[0].tolist() == [r * chunk + j * (chunk // bs) for j in range(bs)]  # columns of the chunk
    got = torch.cat(covered)
    assert len(got.unique()) == len(got)  # no token served twice in an epoch
    assert len(got) >= 0.98 * n           # only batchify/bptt remainders left out


def test_batchify_matches_standard_recipe():
    data = batchify(torch.arange(26), 4)
    assert data.shape == (6, 4) and data[:, 1].tolist() == [6, 7, 8, 9, 10, 11]


# ---------------------------------------------------------------------------------------------- determinism


def test_same_seed_same_batches_and_different_seed_differs():
    ds = load_dataset(dataset_cfg(name="synthetic", train_size=512, test_size=64))
    a, b, c = (ds.train_loader(1, 2, 16, s) for s in (7, 7, 8))
    for _ in range(5):
        (xa, ya), (xb, yb) = a.next_batch(), b.next_batch()
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    xc, _ = c.next_batch()
    assert not torch.equal(ds.train_loader(1, 2, 16, 7).next_batch()[0], xc)


@pytest.mark.parametrize("advance", [0, 3, 7, 8, 19])
def test_state_dict_resume_gives_identical_batches(advance):
    ds = load_dataset(dataset_cfg(name="synthetic", train_size=256, test_size=64))  # augmentation on
    loader = ds.train_loader(0, 2, 16, seed=1)  # 8 steps per epoch
    for _ in range(advance):
        loader.next_batch()
    state = loader.state_dict()
    expected = [loader.next_batch() for _ in range(10)]
    resumed = ds.train_loader(0, 2, 16, seed=1)
    resumed.load_state_dict(state)
    assert resumed.epoch == advance // 8
    for i, (x, y) in enumerate(expected):
        rx, ry = resumed.next_batch()
        assert torch.equal(x, rx) and torch.equal(y, ry)
        assert resumed.new_epoch == ((advance + i) % 8 == 0)
    with pytest.raises(ValueError, match="world"):
        ds.train_loader(0, 4, 16, seed=1).load_state_dict(state)


def test_lm_resume_and_new_epoch_flag():
    ds = LMDataset("toy", [str(i) for i in range(400)], np.arange(400), np.arange(100), bptt=5)
    loader = ds.train_loader(0, 1, 4, seed=0)   # 100 rows -> 19 windows
    assert loader.steps_per_epoch == 19 and not loader.new_epoch
    flags = []
    for _ in range(40):
        loader.next_batch()
        flags.append(loader.new_epoch)  # checked after fetching: "this batch starts an epoch"
    assert [i for i, f in enumerate(flags) if f] == [0, 19, 38]
    assert loader.epoch == 2 and abs(loader.epoch_progress - (2 + 2 / 19)) < 1e-9
    other = ds.train_loader(0, 1, 4, seed=0)
    other.load_state_dict(loader.state_dict())
    assert torch.equal(other.next_batch()[0], loader.next_batch()[0])


# ---------------------------------------------------------------------------------------------- augmentation


def test_augment_hand_example():
    x = torch.arange(1, 10, dtype=torch.uint8).view(1, 1, 3, 3)
    same = augment_batch(x, pad=1, offsets=torch.tensor([[1, 1]]), flips=torch.tensor([False]))
    assert torch.equal(same, x)
    crop = augment_batch(x, pad=1, offsets=torch.tensor([[0, 0]]), flips=torch.tensor([False]))
    assert crop[0, 0].tolist() == [[0, 0, 0], [0, 1, 2], [0, 4, 5]]   # shifted down-right, zero padding
    flipped = augment_batch(x, pad=1, offsets=torch.tensor([[1, 1]]), flips=torch.tensor([True]))
    assert flipped[0, 0].tolist() == [[3, 2, 1], [6, 5, 4], [9, 8, 7]]
    both = augment_batch(x, pad=1, offsets=torch.tensor([[2, 0]]), flips=torch.tensor([True]))
    assert both[0, 0].tolist() == [[5, 4, 0], [8, 7, 0], [0, 0, 0]]   # crop (up, left), then mirror


def test_augment_random_batch_keeps_shape_dtype_and_varies():
    x = torch.randint(0, 256, (64, 3, 32, 32), dtype=torch.uint8)
    out = augment_batch(x, np.random.default_rng(0))
    assert isinstance(out, torch.Tensor) and out.shape == x.shape and out.dtype == x.dtype
    changed = [not torch.equal(out[i], x[i]) for i in range(64)]
    assert 40 < sum(changed) <= 64  # identity only when offset (4,4) and no flip: ~1/162 of samples
    assert torch.equal(augment_batch(x, np.random.default_rng(0)), out)
    f = augment_batch(x.float(), np.random.default_rng(0))
    assert f.dtype == torch.float32 and torch.equal(f, out.float())
    a = augment_batch(x.numpy(), np.random.default_rng(0))
    assert isinstance(a, np.ndarray) and np.array_equal(a, out.numpy())


def test_loader_batches_match_reference_pipeline():
    """The loader's numpy pipeline equals crop/flip + torchvision-style normalisation done by hand."""
    from gravac.data.augment import crop_flip_nhwc
    ds = load_dataset(dataset_cfg(name="synthetic", train_size=256, test_size=64))
    x, y = ds.train_loader(0, 1, 16, 0).next_batch()
    assert x.is_contiguous() and x.shape == (16, 3, 16, 16)
    xe, ye = next(ds.eval_batches(16))
    raw = torch.from_numpy(np.asarray(ds.test_x[:16])).permute(0, 3, 1, 2)
    assert torch.allclose(xe, normalize(raw, ds.mean, ds.std), atol=1e-5) and torch.equal(ye, torch.from_numpy(ds.test_y[:16]))
    img = np.arange(2 * 3 * 3 * 1, dtype=np.uint8).reshape(2, 3, 3, 1)
    out = crop_flip_nhwc(img, np.array([[1, 1], [0, 2]]), np.array([False, True]), pad=1)
    assert np.array_equal(out[0], img[0]) and out[1, :, :, 0].tolist() == [[0, 0, 0], [0, 11, 10], [0, 14, 13]]


def test_normalize():
    x = torch.full((2, 3, 4, 4), 255, dtype=torch.uint8)
    out = normalize(x, (0.5, 0.5, 0.5), (0.25, 0.5, 1.0))
    assert out.dtype == torch.float32 and torch.allclose(out[0, :, 0, 0], torch.tensor([2.0, 1.0, 0.5]))
    assert torch.allclose(normalize(torch.ones(1, 3, 1, 1), (0.5,) * 3, (0.5,) * 3), torch.ones(1, 3, 1, 1))


def test_eval_batches_cover_exactly_once():
    ds = _indexed_images(1000)
    full = np.concatenate([_ids(x) for x, _ in ds.eval_batches(64)])
    assert full.tolist() == list(range(500))
    parts = [np.concatenate([_ids(x) for x, _ in ds.eval_batches(64, r, 3)]) for r in range(3)]
    assert sorted(np.concatenate(parts).tolist()) == list(range(500))
    lm = LMDataset("toy", [str(i) for i in range(300)], np.arange(300), np.arange(300), bptt=6)
    toks = torch.cat([y.flatten() for r in range(2) for _, y in lm.eval_batches(5, r, 2)])
    assert len(toks.unique()) == len(toks) >= 290


# ---------------------------------------------------------------------------------------------- errors


def test_unknown_dataset_and_bad_split():
    with pytest.raises(DataError, match="cifar10"):
        load_dataset(dataset_cfg(name="imagenet"))
    with pytest.raises(DataError, match="eval_split"):
        load_dataset(dataset_cfg(name="synthetic", eval_split="valid"))


def test_missing_cifar10_is_a_clear_error(tmp_path):
    with pytest.raises(DataError) as e:
        load_dataset(dataset_cfg(name="cifar10", root=str(tmp_path), download=False, cache_dir=str(tmp_path / "c")))
    msg = str(e.value)
    assert "\n" not in msg and str(tmp_path) in msg and "cifar-10-batches-py" in msg
    assert "GRAVAC_DATA_DIR" in msg and "dataset.root" in msg and isinstance(e.value, ValueError)


def _offline(*args, **kwargs):
    raise urllib.error.URLError("no network")


def test_cifar_download_failure_is_a_clear_error(tmp_path, monkeypatch):
    import gravac.data.cifar as cifar
    monkeypatch.setattr(cifar, "_download", _offline)
    with pytest.raises(DataError, match="download.*failed.*no network"):
        load_dataset(dataset_cfg(name="cifar10", root=str(tmp_path), download=True))
    with pytest.raises(DataError) as e:
        load_dataset(dataset_cfg(name="cifar100", root=str(tmp_path), download=True))
    msg = str(e.value)
    assert "cifar-100-python" in msg and str(tmp_path) in msg and "no network" in msg and "offline" in msg


class _Py2Pickler(pickle._Pickler):
    """Writes bytes as Python 2's str (BINSTRING), as the official CIFAR batch files were written."""

    def save_bytes(self, obj):
        self.write(pickle.BINSTRING + struct.pack("<i", len(obj)) + obj)
        self.memoize(obj)

    dispatch = {**pickle._Pickler.dispatch, bytes: save_bytes}


def _cifar_batch(n: int, seed: int) -> tuple[bytes, dict]:
    """A batch file in the official format (protocol 2, numpy.core.multiarray) and what it holds."""
    rng = np.random.default_rng(seed)
    entry = {"batch_label": "fake", "labels": [int(v) for v in rng.integers(0, 10, n)],
             "data": rng.integers(0, 256, (n, 3072), dtype=np.uint8), "filenames": [f"{i}.png" for i in range(n)]}
    buf = io.BytesIO()
    _Py2Pickler(buf, 2).dump(entry)
    return buf.getvalue().replace(b"numpy._core.multiarray\n", b"numpy.core.multiarray\n"), entry


class _WritesAFile:
    """Unpickled, it opens (so creates) `path`: what a crafted batch file can do to pickle.load."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return open, (str(self.path), "w")


def _fake_cifar10(root: Path, monkeypatch, crafted: bytes | None = None) -> dict[str, dict]:
    """A tiny cifar-10-batches-py (3 images a batch) under root, torchvision's checksums set to its
    files' (as if they were the official ones); `crafted` replaces data_batch_1. Returns the entries."""
    import torchvision.datasets as tvd
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    names = [*(f"data_batch_{k}" for k in range(1, 6)), "test_batch"]
    made = {name: _cifar_batch(3, i) for i, name in enumerate(names)}
    blobs = {name: b for name, (b, _) in made.items()}
    blobs["batches.meta"] = pickle.dumps({"label_names": CIFAR10_CLASSES}, protocol=2)
    if crafted is not None:
        blobs["data_batch_1"] = crafted
    md5 = {name: hashlib.md5(b).hexdigest() for name, b in blobs.items()}
    for name, b in blobs.items():
        (folder / name).write_bytes(b)
    monkeypatch.setattr(tvd.CIFAR10, "train_list", [[n, md5[n]] for n in names[:5]])
    monkeypatch.setattr(tvd.CIFAR10, "test_list", [["test_batch", md5["test_batch"]]])
    monkeypatch.setattr(tvd.CIFAR10, "meta", {**tvd.CIFAR10.meta, "md5": md5["batches.meta"]})
    return {name: e for name, (_, e) in made.items()}


def test_cifar_batches_in_the_official_format_are_read(tmp_path, monkeypatch):
    """What the restricted unpickler admits is enough for the official files (Python 2 pickles of
    numpy arrays): images in HWC order and labels, batches in order."""
    entries = _fake_cifar10(tmp_path, monkeypatch)
    ds = load_dataset(dataset_cfg(name="cifar10", root=str(tmp_path), download=False))
    train = [entries[f"data_batch_{k}"] for k in range(1, 6)]
    assert (ds.train_size, ds.eval_size) == (15, 3)
    assert ds.train_y.tolist() == [y for e in train for y in e["labels"]]
    want = np.vstack([e["data"] for e in train]).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    assert np.array_equal(ds.train_x, want) and ds.test_y.tolist() == entries["test_batch"]["labels"]


def test_a_crafted_cifar_batch_is_refused_and_runs_nothing(tmp_path, monkeypatch):
    """Issue 33 case 1: torchvision reads its CIFAR format with pickle.load, which runs what a
    crafted file names. Its MD5 check stops a changed official file, but not one whose checksum
    matches (a weak hash, a file replaced between check and read, another torchvision): here the
    checksums are the crafted files' own. The read names no code; the file is never written."""
    marker = tmp_path / "written-by-the-pickle"
    _fake_cifar10(tmp_path / "data", monkeypatch, crafted=pickle.dumps(_WritesAFile(marker), protocol=2))
    with pytest.raises(DataError) as e:
        load_dataset(dataset_cfg(name="cifar10", root=str(tmp_path / "data"), download=False))
    msg = str(e.value)
    assert not marker.exists()
    assert "\n" not in msg and "data_batch_1 is not a CIFAR batch file" in msg and "refusing to read it" in msg


def test_a_changed_cifar_batch_is_refused_by_its_checksum(tmp_path, monkeypatch):
    _fake_cifar10(tmp_path, monkeypatch)
    (tmp_path / "cifar-10-batches-py" / "test_batch").write_bytes(b"garbage")
    with pytest.raises(DataError, match="incomplete or corrupt .test_batch differs from the official file"):
        load_dataset(dataset_cfg(name="cifar10", root=str(tmp_path), download=False))


def test_missing_cifar100_is_a_clear_error(tmp_path):
    with pytest.raises(DataError) as e:
        load_dataset(dataset_cfg(name="cifar100", root=str(tmp_path), download=False))
    msg = str(e.value)
    assert "\n" not in msg and "cifar-100-python" in msg and str(tmp_path) in msg and "offline" in msg


def test_missing_ptb_is_a_clear_error(tmp_path, monkeypatch):
    with pytest.raises(DataError, match=r"ptb\.train\.txt.*GRAVAC_DATA_DIR"):
        load_dataset(dataset_cfg(name="ptb", root=str(tmp_path), download=False))
    import gravac.data.ptb as ptb
    monkeypatch.setattr(ptb.urllib.request, "urlopen", _offline)
    with pytest.raises(DataError, match=r"ptb\.train\.txt.*download.*failed.*no network"):
        load_dataset(dataset_cfg(name="ptb", root=str(tmp_path), download=True))


@pytest.mark.parametrize("args", [["dataset=cifar10"], ["dataset=ptb", "model=lstm_mini", "dataset.download=true"]],
                         ids=["cifar10", "ptb"])
def test_a_missing_dataset_run_creates_no_data_folder(tmp_path, args):
    """Issue 20: the failed download made ./data (torchvision creates its root first) and left it.
    A proxy that refuses every connection keeps the test offline wherever it runs."""
    from conftest import run_cli
    cwd, cache = tmp_path / "cwd", tmp_path / "cache"
    cwd.mkdir()
    offline = {k: "http://127.0.0.1:9" for k in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")}
    r = run_cli([*args, "logger.progress=false", f"experiment.results_root={tmp_path / 'results'}"], cwd=cwd,
                env={"GRAVAC_DATA_DIR": "", "GRAVAC_CACHE_DIR": str(cache), "no_proxy": "", "NO_PROXY": "", **offline})
    assert r.returncode == 2 and "not found" in r.stderr and "download" in r.stderr, failure(r)
    assert str(cwd / "data") in r.stderr                     # it did look in ./data
    assert list(cwd.iterdir()) == [] and not cache.exists()


@pytest.mark.parametrize("train,fragment", [
    (b"\x89PNG\r\n\x1a\n\x00\xff\xfe binary", r"ptb\.train\.txt is not a text file \(byte \d+ is not UTF-8\)"),
    (b"the cat sat\n", r"ptb\.train\.txt holds no <unk> token \(4 words\): it is truncated"),
])
def test_a_bad_ptb_training_file_is_named_in_one_line(tmp_path, train, fragment):
    """Issue 21 case 8: a binary train file was a UnicodeDecodeError, a truncated one was blamed on
    ptb.valid.txt."""
    d = tmp_path / "ptb"
    d.mkdir()
    (d / "ptb.train.txt").write_bytes(train)
    for split in ("valid", "test"):
        (d / f"ptb.{split}.txt").write_text("the dog ran <unk>\n")
    with pytest.raises(DataError, match=fragment) as e:
        load_dataset(dataset_cfg(name="ptb", root=str(tmp_path), cache_dir=str(tmp_path / "cache")))
    assert "\n" not in str(e.value)


# ---------------------------------------------------------------------------------------------- ImageFolder + cache


def _write_folder(root: Path, per_class: int = 2) -> np.ndarray:
    from PIL import Image
    rng = np.random.default_rng(0)
    imgs = rng.integers(0, 256, (2, 10, per_class, 32, 32, 3), dtype=np.uint8)
    for s, split in enumerate(("train", "test")):
        for c, name in enumerate(CIFAR10_CLASSES):
            (root / split / name).mkdir(parents=True)
            for i in range(per_class):
                Image.fromarray(imgs[s, c, i]).save(root / split / name / f"{i:04d}.png")
    return imgs


def test_imagefolder_layout_cache_and_invalidation(tmp_path):
    imgs = _write_folder(tmp_path / "data" / "cifar10")
    cache = tmp_path / "cache"
    for root in (tmp_path / "data", tmp_path / "data" / "cifar10"):  # parent of cifar10/ or cifar10/ itself
        ds = load_dataset(dataset_cfg(name="cifar10", root=str(root), cache_dir=str(cache)))
        assert (ds.train_size, ds.eval_size, ds.num_classes) == (20, 20, 10)
        assert ds.classes == CIFAR10_CLASSES and ds.train_y.tolist() == [c for c in range(10) for _ in range(2)]
        assert np.array_equal(np.asarray(ds.train_x), imgs[0].reshape(20, 32, 32, 3))  # PNG: lossless
    assert len(list(cache.glob("cifar10-*"))) == 1 and not list(cache.glob(".tmp*"))
    # a changed file gives a new key and a fresh decode
    from PIL import Image
    p = tmp_path / "data" / "cifar10" / "test" / "cat" / "0000.png"
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(p)
    os.utime(p, ns=(1, 1))
    ds = load_dataset(dataset_cfg(name="cifar10", root=str(tmp_path / "data"), cache_dir=str(cache)))
    assert int(np.asarray(ds.test_x[6]).max()) == 0
    assert len(list(cache.glob("cifar10-*"))) == 2


def test_unwritable_cache_only_warns(tmp_path):
    _write_folder(tmp_path / "cifar10", per_class=1)
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.warns(UserWarning, match="cache"):
        ds = load_dataset(dataset_cfg(name="cifar10", root=str(tmp_path), cache_dir=str(blocker / "sub")))
    assert ds.train_size == 10


def test_imagefolder_wrong_classes(tmp_path):
    (tmp_path / "cifar10" / "train" / "dogs").mkdir(parents=True)
    (tmp_path / "cifar10" / "test" / "dogs").mkdir(parents=True)
    with pytest.raises(DataError, match="expected class folders airplane"):
        load_dataset(dataset_cfg(name="cifar10", root=str(tmp_path), cache_dir=str(tmp_path / "c")))


# ---------------------------------------------------------------------------------------------- real data


@pytest.mark.slow
def test_cifar10_imagefolder_real(tmp_path):
    root = _data_dir("cifar10")
    cfg = dataset_cfg(name="cifar10", root=str(root), cache_dir=str(tmp_path))
    ds = load_dataset(cfg)                      # cold: decodes 60,000 JPEGs (~10-20 s)
    assert (ds.train_size, ds.eval_size, ds.num_classes) == (50_000, 10_000, 10)
    assert ds.classes == CIFAR10_CLASSES
    assert np.bincount(ds.train_y).tolist() == [5000] * 10 and np.bincount(ds.test_y).tolist() == [1000] * 10
    assert ds.train_y[0] == 0 and ds.train_y[-1] == 9  # airplane first, truck last
    mean = np.asarray(ds.train_x[::10]).reshape(-1, 3).mean(0) / 255
    assert np.allclose(mean, (0.4913, 0.4821, 0.4465), atol=0.01)
    t = time.perf_counter()
    warm = load_dataset(cfg)
    assert time.perf_counter() - t < 5.0        # cached: ~0.4 s
    assert np.array_equal(np.asarray(warm.train_x[:500]), np.asarray(ds.train_x[:500]))
    assert np.array_equal(warm.test_y, ds.test_y)
    x, y = warm.train_loader(3, 8, 32, 0).next_batch()
    assert x.shape == (32, 3, 32, 32) and x.dtype == torch.float32 and abs(x.mean().item()) < 0.5


def test_cifar10_real_layout():
    """Fast check of the real ImageFolder listing (no decoding): counts, classes, label order."""
    from gravac.data.cifar import _imagefolder_root, _list_split
    root = _data_dir("cifar10")
    src = _imagefolder_root(root)
    assert src == root / "cifar10" and _imagefolder_root(src) == src
    for split, n in (("train", 5000), ("test", 1000)):
        classes, files, labels, _ = _list_split(src / split)
        assert classes == CIFAR10_CLASSES
        assert np.bincount(labels).tolist() == [n] * 10 and labels[0] == 0 and labels[-1] == 9
        assert Path(files[0]).parent.name == "airplane" and Path(files[-1]).parent.name == "truck"


def test_ptb_real(tmp_path):
    root = _data_dir("ptb")
    for r in (root, root / "ptb"):
        ds = load_dataset(dataset_cfg(name="ptb", root=str(r), cache_dir=str(tmp_path)))
        assert (ds.task, ds.num_classes, ds.train_size, ds.eval_size) == ("lm", 10_000, 929_589, 82_430)
        assert "<unk>" in ds.vocab and "<eos>" in ds.vocab and len(set(ds.vocab)) == 10_000
    valid = load_dataset(dataset_cfg(name="ptb", root=str(root), cache_dir=str(tmp_path), eval_split="valid"))
    assert valid.eval_size == 73_760
    first_line = (root / "ptb" / "ptb.train.txt").read_text().split("\n", 1)[0].split() + ["<eos>"]
    assert [ds.vocab[i] for i in ds.train_ids[: len(first_line)]] == first_line
    x, y = ds.train_loader(0, 4, 20, 0).next_batch()
    assert x.shape == (35, 20) and torch.equal(x[1:], y[:-1])


def test_cache_concurrent_builders_build_once(tmp_path):
    """Concurrent starts (e.g. ddp ranks) wait on a lock: one builds, the others read its cache."""
    import threading
    from gravac.data.files import cached_arrays
    calls = []

    def build():
        calls.append(1)
        time.sleep(0.3)
        return {"a": np.arange(10), "b": np.ones((2, 3), np.uint8)}

    out = [None] * 3
    threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, cached_arrays(tmp_path, "t", "k", build)))
               for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and all(np.array_equal(o["a"], np.arange(10)) for o in out)
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == ["t-k"]
    (tmp_path / "t-k" / "a.npy").write_bytes(b"garbage")  # a corrupt cache is rebuilt with a warning
    with pytest.warns(UserWarning, match="unreadable cache"):
        again = cached_arrays(tmp_path, "t", "k", build)
    assert len(calls) == 2 and np.array_equal(again["a"], np.arange(10))
    assert np.array_equal(cached_arrays(tmp_path, "t", "k", build)["b"], np.ones((2, 3)))

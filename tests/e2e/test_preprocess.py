"""tensorflow-transform: analyzers checked against numpy, train/serve consistency, user functions.

Every expected value is computed here, with numpy, from the source table and the rows of the
fitting split; the records are read back with plain tf.data + tf.io.parse_example.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import published_root, tf_raw_records

import recordforge
from recordforge.errors import RecordForgeError, SchemaError
from recordforge.pipelines.convert import run
from recordforge.tools.verify import verify

N_TRAIN, N_EVAL = 2400, 600
FRUITS = ["apple", "banana", "cherry", "damson", "elder", "fig", "grape", "kiwi"]

SCHEMA = """
features:
  - {name: id, type: int64, nulls: required}
  - {name: part, type: string, nulls: required}
  - name: fruit
    type: string
    nulls: required
    transform: {vocabulary: {top_k: 6, frequency_threshold: 120}, output: fruit_id}
  - name: color
    type: string
    transform: {vocabulary: {num_oov_buckets: 2}, output: color_id}
  - {name: x, type: float64, narrow: true, nulls: required, transform: {scale_to_z_score: {}, output: x_z}}
  - {name: y, type: float32, transform: {scale_to_0_1: {}}}
  - {name: k, type: int64, nulls: required, transform: {bucketize: {num_buckets: 4}, output: k_bucket}}
  - {name: w, type: float64, encode: bytes, transform: {scale_to_z_score: {}, output: w_z}}
  - {name: h, type: string, nulls: required, transform: {hash_strings: {hash_buckets: 50}, output: h_hash}}
  - {name: tags, type: int64, shape: [-1]}
"""


def _table() -> pa.Table:
    rng = np.random.default_rng(7)
    n = N_TRAIN + N_EVAL
    part = np.array(["train"] * N_TRAIN + ["eval"] * N_EVAL)
    rng.shuffle(part)
    # Train counts fixed so that the frequency threshold and a tie (cherry/damson) matter.
    counts = {"apple": 800, "banana": 700, "cherry": 300, "damson": 300, "elder": 150, "fig": 48, "grape": 2}
    counts["kiwi"] = N_TRAIN - sum(counts.values())
    fruit_train = np.repeat(list(counts), list(counts.values()))
    rng.shuffle(fruit_train)
    fruit = np.empty(n, dtype=object)
    fruit[part == "train"] = fruit_train
    fruit[part == "eval"] = rng.choice(FRUITS + ["mango", "papaya"], N_EVAL)  # unseen in eval
    colors = np.array(["red", "green", "blue", "plum", ""])  # "" is a real value, not a null
    color = [None if i % 9 == 0 else str(c) for i, c in enumerate(rng.choice(colors, n))]
    y = [None if i % 11 == 0 else float(v) for i, v in enumerate(rng.uniform(-3, 9, n).astype(np.float32))]
    w = [None if i % 13 == 0 else float(v) for i, v in enumerate(rng.normal(1e6, 1e-3, n))]
    return pa.table(
        {
            "id": np.arange(n),
            "part": part,
            "fruit": fruit.astype(str),
            "color": pa.array(color, pa.string()),
            "x": rng.normal(40.0, 12.0, n),
            "y": pa.array(y, pa.float32()),
            # distinct integers: quantile boundaries are data points
            "k": rng.permutation(n) * 3 + 1,
            "w": pa.array(w, pa.float64()),
            "h": np.array([f"user-{i % 97}" for i in range(n)]),
            "tags": pa.array([list(range(i % 4)) for i in range(n)], pa.list_(pa.int64())),
        }
    )


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, pa.Table]:
    root = tmp_path_factory.mktemp("tft")
    table = _table()
    pq.write_table(table, root / "t.parquet", row_group_size=700)
    (root / "s.yaml").write_text(SCHEMA)
    out = root / "out"
    run(
        [
            f"--source={root / 't.parquet'}",
            f"--schema={root / 's.yaml'}",
            f"--output={out}",
            "--splits=train=8,eval=2",
            "--split_column=part",
        ]
    )
    return out, table


def read_split(out: Path, split: str | None = None) -> dict[str, list[Any]]:
    """Records of one split (or all) with tf.data + tf.io.parse_example and the bundle's spec,
    as {feature: one value list per record}."""
    import tensorflow as tf

    from recordforge.schemas.export import decode_parsed, to_tf_feature_spec

    meta = json.loads((out / "metadata.json").read_text())
    spec_json = json.loads((out / "feature_spec.json").read_text())
    files = [str(out / s["file"]) for s in meta["shards"] if split is None or s.get("split") == split]
    ds = tf.data.TFRecordDataset(files, compression_type=meta["tf_compression_type"]).batch(100_000)
    cols: dict[str, list[Any]] = {}
    for batch in ds:
        parsed = decode_parsed(tf.io.parse_example(batch, to_tf_feature_spec(spec_json)), spec_json)
        for name, t in parsed.items():
            if isinstance(t, tf.SparseTensor):
                t = tf.RaggedTensor.from_sparse(t)
                cols.setdefault(name, []).extend(np.asarray(r) for r in t.numpy())
            else:
                cols.setdefault(name, []).extend(np.asarray(v).reshape(-1) for v in t.numpy())
    return cols


def _by_id(cols: dict[str, list[Any]]) -> dict[str, dict[int, Any]]:
    ids = [int(v[0]) for v in cols["id"]]
    return {name: dict(zip(ids, values, strict=True)) for name, values in cols.items()}


def _expected_vocabulary(values: list[str], top_k: int | None = None, threshold: int = 0) -> list[str]:
    """TFT's order: most frequent first, ties broken by the larger token first."""
    tokens, counts = np.unique(np.array(values, dtype=object).astype(bytes), return_counts=True)
    ranked = sorted(
        ((int(c), t) for t, c in zip(tokens, counts, strict=True) if c >= threshold), reverse=True
    )
    return [t.decode() for _, t in ranked[:top_k]]


def test_vocabulary_ids_match_numpy(converted: tuple[Path, pa.Table]) -> None:
    out, table = converted
    rows = table.to_pydict()
    train = [i for i, p in enumerate(rows["part"]) if p == "train"]
    vocab = _expected_vocabulary([rows["fruit"][i] for i in train], top_k=6, threshold=120)
    # kiwi (100) is cut by the threshold, not by top_k; damson and cherry tie at 300
    assert vocab == ["apple", "banana", "damson", "cherry", "elder"]
    records = _by_id(read_split(out))
    for i, fruit in enumerate(rows["fruit"]):
        expected = vocab.index(fruit) if fruit in vocab else -1  # out of vocabulary: -1
        assert records["fruit_id"][i].tolist() == [expected], (i, fruit)
        assert records["fruit"][i].tolist() == [fruit.encode()]  # the raw value kept beside it
    # num_oov_buckets: known colours get their rank, absent stays absent
    color_vocab = _expected_vocabulary([rows["color"][i] for i in train if rows["color"][i] is not None])
    for i, color in enumerate(rows["color"]):
        got = records["color_id"][i].tolist()
        if color is None:
            assert got == []
        else:
            assert got == [color_vocab.index(color)]
    # the vocabulary file TFT wrote, readable by name for serving
    import tensorflow_transform as tft

    tft_out = tft.TFTransformOutput(recordforge.version_path(str(out)))
    assert [t.decode() for t in tft_out.vocabulary_by_name("fruit_id")] == vocab


def test_scaling_and_buckets_match_numpy(converted: tuple[Path, pa.Table]) -> None:
    out, table = converted
    rows = table.to_pydict()
    is_train = np.array(rows["part"]) == "train"
    records = _by_id(read_split(out))
    n = len(rows["id"])

    # z-score over the train rows: population variance, as TFT; x was narrowed to float32 first
    x = np.array(rows["x"], dtype=np.float32).astype(np.float64)
    expected = (x - x[is_train].mean()) / x[is_train].std()
    got = np.array([records["x_z"][i][0] for i in range(n)])
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)

    # 0-1 scaling in place of y; absent values stay absent and are left out of min and max
    y = np.array([np.nan if v is None else v for v in rows["y"]], dtype=np.float64)
    lo, hi = np.nanmin(y[is_train]), np.nanmax(y[is_train])
    for i in range(n):
        if np.isnan(y[i]):
            assert records["y"][i].size == 0
        else:
            np.testing.assert_allclose(records["y"][i], [(y[i] - lo) / (hi - lo)], rtol=1e-6, atol=1e-6)

    # float64 kept as bytes: analysed at full precision (values 1e6 +- 1e-3: float32 would round them away)
    w = np.array([np.nan if v is None else v for v in rows["w"]])
    train_w = w[is_train & ~np.isnan(w)]
    for i in range(n):
        if np.isnan(w[i]):
            assert records["w_z"][i].size == 0
        else:
            expected_w = (w[i] - train_w.mean()) / train_w.std()
            np.testing.assert_allclose(records["w_z"][i], [expected_w], rtol=1e-5, atol=1e-5)

    # quantile buckets: boundaries are the train values at ranks n/4, n/2, 3n/4
    k = np.array(rows["k"])
    ranked = np.sort(k[is_train])
    boundaries = ranked[[N_TRAIN * q // 4 for q in (1, 2, 3)]]
    expected_k = np.searchsorted(boundaries, k, side="right")
    assert [int(records["k_bucket"][i][0]) for i in range(n)] == expected_k.tolist()
    assert np.bincount(expected_k[is_train]).tolist() == [N_TRAIN // 4] * 4

    # hash_strings is tf.strings.to_hash_bucket_fast (FarmHash), stable across runs and machines
    import tensorflow as tf

    hashed = tf.strings.to_hash_bucket_fast(rows["h"], 50).numpy()
    assert [int(records["h_hash"][i][0]) for i in range(n)] == hashed.tolist()
    # untouched features pass through unchanged
    assert all(records["tags"][i].tolist() == rows["tags"][i] for i in range(n))


def test_bundle_describes_transformed_records(converted: tuple[Path, pa.Table]) -> None:
    out, _ = converted
    assert verify(str(out)) == []
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["rows_read"] == meta["rows_written"] == N_TRAIN + N_EVAL
    assert meta["split_counts"] == {
        "train": {"records": N_TRAIN, "shards": 1},
        "eval": {"records": N_EVAL, "shards": 1},
    }
    assert meta["transform"]["fit_on"] == "train"
    spec = json.loads((out / "feature_spec.json").read_text())
    assert spec["fruit_id"] == {"kind": "FixedLenFeature", "dtype": "int64", "shape": []}
    assert spec["x_z"] == {"kind": "FixedLenFeature", "dtype": "float32", "shape": []}
    assert spec["y"] == {"kind": "VarLenFeature", "dtype": "float32"}
    raw = json.loads((out / "raw_feature_spec.json").read_text())
    assert raw["w"]["decode"]["raw"] == "float64"
    # the transformed schema as TFT wrote it, with the vocabulary size as the domain
    root = published_root(out)
    assert (out / "schema.pbtxt").read_text() == (root / "transformed_metadata" / "schema.pbtxt").read_text()
    assert not list(root.glob("_tmp-*"))
    import tensorflow_transform as tft

    tft_out = tft.TFTransformOutput(recordforge.version_path(str(out)))
    assert set(tft_out.transformed_feature_spec()) == set(spec)
    assert set(tft_out.raw_feature_spec()) == set(raw)


def _raw_example(rows: dict[str, list[Any]], i: int) -> bytes:
    """A raw record built independently with the protobuf API, as a serving client would."""
    from tensorflow.core.example import example_pb2

    ex = example_pb2.Example()
    f = ex.features.feature
    f["id"].int64_list.value.append(rows["id"][i])
    f["k"].int64_list.value.append(rows["k"][i])
    f["x"].float_list.value.append(rows["x"][i])
    for name in ("part", "fruit", "h"):
        f[name].bytes_list.value.append(rows[name][i].encode())
    if rows["color"][i] is not None:
        f["color"].bytes_list.value.append(rows["color"][i].encode())
    if rows["y"][i] is not None:
        f["y"].float_list.value.append(rows["y"][i])
    if rows["w"][i] is not None:
        f["w"].bytes_list.value.append(struct.pack("<d", rows["w"][i]))
    f["tags"].int64_list.value.extend(rows["tags"][i])
    return ex.SerializeToString()


def test_train_serve_consistency(converted: tuple[Path, pa.Table]) -> None:
    """Raw rows through the saved transform_fn give exactly the values in the TFRecords."""
    import tensorflow as tf
    import tensorflow_transform as tft

    out, table = converted
    rows = table.to_pydict()
    tft_out = tft.TFTransformOutput(recordforge.version_path(str(out)))
    layer = tft_out.transform_features_layer()
    serialized = tf.constant([_raw_example(rows, i) for i in range(len(rows["id"]))])
    served = layer(tf.io.parse_example(serialized, tft_out.raw_feature_spec()))
    records = _by_id(read_split(out))
    assert set(served) == set(records)
    for name, tensor in served.items():
        if isinstance(tensor, tf.SparseTensor):
            values = [np.asarray(r) for r in tf.RaggedTensor.from_sparse(tensor).numpy()]
        else:
            values = [np.asarray(v).reshape(-1) for v in tensor.numpy()]
        for i, v in enumerate(values):
            stored = records[name][i]
            assert v.dtype == stored.dtype, (name, v.dtype, stored.dtype)
            # floats compared by bit pattern, strings by their bytes
            same = v.tolist() == stored.tolist() if v.dtype == object else v.tobytes() == stored.tobytes()
            assert same, (name, i, v, stored)


USER_FN = """
import tensorflow as tf
import tensorflow_transform as tft


def preprocessing_fn(inputs):
    return {
        "id": inputs["id"],
        "fruit_len": tf.strings.length(inputs["fruit"]),
        "fruit_idx": tft.compute_and_apply_vocabulary(inputs["fruit"], top_k=2),
    }
"""


def test_user_preprocessing_fn_with_schema_transforms(tmp_path: Path) -> None:
    table = _table().slice(0, 500)
    pq.write_table(table, tmp_path / "t.parquet")
    (tmp_path / "fn.py").write_text(USER_FN)
    (tmp_path / "s.yaml").write_text(
        textwrap.dedent(
            """
            features:
              - {name: id, type: int64, nulls: required}
              - {name: fruit, type: string, nulls: required}
              - name: x
                type: float64
                narrow: true
                nulls: required
                transform: {scale_to_z_score: {}, output: x_z}
            """
        )
    )
    out = tmp_path / "out"
    meta = run(
        [
            f"--source={tmp_path / 't.parquet'}",
            f"--schema={tmp_path / 's.yaml'}",
            f"--output={out}",
            f"--preprocessing_fn={tmp_path / 'fn.py'}:preprocessing_fn",
        ]
    )
    assert meta["transform"]["fit_on"] == "all rows"
    records = _by_id(read_split(out))
    # exactly what the function returns, plus the schema's declared transform; raw x and fruit are gone
    assert set(records) == {"id", "fruit_len", "fruit_idx", "x_z"}
    rows = table.to_pydict()
    vocab = _expected_vocabulary(rows["fruit"], top_k=2)
    x = np.array(rows["x"], dtype=np.float32).astype(np.float64)
    for i, fruit in enumerate(rows["fruit"]):
        assert records["fruit_len"][i].tolist() == [len(fruit)]
        assert records["fruit_idx"][i].tolist() == [vocab.index(fruit) if fruit in vocab else -1]
        np.testing.assert_allclose(records["x_z"][i], [(x[i] - x.mean()) / x.std()], rtol=1e-6, atol=1e-6)


def test_plain_conversion_never_imports_tensorflow_transform(tmp_path: Path) -> None:
    pq.write_table(_table().slice(0, 100), tmp_path / "t.parquet")
    code = textwrap.dedent(
        f"""
        import sys
        from recordforge.pipelines.convert import run
        run(["--source={tmp_path / "t.parquet"}", "--output={tmp_path / "out"}"])
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("tensorflow", "tensorflow_transform")))
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip().splitlines()[-1] == "[]", result.stdout


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("{name: x, type: float32, transform: {vocabulary: {}}}", "applies to string or bytes"),
        ("{name: s, type: string, transform: {scale_to_z_score: {}}}", "applies to numeric"),
        ("{name: x, type: int64, transform: {bucketize: {}}}", "needs `num_buckets`"),
        ("{name: x, type: int64, transform: {bucketize: {num_buckets: 0}}}", "must be positive"),
        ("{name: s, type: string, transform: {vocabulary: {top_n: 3}}}", "no parameter 'top_n'"),
        ("{name: s, type: string, transform: {tfidf: {}}}", "unknown transform 'tfidf'"),
        ("{name: s, type: string, transform: {vocabulary: {}, output: x}}", "duplicate feature names: x"),
    ],
)
def test_schema_errors_name_the_line(tmp_path: Path, entry: str, message: str) -> None:
    from recordforge.schemas import load_schema

    (tmp_path / "s.yaml").write_text(f"features:\n  - {{name: x, type: int64}}\n  - {entry}\n")
    if entry.endswith("output: x}}"):
        (tmp_path / "s.yaml").write_text(f"features:\n  - {{name: x, type: float32}}\n  - {entry}\n")
    with pytest.raises(SchemaError, match=message):
        load_schema(str(tmp_path / "s.yaml"))


def test_bad_preprocessing_setups_fail_before_running(tmp_path: Path) -> None:
    pq.write_table(_table().slice(0, 50), tmp_path / "t.parquet")
    (tmp_path / "s.yaml").write_text(
        "features:\n  - {name: id, type: int64, nulls: required, transform: {scale_to_0_1: {}}}\n"
    )
    base = [
        f"--source={tmp_path / 't.parquet'}",
        f"--schema={tmp_path / 's.yaml'}",
        f"--output={tmp_path / 'o'}",
    ]
    with pytest.raises(RecordForgeError, match="'train' split, which --splits does not have"):
        run([*base, "--splits=a=1,b=1"])
    with pytest.raises(RecordForgeError, match="no function 'nope'"):
        (tmp_path / "fn.py").write_text(USER_FN)
        run([*base, f"--preprocessing_fn={tmp_path / 'fn.py'}:nope"])
    with pytest.raises(RecordForgeError, match="cannot load"):
        run([*base, f"--preprocessing_fn={tmp_path / 'missing.py'}:preprocessing_fn"])


def test_ragged_and_image_features_are_refused_with_transforms() -> None:
    from recordforge.schemas import DType, Feature, Schema, compile_schema
    from recordforge.schemas.preprocessing_fn import raw_tf_spec

    for feature in (Feature("img", DType.IMAGE), Feature("r", DType.INT64, shape=(-1, -1))):
        plan = compile_schema(Schema((feature, Feature("x", DType.INT64))))
        with pytest.raises(RecordForgeError, match=f"{feature.name}: ragged lists and images"):
            raw_tf_spec(plan)


KINDS_SCHEMA = """
features:
  - {name: a, type: int64}
  - {name: b, type: float32, nulls: required}
  - {name: s, type: string}
  - {name: l, type: int64, shape: [-1]}
  - {name: fx, type: float32, shape: [2], nulls: required}
  - {name: w, type: float64, encode: bytes}
  - {name: t, type: bool}
  - {name: d, type: date}
  - {name: ts, type: timestamp, unit: ms}
  - {name: fn, type: int64, shape: [2]}
  - {name: wl, type: float64, encode: bytes, shape: [2], nulls: required}
"""


def _kinds_table(n: int, seed: int) -> pa.Table:
    """Columns of the kinds TFT's input handles: nulls, empty lists, fixed shapes, `encode: bytes`
    floats, bools, dates, timestamps (as the schemas below declare them)."""
    rng = np.random.default_rng(seed)
    return pa.table(
        {
            "a": pa.array([None if i % 7 == 0 else int(i) for i in range(n)], pa.int64()),
            "b": pa.array(rng.normal(size=n).astype(np.float32)),
            "s": pa.array([None if i % 5 == 0 else f"v{i % 11}" for i in range(n)], pa.string()),
            "l": pa.array(
                [None if i % 4 == 0 else list(range(i % 3)) for i in range(n)], pa.list_(pa.int64())
            ),
            "fx": pa.array([[float(i), -float(i)] for i in range(n)], pa.list_(pa.float32())),
            "w": pa.array([None if i % 6 == 0 else i / 3 for i in range(n)], pa.float64()),
            "t": pa.array([None if i % 8 == 0 else bool(i % 2) for i in range(n)], pa.bool_()),
            "d": pa.array([None if i % 9 == 0 else i for i in range(n)], pa.int32()).cast(pa.date32()),
            "ts": pa.array([None if i % 10 == 0 else 1000 * i for i in range(n)], pa.timestamp("ms")),
            "fn": pa.array([None if i % 3 == 0 else [i, -i] for i in range(n)], pa.list_(pa.int64())),
            "wl": pa.array([[i / 7, -i / 7] for i in range(n)], pa.list_(pa.float64())),
        }
    )


def _passed_table(n: int, seed: int) -> pa.Table:
    """`_kinds_table` plus a required int64 of any size and a string with a default."""
    rng = np.random.default_rng(seed + 1)
    return (
        _kinds_table(n, seed)
        .append_column("r", pa.array(rng.integers(-(2**62), 2**62, n)))
        .append_column("dv", pa.array([None if i % 3 == 0 else "x" * (i % 4) for i in range(n)], pa.string()))
    )


def test_tft_input_equals_tfx_bsl_decoding_the_encoded_records() -> None:
    """TFT reads conformed rows instead of decoding encoded Examples: its input batch must equal
    what tfx-bsl's decoder makes of the records a plain conversion writes, for scalars and lists
    with nulls, empty lists, fixed shapes, `encode: bytes` floats, and sliced or taken batches."""
    import yaml
    from tensorflow_transform.tf_metadata import schema_utils
    from tfx_bsl.coders import example_coder

    from recordforge.conforming.conform import conform_batch
    from recordforge.records.encoding import ExampleEncoder
    from recordforge.schemas.loader import schema_from_dict
    from recordforge.schemas.plan import compile_schema
    from recordforge.schemas.preprocessing_fn import raw_tf_spec
    from recordforge.transforms.analyze_transform import _absentable, _TftInputFn

    plan = compile_schema(schema_from_dict(yaml.safe_load(KINDS_SCHEMA)))
    table = _kinds_table(300, seed=3)
    conformed = conform_batch(table.to_batches()[0], plan, file="f", first_row=0).batch
    raw_schema = schema_utils.schema_from_feature_spec(raw_tf_spec(plan))
    decoder = example_coder.ExamplesToRecordBatchDecoder(raw_schema.SerializeToString())
    fn = _TftInputFn(decoder.ArrowSchema(), _absentable(plan))
    encoder = ExampleEncoder(plan)
    pieces = [conformed, conformed.slice(37, 101), conformed.take(pa.array([299, 3, 150, 0, 42]))]
    pieces.append(conformed.slice(0, 9).slice(3, 4))
    for rows in pieces:
        (got,) = list(fn.process((("", "f", 0), rows)))
        want = decoder.DecodeBatch(encoder.encode(rows).to_pylist())
        for field in want.schema:
            g, w = got.column(field.name), want.column(field.name)
            assert g.type == w.type, field.name
            assert g.to_pylist() == w.to_pylist(), field.name
            # The tensor adapter reads the buffers: lists must span exactly their values.
            assert len(g.flatten()) == len(g.values), field.name


# The kinds, two of them transformed, plus the two columns `_passed_table` adds.
PASSED_SCHEMA = (
    KINDS_SCHEMA.replace(
        "{name: b, type: float32, nulls: required}",
        "{name: b, type: float32, nulls: required, transform: {scale_to_0_1: {}}}",
    ).replace("{name: s, type: string}", "{name: s, type: string, transform: {vocabulary: {}, output: s_id}}")
    + "  - {name: r, type: int64, nulls: required}\n"
    + "  - {name: dv, type: string, nulls: default, default: none}\n"
)
assert PASSED_SCHEMA.count("transform:") == 2  # both replacements took

# Returns every raw input the schema's transforms leave as it is, so that the whole record goes
# through TensorFlow; the schema's own transforms add b (in place) and s_id.
ALL_THROUGH_FN = """
def preprocessing_fn(inputs):
    return {k: v for k, v in inputs.items() if k != "b"}
"""


def test_features_passed_by_tensorflow_are_written_as_if_they_went_through_it(tmp_path: Path) -> None:
    """The transform pass carries the features no transform touches past TensorFlow. The
    records must be byte for byte those of a run where every feature goes through the
    transform_fn (a function returning its inputs): absent rows, empty lists, fixed shapes,
    `encode: bytes` floats, dates, timestamps, bools, defaults, over several batches."""
    n = 1000
    table = _passed_table(n, seed=11)
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=300)
    (tmp_path / "s.yaml").write_text(PASSED_SCHEMA)
    (tmp_path / "fn.py").write_text(ALL_THROUGH_FN)
    common = [f"--source={tmp_path / 't.parquet'}", f"--schema={tmp_path / 's.yaml'}", "--deterministic"]
    passed = run([*common, f"--output={tmp_path / 'passed'}"])
    through = run(
        [
            *common,
            f"--output={tmp_path / 'through'}",
            f"--preprocessing_fn={tmp_path / 'fn.py'}:preprocessing_fn",
        ]
    )
    assert passed["num_records"] == through["num_records"] == n
    assert json.loads((tmp_path / "passed" / "feature_spec.json").read_text()) == json.loads(
        (tmp_path / "through" / "feature_spec.json").read_text()
    )
    shards = [sorted(published_root(tmp_path / out).glob("data-*")) for out in ("passed", "through")]
    assert len(shards[0]) == len(shards[1]) > 0
    for mine, theirs in zip(*shards, strict=True):
        assert mine.read_bytes() == theirs.read_bytes(), mine.name
    # And what was written is what the records hold: spot values read back with tf.data.
    records = _by_id_of(read_split(tmp_path / "passed"), "r")
    r = table.column("r").to_pylist()
    assert sorted(records["a"]) == sorted(r)
    by_r = {v: i for i, v in enumerate(r)}
    for value, got in records["a"].items():
        i = by_r[value]
        assert got.tolist() == ([] if i % 7 == 0 else [i])
    for value, got in records["l"].items():
        i = by_r[value]
        assert got.tolist() == ([] if i % 4 == 0 else list(range(i % 3)))


def _by_id_of(cols: dict[str, list[Any]], key: str) -> dict[str, dict[int, Any]]:
    ids = [int(v[0]) for v in cols[key]]
    return {name: dict(zip(ids, values, strict=True)) for name, values in cols.items()}


UNWEIGHTED_FN = """
import tensorflow_transform as tft


def preprocessing_fn(inputs):
    def vocab(name, **params):
        return tft.compute_and_apply_vocabulary(
            inputs[name], vocab_filename=f"ref_{name}", file_format="tfrecord_gzip", **params
        )

    return {
        "id": inputs["id"],
        "ref_fruit": vocab("fruit", top_k=6, frequency_threshold=120),
        "ref_color": vocab("color", num_oov_buckets=2),
        "ref_words": vocab("words", frequency_threshold=2),
    }
"""


def test_vocabularies_equal_tensorflow_transforms_unweighted_ones(tmp_path: Path) -> None:
    """The schema's vocabularies are counted per batch in the graph (TFT's weighted path, with a
    weight of one per value): the same files and ids as TFT's plain vocabulary of the same
    values, computed in the same run by a user's function: a top_k cut inside a tie, a
    frequency threshold, out-of-vocabulary buckets, an empty-string token, absent rows and a
    list feature with empty lists, over several batches."""

    table = _table()
    # Tokens seen once (under the threshold of 2) and twice (at it), besides frequent ones.
    rare = {1: "once{}", 2: "twice{}", 3: "twice{}"}
    words = [
        None
        if i % 17 == 0
        else [f"w{(i * j) % 23}" for j in range(i % 5)]
        + [rare.get(i % 50, "").format(i // 50)] * (i % 50 in rare)
        for i in range(len(table))
    ]
    table = table.append_column("words", pa.array(words, pa.list_(pa.string())))
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=700)
    (tmp_path / "fn.py").write_text(UNWEIGHTED_FN)
    (tmp_path / "s.yaml").write_text(
        textwrap.dedent(
            """
            features:
              - {name: id, type: int64, nulls: required}
              - name: fruit
                type: string
                nulls: required
                transform: {vocabulary: {top_k: 6, frequency_threshold: 120}, output: fruit_id}
              - {name: color, type: string, transform: {vocabulary: {num_oov_buckets: 2}, output: color_id}}
              - name: words
                type: string
                shape: [-1]
                transform: {vocabulary: {frequency_threshold: 2}, output: words_id}
            """
        )
    )
    out = tmp_path / "out"
    run(
        [
            f"--source={tmp_path / 't.parquet'}",
            f"--schema={tmp_path / 's.yaml'}",
            f"--output={out}",
            f"--preprocessing_fn={tmp_path / 'fn.py'}:preprocessing_fn",
        ]
    )
    assets = published_root(out) / "transform_fn" / "assets"

    def tokens(name: str) -> list[bytes]:
        (path,) = assets.glob(f"{name}.tfrecord.gz")
        return tf_raw_records([str(path)], "GZIP")

    records = _by_id(read_split(out))
    for feature in ("fruit", "color", "words"):
        mine = tokens(f"{feature}_id")
        assert mine and mine == tokens(f"ref_{feature}"), feature
        for i, ids in records[f"{feature}_id"].items():
            assert ids.tolist() == records[f"ref_{feature}"][i].tolist(), (feature, i)
    assert tokens("fruit_id") == [
        t.encode() for t in _expected_vocabulary(table.column("fruit").to_pylist(), top_k=6, threshold=120)
    ]


def test_two_workers_write_what_one_writes_with_transforms(tmp_path: Path) -> None:
    """The transform path's DoFns (passthrough features, unread analyzer inputs) in forked
    workers: the same shards, byte for byte, as one worker."""
    pq.write_table(_passed_table(2000, seed=5), tmp_path / "t.parquet", row_group_size=250)
    (tmp_path / "s.yaml").write_text(PASSED_SCHEMA)
    common = [f"--source={tmp_path / 't.parquet'}", f"--schema={tmp_path / 's.yaml'}", "--deterministic"]
    run([*common, f"--output={tmp_path / 'one'}"])
    run(
        [
            *common,
            f"--output={tmp_path / 'two'}",
            "--direct_running_mode=multi_processing",
            "--direct_num_workers=2",
        ]
    )
    shards = [sorted(published_root(tmp_path / out).glob("data-*")) for out in ("one", "two")]
    assert len(shards[0]) == len(shards[1]) > 0
    for mine, theirs in zip(*shards, strict=True):
        assert mine.read_bytes() == theirs.read_bytes(), mine.name

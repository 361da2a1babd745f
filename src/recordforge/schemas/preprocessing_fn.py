"""The tensorflow-transform side of a schema: the preprocessing_fn, and the plan of its output."""
# Design notes: docs/architecture.md, "Module notes".

from __future__ import annotations

import dataclasses
import re
import types
from collections.abc import Callable
from typing import Any

import tensorflow as tf
import tensorflow_transform as tft

from recordforge.errors import RecordForgeError
from recordforge.files.storage import open_input
from recordforge.schemas.analyzers import Analyzer, Transform
from recordforge.schemas.export import to_tf_feature_spec
from recordforge.schemas.kinds import DType, NullPolicy
from recordforge.schemas.model import Feature, Schema
from recordforge.schemas.plan import Plan, compile_schema

__all__ = [
    "apply_transform",
    "build_preprocessing_fn",
    "load_user_fn",
    "output_plan",
    "raw_tf_spec",
    "vocabulary_name",
]

PreprocessingFn = Callable[[dict[str, Any]], dict[str, Any]]


def load_user_fn(ref: str) -> PreprocessingFn:
    """`path/to/module.py:fn` (any Beam filesystem) or `package.module:fn`."""
    module_ref, _, name = ref.rpartition(":")
    if not module_ref or not name:
        raise RecordForgeError(
            f"--preprocessing_fn {ref!r}: expected path/to/module.py:function or package.module:function"
        )
    try:
        if module_ref.endswith(".py"):
            with open_input(module_ref) as f:
                code = compile(f.read(), module_ref, "exec")
            module = types.ModuleType(re.sub(r"\W", "_", module_ref.rsplit("/", 1)[-1][:-3]))
            module.__file__ = module_ref
            exec(code, module.__dict__)  # noqa: S102 - the user's own preprocessing module
        else:
            import importlib

            module = importlib.import_module(module_ref)
    except Exception as exn:
        raise RecordForgeError(f"--preprocessing_fn {ref!r}: cannot load {module_ref}: {exn}") from exn
    fn = getattr(module, name, None)
    if not callable(fn):
        raise RecordForgeError(f"--preprocessing_fn {ref!r}: {module_ref} has no function {name!r}")
    return fn


def raw_tf_spec(plan: Plan) -> dict[str, Any]:
    """The tf.io parsing spec of the raw records, as TFT receives them."""
    ragged = [name for name, e in plan.feature_spec.items() if e["kind"] == "RaggedFeature"]
    images = [f.name for f in plan.features if f.is_image]
    if ragged or images:
        raise RecordForgeError(
            f"feature(s) {', '.join(ragged + images)}: ragged lists and images cannot go through "
            "tensorflow-transform yet; convert them without transforms"
        )
    return to_tf_feature_spec(plan.feature_spec)


def vocabulary_name(output: str) -> str:
    """The vocabulary's file name in transform_fn/assets (tft_output.vocabulary_file_by_name)."""
    return re.sub(r"[^A-Za-z0-9_.\-]", "_", output)


def _scope(output: str) -> str:
    return "rf_" + re.sub(r"[^A-Za-z0-9_]", "_", output)


def _as_float64(x: Any, entry: dict[str, Any]) -> Any:
    """Numeric input as float64: analyzers then accumulate in double precision."""
    decode = entry.get("decode")
    if decode is None:
        return tf.cast(x, tf.float64)
    # `encode: bytes` float64: little-endian bytes, one value per record.
    if isinstance(x, tf.SparseTensor):
        if decode["shape"]:
            raise RecordForgeError("analyzers on optional `encode: bytes` float64 lists are not supported")
        values = tf.reshape(tf.io.decode_raw(x.values, tf.float64, little_endian=True), [-1])
        return tf.SparseTensor(x.indices, values, x.dense_shape)
    return tf.reshape(tf.io.decode_raw(x, tf.float64, little_endian=True), [-1, *decode["shape"]])


def apply_transform(transform: Transform, x: Any, entry: dict[str, Any], output: str) -> Any:
    """One declared transform on one raw input tensor (dense or sparse)."""
    a = transform.analyzer
    if a is Analyzer.VOCABULARY:
        return tft.compute_and_apply_vocabulary(
            x,
            top_k=transform.param("top_k"),
            frequency_threshold=transform.param("frequency_threshold"),
            num_oov_buckets=transform.param("num_oov_buckets", 0),
            vocab_filename=vocabulary_name(output),
            # TFT's default text file silently drops empty strings and tokens holding a newline;
            # this format keeps every token as it is.
            file_format="tfrecord_gzip",
            # A weight of one per value: TFT then counts each batch's tokens inside the graph
            # and hands Beam each distinct token once with its count, instead of one element
            # per value (it does so only for weighted vocabularies). Integer weights sum to the
            # counts themselves, so the vocabulary is the unweighted one, ties and thresholds
            # alike (tests/e2e/test_preprocess.py compares the two).
            weights=tf.ones_like(x.values if isinstance(x, tf.SparseTensor) else x, dtype=tf.int64),
            name=_scope(output),
        )
    if a is Analyzer.HASH_STRINGS:
        return tft.hash_strings(x, transform.param("hash_buckets"), name=_scope(output))
    value = _as_float64(x, entry)
    if a is Analyzer.BUCKETIZE:
        return tft.bucketize(
            value, transform.param("num_buckets"), epsilon=transform.param("epsilon"), name=_scope(output)
        )
    scale = tft.scale_to_z_score if a is Analyzer.SCALE_TO_Z_SCORE else tft.scale_to_0_1
    return tf.cast(scale(value, name=_scope(output)), tf.float32)


def build_preprocessing_fn(plan: Plan, user_fn: PreprocessingFn | None = None) -> PreprocessingFn:
    """The schema's declared transforms, combined with a user's function (see the module doc)."""
    declared = [f for f in plan.features if f.transform is not None]

    def preprocessing_fn(inputs: dict[str, Any]) -> dict[str, Any]:
        outputs: dict[str, Any] = {} if user_fn is not None else dict(inputs)
        for f in declared:
            assert f.transform is not None and f.transformed_name is not None
            outputs[f.transformed_name] = apply_transform(
                f.transform, inputs[f.name], plan.feature_spec[f.name], f.transformed_name
            )
        if user_fn is not None:
            returned = user_fn(dict(inputs))
            if not isinstance(returned, dict) or not returned:
                raise RecordForgeError("--preprocessing_fn must return a non-empty dict of tensors")
            clash = sorted(set(returned) & {f.transformed_name for f in declared})
            if clash:
                raise RecordForgeError(
                    f"--preprocessing_fn returns {', '.join(clash)}, which the schema's transforms "
                    "also write; rename one of them"
                )
            outputs.update({name: _widen(name, t) for name, t in returned.items()})
        return outputs

    return preprocessing_fn


def _widen(name: str, tensor: Any) -> Any:
    """Outputs in the types tf.train.Example holds: narrower integers and bools become int64,
    half floats float32, without loss; float64 is refused rather than rounded in silence."""
    dtype = tensor.dtype
    if dtype in (tf.int64, tf.float32, tf.string):
        return tensor
    if dtype.is_integer or dtype == tf.bool:
        return tf.cast(tensor, tf.int64)
    if dtype in (tf.float16, tf.bfloat16):
        return tf.cast(tensor, tf.float32)
    if dtype == tf.float64:
        raise RecordForgeError(
            f"--preprocessing_fn output {name!r} is float64, which tf.train.Example cannot hold: "
            "return tf.cast(x, tf.float32) to accept float32 precision, or tf.io.serialize_tensor(x)"
        )
    raise RecordForgeError(f"--preprocessing_fn output {name!r} has dtype {dtype.name}")


_DTYPES = {tf.int64: DType.INT64, tf.float32: DType.FLOAT32, tf.string: DType.BYTES}


def output_plan(transformed_spec: dict[str, Any], raw: Plan) -> Plan:
    """The plan of the transformed records, from TFT's output feature spec. A feature passed
    through unchanged keeps its raw spec entry (with notes such as `decode` or `image`)."""
    features = []
    for name, spec in sorted(transformed_spec.items()):
        if isinstance(spec, tf.io.FixedLenFeature):
            shape, nulls = tuple(spec.shape), NullPolicy.REQUIRED
        elif isinstance(spec, tf.io.VarLenFeature):
            shape, nulls = (-1,), NullPolicy.ABSENT
        else:
            raise RecordForgeError(
                f"preprocessing output {name!r} is a {type(spec).__name__}; RecordForge writes dense "
                "tensors and SparseTensors (VarLenFeature)"
            )
        if spec.dtype not in _DTYPES:
            raise RecordForgeError(f"preprocessing output {name!r} has dtype {spec.dtype.name}")
        if len(shape) > 2 or not all(isinstance(d, int) and d > 0 for d in shape if d != -1):
            raise RecordForgeError(f"preprocessing output {name!r} has shape {list(shape)}")
        features.append(Feature(name=name, dtype=_DTYPES[spec.dtype], shape=shape, nulls=nulls))
    plan = compile_schema(Schema(tuple(features), origin="tensorflow-transform output"))
    spec_entries = dict(plan.feature_spec)
    for name, entry in spec_entries.items():
        kept = raw.feature_spec.get(name)
        if kept is not None and all(kept.get(k) == entry.get(k) for k in ("kind", "dtype", "shape")):
            spec_entries[name] = kept
    return dataclasses.replace(plan, feature_spec=spec_entries)

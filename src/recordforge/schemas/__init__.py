"""The schema model, its loader, inference, and the exports derived from it."""

from recordforge.schemas.infer import infer_schema
from recordforge.schemas.kinds import DType, NullPolicy, normalize_name
from recordforge.schemas.loader import dump_schema, load_schema, schema_from_dict
from recordforge.schemas.model import Feature, Schema
from recordforge.schemas.plan import Plan, compile_schema

__all__ = [
    "DType",
    "Feature",
    "NullPolicy",
    "Plan",
    "Schema",
    "compile_schema",
    "dump_schema",
    "infer_schema",
    "load_schema",
    "normalize_name",
    "schema_from_dict",
]

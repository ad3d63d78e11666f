"""Events in: the schema, the bundle store, importers and capture."""
from taxmodel.trace.bundle import Bundle, load_bundle, write_bundle

__all__ = ["Bundle", "load_bundle", "write_bundle"]

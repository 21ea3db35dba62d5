"""Every published schema is a valid JSON schema, and validate() names the failing place."""
import json

import jsonschema
import pytest

from caldera.protocol import schemas
ALL = sorted(p.relative_to(schemas.schema_dir()).as_posix() for p in schemas.schema_dir().rglob("*.json"))


def test_there_are_schemas():
    assert "commands/collect_system_info.schema.json" in ALL and len(ALL) > 10


@pytest.mark.parametrize("name", ALL)
def test_schema_is_valid_against_its_metaschema(name):
    schema = json.loads((schemas.schema_dir() / name).read_text())
    jsonschema.validators.validator_for(schema).check_schema(schema)


def test_validate_names_the_path(tmp_path, monkeypatch):
    (tmp_path / "t.schema.json").write_text(json.dumps(
        {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "integer"}}}}}))
    monkeypatch.setenv("CALDERA_SCHEMA_DIR", str(tmp_path))
    schemas._validator.cache_clear()
    try:
        with pytest.raises(schemas.SchemaError, match=r"^a/b: 'x' is not of type 'integer'"):
            schemas.validate("t.schema.json", {"a": {"b": "x"}})
        schemas.validate("t.schema.json", {"a": {"b": 3}})
    finally:
        schemas._validator.cache_clear()

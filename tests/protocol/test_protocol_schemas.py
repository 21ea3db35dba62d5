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


OBJECT_ONLY = [name for name in ALL if schemas._only_an_object(schemas._schema(name))]
DOCUMENTS = [{}, {"a": 1, "b": [None]}, [], [1], "x", "", 0, 1.5, None, True, False]


def test_object_only_schemas_are_the_trivial_command_schemas():
    assert {"commands/pause.schema.json", "commands/resume.schema.json", "commands/settings_get.schema.json",
            "commands/collect_system_info.schema.json", "commands/health_check.schema.json"} <= set(OBJECT_ONLY)
    assert "commands/settings_set.schema.json" not in OBJECT_ONLY and "manifest.schema.json" not in OBJECT_ONLY


@pytest.mark.parametrize("name", OBJECT_ONLY)
def test_an_object_only_schema_gives_jsonschemas_verdict_and_message(name):
    validator = schemas._validator(name)
    for document in DOCUMENTS:
        errors = list(validator.iter_errors(document))
        expected = f"(top level): {errors[0].message}" if errors else None
        try:
            schemas.validate(name, document)
            got = None
        except schemas.SchemaError as exc:
            got = str(exc)
        assert got == expected, document


def test_an_object_only_schema_is_checked_without_importing_jsonschema():
    import subprocess
    import sys

    code = ("import sys\nfrom caldera.protocol import schemas\n"
            "schemas.validate('commands/pause.schema.json', {})\n"
            "try:\n    schemas.validate('commands/pause.schema.json', [])\nexcept schemas.SchemaError:\n    pass\n"
            "print('jsonschema' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"

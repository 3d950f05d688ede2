"""Grammars the structured-output tests force a tiny random model into, and their checks."""

from __future__ import annotations

import json
import re

REGEX = r"[0-9]{3}-(yes|no)"
# bounded fields: a random model ends them only where the grammar forces it to
SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string", "pattern": "[a-z]{1,6}"},
                         "age": {"type": "integer", "minimum": 0, "maximum": 150}},
          "required": ["name", "age"], "additionalProperties": False}
EBNF = 'root ::= "a" ("b" | "c")+ "d"'
EBNF_AS_REGEX = r"a[bc]+d"
GRAMMARS = [{"regex": REGEX}, {"json_schema": json.dumps(SCHEMA)}, {"ebnf": EBNF}]


def check_output(params: dict, text: str) -> None:
    """`text` is a whole sentence of the grammar `params` names (nothing without one)."""
    if "regex" in params:
        assert re.fullmatch(params["regex"], text), text
    elif "json_schema" in params:
        import jsonschema  # the [test] extra's

        jsonschema.validate(json.loads(text), json.loads(params["json_schema"]))
    elif "ebnf" in params:
        assert params["ebnf"] == EBNF, "only EBNF's language is known here"
        assert re.fullmatch(EBNF_AS_REGEX, text), text

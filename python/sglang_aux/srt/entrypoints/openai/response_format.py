"""OpenAI's `response_format` as the native grammar fields (`json_schema`, `structural_tag`)."""

from __future__ import annotations

import json
from typing import Any

from sglang_aux.srt.entrypoints.openai.api_error import APIError

RESPONSE_FORMAT_TYPES = ("text", "json_object", "json_schema", "structural_tag")
ANY_JSON_OBJECT = '{"type": "object"}'  # what json_object asks for (as SGLang)


def response_format_grammar(fmt: dict[str, Any]) -> tuple[str, str] | None:
    """The native grammar field and text an OpenAI `response_format` asks for, None for
    plain text; a 400 naming the part that is wrong."""
    kind = fmt.get("type")
    if kind not in RESPONSE_FORMAT_TYPES:
        raise APIError(400, f"response_format.type must be one of "
                            f"{', '.join(RESPONSE_FORMAT_TYPES)}, got {kind!r}")
    if kind == "text":
        return None
    if kind == "json_object":
        return "json_schema", ANY_JSON_OBJECT
    if kind == "structural_tag":  # the whole object, as SGLang passes it on
        return "structural_tag", json.dumps(fmt)
    spec = fmt.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if not isinstance(schema, dict | bool):
        raise APIError(400, "response_format.json_schema.schema must be a JSON schema "
                            f"(an object), got {schema!r}")
    return "json_schema", json.dumps(schema)

"""Which grammar a request asks for, checked without a tokenizer.

SGLang's grammar fields of `SamplingParams`, at most one per request. A request's grammar is
keyed `(field, text)`: the key of the compiled-grammar cache (`GrammarBackend`). Checking
builds xgrammar's tokenizer-independent `Grammar`, so a bad grammar is refused by the front
end (a 400 naming the field) before it reaches the scheduler.
"""

from __future__ import annotations

import json
import re
from types import ModuleType
from typing import Any

GRAMMAR_FIELDS = ("json_schema", "regex", "ebnf", "structural_tag")
GrammarKey = tuple[str, str]  # (field, its text)
# xgrammar's errors start with "[hh:mm:ss] /path/file.cc:line: " (and maybe "Check failed:
# (...) is false: "), which says nothing to a client
_NATIVE_PREFIX = re.compile(r"^\[[^\]]*\] \S+:\d+: (Check failed: \(.*?\) is false: )?")


def load_xgrammar() -> ModuleType:
    """The xgrammar module (ValueError when it is not installed: a request asked for what this
    installation cannot do)."""
    try:
        import xgrammar
    except ImportError:
        raise ValueError("structured output (json_schema, regex, ebnf, structural_tag, "
                         "response_format) needs the xgrammar package: pip install "
                         "'sglang_aux[grammar]'") from None
    return xgrammar


def to_grammar(key: GrammarKey, any_whitespace: bool = True) -> Any:
    """xgrammar's `Grammar` of `key`; ValueError naming the field when its text is not a valid
    grammar of that kind. `any_whitespace`: a JSON schema allows whitespace between tokens
    (else compact JSON)."""
    xgr = load_xgrammar()
    field, text = key
    try:
        if field == "json_schema":
            return xgr.Grammar.from_json_schema(text, any_whitespace=any_whitespace)
        if field == "regex":
            return xgr.Grammar.from_regex(text)
        if field == "ebnf":
            return xgr.Grammar.from_ebnf(text)
        return xgr.Grammar.from_structural_tag(_structural_tag(xgr, text))
    except (RuntimeError, ValueError, TypeError, KeyError) as e:
        message = _NATIVE_PREFIX.sub("", str(e).strip()).strip()
        raise ValueError(f"{field} is not valid: {message}") from None


def _structural_tag(xgr: ModuleType, text: str) -> Any:
    """SGLang's two spellings: the legacy `{"structures": [{"begin", "schema", "end"}],
    "triggers": [...]}` or xgrammar's `{"type": "structural_tag", "format": {...}}`."""
    tag = json.loads(text)
    if not isinstance(tag, dict) or "structures" not in tag:
        return text
    items = [xgr.StructuralTagItem(begin=s["begin"], schema=json.dumps(s.get("schema") or {}),
                                   end=s["end"]) for s in tag["structures"]]
    return xgr.StructuralTag.from_legacy_structural_tag(items, tag["triggers"])

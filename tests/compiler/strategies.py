"""Hypothesis strategies for flow documents, and a YAML writer that round-trips exactly."""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from hypothesis import strategies as st

SLUG = st.from_regex(r"[a-z](?:[a-z0-9]|_[a-z0-9]){0,6}", fullmatch=True).filter(
    lambda s: s != "run"
)
QUEUE = st.from_regex(r"q(?:[a-z0-9]|_[a-z0-9]){0,5}", fullmatch=True)
SURROGATES: tuple[Literal["Cs"]] = ("Cs",)  # not encodable; YAML text cannot hold them
STORABLE_CHARACTERS = st.characters(exclude_categories=SURROGATES, exclude_characters="\x00")
TEXT = st.text(STORABLE_CHARACTERS, max_size=20)
JSON_SCALAR = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**53), 2**53),
    st.floats(allow_nan=False, allow_infinity=False, width=32), TEXT,
)
JSON_VALUE = st.recursive(
    JSON_SCALAR,
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(TEXT, inner, max_size=3)),
    max_leaves=8,
)
CONDITION = st.dictionaries(TEXT, JSON_VALUE, min_size=1, max_size=3)


def conditions(needs: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    """A valid condition: any keys for a root step (it tests the run input), else keys
    among the step's needs (FL035: the engine tests ``{need: output}`` only)."""
    if not needs:
        return CONDITION
    return st.dictionaries(st.sampled_from(needs), JSON_VALUE, min_size=1, max_size=3)
_PAIR = re.compile(r"\\u(d[89ab][0-9a-f]{2})\\u(d[c-f][0-9a-f]{2})")


def to_yaml(document: Any) -> str:
    """JSON text (valid YAML) with astral characters as YAML ``\\U`` escapes."""
    text = json.dumps(document, ensure_ascii=True)

    def astral(match: re.Match[str]) -> str:
        pair = chr(int(match[1], 16)) + chr(int(match[2], 16))
        char = pair.encode("utf-16", "surrogatepass").decode("utf-16")
        return f"\\U{ord(char):08x}"

    return _PAIR.sub(astral, text)


@st.composite
def flow_documents(draw: st.DrawFn, slug: str | None = None) -> dict[str, Any]:
    """A valid ``kind: flow`` document: a random DAG declared in a random order."""
    flow_slug = slug or "f" + draw(SLUG)
    steps = draw(st.lists(SLUG, min_size=1, max_size=7, unique_by=str.lower))
    specs: dict[str, dict[str, Any]] = {}
    for index, step in enumerate(steps):
        needs = draw(st.lists(st.sampled_from(steps[:index]), unique=True, max_size=3)
                     ) if index else []
        spec: dict[str, Any] = {"handler": f"pkg.mod:{step}"}
        if needs:
            spec["needs"] = needs
        if len(needs) <= 1 and draw(st.booleans()):
            spec["type"] = "map"
        if draw(st.integers(0, 3)) == 0:
            spec["if"] = draw(conditions(needs))
            spec["when_unmet"] = draw(st.sampled_from(["skip", "skip-cascade", "fail"]))
        if draw(st.integers(0, 3)) == 0:
            spec["unless"] = draw(conditions(needs))
        if draw(st.booleans()):
            spec["timeout"] = draw(st.integers(3, 10_000))
        specs[step] = spec
    order = draw(st.permutations(steps))
    document: dict[str, Any] = {"kind": "flow", "slug": flow_slug,
                                "steps": {s: specs[s] for s in order}}
    routing = draw(st.sampled_from(["default", "flow", "per-step", "explicit"]))
    if routing == "explicit":
        document["queues"] = {s: draw(QUEUE) for s in order}
    elif routing != "default":
        document["queues"] = routing
    return document


# Candidate names for the name-rule parity tests: near misses of every rule (case variants,
# boundary lengths, digits and underscores in every position, the reserved word, unicode
# look-alikes, a final newline) as well as arbitrary text.
# letters that are not ASCII but look like it or change under case mapping, and other traps
LOOK_ALIKES = ("\u00e9\u00df\u0131\u0130\u017f\u212a\u212b\uff41\u0661\u0662\U0001d7d8"
               "\u01c5")  # é ß dotless-i İ long-s Kelvin Ångström fullwidth-a digits ǅ
ALPHABET = "aAbzZrRuUnN09_.-" + LOOK_ALIKES + " \t\n"
BOUNDARIES = (0, 1, 2, 46, 47, 48, 127, 128, 129)
FIXED = ("", "a", "A", "run", "RUN", "Run", "rUn", "run_", "runs", "_run", "run\n", "a_", "_a",
         "a__b", "a_b", "1abc", "a1", "a.b", "a-b", ".a", "-a", "q_9lives", "abc\n", "\nabc",
         "a b", "ab\t", "é", "aé", "\u212aelvin", "\u017ftep", "\uff41bc", "a\u0301")


@st.composite
def _at_length(draw: st.DrawFn) -> str:
    """A name of a boundary length, with one character somewhere replaced."""
    length = draw(st.sampled_from(BOUNDARIES))
    base = draw(st.sampled_from(["a", "A", "q", "1"])) + "b" * max(length - 1, 0)
    text = base[:length]
    if text and draw(st.booleans()):
        index = draw(st.integers(0, len(text) - 1))
        text = text[:index] + draw(st.sampled_from(ALPHABET)) + text[index + 1:]
    return text


NAMES = st.one_of(
    st.sampled_from(FIXED),
    _at_length(),
    st.text(st.sampled_from(ALPHABET), max_size=12),
    st.from_regex(r"[a-zA-Z0-9][a-zA-Z0-9_.-]{0,20}", fullmatch=True),
    st.text(STORABLE_CHARACTERS, max_size=8),
)

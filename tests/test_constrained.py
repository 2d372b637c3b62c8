"""response_format through llguidance: the reply is JSON (valid against its schema) because of the mask.

The tiny synthetic model has random weights, so sampling it at temperature 1 with no top-k/top-p gives
noise: any JSON it writes is the mask's doing. SmolLM2 (greedy) shows realistic output.
"""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest

from engine.errors import PromptError
from engine.sampling import apply_mask
from engine.text.constrained import Constraint, ConstraintError, lltokenizer_for
from engine.types import ResponseFormat, ResponseFormatKind, SamplingParams, StopReason

GREEDY = SamplingParams.greedy_params()
MESSAGES = [{"role": "user", "content": "hello there"}]

SCHEMAS = {
    "required fields": {
        "type": "object", "additionalProperties": False, "required": ["name", "age"],
        "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 130}},
    },
    "enum": {
        "type": "object", "additionalProperties": False, "required": ["color"],
        "properties": {"color": {"enum": ["red", "green", "blue"]}},
    },
    "array of objects": {
        "type": "object", "additionalProperties": False, "required": ["items"],
        "properties": {"items": {"type": "array", "minItems": 1, "maxItems": 3, "items": {
            "type": "object", "additionalProperties": False, "required": ["id", "done"],
            "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 99}, "done": {"type": "boolean"}}}}},
    },
    "nested": {
        "type": "object", "additionalProperties": False, "required": ["user"],
        "properties": {"user": {"type": "object", "additionalProperties": False, "required": ["address"], "properties": {
            "address": {"type": "object", "additionalProperties": False, "required": ["city", "zip"], "properties": {
                "city": {"type": "string", "maxLength": 10}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}}}}},
    },
    # multipleOf bounds the fraction's digits: a random model would otherwise write digits for ever
    "number ranges": {
        "type": "object", "additionalProperties": False, "required": ["score", "count"],
        "properties": {"score": {"type": "number", "minimum": 0, "maximum": 10, "multipleOf": 0.25},
                       "count": {"type": "integer", "minimum": -5, "maximum": 5}},
    },
}


def schema_format(name: str) -> ResponseFormat:
    return ResponseFormat(ResponseFormatKind.JSON_SCHEMA, SCHEMAS[name], name=name.replace(" ", "_"))


def noise(seed: int) -> SamplingParams:
    """The model's whole distribution at temperature 1: nothing but the mask keeps it on track."""
    return SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0, seed=seed)


@pytest.mark.parametrize("name", SCHEMAS)
def test_random_weights_sampled_at_temperature_1_still_give_valid_json(tiny_engine, name):
    prompt = tiny_engine.prompt_tokens(MESSAGES)
    for seed in range(3):
        pieces: list[str] = []
        result = tiny_engine.generate(prompt, noise(seed), 200, on_text=pieces.append, response_format=schema_format(name))
        assert result.stop_reason == "eos", result.text
        jsonschema.validate(json.loads(result.text), SCHEMAS[name])
        assert "".join(pieces) == result.text


def test_without_the_mask_the_same_sampling_is_not_json(tiny_engine):
    """The control for the test above: the validity comes from the constraint, not from the model."""
    result = tiny_engine.generate(tiny_engine.prompt_tokens(MESSAGES), noise(0), 40)
    with pytest.raises(ValueError):
        json.loads(result.text)


def test_json_object_gives_a_json_object(tiny_engine):
    fmt = ResponseFormat(ResponseFormatKind.JSON_OBJECT)
    for seed in range(3):
        result = tiny_engine.generate(tiny_engine.prompt_tokens(MESSAGES), noise(seed), 200, response_format=fmt)
        if result.stop_reason == "eos":
            assert isinstance(json.loads(result.text), dict)
        else:  # an open-ended object may run on: it is still a JSON object in the making
            assert result.stop_reason in ("length", "context_full") and result.text.startswith("{")


def test_a_text_format_is_no_constraint(tiny_engine):
    assert Constraint.for_format(ResponseFormat(), tiny_engine.tokenizer, tiny_engine.stop_ids) is None
    assert Constraint.for_format(None, tiny_engine.tokenizer, tiny_engine.stop_ids) is None


def test_too_few_tokens_end_with_length_and_a_valid_start(tiny_engine):
    fmt = schema_format("nested")
    result = tiny_engine.generate(tiny_engine.prompt_tokens(MESSAGES), noise(1), 5, response_format=fmt)
    assert result.stop_reason == "length" and len(result.tokens) == 5
    assert len(result.text) >= 5 and '{"user":{"address":{"city":"'.startswith(result.text)  # the forced start, cut


@pytest.mark.parametrize("schema, message", [
    ({"type": "frob"}, "Invalid type: frob"),
    ({"type": "object", "properties": 3}, "properties must be an object"),
    ({"$ref": "#/definitions/missing"}, "does not exist"),
    ([1, 2], "must be an object, got list"),
    (None, "needs a schema"),
    ({"type": "object", "default": float("nan")}, "is not valid JSON"),
])
def test_an_invalid_schema_is_refused_with_a_clear_error_before_any_work(tiny_engine, schema, message):
    before = list(tiny_engine.tokens)
    fmt = ResponseFormat(ResponseFormatKind.JSON_SCHEMA, schema)
    with pytest.raises(ConstraintError, match=message) as caught:
        tiny_engine.generate(tiny_engine.prompt_tokens(MESSAGES), GREEDY, 5, response_format=fmt)
    assert isinstance(caught.value, PromptError)
    assert str(caught.value).startswith(("the JSON schema", "response_format", "the response format"))
    assert tiny_engine.tokens == before


def test_an_oversized_schema_is_refused(tiny_engine):
    schema = {"type": "object", "description": "x" * 300_000}
    with pytest.raises(ConstraintError, match="bytes; at most"):
        Constraint.for_format(ResponseFormat(ResponseFormatKind.JSON_SCHEMA, schema), tiny_engine.tokenizer,
                              tiny_engine.stop_ids)


def test_the_mask_forbids_what_the_grammar_forbids(tiny_engine):
    c = Constraint.for_format(schema_format("enum"), tiny_engine.tokenizer, tiny_engine.stop_ids)
    allowed = c.allowed()
    assert allowed.dtype == bool and allowed.size == tiny_engine.tokenizer.vocab_size
    assert [tiny_engine.tokenizer.token_bytes(int(i)) for i in np.flatnonzero(allowed)] == [b"{"]
    logits = np.zeros(tiny_engine.tokenizer.vocab_size + 3, dtype=np.float32)  # a padded head: extra ids forbidden too
    masked = c.mask(logits)
    assert np.isfinite(masked).sum() == 1 and np.isneginf(masked[-3:]).all()
    with pytest.raises(PromptError, match="allows no token"):
        apply_mask(logits, np.zeros(3, dtype=bool))


def test_the_library_tokenizer_is_built_once_per_tokenizer(tiny_engine):
    first = lltokenizer_for(tiny_engine.tokenizer, tiny_engine.stop_ids)
    assert lltokenizer_for(tiny_engine.tokenizer, tiny_engine.stop_ids) is first
    with pytest.raises(ConstraintError, match="no end-of-text token"):
        lltokenizer_for(tiny_engine.tokenizer, ())


def test_stop_strings_and_a_schema_together(tiny_engine):
    fmt = schema_format("required fields")
    result = tiny_engine.generate(tiny_engine.prompt_tokens(MESSAGES), noise(0), 200, response_format=fmt, stop=['"age"'])
    assert result.stop_reason == "stop" and result.text.startswith('{"name":"') and '"age"' not in result.text


@pytest.mark.real_model
@pytest.mark.parametrize("name", SCHEMAS)
def test_smollm2_greedy_writes_valid_json_for_each_schema(real_engine, name):
    schema = SCHEMAS[name]
    messages = [{"role": "system", "content": "You answer with JSON only."},
                {"role": "user", "content": f"Give an example object for this JSON schema: {json.dumps(schema)}"}]
    result = real_engine.generate(real_engine.prompt_tokens(messages), GREEDY, 300, response_format=schema_format(name))
    assert result.stop_reason == "eos", result.text
    jsonschema.validate(json.loads(result.text), schema)


def test_complete_and_complete_raw_take_a_response_format(hearth):
    fmt = schema_format("array of objects")
    chat = hearth.complete(MESSAGES, noise(2), 200, response_format=fmt)
    raw = hearth.complete_raw("Items:", noise(3), 200, response_format=fmt)
    for reply in (chat, raw):
        assert reply.stop_reason == StopReason.EOS
        jsonschema.validate(json.loads(reply.text), SCHEMAS["array of objects"])
    with pytest.raises(PromptError, match="Invalid type"):
        hearth.complete(MESSAGES, GREEDY, 5, response_format=ResponseFormat(ResponseFormatKind.JSON_SCHEMA, {"type": "x"}))

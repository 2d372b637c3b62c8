"""The converted graph's input and output names: the graph builder declares them, the runtime binds them.

Inputs: input_ids int64 [batch, seq]; seqlens_k int32 [batch] (tokens in the cache after this call,
minus one); total_sequence_length int32 scalar; past_key_values.{i}.key/.value [batch, kv_heads,
capacity, head_dim] in the KV dtype; logits_start int64 [1] (graphs with last-position logits: minus
how many last positions get logits, -1 to decode, -(1 + drafted) to verify a prompt-lookup draft).
Outputs: logits float32 [batch, seq or 1, vocab];
present.{i}.key/.value, shaped like the past (one buffer bound as both updates the cache in place).
"""

INPUT_IDS = "input_ids"
SEQLENS_K = "seqlens_k"
TOTAL_SEQUENCE_LENGTH = "total_sequence_length"
LOGITS = "logits"
LOGITS_START = "logits_start"


def past_key(layer: int) -> str:
    return f"past_key_values.{layer}.key"


def past_value(layer: int) -> str:
    return f"past_key_values.{layer}.value"


def present_key(layer: int) -> str:
    return f"present.{layer}.key"


def present_value(layer: int) -> str:
    return f"present.{layer}.value"

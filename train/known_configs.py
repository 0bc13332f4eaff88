"""Published configs of models whose weights we cannot download here, and a training-memory estimate.

The Qwen3-8B recipes are checked against the model built from this config on the ``meta``
device (tests/unit/test_recipes.py): target modules, trainable parameters, memory.
"""

from __future__ import annotations

# Qwen/Qwen3-8B config.json (the architecture fields; dtype bfloat16).
QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "hidden_act": "silu",
    "bos_token_id": 151643,
    "eos_token_id": 151645,
}

GB = 1e9


def lora_parameters(config: dict, r: int) -> int:
    """LoRA parameters on every linear layer of a Qwen3/Llama decoder: r x (in + out) per layer."""
    h, i = config["hidden_size"], config["intermediate_size"]
    q = config["num_attention_heads"] * config["head_dim"]
    kv = config["num_key_value_heads"] * config["head_dim"]
    per_layer = (h + q) + 2 * (h + kv) + (q + h) + 2 * (h + i) + (i + h)  # q, k, v, o, gate, up, down
    return r * per_layer * config["num_hidden_layers"]


def training_memory_gb(config: dict, base_parameters: int, lora_params: int, batch: int, seq_len: int,
                       checkpointing: bool = True) -> dict[str, float]:
    """Peak GPU memory of bf16 LoRA SFT on one device, by component (GB, 1e9 bytes).

    weights bf16; LoRA weights, grads and two Adam moments in fp32 (peft keeps adapters fp32);
    activations: with checkpointing each layer keeps its bf16 input and one layer at a time is
    recomputed (its saved tensors: norms, q/k/v/o, gate/up/act/down inputs, LoRA dropout copies);
    logits: bf16 logits + fp32 copy for the loss + fp32 gradient (+ fp32 entropy/accuracy pass in
    TRL) = 14 bytes per logit. sdpa/flash attention: no seq² term.
    """
    h, i, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    kv = config["num_key_value_heads"] * config["head_dim"]
    tokens = batch * seq_len
    per_layer_elements = 12 * h + 2 * kv + 5 * i  # per token, one layer's saved activations
    if checkpointing:
        activations = layers * tokens * h * 2 + tokens * per_layer_elements * 2
    else:
        activations = layers * tokens * per_layer_elements * 2
    parts = {
        "weights": base_parameters * 2 / GB,
        "lora_weights_grads_adam": lora_params * 16 / GB,
        "activations": activations / GB,
        "logits": tokens * config["vocab_size"] * 14 / GB,
    }
    parts["total"] = sum(parts.values())
    return parts

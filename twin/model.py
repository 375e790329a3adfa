"""The twin's fake model and the environment vLLM needs without a GPU, weights or a hub.

Standard library only: kvtop's test process uses it to prepare a served twin, and the modules
that import vllm take their shapes from here so the fake model and the KV spec agree.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

MODEL_NAME = "twin-llama"  # --served-model-name, the model_name label
BLOCK_SIZE = 16  # tokens per KV block
NUM_LAYERS = 2
NUM_QUERY_HEADS = 4
NUM_KV_HEADS = 2
HEAD_SIZE = 16
VOCAB_SIZE = 32_000
EOS_TOKEN_ID = 2
FIRST_TEXT_TOKEN_ID = 3  # 0-2 are special (pad, BOS, EOS): random prompts and outputs avoid them
MAX_POSITIONS = 8192  # the longest max_model_len the fake model allows
# One block across all layers: a key and a value vector per head and token, 2 bytes each (fp16).
BLOCK_BYTES = NUM_LAYERS * 2 * NUM_KV_HEADS * HEAD_SIZE * BLOCK_SIZE * 2

# Set before vllm is imported: its CPU platform, nothing fetched, nothing reported home.
VLLM_ENV = {
    "VLLM_TARGET_DEVICE": "cpu",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
}


def layer_names() -> list[str]:
    """The attention layers' names, as a Llama's KV-cache spec lists them."""
    return [f"model.layers.{i}.self_attn.attn" for i in range(NUM_LAYERS)]


def use_vllm_environment(*, quiet: bool = False) -> None:
    """Put VLLM_ENV into this process's environment (values already set win); ``quiet``
    keeps vLLM's log to errors."""
    for name, value in VLLM_ENV.items():
        os.environ.setdefault(name, value)
    if quiet:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")


def write_model_dir(folder: Path) -> Path:
    """A "model" that is only a Llama config.json: no weights, no tokenizer. Returns ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": NUM_QUERY_HEADS * HEAD_SIZE,
        "intermediate_size": 128,
        "num_attention_heads": NUM_QUERY_HEADS,
        "num_key_value_heads": NUM_KV_HEADS,
        "num_hidden_layers": NUM_LAYERS,
        "vocab_size": VOCAB_SIZE,
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-5,
        "torch_dtype": "float16",
        "bos_token_id": 1,
        "eos_token_id": EOS_TOKEN_ID,
    }
    (folder / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    return folder

"""SGLang 0.5.23's request fields that this server knows but does not implement.

Each table maps a field to the value that means "off" in SGLang (`GenerateReqInput` for
`/generate`, the OpenAI `CompletionRequest` and `ChatCompletionRequest`). A request may send
such a field at that value or null, as SGLang's own clients do (they send many of them at
their defaults); any other value is a 400 naming the field. `NO_EFFECT` fields are labels
and routing hints that change nothing a request computes here (one engine, no tracing, no
reasoning parser): any value is accepted. `docs/compat.md` lists them all.
"""

from __future__ import annotations

from typing import Any

from sglang_aux.srt.sampling.sampling_params import refuse_unsupported

_MULTIMODAL = {
    "image_data": None, "video_data": None, "audio_data": None, "modalities": None,
    "mm_hashes": None, "mm_content_hashes": None, "use_audio_in_video": False,
    "video_config": None, "images_config": None, "mm_processor_kwargs": None,
    "max_dynamic_patch": None, "min_dynamic_patch": None, "image_max_dynamic_patch": None,
    "video_max_dynamic_patch": None, "need_wait_for_mm_inputs": None,
    "num_items_assigned": None, "encoder_urls": None,
}
_DISAGGREGATION = {
    "bootstrap_host": None, "bootstrap_port": None, "bootstrap_room": None,
    "bootstrap_pair_key": None, "decode_tp_size": None, "routed_dp_rank": None,
    "data_parallel_rank": None, "disagg_prefill_dp_rank": None, "http_worker_ipc": None,
}
_SHARED = {
    "lora_path": None, "session_params": None, "custom_logit_processor": None,
    "custom_params": None, "watermark": None, "cache_salt": None, "priority": None,
    "return_hidden_states": False, "return_routed_experts": False,
    "routed_experts_start_len": 0,
}

GENERATE_UNSUPPORTED: dict[str, Any] = {
    **_MULTIMODAL, **_DISAGGREGATION, **_SHARED,
    "input_embeds": None, "lora_id": None, "positional_embed_overrides": None,
    "return_sampling_mask": None, "sampling_logprobs_mode": None,
    "return_flat_raw_top_logprobs": False, "return_flat_raw_output_top_logprobs": False,
    "return_flat_raw_top_logprobs_b64": False, "return_indexer_topk": False,
    "background": False, "require_reasoning": False, "max_thinking_tokens": None,
    "return_bytes": False, "return_entropy": False, "return_prompt_token_ids": False,
    "multi_item_delimiter_indices": None, "token_indices_to_pool": None, "kv_hints": None,
}
GENERATE_NO_EFFECT = frozenset({
    "log_metrics", "no_logs", "custom_labels", "received_time", "external_trace_header",
    "conversation_id", "routing_key", "session_id", "extra_key",
})

_OPENAI_UNSUPPORTED = {
    **_SHARED, **{k: _DISAGGREGATION[k] for k in (
        "bootstrap_host", "bootstrap_port", "bootstrap_room", "routed_dp_rank",
        "data_parallel_rank", "disagg_prefill_dp_rank")},
    "images_config": None, "mm_processor_kwargs": None, "logit_bias": None,
    "return_cached_tokens_details": False, "return_spec_tokens_details": False,
    "return_token_ids": False,
}
_OPENAI_NO_EFFECT = frozenset({"user", "session_id", "extra_key", "custom_labels"})

COMPLETION_UNSUPPORTED: dict[str, Any] = {**_OPENAI_UNSUPPORTED, "suffix": None}
COMPLETION_NO_EFFECT = _OPENAI_NO_EFFECT

CHAT_UNSUPPORTED: dict[str, Any] = {
    **_OPENAI_UNSUPPORTED,
    "tools": None, "return_prompt_token_ids": False, "return_meta_info": False,
    "return_input_ids_in_sglext": False, "return_output_ids_in_sglext": False,
    "return_sampling_mask": False, "sampling_logprobs_mode": None,
    "return_flat_raw_output_top_logprobs": False, "reasoning_effort": None, "thinking": None,
    "task": None, "continue_final_message": False, "chat_template_kwargs": None,
    "max_dynamic_patch": None, "min_dynamic_patch": None, "use_audio_in_video": False,
    "video_config": None, "input_ids": None,
}
# tool_choice and parallel_tool_calls act only on tools (refused above); the reasoning
# switches only with a reasoning parser (none here); the b64 switch only with flat logprobs
CHAT_NO_EFFECT = _OPENAI_NO_EFFECT | {
    "tool_choice", "parallel_tool_calls", "separate_reasoning", "stream_reasoning",
    "return_flat_raw_top_logprobs_b64",
}


def drop_known_fields(body: dict, unsupported: dict[str, Any], no_effect: frozenset[str],
                      what: str) -> dict:
    """`body` without the fields of the two tables (ValueError naming a field given at a
    value this server does not implement)."""
    body = {k: v for k, v in body.items() if k not in no_effect}
    refuse_unsupported(body, unsupported, what)
    return body

"""Triton kernels behind the fused layers, one kernel per file; each layer keeps a torch twin.

- `rms_norm`: RMSNorm of rows, optionally after adding the residual (returns both).
- `rope_store`: per-head q/k RMSNorm (optional), NeoX RoPE at `positions`, and the K/V store.
- `silu_and_mul`: `silu(gate) * up` from one `[T, 2 * I]` gate-up projection.
- `attn_res_mix`: Kimi-K3-style Block AttnRes mixing (scores, softmax over sources, sum).
- `row_gemv`: the decode GEMV of one row, with the RMSNorm (and residual add) before it and
  the bias fused (behind `--decode-gemv-backend`).
- `paired_row_gemv`: the row GEMV with RoPE + KV store or SiLU-mul in its epilogue (the bs-1
  decode's qkv and gate_up under the row GEMV backend).
- `grid_dependency`: programmatic dependent launch (`pdl=` of the kernels; one-token launches
  on sm_90+ by default).
- `dispatch`: when a layer runs its kernel rather than its torch twin.
"""

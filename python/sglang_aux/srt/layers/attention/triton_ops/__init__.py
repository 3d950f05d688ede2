"""Triton kernels behind TritonAttnBackend: one attention layout per file.

- `extend_attention`: EXTEND (prefill over a cached prefix), variable lengths per request.
- `decode_attention`: fixed-layout modes (DECODE, TARGET_VERIFY, DRAFT_BLOCK), split over the
  key axis so small batches still fill the GPU; merges its splits itself with
  `merge="in_kernel"`.
- `merge_attn_states`: combines the per-split partial results of either kernel (a second
  launch).
"""

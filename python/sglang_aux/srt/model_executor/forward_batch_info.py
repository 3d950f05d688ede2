"""SGLang's path for the per-forward state. It lives in `srt/forward_state/` here, below the
layers that read it (docs/architecture.md); code written against SGLang imports it from here."""

from sglang_aux.srt.forward_state.forward_batch_info import (
    CaptureHiddenMode,
    ForwardBatch,
    ForwardMode,
)

__all__ = ["CaptureHiddenMode", "ForwardBatch", "ForwardMode"]

"""SGLang's path for the speculative algorithm. It lives in `srt/configs/` here, below the
models, the loader and the flags that read it; code written against SGLang imports it from
here."""

from sglang_aux.srt.configs.speculative_algorithm import SpeculativeAlgorithm

__all__ = ["SpeculativeAlgorithm"]

"""SGLang's path for its decode CUDA-graph runner. Here one `GraphRunner` captures every
graph mode, the decode and TARGET_VERIFY step graphs among them (`ModelRunner.step_graphs()`),
so code written against SGLang's `DecodeCudaGraphRunner` finds it under that name."""

from sglang_aux.srt.model_executor.runner.graph_runner import GraphRunner as DecodeCudaGraphRunner

__all__ = ["DecodeCudaGraphRunner"]

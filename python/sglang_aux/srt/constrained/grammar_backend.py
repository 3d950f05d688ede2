"""Compiling requests' grammars against the served vocabulary (SGLang's xgrammar backend).

A grammar compiles once per `(field, text)` (the cache: later requests share the compiled
grammar, each with a matcher of its own), in a thread pool, so a step of the running batch
never waits for a compile: the scheduler admits a grammar request once its compile is done.
The vocabulary is read, and xgrammar imported, on the first compile: a server that never
sees a grammar pays nothing for it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from sglang_aux.srt.constrained.grammar_spec import GrammarKey, load_xgrammar, to_grammar
from sglang_aux.srt.constrained.request_grammar import RequestGrammar

COMPILE_THREADS = 2
CACHE_ENTRIES = 256  # compiled grammars kept; the oldest finished one goes first


class GrammarBackend:
    def __init__(self, vocab: Callable[[], list[bytes]], vocab_size: int,
                 stop_token_ids: Iterable[int], any_whitespace: bool = True):
        """`vocab()`: every token's bytes, b"" for special tokens (never matched by a
        grammar); `vocab_size`: the logits' width (ids past the vocabulary are never
        allowed); `stop_token_ids`: what ends a grammar (EOS); `any_whitespace`: JSON
        schemas allow optional whitespace (SGLang's default)."""
        self.any_whitespace = any_whitespace
        self._vocab = vocab
        self.vocab_size = vocab_size
        self._stop_token_ids = sorted(stop_token_ids)
        self._compiler: Any = None  # xgrammar.GrammarCompiler, built by the first compile
        self._compiler_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(COMPILE_THREADS, thread_name_prefix="grammar")
        self._cache: dict[GrammarKey, Future] = {}

    def compile(self, key: GrammarKey) -> Future:
        """The compiled grammar of `key` (a future; its exception says why it is invalid)."""
        future = self._cache.get(key)
        if future is None:
            if len(self._cache) >= CACHE_ENTRIES:
                done = next((k for k, f in self._cache.items() if f.done()), None)
                if done is not None:
                    del self._cache[done]
            future = self._cache[key] = self._pool.submit(self._compile, key)
        return future

    def _compile(self, key: GrammarKey) -> Any:
        with self._compiler_lock:  # the first compile builds the compiler
            if self._compiler is None:
                xgr = load_xgrammar()
                info = xgr.TokenizerInfo(self._vocab(), xgr.VocabType.RAW,
                                         vocab_size=self.vocab_size,
                                         stop_token_ids=self._stop_token_ids)
                self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        return self._compiler.compile_grammar(to_grammar(key, self.any_whitespace))

    def new_grammar(self, compiled: Any, output_ids: list[int]) -> RequestGrammar:
        """A request's own matcher at the start of `compiled`, advanced by its output so far;
        ValueError when that output breaks the grammar."""
        grammar = RequestGrammar(load_xgrammar().GrammarMatcher(compiled))
        for token in output_ids:
            if not grammar.accept(token):
                raise ValueError(f"the request's output token {token} breaks its grammar")
        return grammar

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

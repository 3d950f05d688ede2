"""Offline engine: `Engine(model_path=...).generate(prompts, sampling_params)`."""

from __future__ import annotations

import dataclasses
import time

from sglang_aux.srt.configs.speculative_algorithm import SpeculativeAlgorithm
from sglang_aux.srt.constrained.grammar_backend import GrammarBackend
from sglang_aux.srt.distributed.parallel_state import (
    GroupCoordinator,
    destroy_distributed_environment,
    get_tp_group,
    init_distributed_environment,
)
from sglang_aux.srt.managers.model_worker import ModelWorker
from sglang_aux.srt.managers.request_factory import RequestFactory
from sglang_aux.srt.managers.request_output import request_output
from sglang_aux.srt.managers.schedule_batch import Req
from sglang_aux.srt.managers.scheduler.chunk_pacer import ChunkPacer
from sglang_aux.srt.managers.scheduler.prefill_delayer import PrefillDelayer
from sglang_aux.srt.managers.scheduler.scheduler import Scheduler
from sglang_aux.srt.managers.scheduler.tp_ranks import (
    first_failure,
    node_ranks,
    ranks_per_node,
    start_followers,
    stop_followers,
    with_rendezvous,
)
from sglang_aux.srt.managers.scheduler.tp_step_broadcast import StepBroadcast
from sglang_aux.srt.managers.scheduler.worker import Worker
from sglang_aux.srt.mem_cache.radix_cache import RadixCache
from sglang_aux.srt.model_loader.builtin import resolve_draft, resolve_model
from sglang_aux.srt.sampling.sampling_params import SamplingParams
from sglang_aux.srt.server_args import ServerArgs
from sglang_aux.srt.speculative.dflash_worker import DFlashWorker
from sglang_aux.srt.speculative.dspark_worker import DSparkWorker


class Engine:
    """Runs the scheduler in the caller's thread. Keyword arguments are ServerArgs fields.

    With `--tp-size` > 1 this process is rank 0 and starts the node's other ranks
    (`tp_ranks.py`), unless `tp_rank` says which rank it is (a process the server or a
    follower node started); call `shutdown()` to stop them."""

    def __init__(self, server_args: ServerArgs | None = None, *, tp_rank: int | None = None,
                 **kwargs):
        args = server_args or ServerArgs(**kwargs)
        self.server_args = args
        self.model_config, self.tokenizer = resolve_model(args)
        tp_group = self._join_tp_group(tp_rank)
        try:
            self.worker = self._make_worker()
            eos = getattr(self.model_config.hf_config, "eos_token_id", None)
            eos_ids = set(eos if isinstance(eos, list) else [eos]) - {None}
            if self.tokenizer.eos_token_id is not None:
                eos_ids.add(self.tokenizer.eos_token_id)
            self.eos_token_ids = frozenset(eos_ids)
            graph_limits = self.worker.model_runner.prefill_graph_limits()
            self.scheduler = Scheduler(
                self.worker, self.tokenizer,
                max_running_requests=args.max_running_requests,
                context_len=self.model_config.context_len,
                eos_token_ids=eos_ids,
                overlap=args.resolved_overlap_schedule(),
                tree_cache=None if args.disable_radix_cache
                else RadixCache(self.worker.model_runner.token_to_kv_pool_allocator),
                prefill_delayer=self._prefill_delayer(graph_limits),
                prefill_graph_limits=graph_limits,
                mixed_limits=self.worker.model_runner.mixed_limits(),
                chunked_prefill_size=args.resolved_chunked_prefill_size(),
                chunk_pacer=self._chunk_pacer(),
                grammar_backend=GrammarBackend(
                    self.tokenizer.vocab_bytes, self.model_config.hf_config.vocab_size,
                    eos_ids, any_whitespace=not args.constrained_json_disable_any_whitespace),
            )
        except BaseException:
            self._leave_tp_group()  # a failed start leaves no rank behind
            raise
        self.step_broadcast = StepBroadcast(self.scheduler, tp_group)
        self.requests = RequestFactory(self.tokenizer, self.scheduler.limits,
                                       self.model_config.hf_config.vocab_size, args.random_seed)

    def _join_tp_group(self, tp_rank: int | None) -> GroupCoordinator:
        """This process's tensor-parallel group (one rank without `--tp-size`); as rank 0 of
        an offline engine, first start the node's other ranks, and fail at once, naming its
        error, if one ends before the group forms."""
        args = self.server_args
        self._followers = []
        if args.tp_size == 1:
            return get_tp_group()
        if args.spec_algorithm.is_dflash_family():
            resolve_draft(args)  # a preset draft is written now, before any model is sharded
        if tp_rank is None:
            if args.node_rank != 0:
                raise ValueError("an offline Engine is rank 0, on node 0; run the other nodes "
                                 "with `python -m sglang_aux.launch_server --node-rank N`")
            args = self.server_args = with_rendezvous(args)
            ranks = node_ranks(args)
            tp_rank = ranks[0]
            self._followers = start_followers(args, type(self), ranks[1:])
        local_rank = tp_rank % ranks_per_node(args)
        if args.resolved_device() == "cuda":
            args = self.server_args = dataclasses.replace(args, device=f"cuda:{local_rank}")
        try:
            return init_distributed_environment(
                world_size=args.tp_size, rank=tp_rank, local_rank=local_rank,
                dist_init_addr=args.dist_init_addr, device=args.resolved_device(),
                timeout_s=args.dist_timeout, abort_check=lambda: first_failure(self._followers))
        except BaseException:
            stop_followers(self._followers, timeout=0)
            raise

    def _prefill_delayer(self, graph_limits: tuple[int, int] | None) -> PrefillDelayer | None:
        args = self.server_args
        if not args.enable_prefill_delayer:
            return None
        width = graph_limits[0] if graph_limits else min(args.max_running_requests, 4)
        return PrefillDelayer(width, args.prefill_delayer_max_delay_passes)

    def _chunk_pacer(self) -> ChunkPacer | None:
        """Paces a chunked prompt's chunks in mixed steps (`--chunked-prefill-decode-share`);
        None without mixed steps or chunked prefill, or with the share 0."""
        args, runner = self.server_args, self.worker.model_runner
        sizes = runner.mixed_chunk_sizes()
        if (not sizes or args.resolved_chunked_prefill_size() is None
                or args.chunked_prefill_decode_share == 0):
            return None
        return ChunkPacer(args.chunked_prefill_decode_share, sizes,
                          cuda=runner.device.type == "cuda")

    def _make_worker(self) -> Worker:
        algo = self.server_args.spec_algorithm
        if algo.is_none():
            return ModelWorker(self.model_config, self.server_args)
        workers = {SpeculativeAlgorithm.DFLASH: DFlashWorker,
                   SpeculativeAlgorithm.DSPARK: DSparkWorker}
        if algo not in workers:
            raise NotImplementedError(f"--speculative-algorithm {algo.value} is not "
                                      "implemented in this runtime (DFLASH, DSPARK and NONE are)")
        return workers[algo](self.model_config, resolve_draft(self.server_args),
                             self.server_args, token_to_id=self.tokenizer.token_to_id)

    def make_request(self, *, text: str | None = None, input_ids: list[int] | None = None,
                     sampling_params: dict | SamplingParams | None = None,
                     rid: str | None = None, logprob: dict | None = None) -> Req:
        """A validated request (ValueError with the reason otherwise); `logprob`: SGLang's
        native logprob fields."""
        return self.requests.make(text=text, input_ids=input_ids,
                                  sampling_params=sampling_params, rid=rid, logprob=logprob)

    def generate(self, prompt: str | list[str] | None = None,
                 sampling_params: dict | list[dict] | None = None,
                 input_ids: list[int] | list[list[int]] | None = None,
                 return_logprob: bool = False, logprob_start_len: int = -1,
                 top_logprobs_num: int = 0, token_ids_logprob: list[int] | None = None,
                 return_text_in_logprobs: bool = False) -> dict | list[dict]:
        """Generate for one prompt (a dict back) or a batch (a list back); the logprob
        arguments (SGLang's, the same for every prompt) add SGLang's logprob meta_info."""
        logprob = {"return_logprob": return_logprob, "logprob_start_len": logprob_start_len,
                   "top_logprobs_num": top_logprobs_num, "token_ids_logprob": token_ids_logprob,
                   "return_text_in_logprobs": return_text_in_logprobs}
        single = isinstance(prompt, str) or (input_ids is not None and input_ids
                                            and isinstance(input_ids[0], int))
        texts = [prompt] if isinstance(prompt, str) else prompt
        ids = [input_ids] if single and input_ids is not None else input_ids
        n = len(texts) if texts is not None else len(ids)
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * n
        reqs = [self.make_request(text=None if texts is None else texts[i],
                                  input_ids=None if ids is None else ids[i],
                                  sampling_params=params[i], logprob=logprob)
                for i in range(n)]
        start = time.perf_counter()
        for r in reqs:
            self.step_broadcast.add_request(r)
        while not all(r.finished for r in reqs):
            self.step_broadcast.step()
        latency = time.perf_counter() - start
        outs = [self.output_of(r, latency) for r in reqs]
        return outs[0] if single else outs

    def output_of(self, req: Req, latency: float | None = None) -> dict:
        return request_output(self.tokenizer, req, latency)

    def shutdown(self) -> None:
        """Stop the grammar compile threads, and the tensor-parallel ranks this engine leads
        and leave the group (SGLang's Engine interface)."""
        self.scheduler.grammar_backend.shutdown()
        if self.step_broadcast.replicated:
            try:
                self.step_broadcast.stop()
            finally:
                self._leave_tp_group()

    def _leave_tp_group(self) -> None:
        stop_followers(self._followers)
        destroy_distributed_environment()

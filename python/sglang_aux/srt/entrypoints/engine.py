"""Offline engine: `Engine(model_path=...).generate(prompts, sampling_params)`."""

from __future__ import annotations

import itertools
import logging
import time

import torch

from sglang_aux.srt.managers.prefill_delayer import PrefillDelayer
from sglang_aux.srt.managers.schedule_batch import Req
from sglang_aux.srt.managers.scheduler import Scheduler
from sglang_aux.srt.managers.tp_worker import TpModelWorker
from sglang_aux.srt.mem_cache.radix_cache import RadixCache
from sglang_aux.srt.model_loader.builtin import resolve_draft, resolve_model
from sglang_aux.srt.sampling.sampling_params import SamplingParams
from sglang_aux.srt.server_args import ServerArgs
from sglang_aux.srt.speculative.dflash_worker import DFlashWorker
from sglang_aux.srt.speculative.spec_info import SpeculativeAlgorithm

logger = logging.getLogger(__name__)


def spec_meta_info(req: Req) -> dict:
    """SGLang's speculative fields of a request's meta_info (zeros without speculation). The
    accept length counts every completion token per verify step (bonus tokens included); the
    rate is accepted over proposed drafts, B-1 proposed per verify step."""
    verify_ct, hist = req.spec_verify_ct, req.spec_accept_histogram
    accepted = sum(i * n for i, n in enumerate(hist))
    proposed = verify_ct * (len(hist) - 1)
    return {
        "spec_accept_length": len(req.output_ids) / verify_ct if verify_ct else 0.0,
        "spec_accept_rate": accepted / proposed if proposed else 0.0,
        "spec_accepted_drafts": accepted,
        "spec_proposed_drafts": proposed,
        "spec_verify_ct": verify_ct,
        "spec_accept_histogram": list(hist),
    }


class Engine:
    """Runs the scheduler in the caller's thread. Keyword arguments are ServerArgs fields."""

    def __init__(self, server_args: ServerArgs | None = None, **kwargs):
        args = server_args or ServerArgs(**kwargs)
        if args.pp_size > 1:
            raise ValueError(
                "--pp-size > 1: this runtime runs one pipeline stage; the flag exists for the "
                "aux gating contract (pipeline stages keep the list path), not for serving"
            )
        if args.enable_two_batch_overlap:
            logger.warning("--enable-two-batch-overlap: batches are not split at run time here; "
                           "only the split contract (two_batch_overlap.filter_batch) is provided")
        # Seeds for requests that give none, from a private CPU generator: reseeding the
        # global CUDA one after another engine captured graphs breaks later random ops.
        self._seeds = torch.Generator().manual_seed(args.random_seed)
        self.server_args = args
        self.model_config, self.tokenizer = resolve_model(args)
        self.worker = self._make_worker()
        eos = getattr(self.model_config.hf_config, "eos_token_id", None)
        eos_ids = set(eos if isinstance(eos, list) else [eos]) - {None}
        if self.tokenizer.eos_token_id is not None:
            eos_ids.add(self.tokenizer.eos_token_id)
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
        )
        self._rids = itertools.count()

    def _prefill_delayer(self, graph_limits: tuple[int, int] | None) -> PrefillDelayer | None:
        args = self.server_args
        if not args.enable_prefill_delayer:
            return None
        width = graph_limits[0] if graph_limits else min(args.max_running_requests, 4)
        return PrefillDelayer(width, args.prefill_delayer_max_delay_passes)

    def _make_worker(self) -> TpModelWorker | DFlashWorker:
        algo = self.server_args.spec_algorithm
        if algo.is_none():
            return TpModelWorker(self.model_config, self.server_args)
        if algo == SpeculativeAlgorithm.DFLASH:
            return DFlashWorker(self.model_config, resolve_draft(self.server_args),
                                self.server_args, token_to_id=self.tokenizer.token_to_id)
        raise NotImplementedError(
            f"--speculative-algorithm {algo.value} is not implemented in this runtime yet "
            "(DFLASH and NONE are)"
        )

    def make_request(self, *, text: str | None = None, input_ids: list[int] | None = None,
                     sampling_params: dict | SamplingParams | None = None,
                     rid: str | None = None) -> Req:
        """A validated request (ValueError with the reason otherwise)."""
        if (text is None) == (input_ids is None):
            raise ValueError("give exactly one of text and input_ids")
        ids = self.tokenizer.encode(text) if text is not None else list(input_ids)
        vocab = self.model_config.hf_config.vocab_size
        # the tokenizer's ids are ints; min/max keep a long prompt's check off Python loops
        if ((text is None and not all(isinstance(t, int) for t in ids))
                or (ids and not 0 <= min(ids) <= max(ids) < vocab)):
            raise ValueError(f"input_ids must be integers in [0, {vocab})")
        params = (sampling_params if isinstance(sampling_params, SamplingParams)
                  else SamplingParams.from_dict(sampling_params))
        seed = params.seed
        if seed is None:
            seed = int(torch.randint(0, 2**62, (1,), generator=self._seeds))
        req = Req(rid or f"req-{next(self._rids)}", ids, params, seed=seed)
        self.scheduler.validate(req)
        return req

    def generate(self, prompt: str | list[str] | None = None,
                 sampling_params: dict | list[dict] | None = None,
                 input_ids: list[int] | list[list[int]] | None = None) -> dict | list[dict]:
        """Generate for one prompt (a dict back) or a batch (a list back)."""
        single = isinstance(prompt, str) or (input_ids is not None and input_ids
                                            and isinstance(input_ids[0], int))
        texts = [prompt] if isinstance(prompt, str) else prompt
        ids = [input_ids] if single and input_ids is not None else input_ids
        n = len(texts) if texts is not None else len(ids)
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * n
        reqs = [self.make_request(text=None if texts is None else texts[i],
                                  input_ids=None if ids is None else ids[i],
                                  sampling_params=params[i]) for i in range(n)]
        start = time.perf_counter()
        for r in reqs:
            self.scheduler.add_request(r)
        while not all(r.finished for r in reqs):
            self.scheduler.step()
        latency = time.perf_counter() - start
        outs = [self.output_of(r, latency) for r in reqs]
        return outs[0] if single else outs

    def output_of(self, req: Req, latency: float | None = None) -> dict:
        text = self.tokenizer.decode(req.output_ids)
        reason = req.finished_reason
        if reason and reason["type"] == "stop" and isinstance(reason.get("matched"), str):
            text = text[: text.find(reason["matched"])] if reason["matched"] in text else text
        meta = {
            "id": req.rid,
            "prompt_tokens": len(req.origin_input_ids),
            "completion_tokens": len(req.output_ids),
            "cached_tokens": req.cached_tokens,
            "finish_reason": reason,
            **spec_meta_info(req),
        }
        if latency is not None:
            meta["e2e_latency"] = latency
        return {"text": text, "output_ids": list(req.output_ids), "meta_info": meta}

    def shutdown(self) -> None:
        """Nothing runs in the background yet; kept for SGLang's Engine interface."""

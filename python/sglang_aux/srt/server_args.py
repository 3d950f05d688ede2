"""Server arguments: one validated dataclass and its argparse front, with SGLang's flag names."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from sglang_aux.srt.configs.acceptance_profile import FROM_DRAFT, NO_PROFILE, AcceptanceProfile
from sglang_aux.srt.configs.draft_len_schedule import FLAG as DRAFT_LEN_SCHEDULE_FLAG
from sglang_aux.srt.configs.draft_len_schedule import DraftLenSchedule
from sglang_aux.srt.configs.presets import DEFAULT_DRAFT_MODEL, DEFAULT_MODEL
from sglang_aux.srt.configs.speculative_algorithm import SpeculativeAlgorithm
from sglang_aux.srt.configs.step_costs import StepCosts
from sglang_aux.srt.layers.triton_ops.dispatch import GEMV_BACKENDS, check_kernel_switches

ATTENTION_BACKENDS = ("torch_native", "triton")
# SGLang's other `--attention-backend` names: a command line written for SGLang starts here on
# the default backend, with a warning. FlashInfer's decode and prefill lost to our Triton
# kernels on the H200 (docs/kernels.md); the others are not built.
SGLANG_ATTENTION_BACKENDS = ("flashinfer", "fa3", "fa4", "flex_attention", "trtllm_mha",
                             "dual_chunk_flash_attn", "aiter", "wave", "ascend", "intel_amx",
                             "intel_xpu", "flashmla", "cutlass_mla", "trtllm_mla", "nsa")
# How the Triton backend's fixed-layout attention combines key splits (its
# `decode_attention.MERGE_MODES`): a merge kernel after the split one, or in the split kernel
TRITON_DECODE_MERGES = ("launch", "in_kernel")
DTYPES = ("auto", "float32", "float16", "bfloat16")
LOAD_FORMATS = ("auto", "dummy")
FC_QUANTIZATIONS = ("none", "mxfp8")
AUX_PROJECTIONS = ("packed", "streamed")
# What the CLI offers: the algorithms that run (EAGLE3 stays in the enum, where the gating
# checks use it).
CLI_ALGORITHMS = ("NONE", "DFLASH", "DSPARK")
# How many tokens each request of the DFlash family verifies: static (its whole verify width),
# compact (per-request lengths from the draft's confidences). SGLang chooses it with an
# environment variable, read here as --speculative-verify-mode's default.
VERIFY_MODES = ("static", "compact")
RAGGED_VERIFY_MODE_ENV = "SGLANG_RAGGED_VERIFY_MODE"
DEFAULT_COMPACT_VERIFY_BUDGET_FRAC = 0.5
# SGLang's spellings of --speculative-verify-width; DSpark's counts proposals (one fewer)
VERIFY_WIDTH_ALIASES = ("--speculative-num-draft-tokens", "--speculative-dflash-block-size")
DSPARK_PROPOSALS_FLAG = "--speculative-dspark-block-size"
COMPACT_ONLY_FLAGS = ("compact_verify_budget_frac", "compact_verify_max_tokens",
                      "speculative_dspark_align_verify_tokens_to_graph_tier")
DRAFT_LEN_FILE_FLAGS = ("speculative_acceptance_profile", "speculative_step_costs")
# its counts cannot change a schedule whose graphs are captured for it
STATIC_COSTS_NEED_PROFILE = ("--speculative-step-costs under static verify needs an acceptance "
                             "profile (--speculative-acceptance-profile, or the draft's own "
                             "acceptance_profile.json): static verify derives its draft length "
                             "schedule once, at start-up, from both")
DEFAULT_STEP_COST_CONTEXT = 1024  # tokens: a few-shot prompt and its answer

logger = logging.getLogger(__name__)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends each flag's default to its help, unless the help already says it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def _cli_algorithm(name: str) -> str:
    name = name.upper()
    if name in CLI_ALGORITHMS or name not in SpeculativeAlgorithm.__members__:
        return name  # argparse names the choices for an unknown one
    raise argparse.ArgumentTypeError(
        f"{name} is not implemented in this runtime; choose from {', '.join(CLI_ALGORITHMS)}")


def _flag(name: str) -> str:
    return f"--{name.replace('_', '-')}"


class _VerifyWidthFlag(argparse.Action):
    """Every spelling of the verify width into its one field: DSpark's proposal count G
    (`--speculative-dspark-block-size`) is a width of G + 1; two spellings must agree."""

    def __call__(self, parser, namespace, value, option_string=None):
        width = value + 1 if option_string == DSPARK_PROPOSALS_FLAG else value
        earlier = getattr(namespace, "verify_width_flag", None)
        if earlier is not None and namespace.speculative_verify_width != width:
            parser.error(f"{earlier} and {option_string} give different verify widths "
                         f"({namespace.speculative_verify_width} and {width} tokens per "
                         "request, anchor included)")
        namespace.speculative_verify_width = width
        namespace.verify_width_flag = option_string


def _verify_mode_from_env() -> str:
    """--speculative-verify-mode's default: SGLang's variable, else static."""
    mode = os.environ.get(RAGGED_VERIFY_MODE_ENV, "").strip().lower() or "static"
    if mode not in VERIFY_MODES:
        raise ValueError(f"{RAGGED_VERIFY_MODE_ENV}={mode!r} is not supported; choose from "
                         f"{', '.join(VERIFY_MODES)} (SGLang's cap-accept is not built)")
    return mode


def _is_host_port(addr: str) -> bool:
    host, _, port = addr.rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) < 65536


def _add_parallel_args(add, d: dict) -> None:
    """The tensor-parallel flags (SGLang's names; docs/tensor_parallel.md)."""
    add("--tp-size", type=int, default=d["tp_size"],
        help="tensor-parallel ranks, one process (and device) each")
    add("--nnodes", type=int, default=d["nnodes"], help="nodes the ranks spread over")
    add("--node-rank", type=int, default=d["node_rank"],
        help="this node's index; node 0 serves HTTP, the others run their ranks only")
    add("--dist-init-addr", default=None,
        help="HOST:PORT of the ranks' rendezvous on node 0 (needed with --nnodes > 1; "
             "default on one node: a free loopback port)")
    add("--dist-timeout", type=int, default=None,
        help="seconds to wait for every node to join, and for a collective (default: 600)")


@dataclass
class ServerArgs:
    model_path: str | None = None  # None: the built-in default model
    tokenizer_path: str | None = None
    served_model_name: str | None = None  # None: the built-in name or the folder's name
    device: str = "auto"  # auto: cuda when available, else cpu
    dtype: str = "auto"  # auto: float32 on CPU, else the checkpoint's torch_dtype
    load_format: str = "auto"  # auto: safetensors; dummy: random weights (benchmarks)
    context_length: int | None = None
    attention_backend: str | None = None  # None: triton on CUDA, torch_native on CPU
    triton_attention_decode_merge: str = "launch"  # ours; one of TRITON_DECODE_MERGES
    # dense projections of one-token forwards: triton (the row GEMV kernel with the norm and
    # bias fused, on CUDA; layers/decode_gemv.py) or torch (cuBLAS / the CPU GEMM)
    decode_gemv_backend: str = "triton"
    mem_fraction_static: float = 0.85
    max_total_tokens: int | None = None  # KV slots; None: derived from memory
    max_running_requests: int = 64
    tp_size: int = 1
    pp_size: int = 1  # SGLang's; refused above 1 (below)
    # tensor parallelism over several nodes (SGLang's names): tp_size / nnodes ranks per node,
    # rendezvous at dist_init_addr (host:port; None on one node: a free loopback port);
    # dist_timeout: seconds a node may take to join, and a collective to answer (None: 600)
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: str | None = None
    dist_timeout: int | None = None
    speculative_algorithm: str | None = None  # None: DFLASH for the built-in default, else NONE
    speculative_draft_model_path: str | None = None
    # the draft vocabulary (SGLang's flag; speculative/token_map.py): a torch.save'd list of
    # the token ids a DFlash or DSpark draft may propose, its LM head (and DSpark's markov_w2)
    # cut to them; None: all
    speculative_token_map: str | None = None
    # tokens a request carries through one verify step, anchor included: its draft's
    # proposals + 1 (docs/dspark.md); None: the draft config's
    speculative_verify_width: int | None = None
    # static or compact (VERIFY_MODES); None: $SGLANG_RAGGED_VERIFY_MODE, else static
    speculative_verify_mode: str | None = None
    # compact verify only (COMPACT_ONLY_FLAGS): grow the requests' verify lengths, by
    # survival, to the token bucket the step's graph pads to anyway (SGLang's flag)
    speculative_dspark_align_verify_tokens_to_graph_tier: bool = False
    # ours: compact verify's extra tokens per step beyond each request's anchor, as a fraction
    # of every request's proposals (1.0 verifies everything, as SGLang without a cost table);
    # None: DEFAULT_COMPACT_VERIFY_BUDGET_FRAC under compact verify
    compact_verify_budget_frac: float | None = None
    compact_verify_max_tokens: int | None = None  # set: the budget is the step's token cap
    # the verify width per running batch size, "BS:WIDTH,..." (configs/draft_len_schedule.py);
    # None: derived under compact verify, or under static verify with an acceptance profile
    # (speculative/draft_len_planner.py), else full width
    speculative_draft_len_schedule: str | None = None
    # the derived schedule's acceptance prior (configs/acceptance_profile.py) and step costs
    # (configs/step_costs.py; None: measured at start-up, the requests' attention over
    # contexts of speculative_step_cost_context tokens included; 0: padding rows only)
    speculative_acceptance_profile: str | None = None
    speculative_step_costs: str | None = None
    speculative_step_cost_context: int = DEFAULT_STEP_COST_CONTEXT
    speculative_draft_fc_quantization: str | None = None  # "mxfp8"; None: the draft config's
    dflash_staged_projection_min_tokens: int = 1024  # staged MXFP8 fc input from this size on
    # packed: [T, K*H] aux rows, then fc (shared graph buffer; staged input for large MXFP8
    # prefills); streamed: each aux state projected into the fc's fp32 accumulator as tapped
    speculative_dflash_aux_projection: str = "packed"
    cuda_graph_max_bs_decode: int | None = None
    cuda_graph_bs_decode: list[int] | None = None
    disable_decode_cuda_graph: bool = False
    # Prefill graphs, one per token count up to the max (None: 2048 on CUDA for models of
    # hidden size <= 2048, else none), each for up to `cuda_graph_max_bs_prefill` requests
    # (None: min(max running, 4)); see runner_utils/capture_sizes.py.
    cuda_graph_max_tokens_prefill: int | None = None
    cuda_graph_tokens_prefill: list[int] | None = None
    # arrival token counts of the mixed graphs (capture_sizes.mixed_graph_plan)
    cuda_graph_tokens_mixed: list[int] | None = None
    cuda_graph_max_bs_prefill: int | None = None
    disable_prefill_cuda_graph: bool = False
    disable_shared_aux_buffer: bool = False
    disable_radix_cache: bool = False  # the prefix cache (mem_cache/radix_cache.py) is on
    # hold a prefill back while requests run until a prefill graph's worth wait, at most this
    # many steps (managers/scheduler/prefill_delayer.py)
    enable_prefill_delayer: bool = False
    prefill_delayer_max_delay_passes: int = 30
    # SGLang's flag; batches are never split here, so turning it on is refused (below)
    enable_two_batch_overlap: bool = False
    # the host reads step n's tokens while the device runs step n+1; None: on for CUDA
    disable_overlap_schedule: bool | None = None
    # arrivals' prefills ride in the running batch's decode / verify forward (MIXED, SGLang's
    # flag name), up to this many arrival tokens per forward (managers/scheduler/scheduler.py);
    # None: on CUDA, where it won for target-only and DFlash at 1, 8 and 32 concurrent
    # (docs/benchmarks.md, section 9d; SGLang's default is off), unless compact verify, which
    # no mixed forward takes; off on the CPU, where capturing its layouts costs start-up time
    # and nothing shows a win. Resolved at start-up; --disable-mixed-chunk: off
    enable_mixed_chunk: bool | None = None
    mixed_chunk_max_prefill_tokens: int = 512
    # SGLang's: a prompt longer than this prefills over several steps of at most this many
    # tokens, between the running batch's steps; <= 0 (SGLang's -1): off; None: SGLang's pick
    # for the device's memory (`resolved_chunked_prefill_size`)
    chunked_prefill_size: int | None = None
    # with mixed steps, the running requests take decode steps of their own between a
    # chunked prompt's chunks so they keep this share of their decode tokens/s while it is
    # prefilled (managers/scheduler/chunk_pacer.py); 0: off, a chunk every step
    chunked_prefill_decode_share: float = 0.5
    # SGLang's: JSON schemas compile without optional whitespace (compact JSON; a small model
    # may otherwise wander in whitespace the grammar allows)
    constrained_json_disable_any_whitespace: bool = False
    host: str = "127.0.0.1"
    port: int = 30000
    api_key: str | None = None
    # native /generate streams: each event carries only the new text and ids (SGLang's flag;
    # off: the whole text and ids so far, SGLang's default); OpenAI routes always send deltas
    incremental_streaming_output: bool = False
    # HTTP limits (entrypoints/http_limits.py): a larger body is refused with 413 (None: the
    # largest that can carry a prompt the context holds), a larger request head with 431; a
    # head must arrive, and a body may pause, within `timeout_request_read` seconds; an idle
    # keep-alive connection closes after `timeout_keep_alive` seconds
    max_request_body_bytes: int | None = None
    max_request_head_bytes: int = 64 * 1024
    timeout_request_read: float = 30.0
    timeout_keep_alive: float = 5.0
    log_level: str = "info"
    random_seed: int = 0

    def __post_init__(self) -> None:
        if self.model_path is None and self.speculative_algorithm is None:
            # The built-in default model is served with its DFlash draft.
            self.speculative_algorithm = "DFLASH"
            if self.speculative_draft_model_path is None:
                self.speculative_draft_model_path = DEFAULT_DRAFT_MODEL
        algo = SpeculativeAlgorithm.from_string(self.speculative_algorithm)
        self.speculative_algorithm = algo.value
        if self.served_model_name is None:
            # absolute (so "." names its folder) but not resolved (a symlink keeps its name)
            self.served_model_name = Path(os.path.abspath(self.model_path or DEFAULT_MODEL)).name
        if self.attention_backend in SGLANG_ATTENTION_BACKENDS:
            logger.warning("--attention-backend %s: SGLang's, not built in this runtime; "
                           "running the default (triton on CUDA, torch_native on CPU)",
                           self.attention_backend)
            self.attention_backend = None
        for name, choices in (("dtype", DTYPES), ("load_format", LOAD_FORMATS),
                              ("attention_backend", (None, *ATTENTION_BACKENDS)),
                              ("triton_attention_decode_merge", TRITON_DECODE_MERGES),
                              ("decode_gemv_backend", GEMV_BACKENDS),
                              ("speculative_draft_fc_quantization", (None, *FC_QUANTIZATIONS)),
                              ("speculative_dflash_aux_projection", AUX_PROJECTIONS)):
            if getattr(self, name) not in choices:
                raise ValueError(f"--{name.replace('_', '-')} must be one of {choices}, "
                                 f"got {getattr(self, name)!r}")
        check_kernel_switches()
        for name in ("tp_size", "pp_size", "max_running_requests"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
        if self.enable_two_batch_overlap:
            raise ValueError("--enable-two-batch-overlap: this runtime does not split batches "
                             "(only the split's aux contract, two_batch_overlap.filter_batch, "
                             "is built); run without it")
        if self.pp_size > 1:
            raise ValueError(f"--pp-size {self.pp_size}: this runtime runs one pipeline stage "
                             "(SGLang's flag; the models keep its aux gating: a later stage "
                             "keeps the list path); run with --pp-size 1")
        self._check_parallel()
        if not 0.0 < self.mem_fraction_static < 1.0:
            raise ValueError(
                f"--mem-fraction-static must be in (0, 1), got {self.mem_fraction_static}"
            )
        if self.dflash_staged_projection_min_tokens < 1:
            raise ValueError("--dflash-staged-projection-min-tokens must be >= 1")
        if self.cuda_graph_bs_decode is not None and not self.cuda_graph_bs_decode:
            raise ValueError("--cuda-graph-bs-decode needs at least one size")
        if self.cuda_graph_tokens_prefill is not None and not self.cuda_graph_tokens_prefill:
            raise ValueError("--cuda-graph-tokens-prefill needs at least one size")
        for name in ("cuda_graph_max_tokens_prefill", "cuda_graph_max_bs_prefill"):
            if getattr(self, name) is not None and getattr(self, name) < 0:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 0")
        for name in ("max_request_head_bytes", "timeout_request_read", "timeout_keep_alive"):
            if not getattr(self, name) > 0:
                raise ValueError(f"--{name.replace('_', '-')} must be > 0")
        if self.max_request_body_bytes is not None and self.max_request_body_bytes < 1:
            raise ValueError("--max-request-body-bytes must be >= 1")
        if not 0.0 <= self.chunked_prefill_decode_share < 1.0:
            raise ValueError("--chunked-prefill-decode-share must be in [0, 1) (0: off), got "
                             f"{self.chunked_prefill_decode_share}")
        if self.mixed_chunk_max_prefill_tokens < 1:
            raise ValueError("--mixed-chunk-max-prefill-tokens must be >= 1, got "
                             f"{self.mixed_chunk_max_prefill_tokens}")
        mixed_tokens = self.cuda_graph_tokens_mixed
        if mixed_tokens is not None and not (
                mixed_tokens and all(1 <= n <= self.mixed_chunk_max_prefill_tokens
                                     for n in mixed_tokens)):
            raise ValueError(f"--cuda-graph-tokens-mixed needs token counts in [1, "
                             f"--mixed-chunk-max-prefill-tokens "
                             f"{self.mixed_chunk_max_prefill_tokens}], got {mixed_tokens}")
        if algo.is_dflash_family():
            self._check_dflash(algo)
        if self.enable_mixed_chunk is None:
            # a compact verify step runs ragged lengths no mixed forward takes
            self.enable_mixed_chunk = self.resolved_device().startswith("cuda") and not (
                algo.is_dflash_family() and self.speculative_verify_mode == "compact")
        if not algo.is_dflash_family():
            given = self._given("speculative_verify_width", "speculative_verify_mode",
                                "speculative_draft_len_schedule", "speculative_token_map",
                                *COMPACT_ONLY_FLAGS,
                                *DRAFT_LEN_FILE_FLAGS)
            if given:
                raise ValueError(f"{', '.join(given)} only act with --speculative-algorithm "
                                 f"DFLASH or DSPARK (got {algo.value})")

    def _check_parallel(self) -> None:
        """The tensor-parallel layout: whole nodes of ranks, a rendezvous across nodes."""
        if self.nnodes < 1 or self.tp_size % self.nnodes:
            raise ValueError(f"--tp-size {self.tp_size} must be a multiple of --nnodes "
                             f"{self.nnodes} (>= 1): each node runs tp_size / nnodes ranks")
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"--node-rank {self.node_rank} must be in [0, --nnodes "
                             f"{self.nnodes})")
        if self.nnodes > 1 and not self.dist_init_addr:
            raise ValueError("--nnodes > 1 needs --dist-init-addr HOST:PORT (node 0's address, "
                             "the same on every node)")
        if self.dist_init_addr is not None and not _is_host_port(self.dist_init_addr):
            raise ValueError(f"--dist-init-addr must be HOST:PORT, got {self.dist_init_addr!r}")
        if self.dist_timeout is not None and self.dist_timeout <= 0:
            raise ValueError(f"--dist-timeout must be > 0 seconds, got {self.dist_timeout}")

    def _given(self, *names: str) -> list[str]:
        """The flags among `names` set on the command line (not None, not a False switch)."""
        return [_flag(n) for n in names if getattr(self, n) is not None
                and getattr(self, n) is not False]

    def _check_dflash(self, algo: SpeculativeAlgorithm) -> None:
        least = 3 if algo == SpeculativeAlgorithm.DSPARK else 2  # DSpark: 2 proposals at least
        if self.speculative_verify_width is not None and self.speculative_verify_width < least:
            raise ValueError(f"--speculative-verify-width must be >= {least} with {algo.value} "
                             f"(the anchor and its proposals), got {self.speculative_verify_width}")
        if algo == SpeculativeAlgorithm.DSPARK and self.tp_size > 1:
            raise ValueError("DSPARK with --tp-size > 1 is not built yet (its proposal loop and "
                             "compact verify are not run across ranks): use --tp-size 1 or "
                             "DFLASH")
        self._check_verify_mode(algo)
        self._check_draft_len_files()

    def _check_draft_len_files(self) -> None:
        """The schedule's syntax and the derivation's files parse (their fit to the draft's
        verify width is checked when the draft's config is read, before the models load)."""
        if self.speculative_step_cost_context < 0:
            raise ValueError(f"--speculative-step-cost-context must be >= 0 tokens, got "
                             f"{self.speculative_step_cost_context}")
        if self.speculative_draft_len_schedule is not None:
            schedule = DraftLenSchedule.parse(self.speculative_draft_len_schedule)
            if self.speculative_verify_width is not None:
                schedule.check(self.speculative_verify_width)
        if self.speculative_acceptance_profile not in (None, FROM_DRAFT, NO_PROFILE):
            AcceptanceProfile.load(self.speculative_acceptance_profile)
        if self.speculative_step_costs is not None:
            StepCosts.load(self.speculative_step_costs)

    def _check_verify_mode(self, algo: SpeculativeAlgorithm) -> None:
        mode = self.speculative_verify_mode = (self.speculative_verify_mode
                                               or _verify_mode_from_env())
        if mode not in VERIFY_MODES:
            raise ValueError(f"--speculative-verify-mode must be one of {VERIFY_MODES}, got "
                             f"{mode!r}")
        if mode == "static":
            given = self._given(*COMPACT_ONLY_FLAGS)
            if given:
                raise ValueError(f"{', '.join(given)} only act with --speculative-verify-mode "
                                 "compact (the verify mode is static)")
            if self.speculative_step_costs and self.speculative_acceptance_profile == NO_PROFILE:
                raise ValueError(STATIC_COSTS_NEED_PROFILE)
            return
        if self.compact_verify_budget_frac is not None and self.compact_verify_max_tokens:
            raise ValueError("--compact-verify-budget-frac and --compact-verify-max-tokens are "
                             "two budgets of compact verify: give one")
        if self.compact_verify_max_tokens is None and self.compact_verify_budget_frac is None:
            self.compact_verify_budget_frac = DEFAULT_COMPACT_VERIFY_BUDGET_FRAC
        if (self.compact_verify_budget_frac is not None
                and not 0.0 <= self.compact_verify_budget_frac <= 1.0):
            raise ValueError(f"--compact-verify-budget-frac must be in [0, 1], got "
                             f"{self.compact_verify_budget_frac}")
        if self.compact_verify_max_tokens is not None and self.compact_verify_max_tokens < 1:
            raise ValueError(f"--compact-verify-max-tokens must be >= 1, got "
                             f"{self.compact_verify_max_tokens}")
        if self.enable_mixed_chunk:
            raise ValueError("--enable-mixed-chunk with --speculative-verify-mode compact: a "
                             "compact verify step runs ragged lengths no mixed graph takes; "
                             "use static verify or drop the flag")
        if self.tp_size > 1:
            # each rank would choose the lengths from its own confidences: ragged shapes that
            # could differ across ranks
            raise ValueError(f"{algo.value} with --speculative-verify-mode compact and "
                             "--tp-size > 1 is not built yet: use static verify or --tp-size 1")

    @property
    def spec_algorithm(self) -> SpeculativeAlgorithm:
        return SpeculativeAlgorithm.from_string(self.speculative_algorithm)

    def resolved_device(self) -> str:
        if self.device != "auto":
            return self.device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"

    def resolved_dtype(self) -> str:
        """`auto` is float32 on the CPU: bf16 there is ~10x slower on matmuls and flips
        near-ties of the first token; elsewhere `auto` keeps the checkpoint's dtype."""
        if self.dtype == "auto" and self.resolved_device() == "cpu":
            return "float32"
        return self.dtype

    def resolved_overlap_schedule(self) -> bool:
        """Overlap by default where the device runs apart from the host (CUDA); on the CPU
        it only adds a step per finished request."""
        if self.disable_overlap_schedule is not None:
            return not self.disable_overlap_schedule
        return self.resolved_device().startswith("cuda")

    def resolved_chunked_prefill_size(self) -> int | None:
        """The chunk size, None when off. Unset, SGLang's default by the device's memory:
        2048 below 35 GiB, 8192 below 160 GiB (an H100 or H200), else 16384; 4096 where it
        knows no GPU memory (the CPU here)."""
        n = self.chunked_prefill_size
        if n is not None:
            return n if n > 0 else None
        device = self.resolved_device()
        if not device.startswith("cuda"):
            return 4096
        import torch

        gib = torch.cuda.get_device_properties(torch.device(device)).total_memory / 2**30
        return 2048 if gib < 35 else 8192 if gib < 160 else 16384

    def resolved_attention_backend(self) -> str:
        if self.attention_backend is not None:
            return self.attention_backend
        return "triton" if self.resolved_device().startswith("cuda") else "torch_native"

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser, *, serving: bool = True) -> None:
        """Every flag, with help and its default; without `serving`, only those that apply
        offline (no --host, --port, --api-key, --served-model-name)."""
        d = {f.name: f.default for f in dataclasses.fields(ServerArgs)}
        add = parser.add_argument
        add("--model-path", default=None,
            help="HF-format model folder or built-in name (default: the built-in "
                 f"{DEFAULT_MODEL}, served with its DFlash draft)")
        add("--tokenizer-path", default=None,
            help="folder holding tokenizer.json (default: the model folder)")
        if serving:
            add("--served-model-name", default=None,
                help="the model name /v1/models reports and OpenAI requests use (default: the "
                     "built-in name or the model folder's name)")
        add("--device", default=d["device"], help="cpu, cuda, cuda:N or auto (cuda when "
                                                   "available, else cpu)")
        add("--dtype", default=d["dtype"], choices=DTYPES,
            help="weights and activations (auto: float32 on CPU, else the checkpoint's)")
        add("--load-format", default=d["load_format"], choices=LOAD_FORMATS,
            help="auto: the folder's safetensors; dummy: random weights (benchmarks)")
        add("--context-length", type=int, default=None,
            help="longest prompt + output in tokens (default: the model's "
                 "max_position_embeddings)")
        add("--attention-backend", default=None,
            choices=(*ATTENTION_BACKENDS, *SGLANG_ATTENTION_BACKENDS),
            help="default: triton on CUDA, torch_native on CPU")
        add("--triton-attention-decode-merge", default=d["triton_attention_decode_merge"],
            choices=TRITON_DECODE_MERGES,
            help="how Triton decode/verify attention combines key splits: launch (a merge "
                 "kernel after the split one) or in_kernel (short contexts unsplit, long ones "
                 "merged by the split kernel: one launch; not yet measured on the H200)")
        add("--decode-gemv-backend", default=d["decode_gemv_backend"], choices=GEMV_BACKENDS,
            help="dense projections of one-token forwards (a bs-1 decode step) on CUDA: "
                 "triton (a row GEMV with the RMSNorm and bias fused; faster than cuBLAS on "
                 "the H200, docs/kernels.md) or torch (cuBLAS); more tokens always run cuBLAS")
        add("--mem-fraction-static", type=float, default=d["mem_fraction_static"],
            help="fraction of the device's memory for weights and the KV cache")
        add("--max-total-tokens", type=int, default=None,
            help="KV cache slots (default: what --mem-fraction-static leaves)")
        add("--max-running-requests", type=int, default=d["max_running_requests"],
            help="requests decoded together at most")
        _add_parallel_args(add, d)
        add("--pp-size", type=int, default=d["pp_size"],
            help="SGLang's flag, refused above 1: this runtime runs one pipeline stage")
        add("--speculative-algorithm", default=None, type=_cli_algorithm, choices=CLI_ALGORITHMS,
            help="default: DFLASH for the built-in default model, else NONE")
        add("--speculative-draft-model-path", default=None,
            help="the DFlash or DSpark draft: a folder, preset or shipped draft (default: "
                 f"{DEFAULT_DRAFT_MODEL} with the default model, else required)")
        add("--speculative-token-map", default=None,
            help="DFLASH or DSPARK: the draft vocabulary, a torch.save'd list of the token ids "
                 "the draft may propose (its LM head, and DSpark's markov_w2, cut to them; "
                 "SGLang's flag and file; a path that is no file is REPO/FILE on the hub); build "
                 "one with python -m sglang_aux.tools.build_token_map")
        add("--speculative-verify-width", *VERIFY_WIDTH_ALIASES, type=int, default=None,
            action=_VerifyWidthFlag, dest="speculative_verify_width",
            help="tokens a request carries through one verify step, anchor included: the "
                 "draft's proposals + 1; SGLang's spellings are accepted (default: the draft "
                 "config's block_size for DFLASH, its block_size + 1 for DSPARK)")
        add(DSPARK_PROPOSALS_FLAG, type=int, action=_VerifyWidthFlag,
            dest="speculative_verify_width",
            help="SGLang's DSpark flag: proposals per step (gamma), i.e. "
                 "--speculative-verify-width of this + 1")
        add("--speculative-verify-mode", default=None, choices=VERIFY_MODES,
            help="DFLASH or DSPARK: static verifies every request's whole verify width; "
                 "compact gives each request a length from its draft's confidences under a "
                 "token budget (docs/dspark.md) (default: SGLang's environment variable "
                 f"{RAGGED_VERIFY_MODE_ENV} when set, else static)")
        add("--speculative-dspark-align-verify-tokens-to-graph-tier", action="store_true",
            help="compact verify only: fill the token bucket a verify step pads to with the "
                 "next most likely drafts instead of padding")
        add("--compact-verify-budget-frac", type=float, default=None,
            help="compact verify only: the proposals a step verifies beyond each request's "
                 "anchor, as a fraction of all its requests' proposals (default: "
                 f"{DEFAULT_COMPACT_VERIFY_BUDGET_FRAC})")
        add("--compact-verify-max-tokens", type=int, default=None,
            help="compact verify only, instead of --compact-verify-budget-frac: a step "
                 "verifies every proposal while its requests' verify widths fit this many "
                 "tokens, and this many (at least one per request) beyond; e.g. where verify "
                 "stops being memory-bound")
        add(DRAFT_LEN_SCHEDULE_FLAG, default=None,
            help="DFLASH or DSPARK: the verify width per running batch size, BS:WIDTH pairs "
                 "with batch sizes ascending from 1, each width holding from its batch size "
                 "up, e.g. 1:16,8:8,32:4,64:1 (width 1: plain decoding, no draft forward; static "
                 "verify captures its graphs at each width it runs) (default: derived from the "
                 "step costs and the acceptance under compact verify, or under static verify "
                 "with an acceptance profile (the draft's own by default); else the full "
                 "width)")
        add("--speculative-acceptance-profile", default=None,
            help="a JSON acceptance profile (accept_histogram, as in "
                 "benchmark/spec_decode/profiles/), 'draft': the draft folder's own "
                 "acceptance_profile.json (train_dflash --eval writes it), or 'none': the "
                 "prior of the derived draft length schedule before the server's own counts "
                 "(compact verify; none: every proposal accepted); under static verify the "
                 "schedule is derived from it once at start-up and its narrower graphs "
                 "captured (none: the full width) (default: the draft's own when its folder "
                 "has one, else none)")
        add("--speculative-step-costs", default=None,
            help="a JSON file of draft ms per batch size and verify ms "
                 "per token count (what bench_dflash_step.py --out writes) for the derived "
                 "draft length schedule (default: measured at start-up by replaying the "
                 "captured graphs)")
        add("--speculative-step-cost-context", type=int, default=DEFAULT_STEP_COST_CONTEXT,
            help="the context, in tokens per request, at which the start-up probe measures "
                 "what a request's attention adds to the draft and verify steps (fewer "
                 "where the KV pool cannot hold the largest graph's requests at it; 0: "
                 "padding rows only)")
        add("--speculative-draft-fc-quantization", default=None, choices=FC_QUANTIZATIONS,
            help="store the DFlash draft's fc as MXFP8 (default: the draft config's "
                 "'quantization')")
        add("--dflash-staged-projection-min-tokens", type=int,
            default=d["dflash_staged_projection_min_tokens"],
            help="eager target forwards of at least this many tokens quantize each aux state "
                 "into the MXFP8 fc input as produced (needs an MXFP8 fc)")
        add("--speculative-dflash-aux-projection", default=d["speculative_dflash_aux_projection"],
            choices=AUX_PROJECTIONS,
            help="packed: concat the aux states, then the draft fc (shared graph buffer, "
                 "staged MXFP8 input for large prefills); streamed: project each aux state "
                 "into the fc's fp32 accumulator as it is tapped (no [T, K*H] tensor)")
        add("--cuda-graph-max-bs-decode", type=int, default=None,
            help="largest decode batch captured as a graph (default: from "
                 "--max-running-requests; 8 on CPU)")
        add("--cuda-graph-bs-decode", type=int, nargs="+", default=None,
            help="the decode batch sizes to capture (default: up to --cuda-graph-max-bs-decode)")
        add("--disable-decode-cuda-graph", action="store_true",
            help="run decode steps eagerly")
        add("--cuda-graph-max-tokens-prefill", type=int, default=None,
            help="capture prefill graphs up to this many tokens (default: 2048 on CUDA for "
                 "models of hidden size <= 2048, else 0 = none); a prefill pads to the next "
                 "captured count")
        add("--cuda-graph-tokens-prefill", type=int, nargs="+", default=None,
            help="the token counts to capture prefill graphs for (default: ~1.5x apart)")
        add("--cuda-graph-max-bs-prefill", type=int, default=None,
            help="requests one prefill graph takes (default: min(max running requests, 4))")
        add("--disable-prefill-cuda-graph", action="store_true",
            help="run prefills eagerly")
        add("--disable-shared-aux-buffer", action="store_true",
            help="give every captured decode graph its own aux output (the baseline)")
        add("--disable-radix-cache", action="store_true",
            help="no prefix cache: every request prefills its whole prompt")
        add("--enable-prefill-delayer", action="store_true",
            help="while requests run, hold a prefill back until as many requests wait as one "
                 "prefill graph takes (or the free rows hold)")
        add("--prefill-delayer-max-delay-passes", type=int,
            default=d["prefill_delayer_max_delay_passes"],
            help="steps a waiting request can be passed over before its prefill runs anyway")
        add("--enable-two-batch-overlap", action="store_true",
            help="SGLang's flag, refused: batches are not split at run time here")
        add("--disable-overlap-schedule", action="store_const", const=True, default=None,
            help="read each step's tokens before launching the next (default: overlap on CUDA, "
                 "where the host prepares step n+1 while the device runs step n)")
        mixed = parser.add_mutually_exclusive_group()
        mixed.add_argument(
            "--enable-mixed-chunk", action="store_const", const=True, default=None,
            help="run arrivals' prefills inside the running batch's decode (or DFlash verify) "
                 "forward instead of in a step of their own (default: on CUDA, except under "
                 "compact verify, which refuses the flag; off on the CPU)")
        mixed.add_argument(
            "--disable-mixed-chunk", dest="enable_mixed_chunk", action="store_const",
            const=False, help="prefill arrivals in steps of their own")
        add("--mixed-chunk-max-prefill-tokens", type=int,
            default=d["mixed_chunk_max_prefill_tokens"],
            help="most arrival tokens one mixed forward takes; a longer prefill runs alone")
        add("--cuda-graph-tokens-mixed", type=int, nargs="+", default=None,
            help="the arrival token counts to capture mixed graphs for, each at most "
                 "--mixed-chunk-max-prefill-tokens, the largest bounding a mixed forward's "
                 "arrivals (default: 32, 64, 128, ... up to that bound, and the bound)")
        add("--chunked-prefill-size", type=int, default=None,
            help="prefill a longer prompt over several scheduler steps of at most this many "
                 "tokens, between the running batch's steps; -1 turns it off (default: "
                 "SGLang's pick for the GPU's memory: 2048 below 35 GiB, 8192 below 160 GiB, "
                 "else 16384; 4096 on CPU)")
        add("--chunked-prefill-decode-share", type=float,
            default=d["chunked_prefill_decode_share"],
            help="with mixed steps, interleave decode steps of the running batch between a "
                 "chunked prompt's chunks so the running requests keep this share of their "
                 "decode tokens/s while it is prefilled, in [0, 1); 0: off, a chunk every step")
        add("--constrained-json-disable-any-whitespace", action="store_true",
            help="compile json_schema (and response_format) grammars without optional "
                 "whitespace: compact JSON")
        if serving:
            add("--host", default=d["host"], help="address to listen on")
            add("--port", type=int, default=d["port"], help="port to listen on")
            add("--api-key", default=None,
                help="require `Authorization: Bearer KEY` on every route (default: none)")
            add("--incremental-streaming-output", action="store_true",
                help="native /generate streams send each event only the new text and output "
                     "ids (default: the whole text and ids so far, as SGLang); the OpenAI "
                     "routes always stream deltas")
            add("--max-request-body-bytes", type=int, default=None,
                help="refuse a larger request body with 413 (default: the largest body that "
                     "can carry a prompt the context holds)")
            add("--max-request-head-bytes", type=int, default=d["max_request_head_bytes"],
                help="refuse a larger request line plus headers with 431")
            add("--timeout-request-read", type=float, default=d["timeout_request_read"],
                help="seconds a client has to send a request's head, and may pause while "
                     "sending its body, before its connection is closed")
            add("--timeout-keep-alive", type=float, default=d["timeout_keep_alive"],
                help="seconds an idle keep-alive connection stays open")
        add("--log-level", default=d["log_level"], help="debug, info, warning or error")
        add("--random-seed", type=int, default=d["random_seed"],
            help="seed of the random weights (--load-format dummy) and unseeded sampling")

    @classmethod
    def from_parsed(cls, parser: argparse.ArgumentParser, args: argparse.Namespace
                    ) -> ServerArgs:
        """`from_cli_args`, a bad combination of flags ending as a usage error (exit 2)."""
        try:
            return cls.from_cli_args(args)
        except ValueError as e:
            parser.error(str(e))

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> ServerArgs:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in vars(args).items() if k in names})

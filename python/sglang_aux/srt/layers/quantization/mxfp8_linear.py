"""`MXFP8Linear`: a bias-free linear layer whose weight is stored as MXFP8 from load time on."""

import torch

from sglang_aux.srt.layers.quantization.mxfp8 import mxfp8_gemm, quantize_mxfp8
from sglang_aux.srt.layers.quantization.mxfp8_format import MXFP8_BLOCK, SCALES_DTYPE, VALUES_DTYPE


class MXFP8Linear(torch.nn.Module):
    """y = dequant(quantize(x)) @ dequant(W)^T, W quantized once when loaded.

    Buffers: `weight_values` [N, K] e4m3fn and `weight_scales` [N, K/32] uint8.
    NOTE: `Module.to(dtype)` would cast the e4m3 buffer like any float tensor; build the layer
    on its device and load into it instead of converting it.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        out_dtype: torch.dtype = torch.bfloat16,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        if in_features % MXFP8_BLOCK != 0:
            raise ValueError(f"MXFP8Linear: in_features must be a multiple of {MXFP8_BLOCK}, "
                             f"got {in_features}")
        self.in_features = in_features
        self.out_features = out_features
        self.out_dtype = out_dtype
        self.register_buffer(
            "weight_values",
            torch.zeros(out_features, in_features, dtype=VALUES_DTYPE, device=device),
        )
        self.register_buffer(
            "weight_scales",
            torch.zeros(out_features, in_features // MXFP8_BLOCK, dtype=SCALES_DTYPE,
                        device=device),
        )

    @classmethod
    def from_float(cls, weight: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16
                   ) -> "MXFP8Linear":
        """Builds the layer from a float weight [N, K] on the weight's device."""
        if weight.dim() != 2:
            raise ValueError(f"MXFP8Linear.from_float: weight must be [N, K], got "
                             f"{tuple(weight.shape)}")
        layer = cls(weight.shape[1], weight.shape[0], out_dtype=out_dtype, device=weight.device)
        layer.load_weight(weight)
        return layer

    @torch.no_grad()
    def load_weight(self, weight: torch.Tensor) -> None:
        """Quantizes a float weight [N, K] into the layer's buffers (in place)."""
        expected = (self.out_features, self.in_features)
        if tuple(weight.shape) != expected:
            raise ValueError(f"MXFP8Linear.load_weight: expected weight {expected}, got "
                             f"{tuple(weight.shape)}")
        quantize_mxfp8(weight.to(self.weight_values.device),
                       out=(self.weight_values, self.weight_scales))

    def _check_out(self, num_tokens: int, out: torch.Tensor | None) -> torch.Tensor:
        shape = (num_tokens, self.out_features)
        if out is None:
            return torch.empty(shape, dtype=self.out_dtype, device=self.weight_values.device)
        if tuple(out.shape) != shape:
            raise ValueError(f"MXFP8Linear: out must be {shape}, got {tuple(out.shape)}")
        return out

    def forward(self, x: torch.Tensor, out: torch.Tensor | None = None,
                candidate: str | None = None) -> torch.Tensor:
        """x [T, K] (any float dtype) -> out [T, N]; quantizes x, then runs the MXFP8 GEMM
        (`candidate`, see `forward_quantized`)."""
        if x.dim() != 2 or x.shape[1] != self.in_features:
            raise ValueError(f"MXFP8Linear: expected x [T, {self.in_features}], got "
                             f"{tuple(x.shape)}")
        xq, xs = quantize_mxfp8(x)
        return self.forward_quantized(xq, xs, out, candidate)

    def forward_quantized(
        self, xq: torch.Tensor, xs: torch.Tensor, out: torch.Tensor | None = None,
        candidate: str | None = None,
    ) -> torch.Tensor:
        """Pre-quantized input xq [T, K] e4m3fn, xs [T, K/32] uint8 -> out [T, N]; `candidate`
        names the GEMM (`mxfp8_gemm`)."""
        if xq.dim() != 2 or xq.shape[1] != self.in_features:
            raise ValueError(f"MXFP8Linear: expected quantized x [T, {self.in_features}], got "
                             f"{tuple(xq.shape)}")
        out = self._check_out(xq.shape[0], out)
        return mxfp8_gemm(xq, xs, self.weight_values, self.weight_scales, out,
                          candidate=candidate)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, mxfp8"

"""xnnfold: fold computed GEMM weights and biases so that ExecuTorch's XNNPACK delegate takes them."""

from .explain import explain, format_explanation
from .partitioner import XnnpackPartitioner, fold_gemm_params
from .pipeline import FoldResult, GemmOperand

__all__ = ["XnnpackPartitioner", "fold_gemm_params", "explain", "format_explanation",
           "FoldResult", "GemmOperand"]
__version__ = "0.1.0"

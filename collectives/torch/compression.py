"""Gradient compression applied around the wire (Horovod's ``horovod.torch.compression``).

A Compressor turns a tensor into what is sent and back: ``compress(t)``
returns ``(compressed, ctx)`` and ``decompress(compressed, ctx)`` restores
the original dtype. They are used as classes (``Compression.fp16``), as in
Horovod.
"""
from __future__ import annotations

from typing import Any

import torch

__all__ = ["Compressor", "NoneCompressor", "FP16Compressor", "Compression"]


class Compressor:
    """Interface: compress a tensor before communication, decompress after."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """Return the tensor to send and a context for decompress."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        """Return the received tensor in its original form."""
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Send tensors as they are."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """Return `tensor` unchanged and no context."""
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        """Return `tensor` unchanged."""
        return tensor


class FP16Compressor(Compressor):
    """Send floating-point tensors as float16 (halves the bytes); others unchanged."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """Cast a floating-point tensor to float16; the context is the original dtype."""
        dtype = tensor.dtype
        if tensor.is_floating_point() and dtype != torch.float16:
            return tensor.to(torch.float16), dtype
        return tensor, dtype

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        """Cast back to the original dtype."""
        if ctx is not None and tensor.dtype != ctx:
            return tensor.to(ctx)
        return tensor


class Compression:
    """The available compressors: ``Compression.none`` and ``Compression.fp16``."""

    none = NoneCompressor
    fp16 = FP16Compressor

"""The lean forward's KV cache (lean.py): one preallocated tensor per model for keys and one for values, written in
place; rolling back is setting its length, keeping a tree's path is a copy of rows."""

from __future__ import annotations

import torch


class LeanCache:
    """Keys and values of every layer: (layers, kv heads, capacity, head dim) each, `length` rows in use.

    The capacity doubles when a call needs more; rows past `length` are garbage and never read.
    """

    FIRST_ROWS = 128  # the capacity a cache starts with: a chat prompt and a short reply

    def __init__(self, layers: int, kv_heads: int, head_dim: int):
        self.k = torch.zeros(layers, kv_heads, self.FIRST_ROWS, head_dim)
        self.v = torch.zeros_like(self.k)
        self.length = 0

    @classmethod
    def rows_for(cls, n: int) -> int:
        """The capacity a cache has once it holds n rows."""
        cap = cls.FIRST_ROWS
        while cap < n:
            cap *= 2
        return cap

    def reserve(self, n: int) -> None:
        if n <= self.k.shape[2]:
            return
        cap = self.rows_for(n)
        k, v = self.k, self.v
        self.k = k.new_zeros(k.shape[0], k.shape[1], cap, k.shape[3])
        self.v = torch.zeros_like(self.k)
        self.k[:, :, : self.length] = k[:, :, : self.length]
        self.v[:, :, : self.length] = v[:, :, : self.length]

    def get_seq_length(self) -> int:
        """Rows in use (transformers' cache spelling)."""
        return self.length

    def crop(self, count: int) -> None:
        """Drop the last -count rows (a negative count, as transformers' DynamicCache.crop takes)."""
        self.length = max(0, self.length + count)

    def move_rows(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy rows src -> dst in every layer (a tree's accepted path into place)."""
        self.k[:, :, dst] = self.k[:, :, src]
        self.v[:, :, dst] = self.v[:, :, src]

"""Token data for training: the corpus tokenized into one stream, and seeded random windows."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from outpace.train.corpus import SourceFile


@dataclass
class TokenStream:
    """All files' tokens back to back, each file followed by EOS. ``tokens [num_tokens]`` int32."""

    tokens: torch.Tensor

    @classmethod
    def from_files(cls, files: list[SourceFile], tokenizer, eos_id: int) -> TokenStream:
        """``tokenizer`` is a ``tokenizers.Tokenizer`` (batch encoding runs in parallel in Rust)."""
        ids: list[int] = []
        for enc in tokenizer.encode_batch([f.text for f in files], add_special_tokens=False):
            ids.extend(enc.ids)
            ids.append(eos_id)
        return cls(torch.tensor(ids, dtype=torch.int32))

    def __len__(self) -> int:
        return self.tokens.numel()

    def windows(self, batch_size: int, length: int, generator: torch.Generator) -> torch.Tensor:
        """[batch_size, length] int64 windows starting at uniformly random offsets."""
        starts = torch.randint(0, len(self) - length, (batch_size,), generator=generator)
        return self.tokens[starts[:, None] + torch.arange(length)].long()

    def sequential_windows(self, length: int, max_windows: int) -> torch.Tensor:
        """[n, length] non-overlapping windows from the start: a fixed evaluation set."""
        n = min(max_windows, len(self) // length)
        return self.tokens[: n * length].view(n, length).long()

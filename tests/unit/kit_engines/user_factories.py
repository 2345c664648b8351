"""Model and data factories for the tests: good ones and ones that break the contract in one way each."""

from __future__ import annotations

import torch
from torch import nn

NOT_CALLABLE = 3


class TinyLM(nn.Module):
    """Embedding + linear head: tokens (B, S) -> logits (B, S, V)."""

    def __init__(self, vocab: int, hidden: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, x):
        return self.head(self.embed(x))


def good_model(*, stage, num_stages, seed, options):
    return TinyLM(int(options.get("vocab", 256)), int(options.get("hidden", 16)))


def returns_string(*, stage, num_stages, seed, options):
    return "a model"


def two_stages(*, stage, num_stages, seed, options):
    return [TinyLM(256, 16), TinyLM(256, 16)]


def wrong_vocab(*, stage, num_stages, seed, options):
    return TinyLM(100, 16)


def no_keywords(x):
    return TinyLM(256, 16)


class Synthetic(torch.utils.data.Dataset):
    """``n`` samples of ``seq_length + 1`` tokens, item i = (i + arange) % 256, int64."""

    def __init__(self, seq_length, n=64, dtype=torch.int64, extra=0, bad_at=None):
        self.seq_length, self.n, self.dtype, self.extra, self.bad_at = seq_length, n, dtype, extra, bad_at

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        t = (torch.arange(self.seq_length + 1 + self.extra) + i * 7) % 256
        if self.bad_at is not None and i == self.bad_at:
            return t.to(torch.int32)
        return t.to(self.dtype)


def good_data(*, seq_length, seed, options):
    return Synthetic(seq_length, n=int(options.get("n", 64)), bad_at=options.get("bad_at"))


def float_data(*, seq_length, seed, options):
    return Synthetic(seq_length, dtype=torch.float32)


def short_data(*, seq_length, seed, options):
    return Synthetic(seq_length, extra=-1)


class MetaBlind(TinyLM):
    """Its forward branches on the data, so it cannot run on the meta device: only the ranks can check it."""

    def forward(self, x):
        if bool((x >= 0).all()):
            return super().forward(x)
        return super().forward(x.clamp(min=0))


class Crashes(TinyLM):
    """Its forward always raises."""

    def forward(self, x):
        raise RuntimeError("this forward is broken")


def meta_blind_wrong_vocab(*, stage, num_stages, seed, options):
    return MetaBlind(100, 16)


def crashes_in_forward(*, stage, num_stages, seed, options):
    return Crashes(256, 16)

"""Word-level LSTM language model (the paper's PTB model and its mini version).

embedding -> dropout -> multi-layer LSTM (inter-layer dropout) -> dropout -> linear decoder, as
in PyTorch's word_language_model example that the paper's LSTM follows (2 layers, 1500 units,
dropout 0.65). Optionally ties decoder and embedding weights (needs embed_size == hidden_size).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from torch import Tensor, nn

from gravac.core.registry import option
from gravac.models.registry import MODELS
from gravac.core.schema import ModelCfg

Hidden = tuple[Tensor, Tensor]


@dataclass
class LSTMCfg(ModelCfg):
    """The paper's LSTM sizes by default; lstm_mini's YAML sets the small ones."""
    embed_size: int = option(1500, check=lambda v: v >= 1, valid=">= 1")
    hidden_size: int = option(1500, check=lambda v: v >= 1, valid=">= 1")
    num_layers: int = option(2, check=lambda v: v >= 1, valid=">= 1")
    dropout: float = option(0.65, check=lambda v: 0 <= v < 1, valid="in [0, 1)")
    tie_weights: bool = False

    def errors(self, prefix: str) -> list[str]:
        if self.tie_weights and self.embed_size != self.hidden_size:
            return [f"{prefix}.tie_weights=true needs {prefix}.embed_size == {prefix}.hidden_size, "
                    f"got {self.embed_size} and {self.hidden_size}"]
        return []


class LSTMLanguageModel(nn.Module):
    """forward(x (T, B) int64, hidden) -> (logits (T, B, vocab), hidden); init_hidden(B) -> zeros."""

    def __init__(self, vocab_size: int, embed_size: int = 1500, hidden_size: int = 1500, num_layers: int = 2,
                 dropout: float = 0.65, tie_weights: bool = False):
        super().__init__()
        if tie_weights and embed_size != hidden_size:
            raise ValueError(f"model.tie_weights needs embed_size == hidden_size, got {embed_size} and {hidden_size}")
        self.vocab_size, self.hidden_size, self.num_layers = vocab_size, hidden_size, num_layers
        self.encoder = nn.Embedding(vocab_size, embed_size)
        self.drop = nn.Dropout(dropout)
        self.rnn = nn.LSTM(embed_size, hidden_size, num_layers, dropout=dropout if num_layers > 1 else 0.0)
        self.decoder = nn.Linear(hidden_size, vocab_size)
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -0.1, 0.1)
        if tie_weights:
            self.decoder.weight = self.encoder.weight

    def init_hidden(self, batch_size: int) -> Hidden:
        """Zero (h, c), each (num_layers, batch_size, hidden_size), on the model's device and dtype."""
        w = self.decoder.weight
        shape = (self.num_layers, batch_size, self.hidden_size)
        return w.new_zeros(shape), w.new_zeros(shape)

    @staticmethod
    def detach_hidden(hidden: Hidden) -> Hidden:
        """Cut the graph between bptt windows (truncated backpropagation through time)."""
        return tuple(h.detach() for h in hidden)  # type: ignore[return-value]

    def forward(self, x: Tensor, hidden: Optional[Hidden] = None) -> tuple[Tensor, Hidden]:
        if hidden is None:
            hidden = self.init_hidden(x.shape[1])
        out, hidden = self.rnn(self.drop(self.encoder(x)), hidden)
        return self.decoder(self.drop(out)), hidden


def _build(cfg: LSTMCfg, vocab_size: int) -> LSTMLanguageModel:
    """The word-level LSTM language model at cfg's sizes."""
    return LSTMLanguageModel(vocab_size, embed_size=cfg.embed_size, hidden_size=cfg.hidden_size,
                             num_layers=cfg.num_layers, dropout=cfg.dropout, tie_weights=cfg.tie_weights)


@dataclass
class LSTMMiniCfg(LSTMCfg):
    """The CPU-sized LSTM: 200 units and embedding, dropout 0.2."""
    embed_size: int = option(200, check=lambda v: v >= 1, valid=">= 1")
    hidden_size: int = option(200, check=lambda v: v >= 1, valid=">= 1")
    dropout: float = option(0.2, check=lambda v: 0 <= v < 1, valid="in [0, 1)")


MODELS.register("lstm", LSTMCfg, task="lm", doc="the paper's 2-layer LSTM language model (66M parameters on PTB)",
                paper=dict(workers=32, batch_size=20, lr=0.1, device="cuda"), cpu_preset="experiment=mini_lstm")(_build)
MODELS.register("lstm_mini", LSTMMiniCfg, task="lm", doc="a CPU-sized 2-layer LSTM language model")(_build)

"""Stock fairseq RoBERTa (`--task masked_lm --arch roberta`) seen through the interface the multilinguality metrics
use (`encode_layers`, `layers`), so that a stock model trained on `export-stock`'s text is scored by exactly the
code that scores `fake_english` models.

The two dictionaries hold the same symbols in different places (fake_english adds `<mask>` to the English
dictionary before doubling it, stock masked_lm appends one `<mask>` after the doubled one), so token ids go through
a table built from the symbols' text.
"""
import torch
from torch import nn

from fairseq_xmlm.errors import XmlmError


def id_table(ours, stock):
    """LongTensor t with stock[t[i]] == ours[i] for every symbol of `ours` that enters an evaluation (every word
    and its twin, <s>, </s>, <pad>); the others (<mask> twins) map to stock's <unk>."""
    table = torch.tensor([stock.index(ours[i]) for i in range(len(ours))], dtype=torch.long)
    missing = [ours[i] for i in range(stock.nspecial, len(ours))
               if int(table[i]) == stock.unk() and ours[i] != stock[stock.unk()] and "<mask>" not in ours[i]]
    if missing:
        raise XmlmError(f"the stock model's dictionary lacks {len(missing)} symbols of the evaluation data "
                        f"(first: {missing[:3]}): it was not trained on this data's export-stock text")
    return table


class StockRobertaEncoder(nn.Module):
    """A stock RobertaModel whose `encode_layers(tokens)` returns the (B, T, D) states of the embeddings (after
    their LayerNorm) and of every layer, as `PartiallySharedRoberta.encode_layers` does. Stock RoBERTa has one
    embedding table for both languages, so `lang_ids` is ignored."""

    def __init__(self, roberta, to_stock):
        super().__init__()
        self.roberta = roberta
        self.register_buffer("to_stock", to_stock, persistent=False)

    @property
    def layers(self):
        return self.roberta.encoder.sentence_encoder.layers

    def encode_layers(self, src_tokens, lang_ids=None, last_layer=None, **unused):
        _, extra = self.roberta(self.to_stock[src_tokens], features_only=True, return_all_hiddens=True)
        states = [state.transpose(0, 1) for state in extra["inner_states"]]  # fairseq's are (T, B, D)
        return states if last_layer is None else states[:last_layer + 1]
